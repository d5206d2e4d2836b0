"""The contract between agent, operator, chart, dashboards and users: every label, annotation,
environment variable and metric name this project writes or reads. Nothing else spells them.

Stdlib only: the preflight copies this package into foreign serving images.
"""

from __future__ import annotations

from typing import Final

PREFIX: Final = "gluonrollout.io/"

# SGLang's switch for the accelerated path (SGLang PR #34647). Not ours: SGLang reads it.
FLAG_ENV: Final = "SGLANG_AITER_MLA_GLUON"

# ---------------------------------------------------------------- self-test child environment (ours)
# The device index the runner gives each self-test child (fakes of aiter key their failure modes on it).
ENV_SELFTEST_DEVICE_INDEX: Final = "GLUON_SELFTEST_DEVICE_INDEX"
# A module the self-test child asks about devices that are not GPUs (memory_info, before_first_case): the
# seam the local-cluster harness fills with fake devices on the CPU. Unset in a deployment.
ENV_SELFTEST_DEVICE_HOOKS: Final = "GLUON_SELFTEST_DEVICE_HOOKS"

# ---------------------------------------------------------------- node labels, agent-owned
# "true" when the probe found the stack and hardware able to run the Gluon path (gfx950, the aiter
# import, Triton's Gluon cga_layout API, fp8 e4m3fn), whatever the env flag says. "false" otherwise.
LABEL_CAPABLE: Final = PREFIX + "capable"
# Its third value: the aiter Gluon import raises something other than ImportError (or dies). SGLang
# catches only ImportError, so with the flag on the serving process would fail to start: louder than
# "false", never to be enabled.
CAPABLE_IMPORT_CRASH: Final = "import-crash"
CAPABLE_VALUES: Final = ("true", "false", CAPABLE_IMPORT_CRASH)
# The self-test verdict for this node's current fingerprint, worst over GPUs and paths.
LABEL_SELFTEST: Final = PREFIX + "selftest"
SELFTEST_VALUES: Final = ("pass", "fail", "error", "pending", "deferred")
# The GPU architecture of the node, e.g. "gfx950" (first GPU; "mixed" when they differ, "none" without).
LABEL_GPU_ARCH: Final = PREFIX + "gpu-arch"

# ---------------------------------------------------------------- node labels, operator-owned
# "true" only on nodes where the operator has turned the flag on; "false" where it decided off.
LABEL_ENABLED: Final = PREFIX + "enabled"
# The node state of the rollout state machine (NODE_STATES below).
LABEL_STATE: Final = PREFIX + "state"
NODE_STATES: Final = (
    "Ineligible",
    "Eligible",
    "Enabling",
    "Analyzing",
    "Promoted",
    "RolledBack",
    "Disabled",
)

# ---------------------------------------------------------------- pod label, operator-owned
# The value of SGLANG_AITER_MLA_GLUON the serving pod really started with ("1" or "0"),
# read from its preflight verdict, so metrics and dashboards can split by the flag in use.
LABEL_POD_FLAG: Final = PREFIX + "flag"
# The metric label the chart's serving PodMonitor gives that pod label (the judge splits samples by it).
METRIC_LABEL_FLAG: Final = "flag"

# ---------------------------------------------------------------- pod and namespace label, person-owned
# The webhook's opt-in/opt-out (as Istio's sidecar.istio.io/inject and istio-injection labels): with the
# chart's default webhook.podOptIn only pods labelled "true" (in their template) reach the webhook, and the
# operator may delete only such pods; a namespace labelled "false" never reaches it, and with
# webhook.namespaceOptIn only namespaces labelled "true" do.
LABEL_INJECT: Final = PREFIX + "inject"

