"""Analysis and rollback end to end on the real control plane: a real Prometheus scrapes fake SGLang
exporters (real metric names, node and flag labels) for 6 kwok nodes, a real agent (its token bound to its
DaemonSet pod) and the operator's own metrics; the operator under KopfRunner (its own ServiceAccount's
token) judges them and restarts serving Deployments' pods, whose preflight verdicts PreflightReporter
reports (SIMULATION of the kubelet). One node regresses 15% when its flag flips, one speeds up 2x;
Prometheus goes down mid-analysis and comes back. Then every PromQL expression of the chart's dashboard
and alerts runs against that Prometheus (a metric name that drifted from the contract returns nothing)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from gluon_common import contract
from gluon_localcluster import fleet
from gluon_localcluster.fake_sglang import FakeSglang, NodeModel
from gluon_localcluster.fakes.simulated import simulated_node
from tests.clusterkit import Nodes, PreflightReporter, create_rollout, events, kopf_operator, rollout_status, serve
from tests.helpers import free_port, prometheus, running_agent, wait_for

EFFECTS = {"rb-n1": 0.85, "rb-n2": 2.0, "rb-n3": 2.2, "rb-n4": 2.2, "rb-n5": 2.2, "rb-n6": 2.2}
CHART = Path(__file__).resolve().parent.parent / "charts/gluon-rollout"


@pytest.fixture(scope="module")
def nodes(installed):
    made = Nodes(installed, "rb")
    try:
        for index, name in enumerate(EFFECTS, start=320):
            made.create(name.removeprefix("rb-"), index, published={})
        made.wait_for_agents()
        yield made
    finally:
        made.delete()


@pytest.fixture
def stack(nodes, installed, namespace, admin, tmp_path):
    nodes.reset()
    serve(admin, namespace, list(EFFECTS), replicas=1)
    with PreflightReporter(admin, namespace) as reporter:
        exporters = [
            FakeSglang(
                NodeModel(node, flag_effect=effect, noise=0.02),
                lambda node=node: reporter.flags.get(node, "0"),
                namespace=namespace,
            ).start()
            for node, effect in EFFECTS.items()
        ]
        sim = tmp_path / "sim.json"
        sim.write_text(json.dumps(simulated_node()))
        metrics_port = free_port()
        try:
            with (
                running_agent(installed.agent_kubeconfig("rb-n6"), "rb-n6", sim) as agent,
                prometheus(
                    {
                        "sglang": [f"127.0.0.1:{e.port}" for e in exporters],
                        "gluon-rollout-agent": [
                            {"targets": [agent.url.removeprefix("http://")], "labels": {"node": "rb-n6"}}
                        ],
                        "gluon-rollout-operator": [f"127.0.0.1:{metrics_port}"],
                    }
                ) as prom,
            ):
                wait_for(
                    lambda: len(prom.query('{__name__=~"sglang[:_]inter_token_latency_seconds_count"}')) == 6,
                    timeout=30,
                    what="scrapes",
                )
                time.sleep(8)  # pre-enable history: the baseline every node is compared with
                yield prom, metrics_port
        finally:
            for exporter in exporters:
                exporter.stop()


def test_regression_rolled_back_speedup_promoted_and_prometheus_outage(
    stack, monkeypatch, installed, namespace, admin, nodes
):
    prom, metrics_port = stack
    analysis = {
        "prometheusUrl": prom.url,
        "intervalSeconds": 4,
        "stepSeconds": 2,
        "windowSeconds": 16,
        "warmupSeconds": 2,
        "minSamples": 5,
        "consecutiveFailures": 2,
        "tolerance": 0.05,
    }

    def status():
        return rollout_status(admin, namespace)

    with kopf_operator(
        monkeypatch,
        installed,
        namespace,
        webhook=True,
        GLUON_METRICS_PORT=str(metrics_port),
        GLUON_METRICS_ADDR="127.0.0.1",
    ):
        create_rollout(
            admin,
            fleet.rollout(
                "kimi",
                namespace,
                nodeSelector=nodes.selector,
                strategy={"canaryNodes": 2, "maxParallel": 2},
                analysis=analysis,
            ),
        )
        wait_for(
            lambda: (
                {n: s["state"] for n, s in status().get("nodes", {}).items() if n in ("rb-n1", "rb-n2")}
                == {"rb-n1": "Analyzing", "rb-n2": "Analyzing"}
            ),
            timeout=45,
            what="canaries analyzing",
        )

        prom.halt()  # an outage during the analysis: neither promotion nor rollback
        wait_for(
            lambda: "unreachable" in str(status().get("analysis", {}).get("error")), timeout=20, what="analysis error"
        )
        time.sleep(6)
        states = status()["nodes"]
        assert states["rb-n1"]["state"] == states["rb-n2"]["state"] == "Analyzing"
        assert (
            "Prometheus error" in states["rb-n1"]["reason"] and states["rb-n1"]["numbers"]["result"] == "inconclusive"
        )

        prom.start()  # back: the analysis resumes
        wait_for(
            lambda: (
                status()["nodes"]["rb-n1"]["state"] == "RolledBack"
                and status()["nodes"]["rb-n2"]["state"] == "Promoted"
            ),
            timeout=60,
            what="verdicts after the outage",
        )
        time.sleep(1)
        final = status()
        n1, n2 = final["nodes"]["rb-n1"], final["nodes"]["rb-n2"]
        assert (
            0.78 < n1["numbers"]["effect"] < 0.92
            and n1["numbers"]["p_worse"] < 0.05
            and n1["numbers"]["threshold"] == 0.95
        )
        assert n1["numbers"]["failStreak"] >= 2 and "consecutive failing evaluations" in n1["reason"]
        assert 1.7 < n2["numbers"]["effect"] < 2.3 and n2["numbers"]["ci_low"] > 0.95
        node = nodes.read("rb-n1")
        record = json.loads(node["metadata"]["annotations"][contract.ANNOTATION_ROLLBACK])
        assert record["numbers"]["effect"] == n1["numbers"]["effect"] and "decode speed worse" in record["reason"]
        assert node["metadata"]["labels"][contract.LABEL_ENABLED] == "false"
        assert nodes.labels("rb-n2")[contract.LABEL_ENABLED] == "true"
        assert final["analysis"]["controls"] >= 1 and "inter_token_latency_seconds_count" in final["analysis"]["query"]
        assert any("node rb-n1: Analyzing -> RolledBack" in m and "effect x0.8" in m for m in events(admin, namespace))

        # ---- every expression the chart ships, against what really ran
        wait_for(
            lambda: (
                prom.query('up{job="gluon-rollout-operator"} == 1')
                and prom.query(f"{contract.M_ROLLOUT_ROLLBACKS}_total")
            ),
            timeout=30,
            what="operator metrics scraped",
        )
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
