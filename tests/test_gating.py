"""The operator's pure decisions: eligibility, the node state machine, planning, phase. Exhaustive tables
where the space is small, hypothesis properties over random histories elsewhere."""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gluon_common import contract
from gluon_localcluster.fleet import agent_published
from gluon_operator import gating
from gluon_operator.gating import (
    ANALYZING,
    DISABLED,
    ELIGIBLE,
    ENABLING,
    INELIGIBLE,
    PROMOTED,
    ROLLED_BACK,
    Eligibility,
    NodeFacts,
    NodeStatus,
    PodFacts,
    PodSummary,
    Verdict,
)
from gluon_operator.records import RollbackRecord

NOW = 1_000_000.0


def facts(name="n1", alive=True, **traits) -> NodeFacts:
    labels, annotations = agent_published(name, **traits)
    return NodeFacts(name, labels, annotations, alive)


def test_eligible_node():
    el = gating.eligibility(facts(), NOW, None)
    assert el.eligible and el.fingerprint and "both paths pass" in el.reason


@pytest.mark.parametrize(
    "traits,alive,reason",
    [
        ({}, False, "no running, ready agent"),
        ({"capable": False}, True, "not capable: GPU arch gfx950 (have gfx942)"),
        ({"fallback": "fail"}, True, "GPU 0 fallback fail"),
        ({"accelerated": "error"}, True, "GPU 0 accelerated error"),
        ({"stale": True}, True, "self-test is for fingerprint 0ldf1ngerpr1nt00"),
    ],
)
def test_ineligible_nodes_say_why(traits, alive, reason):
    el = gating.eligibility(facts(alive=alive, **traits), NOW, None)
    assert not el.eligible and reason in el.reason


def test_missing_or_malformed_report():
    f = facts()
    bare = NodeFacts("n1", f.labels, {}, True)
    assert gating.eligibility(bare, NOW, None).reason == "the agent has published no report on this node"
    broken = NodeFacts("n1", f.labels, {contract.ANNOTATION_REPORT: "{nope"}, True)
    assert "not JSON" in gating.eligibility(broken, NOW, None).reason


@pytest.mark.parametrize(
    "report,field",
    [
        ({"probe": "x"}, "probe: Input should be a valid dictionary"),
        ({"selftest": {"gpus": ["x"]}}, "selftest.gpus.0: Input should be a valid dictionary"),
        ({"probe": {"capable": "yes"}}, "probe.capable: Input should be a valid boolean"),
        ({"fingerprint": 7}, "fingerprint: Input should be a valid string"),
        ([1, 2], "(top level): Input should be a valid dictionary"),
    ],
)
def test_a_report_of_the_wrong_shape_names_the_field(report, field):
    f = facts()
    el = gating.eligibility(
        NodeFacts("n1", f.labels, {**f.annotations, contract.ANNOTATION_REPORT: json.dumps(report)}, True), NOW, None
    )
    assert not el.eligible and el.reason.startswith("the agent report annotation field " + field), el.reason


def test_skip_label_comes_first():
    f = facts()
    el = gating.eligibility(NodeFacts("n1", {**f.labels, contract.LABEL_SKIP: "true"}, f.annotations, True), NOW, None)
    assert not el.eligible and el.reason == gating.SKIPPED and el.fingerprint
    assert gating.eligibility(
        NodeFacts("n1", {**f.labels, contract.LABEL_SKIP: "false"}, f.annotations, True), NOW, None
    ).eligible


def test_rollback_bars_until_fingerprint_changes_or_retry_passes():
    f = facts()
    fp = gating.eligibility(f, NOW, None).fingerprint
    record = json.dumps({"fingerprint": fp, "at": NOW - 100, "reason": "decode -15% (p=0.001)"})
    barred = NodeFacts("n1", f.labels, {**f.annotations, contract.ANNOTATION_ROLLBACK: record}, True)
    el = gating.eligibility(barred, NOW, None)
    assert not el.eligible and "decode -15%" in el.reason
    assert gating.eligibility(barred, NOW, 50).eligible  # retryAfter passed
    assert not gating.eligibility(barred, NOW, 500).eligible
    other = json.dumps({"fingerprint": "different", "at": NOW, "reason": "x"})
    assert gating.eligibility(
        NodeFacts("n1", f.labels, {**f.annotations, contract.ANNOTATION_ROLLBACK: other}, True), NOW, None
    ).eligible