# ---------------------------------------------------------------- serving pod environment, webhook-owned
# How the flag reaches a serving container (operator.injectionMode): `fileKeyRef` (the kubelet reads the flag
# file, EnvFiles: beta and on from Kubernetes 1.35), `shell` (a wrapper sources it before exec-ing the command)
# or `auto` (fileKeyRef where the API server and every kubelet of the rollout's nodes honour it, else shell).
INJECTION_MODES: Final = ("auto", "fileKeyRef", "shell")
# Set (a plain value, which every kubelet delivers) on each container the webhook gives the flag: that
# container's own name. The agent finds the processes of injected serving containers by it.
ENV_FLAG_CONTAINER: Final = "GLUON_FLAG_CONTAINER"
# fileKeyRef only: the preflight container's own fileKeyRef copy of the flag file's value, which the install
# container has already set to '0'. Anything else means this kubelet ignores fileKeyRef and would hand the
# serving container an empty SGLANG_AITER_MLA_GLUON (SGLang: on): the preflight then holds the pod.
ENV_FILEKEYREF_CHECK: Final = "GLUON_FILEKEYREF_CHECK"

# Where the injected emptyDir is mounted (the preflight's copy, the flag file) and the flag file's name there:
# the install container writes '0', the preflight its verdict, as SGLANG_AITER_MLA_GLUON='0'|'1' (the
# single-quoted KEY='value' lines the kubelet's fileKeyRef reads). Wired containers mount it read-only.
FLAG_MOUNT: Final = "/gluon"
FLAG_FILE: Final = "flag.env"

# ---------------------------------------------------------------- pod annotation, webhook-owned
# Set by the mutating webhook on pods it injected: the GluonRollout whose selector matched.
ANNOTATION_POD_INJECTED: Final = PREFIX + "injected"

# ---------------------------------------------------------------- pod annotation, person-owned
# The container that serves (its image is the one the preflight checks, and only containers of that
# image get the flag). Default: Kubernetes' own default-container annotation below, then the first
# container that is not a well-known sidecar (webhook.KNOWN_SIDECARS).
ANNOTATION_POD_SERVING_CONTAINER: Final = PREFIX + "serving-container"
# Not ours (kubectl's, read only): the container `kubectl logs/exec` pick by default.
FOREIGN_ANNOTATION_DEFAULT_CONTAINER: Final = "kubectl.kubernetes.io/default-container"

# ---------------------------------------------------------------- node annotations
# Agent-owned. JSON: probe, self-test results, fingerprint, time, agent version.
ANNOTATION_REPORT: Final = PREFIX + "report"
# Agent-owned. Comma-separated list of the label and annotation keys the agent last set, so it can
# remove keys it no longer sets (NFD's "extended-resources"/"feature-labels" bookkeeping).
ANNOTATION_OWNED_KEYS: Final = PREFIX + "agent-owned-keys"
# Written by a person or the operator; any new value asks the agent for a self-test run.
ANNOTATION_SELFTEST_REQUEST: Final = PREFIX + "selftest-request"
# Operator-owned. JSON: why the node was rolled back, with the measured numbers and thresholds.
ANNOTATION_ROLLBACK: Final = PREFIX + "rollback"
# Operator-owned. JSON: the node's durable rollout record (rollout, state, reason, since, changedAt,
# fingerprint, holdout, numbers with failStreak), written in the same patch as LABEL_ENABLED/LABEL_STATE,
# so a rollout's status need not hold every node (etcd's request limit at fleet scale).
ANNOTATION_NODE_RECORD: Final = PREFIX + "record"

# ---------------------------------------------------------------- person-owned controls
# Node label: "true" keeps a node off the accelerated path (never enabled; disabled if it was on), as
# NVIDIA's driver-upgrade skip label does. Written by people, read by the operator.
LABEL_SKIP: Final = PREFIX + "skip"
# GluonRollout annotations written by `kubectl gluon` (or a person), read by the operator:
# approve: the approval gate being granted, exactly as status.approval.waitingFor names it;
# abort: a reason; while present the rollout is aborted (flag-on nodes disabled). Removing it resumes.
ANNOTATION_ROLLOUT_APPROVE: Final = PREFIX + "approve"
ANNOTATION_ROLLOUT_ABORT: Final = PREFIX + "abort"

# Operator-owned. JSON: the serving configuration (sglang_routes.ServingConfig.as_dict()) the rollout's
# serving pods run, derived from their args and env with spec.serving for the rest. The agent self-tests
# exactly its routes and q_lens, again whenever its digest changes, and reports the digest it proved.
ANNOTATION_SERVING_CONFIG: Final = PREFIX + "serving-config"

