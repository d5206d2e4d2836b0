"""Analysis and rollback end to end: a real Prometheus scrapes fake SGLang exporters (real metric names,
node and flag labels) for 6 nodes, a real agent and the operator's own metrics; the operator under
KopfRunner judges them. One node regresses 15% when its flag flips, one speeds up 2x; Prometheus goes
down mid-analysis and comes back. Then every PromQL expression of the chart's dashboard and alerts runs
against that Prometheus (a metric name that drifted from the contract returns nothing)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from kopf.testing import KopfRunner

from gluon_agent import contract
from tests.apiserver import ApiServerThread
from tests.cluster import (NODES, PODS, ROLLOUTS, SERVING_NS, ReplicaController, agent_pod, declare_rollouts, gpu_node,
                           rollout)
from gluon_agent.sources import simulated_node
from gluon_localcluster.fake_sglang import FakeSglang, NodeModel
from tests.helpers import free_port, prometheus, running_agent, wait_for
from tests.test_operator import OPERATOR_ENV, status

EFFECTS = {"n1": 0.85, "n2": 2.0, "n3": 2.2, "n4": 2.2, "n5": 2.2, "n6": 2.2}
CHART = Path(__file__).resolve().parent.parent / "charts/gluon-rollout"


def serving_flag(api, node):
    def read():
        for pod in api.server.objects(PODS):
            if pod["spec"].get("nodeName") == node and pod["metadata"]["namespace"] == SERVING_NS:
                for c in pod.get("status", {}).get("initContainerStatuses", []):
                    return json.loads(c["state"]["terminated"]["message"])["flag"]
        return "0"
    return lambda: api.call(read)


@pytest.fixture
def stack(monkeypatch, tmp_path):
    with ApiServerThread() as api:
        declare_rollouts(api.server)

        def build():
            for node in EFFECTS:
                api.server.put_object(NODES, gpu_node(node))
                api.server.put_object(PODS, agent_pod(node))
        api.call(build)
        exporters = [FakeSglang(NodeModel(node, flag_effect=effect, noise=0.02), serving_flag(api, node)).start()
                     for node, effect in EFFECTS.items()]
        sim = tmp_path / "sim.json"
        sim.write_text(json.dumps(simulated_node()))
        metrics_port = free_port()
        try:
            with ReplicaController(api) as replicas, running_agent(api.url, "n6", sim) as agent, prometheus({
                "sglang": [f"127.0.0.1:{e.port}" for e in exporters],
                "gluon-rollout-agent": [{"targets": [agent.url.removeprefix("http://")], "labels": {"node": "n6"}}],
                "gluon-rollout-operator": [f"127.0.0.1:{metrics_port}"],
            }) as prom:
                replicas.wanted = {node: 1 for node in EFFECTS}
                env = dict(OPERATOR_ENV, GLUON_API_URL=api.url, GLUON_METRICS_PORT=str(metrics_port), GLUON_METRICS_ADDR="127.0.0.1")
                for key, value in env.items():
                    monkeypatch.setenv(key, value)
                wait_for(lambda: len(prom.query('{__name__=~"sglang[:_]inter_token_latency_seconds_count"}')) == 6, timeout=30, what="scrapes")
                time.sleep(8)  # pre-enable history: the baseline every node is compared with
                yield api, prom
        finally:
            for exporter in exporters:
                exporter.stop()


def test_regression_rolled_back_speedup_promoted_and_prometheus_outage(stack):
    api, prom = stack
    analysis = {"prometheusUrl": prom.url, "intervalSeconds": 4, "stepSeconds": 2, "windowSeconds": 16,
                "warmupSeconds": 2, "minSamples": 5, "consecutiveFailures": 2, "tolerance": 0.05}
    with KopfRunner(["run", "-m", "gluon_operator.handlers", "--standalone", "-A"], timeout=120) as runner:
        api.call(lambda: api.server.put_object(ROLLOUTS, rollout(strategy={"canaryNodes": 2, "maxParallel": 2}, analysis=analysis)))
        wait_for(lambda: {n: s["state"] for n, s in status(api).get("nodes", {}).items() if n in ("n1", "n2")} ==
                 {"n1": "Analyzing", "n2": "Analyzing"}, timeout=30, what="canaries analyzing")

        prom.halt()  # an outage during the analysis: neither promotion nor rollback
        wait_for(lambda: "unreachable" in str(status(api).get("analysis", {}).get("error")), timeout=20, what="analysis error")
        time.sleep(6)
        nodes = status(api)["nodes"]
        assert nodes["n1"]["state"] == nodes["n2"]["state"] == "Analyzing"
        assert "Prometheus error" in nodes["n1"]["reason"] and nodes["n1"]["numbers"]["result"] == "inconclusive"

        prom.start()  # back: the analysis resumes
        wait_for(lambda: status(api)["nodes"]["n1"]["state"] == "RolledBack" and status(api)["nodes"]["n2"]["state"] == "Promoted",
                 timeout=60, what="verdicts after the outage")
        time.sleep(1)
    assert runner.exception is None

    final = status(api)
    n1, n2 = final["nodes"]["n1"], final["nodes"]["n2"]
    assert 0.78 < n1["numbers"]["effect"] < 0.92 and n1["numbers"]["p_worse"] < 0.05 and n1["numbers"]["threshold"] == 0.95
    assert n1["numbers"]["failStreak"] >= 2 and "consecutive failing evaluations" in n1["reason"]
    assert 1.7 < n2["numbers"]["effect"] < 2.3 and n2["numbers"]["ci_low"] > 0.95
    node = api.call(lambda: api.server.get_object(NODES, None, "n1"))
    record = json.loads(node["metadata"]["annotations"][contract.ANNOTATION_ROLLBACK])
    assert record["numbers"]["effect"] == n1["numbers"]["effect"] and "decode speed worse" in record["reason"]
    assert node["metadata"]["labels"][contract.LABEL_ENABLED] == "false"
    assert api.call(lambda: api.server.get_object(NODES, None, "n2"))["metadata"]["labels"][contract.LABEL_ENABLED] == "true"
    assert final["analysis"]["controls"] >= 1 and "inter_token_latency_seconds_count" in final["analysis"]["query"]
    events = [e.get("message", "") for e in api.call(lambda: api.server.objects(("", "v1", "events")))]
    assert any("node n1: Analyzing -> RolledBack" in m and "effect x0.8" in m for m in events)


    # ---- every expression the chart ships, against what really ran
    wait_for(lambda: prom.query('up{job="gluon-rollout-operator"} == 1') and prom.query(f"{contract.M_ROLLOUT_ROLLBACKS}_total"),
             timeout=30, what="operator metrics scraped")
    for title, expr in dashboard_expressions():
        assert prom.query(expr), f"dashboard panel {title!r} returns nothing: {expr}"
    for alert, expr in alert_expressions():
        for selector in vector_selectors(expr):
            assert prom.query(selector), f"alert {alert}: selector {selector} matches no series"


def dashboard_expressions():
    board = json.loads((CHART / "files/dashboard.json").read_text())
    for panel in board["panels"]:
        for target in panel["targets"]:
            yield panel["title"], target["expr"].replace("$namespace", ".*")


def alert_expressions():
    import yaml

    for group in yaml.safe_load((CHART / "files/alerts.yaml").read_text())["groups"]:
        for rule in group["rules"]:
            yield rule["alert"], rule["expr"]


SELECTOR = re.compile(r'\{__name__=~"[^"]+"[^}]*\}|\b(?:gluon_[a-z_]+|up)(?:\{[^}]*\})?')


def vector_selectors(expr):
    """The series selectors of an expression: each must match something if the names are right."""
    return [m.group(0) for m in SELECTOR.finditer(expr)]