def pods(old=0, new_flags=(), ready=True, refused=()):
    return PodSummary(
        [f"old{i}" for i in range(old)], {f"new{i}": f for i, f in enumerate(new_flags)}, ready, list(refused)
    )


YES = Eligibility(True, "ok", "fp")
NO = Eligibility(False, "not capable", "fp")
NONE = pods()


@pytest.mark.parametrize(
    "state,el,summary,verdict,cleared,expected,action",
    [
        (INELIGIBLE, YES, NONE, None, True, ELIGIBLE, None),
        (INELIGIBLE, NO, NONE, None, True, INELIGIBLE, None),
        (ELIGIBLE, YES, NONE, None, True, ELIGIBLE, None),
        (ELIGIBLE, NO, NONE, None, True, INELIGIBLE, None),
        (ENABLING, YES, pods(old=1), None, True, ENABLING, None),
        (ENABLING, YES, pods(new_flags=("1", None)), None, True, ENABLING, None),
        (ENABLING, YES, pods(new_flags=("1",), ready=False), None, True, ENABLING, None),
        (ENABLING, YES, pods(new_flags=("1", "1")), None, True, ANALYZING, None),
        (ENABLING, YES, pods(new_flags=("0",), refused=("p: not capable",)), None, True, ROLLED_BACK, "rollback"),
        (ENABLING, NO, NONE, None, True, DISABLED, "restart"),
        (ANALYZING, YES, NONE, None, True, ANALYZING, None),
        (ANALYZING, YES, NONE, Verdict("inconclusive", "no data"), True, ANALYZING, None),
        (ANALYZING, YES, NONE, Verdict("pass", "x1.9"), True, PROMOTED, None),
        (ANALYZING, YES, NONE, Verdict("fail", "-15%"), True, ROLLED_BACK, "rollback"),
        (ANALYZING, NO, NONE, Verdict("pass", "x1.9"), True, DISABLED, "restart"),
        (PROMOTED, YES, NONE, Verdict("pass", "x1.9"), True, PROMOTED, None),
        (PROMOTED, YES, NONE, Verdict("fail", "-15%"), True, ROLLED_BACK, "rollback"),
        (PROMOTED, NO, NONE, None, True, DISABLED, "restart"),
        (DISABLED, NO, NONE, None, True, DISABLED, None),
        (DISABLED, YES, pods(old=2), None, True, DISABLED, None),
        (DISABLED, YES, NONE, None, True, ELIGIBLE, None),
        (ROLLED_BACK, YES, NONE, None, False, ROLLED_BACK, None),
        (ROLLED_BACK, NO, NONE, None, False, ROLLED_BACK, None),
        (ROLLED_BACK, YES, NONE, None, True, ELIGIBLE, None),
        (ROLLED_BACK, NO, NONE, None, True, INELIGIBLE, None),
    ],
)
def test_transitions(state, el, summary, verdict, cleared, expected, action):
    step = gating.advance(NodeStatus(state, since=1.0), el, summary, verdict, NOW, cleared)
    assert (step.status.state, step.action) == (expected, action)
    assert step.status.since == (1.0 if expected == state else NOW)
    if action:
        assert step.status.changed_at == NOW  # pods created before this restart