# Agent-owned. JSON (gluon_common.delivery.DeliveryReport): the flag each injected serving container on this
# node really runs, read from its processes' own environment, beside the flag its preflight wrote for it.
ANNOTATION_DELIVERY: Final = PREFIX + "delivery"

# Operator-owned. JSON (gluon_common.report.NodeProofs): what self-test pods proved on this node, one entry per
# (serving image digest, serving configuration digest), newest first and bounded: the verdict belongs to the
# image the serving pods really run, not to the agent's image.
ANNOTATION_PROOFS: Final = PREFIX + "proofs"

# Keys the agent may write and remove; it never touches the operator's or a person's keys.
AGENT_LABELS: Final = (LABEL_CAPABLE, LABEL_SELFTEST, LABEL_GPU_ARCH)
AGENT_ANNOTATIONS: Final = (ANNOTATION_REPORT, ANNOTATION_OWNED_KEYS, ANNOTATION_DELIVERY)
# Keys the operator writes on nodes (the agent reads LABEL_ENABLED and LABEL_STATE for its decision).
OPERATOR_NODE_KEYS: Final = (
    LABEL_ENABLED,
    LABEL_STATE,
    ANNOTATION_ROLLBACK,
    ANNOTATION_NODE_RECORD,
    ANNOTATION_SERVING_CONFIG,
    ANNOTATION_PROOFS,
)

# ---------------------------------------------------------------- agent metrics
AGENT_METRIC_PREFIX: Final = "gluon_agent_"
M_AGENT_INFO: Final = AGENT_METRIC_PREFIX + "probe"  # info metric: versions, arch
M_AGENT_CAPABLE: Final = AGENT_METRIC_PREFIX + "capable"
# 1 while the aiter Gluon import raises a non-ImportError (or dies): SGLang would fail to start with the flag on.
M_AGENT_IMPORT_CRASH: Final = AGENT_METRIC_PREFIX + "aiter_import_crash"
M_AGENT_SELFTEST_RESULT: Final = AGENT_METRIC_PREFIX + "selftest_result"
M_AGENT_CASE_ERROR: Final = AGENT_METRIC_PREFIX + "selftest_case_rel_error"
M_AGENT_KERNEL_SECONDS: Final = AGENT_METRIC_PREFIX + "kernel_seconds"
M_AGENT_KERNEL_BANDWIDTH: Final = AGENT_METRIC_PREFIX + "kernel_bandwidth_bytes_per_second"
M_AGENT_SPEEDUP: Final = AGENT_METRIC_PREFIX + "speedup_ratio"
M_AGENT_LAST_RUN: Final = AGENT_METRIC_PREFIX + "selftest_last_run_timestamp_seconds"
M_AGENT_RUN_DURATION: Final = AGENT_METRIC_PREFIX + "selftest_duration_seconds"
M_AGENT_RUNS: Final = AGENT_METRIC_PREFIX + "selftest_runs"  # counter, _total added by the client
M_AGENT_API_ERRORS: Final = AGENT_METRIC_PREFIX + "api_errors"  # counter
M_AGENT_PUBLISH_SECONDS: Final = AGENT_METRIC_PREFIX + "publish_seconds"
M_AGENT_MALFORMED: Final = AGENT_METRIC_PREFIX + "malformed_input"  # counter
# Injected serving containers on this node by what their processes run against what their preflight wrote
# (label state: match | mismatch | unknown), and the observation's own health.
M_AGENT_DELIVERY_CONTAINERS: Final = AGENT_METRIC_PREFIX + "flag_delivery_containers"
M_AGENT_DELIVERY_AVAILABLE: Final = AGENT_METRIC_PREFIX + "flag_delivery_observable"  # 1 while observed
M_AGENT_DELIVERY_UNREADABLE: Final = AGENT_METRIC_PREFIX + "flag_delivery_unreadable_processes"

