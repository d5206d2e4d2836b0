"""The agent's node report is one schema (gluon_common.report): the agent builds it through the models the
operator reads it with, so what an agent publishes is what the operator sees, field for field."""

from __future__ import annotations

import json
import time

import pytest

from gluon_agent import decisions
from gluon_agent.daemon import node_report, restore, selftest_summary
from gluon_agent.fingerprint import fingerprint
from gluon_common import contract
from gluon_common.report import AgentReport, GpuResult, LastAttempt, SelfTest
from gluon_common.sglang_routes import DEFAULT_SERVING
from gluon_localcluster.fakes.simulated import simulated_node
from gluon_operator import gating

NOW = 1_000_000.0


def published(selftest_outcome: dict | None, verdict: str, last_attempt: LastAttempt | None = None):
    """(the report an agent builds, the annotations it publishes) for a simulated node."""
    spec = simulated_node()
    probe = spec["probe"]
    fp = fingerprint(probe)
    summary = None
    if selftest_outcome is not None:
        outcome = dict(
            selftest_outcome,
            finished_at=time.time(),
            seconds=2,
            fingerprint=fp,
            serving=DEFAULT_SERVING.as_dict() | {"digest": DEFAULT_SERVING.digest},
        )
        summary = selftest_summary(outcome, "start")
    report = node_report("n1", probe, fp, summary, verdict, last_attempt)
    desired = decisions.desired_state(probe, verdict, report.annotation_value())
    return report, desired


def test_what_the_agent_publishes_the_operator_reads_back_whole():
    report, desired = published(simulated_node()["selftest"], "pass")
    read, problem = gating.parse_report(desired.annotations)
    assert problem is None and read == report
    assert (
        read.selftest is not None
        and [g.result for g in read.selftest.gpus] == [{"accelerated": "pass", "fallback": "pass"}] * 8
    )
    assert read.selftest.serving.digest == DEFAULT_SERVING.digest and read.selftest.serving.verifyQLens == [2, 3, 4]
    assert read.probe.capable is True and read.probe.sglang["flag0_route"] == "persistent"
    # every field of the schema is written, so a reader of another version finds each one it knows
    raw = json.loads(desired.annotations[contract.ANNOTATION_REPORT])
    assert set(raw) == set(AgentReport.model_fields) and set(raw["selftest"]) == set(SelfTest.model_fields)
    assert set(raw["selftest"]["gpus"][0]) == set(GpuResult.model_fields)


def test_a_pending_agents_report_is_read_as_pending_not_as_unreadable():
    """Before its first self-test ends an agent publishes `selftest: null`; the operator's own model of the
    report (a self-test always present) refused that as a wrong shape instead of naming the pending test."""
    report, desired = published(None, "pending")
    read, problem = gating.parse_report(desired.annotations)
    assert problem is None and read == report and read.selftest is None
    labels = dict(desired.labels, **{contract.LABEL_CAPABLE: "true"})
    verdict = gating.eligibility(gating.NodeFacts("n1", labels, desired.annotations, agent_alive=True), NOW, None)
    assert not verdict.eligible and verdict.reason == "self-test not passed: label pending, report pending"


def test_a_deferred_attempt_is_published_beside_the_verdict_it_left_standing():
    attempt = LastAttempt(result="deferred", at=NOW, problems=["GPUs busy"], gpus=[])
    report, desired = published(simulated_node()["selftest"], "pass", attempt)
    read, problem = gating.parse_report(desired.annotations)
    assert problem is None and read.last_attempt == attempt and read.verdict == "pass"


def test_a_restarted_agent_restores_the_summary_it_published():
    report, desired = published(simulated_node()["selftest"], "pass")
    node = {"metadata": {"annotations": desired.annotations}}
    assert restore(node, report.fingerprint) == ("pass", report.selftest, None)


@pytest.mark.parametrize(
    "field, value, where",
    [
        ("verdict", 1, "verdict"),
        ("probe", {"capable": "true"}, "probe.capable"),
        ("selftest", {"serving": {"digest": 7}}, "selftest.serving.digest"),
        ("selftest", {"gpus": [{"reasons": {"accelerated": "x"}}]}, "selftest.gpus.0.reasons.accelerated"),
    ],
)
def test_a_field_the_operator_decides_on_is_strict(field, value, where):
    _, desired = published(simulated_node()["selftest"], "pass")
    raw = json.loads(desired.annotations[contract.ANNOTATION_REPORT]) | {field: value}
    read, problem = gating.parse_report({contract.ANNOTATION_REPORT: json.dumps(raw)})
    assert read is None and problem.startswith(f"the agent report annotation field {where}: ")