def test_a_promoted_nodes_number_is_that_of_the_look_that_promoted_it():
    """Guard mode's later looks do not move the recorded effect (its reason stays fixed too): they are kept
    apart under "guard", and the judge's working numbers (failStreak, its sequential state) move on."""
    looked = {"effect": 2.193, "ci_low": 2.1, "ci_high": 2.3, "at": NOW, "failStreak": 0, "sequential": {"n": 1}}
    promoted = gating.advance(
        NodeStatus(ANALYZING, since=1.0), YES, NONE, Verdict("pass", "not worse", looked), NOW, True
    ).status
    assert promoted.numbers["effect"] == 2.193 and promoted.numbers[gating.JUDGED_AT] == NOW
    later = {"effect": 2.273, "ci_low": 2.2, "ci_high": 2.35, "at": NOW + 60, "failStreak": 1, "sequential": {"n": 2}}
    guarded = gating.advance(promoted, YES, NONE, Verdict("inconclusive", "a bad minute", later), NOW + 60, True).status
    assert guarded.reason == "not worse" and gating.effect_text(guarded.numbers) == "x2.193"
    assert guarded.numbers[gating.JUDGED_AT] == NOW and guarded.numbers["at"] == NOW
    assert guarded.numbers["guard"] == {
        "effect": 2.273,
        "ci_low": 2.2,
        "ci_high": 2.35,
        "at": NOW + 60,
        "result": "inconclusive",
    }
    assert guarded.numbers["failStreak"] == 1 and guarded.numbers["sequential"] == {"n": 2}
    again = gating.advance(guarded, YES, NONE, Verdict("pass", "fine", {**later, "failStreak": 0}), NOW + 120, True)
    assert again.status.numbers["effect"] == 2.193 and again.status.numbers["failStreak"] == 0
    failed = gating.advance(guarded, YES, NONE, Verdict("fail", "worse", {"effect": 0.8}), NOW + 120, True).status
    assert failed.state == ROLLED_BACK and failed.numbers == {"effect": 0.8}  # the look that failed it


@pytest.mark.parametrize("el,action", [(NO, "turned ineligible"), (YES, None)])
def test_a_node_turned_off_carries_no_effect(el, action):
    promoted = NodeStatus(PROMOTED, since=1.0, numbers={"effect": 2.2, gating.JUDGED_AT: NOW})
    if action:
        off = gating.advance(promoted, el, NONE, None, NOW, True).status
    else:  # an abort (plan.py) or any other move to a state without the flag
        off = gating.move(promoted, DISABLED, "rollout aborted", NOW, changed_at=NOW)
    assert off.state == DISABLED and off.numbers == {} and gating.effect_text(off.numbers) == "-"
    rolled = NodeStatus(ROLLED_BACK, since=1.0, numbers={"effect": 0.8})
    assert gating.advance(rolled, YES, NONE, None, NOW, True).status.numbers == {}  # cleared: judged afresh


def test_enable_and_labels():
    step = gating.enable(NodeStatus(ELIGIBLE), NOW)
    assert step.status.state == ENABLING and step.action == "restart" and step.status.changed_at == NOW
    assert gating.node_labels(step.status) == {contract.LABEL_ENABLED: "true", contract.LABEL_STATE: ENABLING}
    for state in contract.NODE_STATES:
        on = gating.node_labels(NodeStatus(state))[contract.LABEL_ENABLED] == "true"
        assert on == (state in (ENABLING, ANALYZING, PROMOTED))


def test_summarize_pods():
    pods_ = [
        PodFacts("a", 10, None, None, True, False),
        PodFacts("b", 30, "1", "ok", True, False, delivered="1"),
        PodFacts("c", 31, "0", "not capable", True, False, delivered="0"),
        PodFacts("d", 5, None, None, True, True),
        PodFacts("e", 32, "1", "ok", True, False),  # its preflight chose 1; not yet seen in its processes
    ]
    s = gating.summarize_pods(pods_, 20)
    # new_flags: what their processes were seen to run, never what the preflight chose
    assert s.old == ["a"] and s.new_flags == {"b": "1", "c": "0", "e": None} and s.refused == ["c: not capable"]
    assert gating.summarize_pods(pods_, None).old == []
    # creationTimestamp is whole seconds: a pod stamped 20 may predate a change at 20.4, so it is old
    same_second = [PodFacts("x", 20, None, None, True, False), PodFacts("y", 21, "1", "ok", True, False)]
    assert gating.summarize_pods(same_second, 20.4).old == ["x"]
    assert not gating.restart_due(NodeStatus(ENABLING, changed_at=20.4), 20.9, 0)  # the change's second
    assert gating.restart_due(NodeStatus(ENABLING, changed_at=20.4), 21.0, 0)
    assert not gating.restart_due(NodeStatus(ENABLING, changed_at=20.4), 24.0, 5)


