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

{{- /* An image as repository:tag (dict "root" $ "name" "operator"|"agent"). No image is published: a
       repository left empty fails with how to build it (docs/using/images.md), for both images at once. */ -}}
{{- define "gluon.image" -}}
{{- include "gluon.checks.images" .root -}}
{{- $image := (index .root.Values .name).image -}}
{{- printf "%s:%s" $image.repository (default .root.Chart.AppVersion $image.tag) -}}
{{- end -}}

{{- define "gluon.checks.images" -}}
{{- $missing := list -}}
{{- if not .Values.operator.image.repository -}}
{{- $missing = append $missing "operator.image.repository is not set: build the operator image (docker build --target operator -t <registry>/gluon-rollout-operator:<tag> .), push it and set operator.image.repository and operator.image.tag (docs/using/images.md)." -}}
{{- end -}}
{{- if not .Values.agent.image.repository -}}
{{- $missing = append $missing "agent.image.repository is not set: build the agent FROM your serving image (docker build --target agent --build-arg BASE_IMAGE=<your SGLang image> -t <registry>/gluon-rollout-agent:<tag> .), push it and set agent.image.repository and agent.image.tag (docs/using/images.md)." -}}
{{- end -}}
{{- with $missing -}}{{- fail (join " " .) -}}{{- end -}}
{{- end -}}

{{- /* What the cluster must have, checked when Helm talks to it (install, upgrade, --dry-run=server): the
       release namespace's Pod Security level and the Prometheus Operator's CRDs for the monitors that are
       on. Offline (`helm template`, --dry-run=client) `lookup` returns nothing and Capabilities hold only
       the built-in APIs, so both checks pass silently there (charts/gluon-rollout/README.md). */ -}}
{{- define "gluon.checks.cluster" -}}
{{- if lookup "v1" "Namespace" "" "kube-system" -}}
{{- include "gluon.checks.podSecurity" . -}}
{{- include "gluon.checks.monitoringCRDs" . -}}
{{- include "gluon.checks.injectionMode" . -}}
{{- end -}}
{{- end -}}

{{- /* fileKeyRef forced on an API server older than 1.35: every injected pod would be admitted uninjected (the
       API server drops the field), so the install says so instead. auto takes shell there by itself. */ -}}
{{- define "gluon.checks.injectionMode" -}}
{{- if and (eq .Values.operator.injectionMode "fileKeyRef") (not (semverCompare ">=1.35.0-0" .Capabilities.KubeVersion.Version)) -}}
{{- fail (printf "operator.injectionMode is fileKeyRef but the API server is %s: fileKeyRef (EnvFiles) needs 1.35 or later, and an older API server drops the field. Use operator.injectionMode=auto (shell there) or shell." .Capabilities.KubeVersion.Version) -}}
{{- end -}}
{{- end -}}

{{- /* Every GPU access mode needs hostPort (the preflight asks HOST_IP:<agent.port>) and all but resource
       hostPath: Pod Security level privileged. A namespace not there yet is made by --create-namespace
       without labels (the cluster's default level applies: docs/using/install.md). */ -}}
{{- define "gluon.checks.podSecurity" -}}
{{- $namespace := lookup "v1" "Namespace" "" .Release.Namespace -}}
{{- if $namespace -}}
{{- $labels := $namespace.metadata.labels | default dict -}}
{{- $level := index $labels "pod-security.kubernetes.io/enforce" | default "privileged" -}}
{{- if ne $level "privileged" -}}
{{- fail (printf "namespace %s enforces Pod Security level %q, which refuses the agent's hostPort and hostPath in every GPU access mode: run `kubectl label namespace %s pod-security.kubernetes.io/enforce=privileged --overwrite` and install again." .Release.Namespace $level .Release.Namespace) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "gluon.checks.monitoringCRDs" -}}
{{- if .Values.monitoring.enabled -}}
{{- $m := .Values.monitoring -}}
{{- $wanted := list -}}
{{- if $m.serviceMonitor.enabled }}{{ $wanted = append $wanted "ServiceMonitor" }}{{ end -}}
{{- if or $m.podMonitor.enabled $m.servingPodMonitor.enabled }}{{ $wanted = append $wanted "PodMonitor" }}{{ end -}}
{{- if $m.prometheusRule.enabled }}{{ $wanted = append $wanted "PrometheusRule" }}{{ end -}}
{{- $absent := list -}}
{{- range $wanted -}}
{{- if not ($.Capabilities.APIVersions.Has (printf "monitoring.coreos.com/v1/%s" .)) -}}
{{- $absent = append $absent . -}}
{{- end -}}
{{- end -}}
{{- with $absent -}}
{{- fail (printf "monitoring.enabled is true but this cluster has no Prometheus Operator CRD for %s (monitoring.coreos.com/v1): install the Prometheus Operator (e.g. kube-prometheus-stack) first, or set monitoring.enabled=false and scrape the serving pods yourself." (join ", " .)) -}}
{{- end -}}
{{- end -}}
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