# ---------------------------------------------------------------- operator metrics
ROLLOUT_METRIC_PREFIX: Final = "gluon_rollout_"
M_ROLLOUT_NODES: Final = ROLLOUT_METRIC_PREFIX + "nodes"
M_ROLLOUT_TRANSITIONS: Final = ROLLOUT_METRIC_PREFIX + "transitions"  # counter
M_ROLLOUT_VERDICTS: Final = ROLLOUT_METRIC_PREFIX + "verdicts"  # counter
M_ROLLOUT_ROLLBACKS: Final = ROLLOUT_METRIC_PREFIX + "rollbacks"  # counter
M_ROLLOUT_EFFECT: Final = ROLLOUT_METRIC_PREFIX + "effect_ratio"
M_ROLLOUT_ANALYSIS_ERRORS: Final = ROLLOUT_METRIC_PREFIX + "analysis_errors"  # counter
M_ROLLOUT_QUERY_SECONDS: Final = ROLLOUT_METRIC_PREFIX + "query_seconds"
M_ROLLOUT_API_ERRORS: Final = ROLLOUT_METRIC_PREFIX + "api_errors"  # counter
M_ROLLOUT_RESTARTS: Final = ROLLOUT_METRIC_PREFIX + "pod_restarts"  # counter
# Admission reviews the webhook answered, by outcome (webhook.OUTCOMES); every review is allowed, and only
# bodies no API server sends (too large, not an AdmissionReview) are refused, 413 or 400.
M_ROLLOUT_WEBHOOK_REVIEWS: Final = ROLLOUT_METRIC_PREFIX + "webhook_reviews"  # counter
# The analysis judge's numbers per judged node (docs/how-it-decides/analysis.md): the anytime-valid interval around
# M_ROLLOUT_EFFECT, the effective sample size, the ratio the load adjustment applied, the sequential
# test's always-valid p-values (label hypothesis: worse | not_worse) and its number of looks.
M_ROLLOUT_EFFECT_LOWER: Final = ROLLOUT_METRIC_PREFIX + "effect_ratio_lower"
M_ROLLOUT_EFFECT_UPPER: Final = ROLLOUT_METRIC_PREFIX + "effect_ratio_upper"
M_ROLLOUT_EFFECTIVE_SAMPLES: Final = ROLLOUT_METRIC_PREFIX + "effective_samples"
M_ROLLOUT_LOAD_ADJUSTMENT: Final = ROLLOUT_METRIC_PREFIX + "load_adjustment_ratio"
M_ROLLOUT_SEQUENTIAL_P: Final = ROLLOUT_METRIC_PREFIX + "sequential_p_value"
M_ROLLOUT_ANALYSIS_LOOKS: Final = ROLLOUT_METRIC_PREFIX + "analysis_looks"
# Nodes of a rollout where flag 0 has no working route for the serving configuration (DCP with the gluon
# decode backend, a verify q_len no flag-0 kernel serves, SGLang between #34647 and #37438): no safe
# rollback, so the operator never enables them.
M_ROLLOUT_NO_SAFE_ROLLBACK: Final = ROLLOUT_METRIC_PREFIX + "no_safe_rollback_nodes"
M_ROLLOUT_JUDGE_SECONDS: Final = ROLLOUT_METRIC_PREFIX + "judge_cpu_seconds"  # histogram, per evaluation
# Where the operator's own CPU goes (label phase: watch = list and watch of nodes and pods, plan = the world
# snapshot and the pure plan, write = the API calls the executor makes), and its reconciles by outcome
# (planned | waiting: caches not synced or its own status write not seen yet). bench/scale.py reads them.
M_ROLLOUT_OPERATOR_CPU: Final = ROLLOUT_METRIC_PREFIX + "operator_cpu_seconds"  # counter
M_ROLLOUT_RECONCILES: Final = ROLLOUT_METRIC_PREFIX + "reconciles"  # counter
# A rollout's serving pods by the flag their processes were seen to run (label state: verified, mismatch,
# unobserved, held), and the delivery each uses (an info gauge, labels mode and configured).
M_ROLLOUT_DELIVERY_PODS: Final = ROLLOUT_METRIC_PREFIX + "flag_delivery_pods"
M_ROLLOUT_DELIVERY_MODE: Final = ROLLOUT_METRIC_PREFIX + "injection_mode"
# A rollout's flag-on nodes whose agents are gone, and 1 while disabling for it pauses (too many at once: a
# control plane's or network's trouble, disruption.py).
M_ROLLOUT_LOST_AGENTS: Final = ROLLOUT_METRIC_PREFIX + "lost_agents"
M_ROLLOUT_DISABLING_PAUSED: Final = ROLLOUT_METRIC_PREFIX + "disabling_paused"
# Self-tests in the serving images (selfTest.inServingImage): pods by state (running: created, no verdict read
# yet; waiting: proofs due, left for a later wave), and proofs recorded on nodes by result (a counter).
M_ROLLOUT_SELFTEST_PODS: Final = ROLLOUT_METRIC_PREFIX + "selftest_pods"
M_ROLLOUT_PROOFS: Final = ROLLOUT_METRIC_PREFIX + "image_proofs"