def statuses_from(states: dict[str, str], holdout=()):
    return {n: NodeStatus(s, holdout=n in holdout) for n, s in states.items()}


def test_holdouts_are_stable_and_fill_up():
    fleet = statuses_from({f"n{i}": ELIGIBLE for i in range(10)})
    first = gating.choose_holdouts(fleet, 2)
    assert first == gating.choose_holdouts(fleet, 2) and len(first) == 2
    for n in first:
        fleet[n] = NodeStatus(ELIGIBLE, holdout=True)
    assert gating.choose_holdouts(fleet, 2) == []
    fleet[first[0]] = NodeStatus(INELIGIBLE)  # a control node lost: another takes its place
    assert len(gating.choose_holdouts(fleet, 2)) == 1


@settings(max_examples=300, deadline=None)  # a loaded machine must not fail a test of logic
@given(
    history=st.lists(
        st.tuples(
            st.booleans(),
            st.sampled_from([None, "pass", "fail", "inconclusive"]),
            st.integers(0, 2),
            st.sampled_from(["1", "0", None]),
            st.booleans(),
            st.booleans(),
        ),
        min_size=1,
        max_size=25,
    )
)
def test_random_histories_keep_the_invariants(history):
    """Whatever happens: flag-on states are reached only from Enabling, a failure always ends in a
    rollback with pods restarted, and rolled-back nodes stay so until cleared."""
    status = NodeStatus(INELIGIBLE)
    for step_no, (eligible, verdict, old, flag, cleared, pick) in enumerate(history):
        el = Eligibility(eligible, "r", "fp")
        summary = pods(old=old, new_flags=(flag,) if flag else (), refused=("p: x",) if flag == "0" else ())
        prev = status
        step = gating.advance(prev, el, summary, Verdict(verdict, "v") if verdict else None, NOW + step_no, cleared)
        status = step.status
        if pick and status.state == ELIGIBLE and not status.holdout:
            step = gating.enable(status, NOW + step_no)
            status = step.status
        assert status.state in contract.NODE_STATES
        if status.state in (ANALYZING, PROMOTED):
            assert prev.state in (ENABLING, ANALYZING, PROMOTED)
        if status.state == ROLLED_BACK and prev.state != ROLLED_BACK:
            assert step.action == "rollback"
        if prev.state == ROLLED_BACK and not cleared:
            assert status.state == ROLLED_BACK
        if not eligible and prev.state in (ENABLING, ANALYZING, PROMOTED) and status.state != ROLLED_BACK:
            assert status.state == DISABLED and step.action == "restart"


def test_phase_and_conditions():
    assert gating.phase({}, False, False, True) == "Invalid"
    assert gating.phase(statuses_from({"a": ELIGIBLE}), True, False, False) == "Paused"
    assert gating.phase(statuses_from({"a": ELIGIBLE}), False, True, False) == "Aborted"
    assert gating.phase(statuses_from({"a": ELIGIBLE}), False, False, False) == "Progressing"
    assert gating.phase(statuses_from({"a": ELIGIBLE}, holdout={"a"}), False, False, False) == "Idle"
    assert gating.phase(statuses_from({"a": PROMOTED, "b": INELIGIBLE}), False, False, False) == "Complete"
    conds = {
        c["type"]: c for c in gating.conditions("Complete", statuses_from({"a": PROMOTED, "b": ROLLED_BACK}), "", "t0")
    }
    assert conds["Ready"]["status"] == "True" and conds["Degraded"]["status"] == "True"


