"""Objects of a GPU fleet on the local control plane: kwok nodes carrying the reports their agents would
publish (made by the agent's own code), serving Deployments, GluonRollouts.

The self-test results in the reports are a SIMULATION (no AMD GPU here); the report format, labels and
fingerprints are the agent's own (gluon_agent.daemon.node_report, decisions.desired_state).
"""

from __future__ import annotations

import time
from typing import Any

from gluon_agent import decisions, delivery
from gluon_agent.daemon import node_report, selftest_summary
from gluon_agent.fingerprint import fingerprint
from gluon_common import contract
from gluon_common.delivery import DeliveryReport
from gluon_common.sglang_routes import ServingConfig
from gluon_operator.spec import GROUP, KIND, VERSION

from .binaries import kubernetes_version
from .controlplane import KWOK_NODE_ANNOTATION
from .fakes.simulated import simulated_node

GPU_NODE_LABEL = {"feature.node.kubernetes.io/amd-gpu": "true"}  # what the agent DaemonSet selects (chart default)
SERVING_LABELS = {"app": "sglang"}  # what a rollout's podSelector names (and its analysis query's label matchers)
# A serving pod's labels: the rollout's, plus the opt-in the chart's default webhook objectSelector needs.
SERVING_POD_LABELS = {**SERVING_LABELS, contract.LABEL_INJECT: "true"}
STALE_FINGERPRINT = "0ldf1ngerpr1nt00"


def node_ip(index: int) -> str:
    """A loopback address of its own per node (127.10.0.0/16 holds 62,500): each node's agent listens on
    the real agent port at its node's InternalIP, and the preflight finds it through HOST_IP, as on a cluster."""
    return f"127.10.{index // 250}.{index % 250 + 1}"


def pod_cidr(index: int) -> str:
    """A /24 per node in the pod network namespace's 10.244.0.0/16 (podnet.NetNamespace): kwok gives the
    node's pods IPs from it, and the harness's pod network (podnet.py) listens there, so Prometheus reaches
    pods at their IPs (and Services get endpoints: Kubernetes refuses loopback addresses in EndpointSlices)."""
    if not 0 <= index < 256:
        raise ValueError(f"node index {index}: pod CIDRs in 10.244.0.0/16 exist for indexes 0..255")
    return f"10.244.{index}.0/24"


def node_info(kubelet_version: str) -> dict[str, str]:
    """status.nodeInfo with every field the API's schema requires: the kubelet's version, and empty values
    that kwok's node stage fills with its own (its template keeps each value set, `or` its default)."""
    empty = ("bootID", "containerRuntimeVersion", "kernelVersion", "kubeProxyVersion", "machineID", "osImage")
    filled = {"architecture": "amd64", "operatingSystem": "linux", "kubeletVersion": kubelet_version}
    return dict.fromkeys((*empty, "systemUUID"), "") | filled


def kwok_node(
    name: str,
    index: int,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    pod_index: int | None = None,
    kubelet_version: str | None = None,
) -> dict[str, Any]:
    """A node kwok keeps Ready (SIMULATION of its kubelet), with room for a serving pod and an agent.
    `pod_index`: its pods get IPs of their own (pod_cidr(pod_index)), reachable through podnet.py. Apart
    from `index` (its address on the host's loopback, up to 62,500): each cluster's pod network is a
    namespace of its own with 256 /24s (SimCluster passes index % 256). `kubelet_version`: the version its
    status reports (kwok's node stage keeps it; what the operator reads to choose fileKeyRef), by default
    the pinned Kubernetes version (kubelet_sim's behaviour is that version's unless told to ignore fileKeyRef)."""
    capacity = {"cpu": "128", "memory": "2Ti", "pods": "110", "amd.com/gpu": "8"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {KWOK_NODE_ANNOTATION: "fake", **(annotations or {})},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "type": "kwok",
                **GPU_NODE_LABEL,
                **(labels or {}),
            },
        },
        "spec": {"podCIDR": pod_cidr(pod_index)} if pod_index is not None else {},
        "status": {
            "allocatable": capacity,
            "capacity": capacity,
            "addresses": [{"type": "InternalIP", "address": node_ip(index)}, {"type": "Hostname", "address": name}],
            "nodeInfo": node_info(kubelet_version or kubernetes_version()),
        },
    }


def agent_published(
    name: str,
    capable: bool = True,
    accelerated: str = "pass",
    fallback: str = "pass",
    stale: bool = False,
    serving: ServingConfig = ServingConfig(),
    sglang: str = "0.5.19",
) -> tuple[dict[str, str], dict[str, str]]:
    """The labels and annotations a node's agent publishes for these (simulated) self-test results, the
    self-test having proved `serving` (the configuration a rollout derives from pods that say nothing), and
    its observer seeing no injected serving process on the node (none runs there yet)."""
    spec = simulated_node(capable=capable, accelerated=accelerated, fallback=fallback, driver="6.12.12", sglang=sglang)
    probe = spec["probe"]
    fp = fingerprint(probe)
    selftest = dict(
        spec["selftest"],
        finished_at=time.time(),
        seconds=1.0,
        fingerprint=STALE_FINGERPRINT if stale else fp,
        serving=serving.as_dict() | {"digest": serving.digest},
    )
    summary = selftest_summary(selftest, "start", selftest["fingerprint"])
    report = node_report(name, probe, fp, summary, selftest["result"], None)
    observed = delivery.annotation(DeliveryReport(available=True))
    desired = decisions.desired_state(probe, selftest["result"], report.annotation_value(), observed)
    return dict(desired.labels), dict(desired.annotations)


def gpu_node(name: str, index: int, **traits: Any) -> dict[str, Any]:
    """A kwok node as its agent would have published it (traits: capable, accelerated, fallback, stale)."""
    labels, annotations = agent_published(name, **traits)
    return kwok_node(name, index, labels, annotations)


def serving_deployment(
    name: str,
    node: str | None = None,
    replicas: int = 1,
    labels: dict[str, str] | None = None,
    image: str = "lmsysorg/sglang:rocm-demo",
    spread: bool = False,
) -> dict[str, Any]:
    """A serving Deployment whose template carries SGLANG_AITER_MLA_GLUON=0 (the safe path if the webhook
    is down). `node` pins it to one node; `spread` puts at most one pod per node (anti-affinity)."""
    pod_labels = {**SERVING_POD_LABELS, "serving": name, **(labels or {})}
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": "sglang",
                "image": image,
                "command": ["python3", "-m", "sglang.launch_server"],
                "env": [{"name": contract.FLAG_ENV, "value": "0"}],
                "ports": [{"name": "metrics", "containerPort": 30000}],
            }
        ],
        "tolerations": [{"key": "amd.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "terminationGracePeriodSeconds": 0,
    }
    if node is not None:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    if spread:
        spec["affinity"] = {
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": {"matchLabels": {"serving": name}}, "topologyKey": "kubernetes.io/hostname"}
                ]
            }
        }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": pod_labels},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"serving": name}},
            "template": {"metadata": {"labels": pod_labels}, "spec": spec},
        },
    }


def rollout(name: str, namespace: str, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "podSelector": {"matchLabels": dict(SERVING_LABELS)},
        "strategy": {"canaryNodes": 1, "maxParallel": 2, "restart": "Evict", "restartDelaySeconds": 0},
    }
    for key, value in spec.items():
        body[key] = {**body[key], **value} if isinstance(value, dict) and isinstance(body.get(key), dict) else value
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": body,
    }
