"""Building blocks for a simulated cluster on the API emulator: GPU nodes carrying real agent reports,
agent pods, serving pods, and a stand-in for the kubelet and ReplicaSet controller that recreates an
evicted serving pod on its node with the preflight verdict its agent would give.

The node reports are made by the agent's own code (gluon_agent.daemon.node_report, decisions.desired_state),
so the operator is tested against exactly what agents publish."""

from __future__ import annotations

import json
import threading
import time
import uuid
from typing import Any

from gluon_agent import contract, decisions
from gluon_agent.daemon import node_report, selftest_summary
from gluon_agent.fingerprint import fingerprint
from gluon_agent.sources import simulated_node
from gluon_operator.spec import GROUP, KIND, PLURAL, VERSION
from gluon_operator.webhook import PREFLIGHT_CONTAINER
from tests.apiserver import ApiServer, Key

import kmock

NODES: Key = ("", "v1", "nodes")
PODS: Key = ("", "v1", "pods")
EVENTS: Key = ("", "v1", "events")
ROLLOUTS: Key = (GROUP, VERSION, PLURAL)
AGENT_NS, SERVING_NS = "gluon-system", "serving"
AGENT_LABELS = {"app.kubernetes.io/name": "gluon-rollout-agent"}
SERVING_LABELS = {"app": "sglang"}


def declare_rollouts(server: ApiServer) -> None:
    server.declare(ROLLOUTS, kmock.ResourceInfo(kind=KIND, namespaced=True, verbs={"get", "list", "watch", "patch", "update", "create", "delete"}, subresources={"status"}))


def gpu_node(name: str, capable: bool = True, accelerated: str = "pass", fallback: str = "pass",
             stale: bool = False) -> dict[str, Any]:
    """A Node as its agent would have published it."""
    spec = simulated_node(capable=capable, accelerated=accelerated, fallback=fallback, driver="6.12.12")
    probe = spec["probe"]
    fp = fingerprint(probe)
    selftest = dict(spec["selftest"], finished_at=time.time(), seconds=1.0, fingerprint=fp if not stale else "0ldf1ngerpr1nt00")
    summary = selftest_summary(selftest, "start") | {"fingerprint": selftest["fingerprint"]}
    verdict = selftest["result"]
    desired = decisions.desired_state(probe, verdict, node_report(name, probe, fp, summary, verdict, None))
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **desired.labels},
                         "annotations": desired.annotations}}


def ready_status(phase: str = "Running") -> dict[str, Any]:
    return {"phase": phase, "conditions": [{"type": "Ready", "status": "True"}]}


def agent_pod(node: str, ready: bool = True) -> dict[str, Any]:
    status = ready_status() if ready else {"phase": "Running", "conditions": [{"type": "Ready", "status": "False"}]}
    return {"metadata": {"name": f"agent-{node}", "namespace": AGENT_NS, "labels": dict(AGENT_LABELS)},
            "spec": {"nodeName": node, "containers": [{"name": "agent", "image": "agent"}]}, "status": status}


def serving_pod(node: str, index: int = 0, flag: str | None = None, reason: str = "simulated",
                agent: dict[str, Any] | None = None) -> dict[str, Any]:
    """`agent`: what the node's agent answered the preflight (as the real preflight records it)."""
    status = ready_status()
    if flag is not None:
        message = json.dumps({"flag": flag, "reason": reason, "agent": agent})
        status["initContainerStatuses"] = [{"name": PREFLIGHT_CONTAINER, "image": "lmsysorg/sglang:rocm", "imageID": "sha256:0",
                                            "ready": False, "restartCount": 0,
                                            "state": {"terminated": {"exitCode": 0, "reason": "Completed", "message": message}}}]
    return {"metadata": {"name": f"sglang-{node}-{index}-{uuid.uuid4().hex[:5]}", "namespace": SERVING_NS, "labels": dict(SERVING_LABELS)},
            "spec": {"nodeName": node, "containers": [{"name": "sglang", "image": "lmsysorg/sglang:rocm"}]}, "status": status}


def rollout(name: str = "kimi", **spec: Any) -> dict[str, Any]:
    body = {"podSelector": {"matchLabels": dict(SERVING_LABELS)},
            "strategy": {"canaryNodes": 1, "maxParallel": 2, "restart": "Evict", "restartDelaySeconds": 0}}
    for key, value in spec.items():
        if isinstance(value, dict) and isinstance(body.get(key), dict):
            body[key] = {**body[key], **value}
        else:
            body[key] = value
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "metadata": {"name": name, "namespace": SERVING_NS}, "spec": body}


class ReplicaController:
    """Stands in for a ReplicaSet and the kubelet: each serving pod that disappears is recreated on the
    same node; its preflight verdict is the node's flag as the node's agent would decide it
    (enabled=true and the node's own self-test pass), unless `refuse` names the node."""

    def __init__(self, api: Any, interval: float = 0.1) -> None:
        self.api, self.interval = api, interval
        self.refuse: dict[str, str] = {}
        self.wanted: dict[str, int] = {}
        self.skip_injection: set[str] = set()  # nodes whose next pod is admitted as if the webhook were down
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="replicas")

    def agent_answer(self, node: dict[str, Any]) -> dict[str, Any]:
        labels = node["metadata"].get("labels", {})
        enabled = labels.get(contract.LABEL_ENABLED) == "true"
        ok = enabled and labels.get(contract.LABEL_SELFTEST) == "pass"
        return {"flag": "1" if ok else "0", "current": True, "enabled": enabled}

    def flag_for(self, node: dict[str, Any]) -> str:
        """The agent's answer, unless the serving image refuses (`refuse`)."""
        return self.agent_answer(node)["flag"] if node["metadata"]["name"] not in self.refuse else "0"

    def _tick(self) -> None:
        server = self.api.server
        for node_name, count in self.wanted.items():
            node = server.get_object(NODES, None, node_name)
            pods = [p for p in server.objects(PODS) if p["spec"].get("nodeName") == node_name and p["metadata"]["namespace"] == SERVING_NS]
            for index in range(len(pods), count):
                if node_name in self.skip_injection:  # no preflight ran: no verdict, the template's flag
                    self.skip_injection.discard(node_name)
                    server.put_object(PODS, serving_pod(node_name, index))
                    continue
                flag = self.flag_for(node)
                server.put_object(PODS, serving_pod(node_name, index, flag, self.refuse.get(node_name, f"simulated agent says {flag}"),
                                                    self.agent_answer(node)))

    def _run(self) -> None:
        while not self.stop.is_set():
            self.api.call(self._tick)
            self.stop.wait(self.interval)

    def __enter__(self) -> "ReplicaController":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(5)