def test_merge_conditions_keeps_transition_times():
    before = gating.conditions("Progressing", {}, "", "t0")
    again = gating.merge_conditions(before, gating.conditions("Progressing", {}, "", "t1"))
    assert all(c["lastTransitionTime"] == "t0" for c in again)
    flipped = gating.merge_conditions(before, gating.conditions("Complete", statuses_from({"a": PROMOTED}), "", "t2"))
    times = {c["type"]: c["lastTransitionTime"] for c in flipped}
    assert times["Ready"] == "t2" and times["Progressing"] == "t2" and times["Invalid"] == "t0"


def test_node_status_round_trip():
    s = NodeStatus(PROMOTED, "x1.9", 5.0, "fp", 3.0, True, {"effect": 1.9})
    assert NodeStatus.from_dict(s.to_dict()) == s
    assert NodeStatus.from_dict({"state": "Bogus"}).state == INELIGIBLE
    assert list(itertools.islice(contract.NODE_STATES, 2)) == [INELIGIBLE, ELIGIBLE]


def test_a_rollback_recorded_on_the_node_wins_over_a_stale_status():
    """The reconcile that rolled a node back wrote its labels and record, then lost the status write."""
    record = RollbackRecord(
        rollout="r", fingerprint="fp", at=NOW - 5, reason="2 consecutive failing evaluations", numbers={"effect": 0.85}
    )
    barred = gating.Eligibility(False, "rolled back for fingerprint fp: ...", "fp")
    for state in (ENABLING, ANALYZING, PROMOTED):
        step = gating.advance(
            NodeStatus(state, since=1.0), barred, gating.PodSummary([], {}, True, []), None, NOW, False, record
        )
        assert step.status.state == ROLLED_BACK and step.status.reason == record.reason
        assert step.status.changed_at == NOW - 5 and step.status.numbers == {"effect": 0.85} and step.action is None
    # cleared (new fingerprint, retryAfter, a person): the record no longer decides
    step = gating.advance(
        NodeStatus(ANALYZING, since=1.0), barred, gating.PodSummary([], {}, True, []), None, NOW, True, None
    )
    assert step.status.state == DISABLED


def test_a_node_whose_pods_are_evicted_and_not_yet_replaced_is_not_analyzing():
    el = gating.Eligibility(True, "ok", "fp")
    enabling = gating.enable(NodeStatus(ELIGIBLE, since=1.0), NOW).status
    old = [gating.PodFacts(f"p{i}", NOW - 50, None, None, True, False) for i in range(2)]
    restarting = gating.advance(enabling, el, gating.summarize_pods(old, NOW), None, NOW + 2, True).status
    assert restarting.state == ENABLING and restarting.numbers[gating.RESTARTED_PODS] == 2
    gone = gating.advance(
        restarting, el, gating.summarize_pods([], NOW), None, NOW + 3, True
    ).status  # evicted, not yet replaced
    assert gone.state == ENABLING and "replacements of 2 restarted" in gone.reason
    back = [gating.PodFacts("p9", NOW + 4, "1", None, True, False)]
    unseen = gating.advance(gone, el, gating.summarize_pods(back, NOW), None, NOW + 5, True).status
    assert unseen.state == ENABLING and "waiting for the agent to see flag 1 in the processes of p9" in unseen.reason
    back = [replace(back[0], delivered="1")]
    analyzing = gating.advance(gone, el, gating.summarize_pods(back, NOW), None, NOW + 5, True).status
    assert analyzing.state == ANALYZING and gating.RESTARTED_PODS not in analyzing.numbers
    # a node without serving pods has nothing to wait for
    empty = gating.advance(enabling, el, gating.summarize_pods([], NOW), None, NOW + 2, True).status
    assert empty.state == ANALYZING
    # a bare pod (no controller) is not recreated: once restarted, the node serves nothing, and that is done
    bare = [replace(old[0], controlled=False)]
    restarting = gating.advance(enabling, el, gating.summarize_pods(bare, NOW), None, NOW + 2, True).status
    assert gating.advance(restarting, el, gating.summarize_pods([], NOW), None, NOW + 3, True).status.state == ANALYZING