{{- /* The webhook's namespaceSelector: the user's, plus what is always kept out (our own namespace,
       kube-system, namespaces labelled gluonrollout.io/inject=false) and, with namespaceOptIn, only
       namespaces labelled gluonrollout.io/inject=true. The operator's restart policy reads the same. */ -}}
{{- define "gluon.webhook.namespaceSelector" -}}
{{- $user := .Values.webhook.namespaceSelector | default dict -}}
{{- $labels := deepCopy ($user.matchLabels | default dict) -}}
{{- if .Values.webhook.namespaceOptIn -}}
{{- $_ := set $labels "gluonrollout.io/inject" "true" -}}
{{- end -}}
{{- $expressions := list
      (dict "key" "kubernetes.io/metadata.name" "operator" "NotIn" "values" (list .Release.Namespace "kube-system"))
      (dict "key" "gluonrollout.io/inject" "operator" "NotIn" "values" (list "false")) -}}
{{- $expressions = concat $expressions ($user.matchExpressions | default list) -}}
{{- $selector := dict "matchExpressions" $expressions -}}
{{- if $labels -}}{{- $_ := set $selector "matchLabels" $labels -}}{{- end -}}
{{- toYaml $selector -}}
{{- end -}}

{{- /* The webhook's objectSelector: the user's, plus, with podOptIn, pods labelled gluonrollout.io/inject=true.
       Empty: every pod of the selected namespaces. */ -}}
{{- define "gluon.webhook.objectSelector" -}}
{{- $user := .Values.webhook.objectSelector | default dict -}}
{{- $labels := deepCopy ($user.matchLabels | default dict) -}}
{{- if .Values.webhook.podOptIn -}}
{{- $_ := set $labels "gluonrollout.io/inject" "true" -}}
{{- end -}}
{{- $selector := dict -}}
{{- if $labels -}}{{- $_ := set $selector "matchLabels" $labels -}}{{- end -}}
{{- with $user.matchExpressions -}}{{- $_ := set $selector "matchExpressions" . -}}{{- end -}}
{{- if $selector -}}{{- toYaml $selector -}}{{- end -}}
{{- end -}}

{{- /* A label selector as a CEL expression over a map of labels (dict "labels" CEL-expr "selector" selector),
       with the API server's semantics: matchLabels and each expression must all hold; empty is true. */ -}}
{{- define "gluon.selectorCEL" -}}
{{- $l := .labels -}}
{{- $terms := list -}}
{{- range $key, $value := (.selector.matchLabels | default dict) -}}
{{- $terms = append $terms (printf "(%s in %s && %s[%s] == %s)" (squote $key) $l $l (squote $key) (squote $value)) -}}
{{- end -}}
{{- range (.selector.matchExpressions | default list) -}}
{{- $values := list -}}
{{- range (.values | default list) -}}{{- $values = append $values (squote .) -}}{{- end -}}
{{- $set := printf "[%s]" (join ", " $values) -}}
{{- $k := squote .key -}}
{{- if eq .operator "In" -}}
{{- $terms = append $terms (printf "(%s in %s && %s[%s] in %s)" $k $l $l $k $set) -}}
{{- else if eq .operator "NotIn" -}}
{{- $terms = append $terms (printf "(!(%s in %s) || !(%s[%s] in %s))" $k $l $l $k $set) -}}
{{- else if eq .operator "Exists" -}}
{{- $terms = append $terms (printf "(%s in %s)" $k $l) -}}
{{- else if eq .operator "DoesNotExist" -}}
{{- $terms = append $terms (printf "!(%s in %s)" $k $l) -}}
{{- else -}}
{{- fail (printf "label selector operator %q is not In, NotIn, Exists or DoesNotExist" .operator) -}}
{{- end -}}
{{- end -}}
{{- if $terms -}}{{- join " && " $terms -}}{{- else -}}true{{- end -}}
{{- end -}}

