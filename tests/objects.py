"""Plain Kubernetes objects for pure tests of the operator and the kubectl plugin (no API server): nodes as
their agents publish them (the agent's own report code, through the harness's fleet), agent pods, serving
pods with a preflight verdict, rollouts."""

from __future__ import annotations

import copy
import json
import uuid
from typing import Any

from gluon_agent import delivery
from gluon_common import contract
from gluon_common.delivery import DeliveryReport, ObservedContainer
from gluon_localcluster import fleet
from gluon_operator.webhook import PREFLIGHT_CONTAINER

AGENT_NS, SERVING_NS = "gluon-system", "serving"
AGENT_LABELS = {"app.kubernetes.io/name": "gluon-rollout-agent"}
SERVING_LABELS = dict(fleet.SERVING_LABELS)


def gpu_node(name: str, **traits: Any) -> dict[str, Any]:
    """A Node as its agent would have published it (traits: capable, accelerated, fallback, stale)."""
    labels, annotations = fleet.agent_published(name, **traits)
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **labels}, "annotations": annotations}
    }


def ready_status(phase: str = "Running") -> dict[str, Any]:
    return {"phase": phase, "conditions": [{"type": "Ready", "status": "True"}]}


def agent_pod(node: str, ready: bool = True) -> dict[str, Any]:
    status = ready_status() if ready else {"phase": "Running", "conditions": [{"type": "Ready", "status": "False"}]}
    return {
        "metadata": {"name": f"agent-{node}", "namespace": AGENT_NS, "labels": dict(AGENT_LABELS)},
        "spec": {"nodeName": node, "containers": [{"name": "agent", "image": "agent"}]},
        "status": status,
    }


def serving_pod(
    node: str, index: int = 0, flag: str | None = None, reason: str = "simulated", agent: dict[str, Any] | None = None
) -> dict[str, Any]:
    """`flag`: the preflight's verdict in its termination message, as a kubelet reports it; `agent`: what the
    node's agent answered the preflight."""
    status = ready_status()
    if flag is not None:
        message = json.dumps({"flag": flag, "reason": reason, "agent": agent})
        status["initContainerStatuses"] = [
            {
                "name": PREFLIGHT_CONTAINER,
                "image": "lmsysorg/sglang:rocm",
                "imageID": "sha256:0",
                "ready": False,
                "restartCount": 0,
                "state": {"terminated": {"exitCode": 0, "reason": "Completed", "message": message}},
            }
        ]
    return {
        "metadata": {
            "name": f"sglang-{node}-{index}-{uuid.uuid4().hex[:5]}",
            "namespace": SERVING_NS,
            "labels": dict(SERVING_LABELS),
            "uid": str(uuid.uuid4()),
        },
        "spec": {"nodeName": node, "containers": [serving_container()]},
        "status": status,
    }


def serving_container(mode: str = "fileKeyRef") -> dict[str, Any]:
    """The serving container as the webhook wires it (webhook.wire_container: fileKeyRef, or shell)."""
    from gluon_operator import webhook

    container: dict[str, Any] = {
        "name": "sglang",
        "image": "lmsysorg/sglang:rocm",
        "command": ["python3", "-m", "sglang.launch_server"],
        "env": [],
        "volumeMounts": [],
    }
    webhook.wire_container(container, mode)
    return container


def preflight_flag(pod: dict[str, Any]) -> str | None:
    for status in (pod.get("status") or {}).get("initContainerStatuses") or []:
        message = ((status.get("state") or {}).get("terminated") or {}).get("message")
        if status.get("name") == PREFLIGHT_CONTAINER and message:
            return json.loads(message).get("flag")
    return None


def observed(node: str, pods: list[dict[str, Any]], runs: dict[str, str] | None = None, available: bool = True) -> str:
    """The delivery annotation an agent publishes on `node` when each injected pod's serving process there
    runs the flag its preflight chose (SIMULATION of what gluon_agent.observe reads off /proc), or, for the
    pods named in `runs`, the raw value given there."""
    if not available:
        return delivery.annotation(DeliveryReport(available=False, problem="simulated: no observer"))
    containers = []
    for pod in pods:
        meta, spec = pod["metadata"], pod.get("spec") or {}
        flag = preflight_flag(pod)
        if spec.get("nodeName") != node or flag is None or not meta.get("uid"):
            continue
        for container in spec.get("containers") or []:
            if not any(e.get("name") == contract.ENV_FLAG_CONTAINER for e in container.get("env") or []):
                continue
            raw = (runs or {}).get(meta["name"], flag)
            seen = ObservedContainer(
                pod_uid=meta["uid"],
                container=container["name"],
                container_id=meta["uid"].replace("-", "")[:12],
                intended=flag,
                delivered=raw,
                runs=[sglang_runs(raw)],
                values=[raw],
                processes=1,
                since=0.0,
            )
            containers.append(seen)
    return delivery.annotation(DeliveryReport(available=True, containers=containers))


def sglang_runs(raw: str) -> str:
    from gluon_common.sglang_env import flag_runs

    return flag_runs(None if raw == "<unset>" else raw)


def with_observations(nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The nodes, each with the delivery annotation its agent would publish for these pods (observed())."""
    out = []
    for node in nodes:
        node = copy.deepcopy(node)
        annotations = node["metadata"].setdefault("annotations", {})
        annotations[contract.ANNOTATION_DELIVERY] = observed(node["metadata"]["name"], pods)
        out.append(node)
    return out


def rollout(name: str = "kimi", **spec: Any) -> dict[str, Any]:
    return fleet.rollout(name, SERVING_NS, **spec)


# An AdmissionReview of a pod CREATE as the API server sends it (admission.k8s.io/v1); tests fill in the pod.
REVIEW = {
    "apiVersion": "admission.k8s.io/v1",
    "kind": "AdmissionReview",
    "request": {
        "uid": "u1",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "operation": "CREATE",
        "userInfo": {"username": "x"},
        "object": {"metadata": {}},
        "oldObject": None,
    },
}


def pod_review(pod: dict[str, Any], namespace: str) -> dict[str, Any]:
    """REVIEW of creating `pod` in `namespace`."""
    review = copy.deepcopy(REVIEW)
    review["request"].update(namespace=namespace, object=pod)
    return review