@pytest.mark.parametrize(
    "pod",
    [
        gating.PodFacts("p1", NOW + 2, None, None, True, False, injected=False),  # admitted without the webhook
        gating.PodFacts(
            "p1", NOW + 2, "0", "agent says 0: not enabled", True, False, transient=True
        ),  # stale agent view
    ],
)
def test_stray_pods_are_restarted_not_waited_for_nor_a_refusal(pod):
    summary = gating.summarize_pods([pod], NOW)
    assert summary.retry == ["p1"] and summary.new_flags == {} and summary.refused == []
    el = gating.Eligibility(True, "ok", "fp")
    step = gating.advance(NodeStatus(ENABLING, since=1.0, changed_at=NOW), el, summary, None, NOW + 3, True)
    assert step.status.state == ENABLING and "stale agent view" in step.status.reason
    injected = gating.summarize_pods([gating.PodFacts("p2", NOW + 9, "1", None, True, False, delivered="1")], NOW)
    assert gating.advance(step.status, el, injected, None, NOW + 10, True).status.state == ANALYZING
    # a '0' from the serving image's own stack is a refusal: rolled back, sticky
    refused = gating.summarize_pods([gating.PodFacts("p3", NOW + 9, "0", "not capable", True, False)], NOW)
    assert (
        refused.refused and gating.advance(step.status, el, refused, None, NOW + 10, True).status.state == ROLLED_BACK
    )

    # not ready yet: not restarted yet either, but never taken for a node whose pods run flag 1
    starting = gating.summarize_pods(
        [replace(pod, ready=False), gating.PodFacts("p4", NOW + 9, "1", None, True, False, delivered="1")], NOW
    )
    assert starting.retry == [] and starting.starting == ["p1"] and starting.new_flags == {"p4": "1"}
    waiting = gating.advance(step.status, el, starting, None, NOW + 10, True).status
    assert waiting.state == ENABLING and "to start, to restart them" in waiting.reason


def test_a_pod_waiting_for_its_images_proof_is_neither_a_refusal_nor_restarted_until_the_proof_is_there():
    """Self-tests in serving images: a new image's pod gets '0' until its node proves that image; the node keeps
    enabling (never RolledBack for it), and once the proof is there the pod is restarted to get '1'."""
    waiting = gating.PodFacts("p1", NOW + 2, "0", "agent says 0: this pod runs sha256:b..", True, False, unproved=True)
    summary = gating.summarize_pods([waiting], NOW)
    assert summary.unproved == ["p1"] and summary.refused == [] and summary.retry == [] and summary.new_flags == {}
    el = gating.Eligibility(True, "ok", "fp")
    enabling = NodeStatus(ENABLING, since=1.0, changed_at=NOW)
    step = gating.advance(enabling, el, summary, None, NOW + 3, True).status
    assert step.state == ENABLING and "waiting for the self-tests of the images of 1 serving pods" in step.reason
    proved = gating.summarize_pods([replace(waiting, unproved=False, transient=True)], NOW)
    assert proved.retry == ["p1"] and proved.unproved == []


# ---------------------------------------------------------------- hostile numbers in records (issue 34)


@pytest.mark.parametrize("junk", [math.nan, math.inf, -math.inf, "x", "NaN", None, [1], True])
def test_pod_summaries_and_restarts_never_fail_on_a_non_finite_time(junk):
    pods = [PodFacts("p1", NOW - 5, None, None, True, False)]
    assert gating.summarize_pods(pods, junk).old == []  # read as no change: nothing to restart
    assert gating.restart_due(NodeStatus(ENABLING, changed_at=junk), NOW, 5) is False


@pytest.mark.parametrize("junk", [math.nan, math.inf, "x", "NaN", -3, None, {"a": 1}, pytest.param(10**400, id="huge")])
def test_an_enabling_node_with_a_junk_restart_count_reads_it_as_none(junk):
    el = Eligibility(True, "ok", "fp")
    enabling = NodeStatus(ENABLING, since=1.0, changed_at=NOW - 10, numbers={gating.RESTARTED_PODS: junk})
    old = [PodFacts("p1", NOW - 50, None, None, True, False)]
    assert (
        gating.advance(enabling, el, gating.summarize_pods(old, NOW - 10), None, NOW, True).status.numbers[
            gating.RESTARTED_PODS
        ]
        == 1
    )
    assert gating.advance(enabling, el, gating.summarize_pods([], NOW - 10), None, NOW, True).status.state == ANALYZING


