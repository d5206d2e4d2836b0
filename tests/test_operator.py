"""The operator (kopf, under KopfRunner) against the API emulator: 8 GPU nodes whose agents published
real reports, agent pods, serving pods and a stand-in ReplicaSet that recreates evicted pods."""

from __future__ import annotations

import json
import os
import time

import pytest
from kopf.testing import KopfRunner

from gluon_agent import contract
from tests.apiserver import ApiServerThread
from tests.cluster import (EVENTS, NODES, PODS, ROLLOUTS, SERVING_NS, ReplicaController, agent_pod, declare_rollouts,
                           gpu_node, rollout)
from tests.helpers import wait_for

FLEET = {
    "n1": {}, "n2": {}, "n3": {}, "n4": {},
    "n5": {"capable": False},
    "n6": {"fallback": "fail"},
    "n7": {"stale": True},
    "n8": {"dead_agent": True},
}
OPERATOR_ENV = {"GLUON_SCANNING": "off", "GLUON_METRICS_PORT": "0", "GLUON_WATCH_TIMEOUT": "20"}


@pytest.fixture
def cluster():
    with ApiServerThread() as api:
        server = api.server
        declare_rollouts(server)

        def build():
            for name, traits in FLEET.items():
                server.put_object(NODES, gpu_node(name, capable=traits.get("capable", True),
                                                  fallback=traits.get("fallback", "pass"), stale=traits.get("stale", False)))
                server.put_object(PODS, agent_pod(name, ready=not traits.get("dead_agent")))

        api.call(build)
        with ReplicaController(api) as replicas:
            replicas.wanted = {name: 2 for name in FLEET}
            wait_for(lambda: len(api.call(lambda: server.objects(PODS))) == len(FLEET) * 3, what="serving pods")
            yield api, replicas


@pytest.fixture
def operator(cluster, monkeypatch):
    api, _ = cluster
    for key, value in dict(OPERATOR_ENV, GLUON_API_URL=api.url).items():
        monkeypatch.setenv(key, value)
    with KopfRunner(["run", "-m", "gluon_operator.handlers", "--standalone", "-A"], timeout=60) as runner:
        yield runner
    assert runner.exception is None, runner.output[-3000:]


def status(api, name="kimi"):
    return (api.call(lambda: api.server.get_object(ROLLOUTS, SERVING_NS, name)) or {}).get("status") or {}


def node_labels(api, name):
    return api.call(lambda: api.server.get_object(NODES, None, name))["metadata"].get("labels", {})


def evictions(api):
    return [r for r in api.server.requests_for(PODS, "POST") if r.subresource == "eviction"]


def events(api):
    return api.call(lambda: api.server.objects(EVENTS))


def create(api, body):
    api.call(lambda: api.server.put_object(ROLLOUTS, body))


def patch_spec(api, name, changes):
    def apply():
        obj = api.server.get_object(ROLLOUTS, SERVING_NS, name)
        obj["spec"].update(changes)
        api.server._replace(ROLLOUTS, (ROLLOUTS, SERVING_NS, name), obj, None, None)
    api.call(apply)


def test_gating_canary_labels_status_and_events(cluster, operator):
    api, _ = cluster
    create(api, rollout(strategy={"holdoutNodes": 1}))
    wait_for(lambda: status(api).get("counts", {}).get("Analyzing") == 1, timeout=30, what="canary analyzing")
    nodes = status(api)["nodes"]
    reasons = {n: s["reason"] for n, s in nodes.items()}
    assert nodes["n5"]["state"] == "Ineligible" and "not capable" in reasons["n5"] and "gfx950" in reasons["n5"]
    assert nodes["n6"]["state"] == "Ineligible" and "fallback fail" in reasons["n6"]
    assert nodes["n7"]["state"] == "Ineligible" and "self-test is for fingerprint 0ldf1ngerpr1nt00" in reasons["n7"]
    assert nodes["n8"]["state"] == "Ineligible" and "no running, ready agent" in reasons["n8"]
    holdouts = [n for n, s in nodes.items() if s["holdout"]]
    assert len(holdouts) == 1 and nodes[holdouts[0]]["state"] == "Eligible"
    canary = [n for n, s in nodes.items() if s["state"] == "Analyzing"]
    assert len(canary) == 1 and canary[0] not in holdouts
    # canary: labels on the node, its two old pods evicted (and only its), the new pods labelled flag=1
    assert node_labels(api, canary[0])[contract.LABEL_ENABLED] == "true"
    assert node_labels(api, canary[0])[contract.LABEL_STATE] == "Analyzing"
    evicted = {r.name for r in evictions(api)}
    assert len(evicted) == 2 and all(f"sglang-{canary[0]}-" in pod for pod in evicted)
    pods = [p for p in api.call(lambda: api.server.objects(PODS)) if p["spec"]["nodeName"] == canary[0] and p["metadata"]["namespace"] == SERVING_NS]
    wait_for(lambda: all(p["metadata"]["labels"].get(contract.LABEL_POD_FLAG) == "1" for p in
                         [x for x in api.call(lambda: api.server.objects(PODS)) if x["spec"]["nodeName"] == canary[0] and x["metadata"]["namespace"] == SERVING_NS]))
    assert len(pods) == 2
    for name in ("n5", "n6", "n7", "n8"):
        assert node_labels(api, name)[contract.LABEL_ENABLED] == "false"
        assert node_labels(api, name)[contract.LABEL_STATE] == "Ineligible"
    current = status(api)
    assert current["phase"] == "Progressing" and current["observedGeneration"] == 1
    assert {c["type"]: c["status"] for c in current["conditions"]} == {"Ready": "False", "Progressing": "True", "Degraded": "False", "Invalid": "False"}
    messages = [e.get("message", "") for e in events(api)]
    assert any(m.startswith(f"node {canary[0]}: ") and "-> Enabling: chosen by the rollout strategy" in m for m in messages)
    assert any(f"node {canary[0]}: Enabling -> Analyzing" in m for m in messages)
    time.sleep(1.0)
    assert len(evictions(api)) == 2, "a node was restarted twice"


