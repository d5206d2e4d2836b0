"""Plain Kubernetes objects for pure tests of the operator and the kubectl plugin (no API server): nodes as
their agents publish them (the agent's own report code, through the harness's fleet), agent pods, serving
pods with a preflight verdict, rollouts."""

from __future__ import annotations

import copy
import json
import uuid
from typing import Any

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
        },
        "spec": {"nodeName": node, "containers": [{"name": "sglang", "image": "lmsysorg/sglang:rocm"}]},
        "status": status,
    }


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