def test_a_status_entry_of_junk_reads_as_defaults():
    s = NodeStatus.from_dict(
        {
            "state": "Enabling",
            "since": "x",
            "changedAt": "NaN",
            "reason": 7,
            "numbers": "x",
            "holdout": "yes",
            "fingerprint": ["fp"],
        }
    )
    assert s == NodeStatus(ENABLING, "", 0.0, None, None, False, {})
    assert NodeStatus.from_dict({"since": math.nan, "changedAt": math.inf}) == NodeStatus()
    assert NodeStatus.from_dict("x") == NodeStatus()  # type: ignore[arg-type]


def test_a_rollback_records_non_finite_time_is_never_copied():
    record = RollbackRecord.model_construct(rollout="r", fingerprint="fp", at=math.nan, reason="2 failing", numbers={})
    barred = gating.Eligibility(False, "rolled back", "fp")
    step = gating.advance(
        NodeStatus(PROMOTED, since=1.0), barred, gating.PodSummary([], {}, True, []), None, NOW, False, record
    )
    assert step.status.state == ROLLED_BACK and step.status.changed_at == NOW
    # issue 44: such a record still says the node was rolled back: it reads so, its time unknown (no retryAfter)
    for junk in ("NaN", "Infinity", "-Infinity", "1e999"):
        raw = f'{{"fingerprint": "fp", "at": {junk}, "reason": "x", "numbers": {{"effect": NaN}}}}'
        read, why = gating.parse_rollback({contract.ANNOTATION_ROLLBACK: raw})
        assert why is None and read.at is None and read.reason == "x" and read.numbers == {"effect": None}
        barred = gating.rolled_back_for(read, "fp", NOW, retry_after=60)
        assert (
            barred
            == "rolled back for fingerprint fp: x (its time unreadable: only a person or a new fingerprint clears it)"
        )
    _, why = gating.parse_rollback({contract.ANNOTATION_ROLLBACK: '{"fingerprint": "fp", "at": "NaN"}'})
    assert why.startswith("the rollback record annotation field at")  # a string is no number: unreadable


@pytest.mark.parametrize("state", [ENABLING, ANALYZING, PROMOTED])
@pytest.mark.parametrize("chosen,runs", [("1", "0"), ("0", "1")])
def test_a_flag_on_node_whose_processes_run_another_flag_is_rolled_back_and_says_so(state, chosen, runs):
    """What runs, not what was meant: a serving process seen running another flag than its preflight chose
    (an empty value from a kubelet that ignores fileKeyRef, a command that sets its own) rolls its flag-on
    node back, sticky for its fingerprint, with the pod and what was seen in the record."""
    el = gating.Eligibility(True, "ok", "fp")
    seen = f"container sglang runs {runs} where its preflight chose {chosen}"
    pod = gating.PodFacts("p1", NOW + 1, chosen, None, True, False, delivered=runs, mismatch=seen)
    prev = NodeStatus(state, since=1.0, changed_at=NOW, fingerprint="fp")
    step = gating.advance(prev, el, gating.summarize_pods([pod], NOW), None, NOW + 5, True)
    assert step.action == "rollback" and step.status.state == ROLLED_BACK
    assert step.status.reason == f"flag delivery mismatch: p1: {seen}"
    assert step.status.numbers[gating.MISMATCH] == [f"p1: {seen}"]
    # the same pod on a node that is not on is the eligibility's matter (plan.delivery_eligibility), not a rollback
    off = gating.advance(NodeStatus(ELIGIBLE, since=1.0), el, gating.summarize_pods([pod], NOW), None, NOW + 5, True)
    assert off.action is None and off.status.state == ELIGIBLE
