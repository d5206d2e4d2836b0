{{- define "gluon.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gluon.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains (include "gluon.name" .) .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "gluon.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "gluon.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/part-of: gluon-rollout
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "gluon.operator.selector" -}}
app.kubernetes.io/name: gluon-rollout-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "gluon.agent.selector" -}}
app.kubernetes.io/name: gluon-rollout-agent
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "gluon.operator.name" -}}{{ include "gluon.fullname" . }}-operator{{- end -}}
{{- define "gluon.agent.name" -}}{{ include "gluon.fullname" . }}-agent{{- end -}}
{{- define "gluon.webhook.secret" -}}{{ include "gluon.fullname" . }}-webhook-tls{{- end -}}

{{- define "gluon.image" -}}
{{- printf "%s:%s" .image.repository (default .chart.AppVersion .image.tag) -}}
{{- end -}}

{{- define "gluon.podSecurity" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
fsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "gluon.containerSecurity" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
{{- end -}}