{{- /* The self-test pods' settings (operator env GLUON_SELFTEST_POD, read by gluon_operator.proving): the
       agent's GPU access, groups and tolerations, below serving in priority, no API token. The operator fills
       in the node, the serving image by digest and the commands. */ -}}
{{- define "gluon.selftestPod" -}}
{{- $v := .Values -}}
{{- $hostDevices := eq $v.agent.gpuAccess "hostDevices" -}}
{{- $security := dict "runAsNonRoot" true "runAsUser" 65532 "runAsGroup" 65532 "fsGroup" 65532 "seccompProfile" $v.agent.seccompProfile -}}
{{- with $v.agent.supplementalGroups }}{{ $_ := set $security "supplementalGroups" . }}{{ end -}}
{{- $volumes := list (dict "name" "tmp" "emptyDir" (dict "sizeLimit" "8Gi")) -}}
{{- $mounts := list (dict "name" "tmp" "mountPath" "/tmp") -}}
{{- if $hostDevices -}}
{{- $volumes = append $volumes (dict "name" "kfd" "hostPath" (dict "path" "/dev/kfd" "type" "CharDevice")) -}}
{{- $volumes = append $volumes (dict "name" "dri" "hostPath" (dict "path" "/dev/dri" "type" "Directory")) -}}
{{- $mounts = append $mounts (dict "name" "kfd" "mountPath" "/dev/kfd") -}}
{{- $mounts = append $mounts (dict "name" "dri" "mountPath" "/dev/dri") -}}
{{- end -}}
{{- $pod := dict "serviceAccountName" (printf "%s-selftest" (include "gluon.fullname" .)) "automountServiceAccountToken" false "enableServiceLinks" false "priorityClassName" (default (printf "%s-selftest" (include "gluon.fullname" .)) $v.selfTest.priorityClassName) "securityContext" $security "volumes" $volumes -}}
{{- with $v.agent.tolerations }}{{ $_ := set $pod "tolerations" . }}{{ end -}}
{{- with $v.imagePullSecrets }}{{ $_ := set $pod "imagePullSecrets" . }}{{ end -}}
{{- $resources := deepCopy $v.selfTest.resources -}}
{{- if not $hostDevices -}}
{{- $_ := set $resources "limits" (merge (dict "amd.com/gpu" $v.agent.gpuResourceCount) (default dict $resources.limits)) -}}
{{- end -}}
{{- $containerSecurity := include "gluon.containerSecurity" . | fromYaml -}}
{{- if and $hostDevices $v.agent.privileged -}}
{{- $containerSecurity = dict "privileged" true "readOnlyRootFilesystem" true -}}
{{- end -}}
{{- $env := list (dict "name" "HOME" "value" "/tmp") (dict "name" "TRITON_CACHE_DIR" "value" "/tmp/triton") -}}
{{- $container := dict "resources" $resources "securityContext" $containerSecurity "volumeMounts" $mounts "env" $env -}}
{{- $settings := dict "namespace" .Release.Namespace "agentImage" (include "gluon.image" (dict "root" . "name" "agent")) "pullPolicy" $v.agent.image.pullPolicy "pod" $pod "container" $container -}}
{{- range $key := list "maxParallel" "deadlineSeconds" "scheduleSeconds" "startSeconds" "retrySeconds" "periodSeconds" -}}
{{- $_ := set $settings $key (index $v.selfTest $key) -}}
{{- end -}}
{{- $_ := set $settings "runSeconds" (add $v.selfTest.deadlineSeconds 300) -}}
{{- $_ := set $settings "extraArgs" $v.selfTest.extraArgs -}}
{{- toJson $settings -}}
{{- end -}}