def test_pause_and_resume(cluster, operator):
    api, _ = cluster
    create(api, rollout(paused=True))
    wait_for(lambda: status(api).get("phase") == "Paused", timeout=30)
    time.sleep(1.0)
    assert not evictions(api) and status(api)["counts"]["Eligible"] == 4
    patch_spec(api, "kimi", {"paused": False})
    wait_for(lambda: status(api).get("counts", {}).get("Analyzing") == 1, timeout=30, what="resumed canary")
    assert status(api)["phase"] == "Progressing"


def test_eviction_blocked_by_disruption_budget_waits(cluster, operator):
    api, replicas = cluster
    def block_all():
        for pod in api.server.objects(PODS):
            if pod["metadata"]["namespace"] == SERVING_NS and pod["spec"]["nodeName"] == "n1":
                api.server.eviction_blocked.add((SERVING_NS, pod["metadata"]["name"]))
    api.call(block_all)
    create(api, rollout(nodeSelector={"matchLabels": {"kubernetes.io/hostname": "n1"}}))
    wait_for(lambda: len(evictions(api)) >= 2, timeout=30, what="retried evictions")
    assert status(api)["nodes"]["n1"]["state"] == "Enabling"
    api.call(lambda: api.server.eviction_blocked.clear())
    wait_for(lambda: status(api).get("nodes", {}).get("n1", {}).get("state") == "Analyzing", timeout=30)


def test_pod_admitted_without_the_webhook_is_restarted(cluster, operator):
    """Created while the webhook was unreachable (failurePolicy Ignore): no preflight, the template's flag.
    The node must not wait for it forever: it is restarted and its replacement is injected."""
    api, replicas = cluster
    replicas.skip_injection.add("n1")
    create(api, rollout(nodeSelector={"matchLabels": {"kubernetes.io/hostname": "n1"}}))
    wait_for(lambda: status(api).get("nodes", {}).get("n1", {}).get("state") == "Analyzing", timeout=30, what="n1 analyzing")
    assert "n1" not in replicas.skip_injection and len(evictions(api)) == 3  # its 2 old pods, then the one admitted without injection


def test_preflight_refusal_rolls_back_sticky(cluster, operator):
    api, replicas = cluster
    replicas.refuse["n1"] = "this image's stack is not capable: Triton Gluon cga_layout (have 3.6.0, need >= 3.7)"
    create(api, rollout(nodeSelector={"matchLabels": {"kubernetes.io/hostname": "n1"}}))
    wait_for(lambda: status(api).get("nodes", {}).get("n1", {}).get("state") == "RolledBack", timeout=30)
    node = api.call(lambda: api.server.get_object(NODES, None, "n1"))
    record = json.loads(node["metadata"]["annotations"][contract.ANNOTATION_ROLLBACK])
    assert "cga_layout" in record["reason"] and record["fingerprint"] == status(api)["nodes"]["n1"]["fingerprint"]
    assert node["metadata"]["labels"][contract.LABEL_ENABLED] == "false"
    time.sleep(1.0)
    assert status(api)["nodes"]["n1"]["state"] == "RolledBack"  # sticky for this fingerprint
    assert status(api)["conditions"][2]["status"] == "True"  # Degraded


def test_invalid_spec_is_a_condition_not_a_crash(cluster, operator):
    api, _ = cluster
    create(api, rollout(name="bad", analysis={"intervalSeconds": 300, "windowSeconds": 60}))
    create(api, rollout(name="worse", strategy={"maxParallel": 0}))
    wait_for(lambda: status(api, "bad").get("phase") == "Invalid" and status(api, "worse").get("phase") == "Invalid", timeout=30)
    assert "spec.analysis.windowSeconds (60) must be >= spec.analysis.intervalSeconds (300)" in status(api, "bad")["invalid"]
    assert status(api, "worse")["invalid"].startswith("spec.strategy.maxParallel:")
    invalid = [c for c in status(api, "bad")["conditions"] if c["type"] == "Invalid"][0]
    assert invalid["status"] == "True" and "windowSeconds" in invalid["message"]
    assert not evictions(api)