# ---------------------------------------------------------------- operator environment
# Bearer token and CA file for Prometheus (the chart sets them from operator.prometheusAuth).
ENV_PROMETHEUS_TOKEN: Final = "GLUON_PROMETHEUS_TOKEN"
ENV_PROMETHEUS_CA: Final = "GLUON_PROMETHEUS_CA"
# Comma-separated Prometheus base URLs the cluster admin trusts with the token; any other
# spec.analysis.prometheusUrl is queried without credentials.
ENV_PROMETHEUS_TRUSTED_URLS: Final = "GLUON_PROMETHEUS_TRUSTED_URLS"
# One deadline, in seconds, for a rollout's whole analysis (queries and judgement).
ENV_ANALYSIS_DEADLINE: Final = "GLUON_ANALYSIS_DEADLINE_SECONDS"

# ---------------------------------------------------------------- preflight
# The module the webhook's preflight container runs, from the copy the agent image's install step puts in
# the pod's shared volume (gluon-agent preflight --install).
PREFLIGHT_MODULE: Final = "gluon_agent.preflight"
# The webhook's init container that runs it, in the serving image: its status carries the image digest the
# node's runtime resolved, which the agent reads to answer per image (self-tests in serving images).
PREFLIGHT_CONTAINER: Final = "gluon-preflight"

# ---------------------------------------------------------------- self-test pods, operator-owned
# A self-test pod runs the self-test in a serving image itself, by the digest serving pods resolved to, pinned
# to one node: the operator creates them in waves in its own namespace and deletes them once read.
# Pod label "true" on every one (the operator's selector), and the node it tests.
LABEL_SELFTEST_POD: Final = PREFIX + "selftest-pod"
LABEL_SELFTEST_POD_NODE: Final = PREFIX + "selftest-node"
# Pod annotation: JSON {image, digest, pinned, serving} - what the pod proves (the operator's own words, not
# the pod's: a pod cannot know its image's digest).
ANNOTATION_SELFTEST_POD_STACK: Final = PREFIX + "selftest-stack"
# The module the self-test pod's container runs in the serving image, from the copy the agent image's install
# step puts in the pod's shared volume (gluon-agent selftest-pod --install).
SELFTEST_POD_MODULE: Final = "gluon_agent.selftest_pod"

# The preflight container's own pod (downward API, set by the webhook): the agent reads that pod's status for
# the image digest its runtime resolved, and answers '1' only for a proved one (self-tests in serving images).
ENV_PREFLIGHT_POD_NAMESPACE: Final = "GLUON_POD_NAMESPACE"
ENV_PREFLIGHT_POD_NAME: Final = "GLUON_POD_NAME"
ENV_PREFLIGHT_POD_UID: Final = "GLUON_POD_UID"

# ---------------------------------------------------------------- agent HTTP
AGENT_PORT: Final = 9477
DECISION_PATH: Final = "/v1/decision"
# The preflight asks http://$HOST_IP:AGENT_PORT/DECISION_PATH unless this env var gives a whole URL
# (an agent on another port; tests).
ENV_PREFLIGHT_AGENT_URL: Final = "GLUON_AGENT_URL"


def is_ours(key: str) -> bool:
    """True for keys under the contract prefix (the only ones the agent may write)."""
    return key.startswith(PREFIX)


def as_dict() -> dict[str, object]:
    """Every public name above, for docs, the chart's consistency tests and `gluon-operator contract`."""
    return {k: v for k, v in globals().items() if k.isupper() and not k.startswith("_")}
