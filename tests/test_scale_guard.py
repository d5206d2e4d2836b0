"""The reconcile's cost at a fixed fleet size, counted rather than timed (bench/scale.py times it): how many
plans one reconcile makes, how many times each node is visited, and how many JSON readings are parsed.
A plan that starts visiting nodes once per node (a quadratic fleet) or re-parsing every node's report on
every reconcile fails here, on any machine.

And the reading cache (records.READINGS) changes no decision: a plan from a warm cache equals the plan
from a cleared one, over random histories."""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gluon_common import contract
from gluon_operator import gating, records
from gluon_operator import plan as planner
from gluon_operator.gating import Verdict
from tests.test_plan import Fleet

NODES = 40
PODS_PER_NODE = 2


def counting(monkeypatch: Any, calls: Counter, module: Any, name: str) -> None:
    original: Callable[..., Any] = getattr(module, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[name] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)


def counted_plan(monkeypatch: Any, fleet: Fleet, verdicts: dict[str, Verdict] | None = None) -> Counter:
    calls: Counter = Counter()
    for module, name in (
        (planner, "plan"),
        (planner, "node_work"),
        (planner, "node_plan"),
        (planner, "selects_node"),
        (gating, "eligibility"),
        (records, "_read_json"),
    ):
        counting(monkeypatch, calls, module, name)
    fleet.execute(planner.plan(planner.rollout_view(fleet.rollout), fleet.world(), verdicts or {}, None, fleet.now))
    fleet.now += 10
    monkeypatch.undo()
    return calls


def test_one_reconcile_visits_each_node_a_fixed_number_of_times_and_parses_only_what_changed(monkeypatch):
    records.READINGS.clear()
    fleet = Fleet(NODES, pods_per_node=PODS_PER_NODE, strategy={"canaryNodes": 1, "maxParallel": 2})
    per_node = {"node_work": NODES, "node_plan": NODES, "selects_node": NODES, "eligibility": NODES}
    first = counted_plan(monkeypatch, fleet)
    # Every node's report is new text: one parse each; no record, rollback or preflight verdict exists yet. The
    # agents' delivery observations are one text (no injected pod runs yet): one parse for all.
    assert first == Counter(plan=1, **per_node, _read_json=NODES + 1)
    # The first plan wrote a record on every node: one text shared by the 39 Eligible nodes (the same
    # fields, the same `since`), one for the canary, Enabling.
    assert counted_plan(monkeypatch, fleet) == Counter(plan=1, **per_node, _read_json=2)
    # The canary's record gained its restarted-pod count, its pods came back with a preflight verdict (one text
    # for both), and its agent saw them run it (its delivery observation): 3 new readings. The plan moves it
    # on to Analyzing.
    assert counted_plan(monkeypatch, fleet) == Counter(plan=1, **per_node, _read_json=3)
    assert counted_plan(monkeypatch, fleet) == Counter(plan=1, **per_node, _read_json=1)  # the Analyzing record
    for _ in range(2):  # steady: nothing new to read
        assert counted_plan(monkeypatch, fleet) == Counter(plan=1, **per_node)


EVENTS = st.sampled_from(["none", "skip", "fail", "pass", "verdict-pass", "verdict-fail", "garble"])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 5), history=st.lists(st.tuples(st.integers(0, 4), EVENTS), min_size=1, max_size=12))
def test_the_reading_cache_changes_no_plan(n, history):
    fleet = Fleet(n, pods_per_node=1, strategy={"canaryNodes": 1, "maxParallel": 2})
    for node_no, event in history:
        node = f"n{node_no % n}"
        verdicts: dict[str, Verdict] = {}
        if event == "skip":
            fleet.label(node, contract.LABEL_SKIP, "true")
        elif event in ("fail", "pass"):
            fleet.label(node, contract.LABEL_SELFTEST, event)
        elif event == "garble":  # a report an agent of another version (or a person) wrote badly
            fleet.nodes[node]["metadata"]["annotations"][contract.ANNOTATION_REPORT] = '{"probe": 3}'
        elif event.startswith("verdict"):
            verdicts = {m: Verdict(event.split("-")[1], "v", {}) for m in fleet.nodes}
        view, world = planner.rollout_view(fleet.rollout), fleet.world()
        warm = planner.plan(view, world, verdicts, None, fleet.now).to_dict()
        records.READINGS.clear()
        cold = planner.plan(view, world, verdicts, None, fleet.now).to_dict()
        assert warm == cold
        fleet.step(verdicts)
