"""The control groups from one sorted index of the fleet (evaluation.ControlIndex): the same groups as a
scan of every node for every judged node wherever a group fits MAX_CONTROLS, its earliest steady members
where it does not, and a bounded number of distinct groups at fleet scale (one reference each)."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from gluon_operator import evaluation, gating

NOW = 1_800_000_000.0
BASELINE = 1200.0


def scanned_group(statuses, node, baseline_seconds, now, have=None, min_controls=1):
    """The control group as the operator chose it before the index: every node scanned for every judged
    node (evaluation.control_group up to 9840c09), uncapped."""
    start = (statuses[node].changed_at or now) - baseline_seconds
    off = sorted(
        n
        for n, s in statuses.items()
        if n != node and s.state == gating.ELIGIBLE and (s.changed_at is None or s.changed_at <= start)
    )
    on = sorted(
        n
        for n, s in statuses.items()
        if n != node and s.state == gating.PROMOTED and evaluation._switched_at(s) <= start
    )
    groups = {0: off, 1: on}
    changed = statuses[node].changed_at or now
    kept = evaluation._kept_flag(have, changed)
    if kept is None and max(len(off), len(on)) < min_controls:
        switches = sorted(
            (evaluation._switched_at(s), n)
            for n, s in statuses.items()
            if n != node and s.state == gating.PROMOTED and evaluation._switched_at(s) < changed
        )
        if len(switches) >= min_controls:
            begins = max(switches[min_controls - 1][0], changed - baseline_seconds)
            return 1, sorted(n for at, n in switches if at <= begins), changed - begins
    flag = kept if kept is not None else (1 if len(on) > len(off) else 0)
    if kept == 1 and isinstance(have, dict) and evaluation.finite_number(have.get("baselineSeconds")):
        shorter = float(have["baselineSeconds"])
        switched = [
            n
            for n, s in statuses.items()
            if n != node and s.state == gating.PROMOTED and evaluation._switched_at(s) <= changed - shorter
        ]
        return 1, sorted(switched), shorter
    return flag, groups[flag], float(baseline_seconds)


STATES = (gating.ELIGIBLE, gating.PROMOTED, gating.ANALYZING, gating.ENABLING, gating.INELIGIBLE)
# times on a coarse grid, so that ties (and a control steady exactly at a baseline's start) happen
offsets = st.one_of(st.none(), st.integers(0, 40).map(lambda k: NOW - 150.0 * k))


@st.composite
def fleets(draw, most: int = 40):
    statuses = {}
    for i in range(draw(st.integers(1, most))):
        state = draw(st.sampled_from(STATES))
        changed = draw(offsets)
        switched = draw(st.one_of(st.none(), offsets))
        numbers = {"sequential": {"switchedAt": switched}} if switched is not None else {}
        statuses[f"n{i:03d}"] = gating.NodeStatus(state, changed_at=changed, numbers=numbers)
    judged = [n for n, s in statuses.items() if s.state in (gating.ANALYZING, gating.PROMOTED)]
    return statuses, judged


def kept_states(draw, statuses, node):
    changed = statuses[node].changed_at or NOW
    return draw(
        st.sampled_from(
            [
                None,
                {"changedAt": changed, "controlFlag": 0, "baselineSeconds": BASELINE},
                {"changedAt": changed, "controlFlag": 1, "baselineSeconds": 600.0},
                {"changedAt": changed - 1, "controlFlag": 1},
            ]
        )
    )


@settings(max_examples=200, deadline=None)
@given(st.data(), fleets(), st.integers(1, 5))
def test_the_index_gives_the_scanned_group_wherever_it_fits(data, fleet, min_controls):
    statuses, judged = fleet
    index = evaluation.ControlIndex.of(statuses)
    for node in judged:
        have = kept_states(data.draw, statuses, node)
        expected = scanned_group(statuses, node, BASELINE, NOW, have, min_controls)
        assert evaluation.control_group(statuses, node, BASELINE, NOW, have, min_controls, index) == expected
        assert evaluation.control_group(statuses, node, BASELINE, NOW, have, min_controls) == expected


@settings(max_examples=40, deadline=None)
@given(st.data(), fleets(most=160), st.integers(1, 5))
def test_a_group_over_the_bound_keeps_its_flag_and_its_earliest_steady_members(data, fleet, min_controls):
    """With the bound at 5: the flag and baseline are the scanned group's (sizes compared whole), the
    members a subset of it, and each member steady no later than any member left out."""
    statuses, judged = fleet
    index = evaluation.ControlIndex.of(statuses)
    bound = 5
    for node in judged:
        have = kept_states(data.draw, statuses, node)
        flag, everyone, baseline = scanned_group(statuses, node, BASELINE, NOW, have, min_controls)
        changed = statuses[node].changed_at or NOW
        chosen = index.steady(flag, changed - baseline, node, at_most=bound)
        assert set(chosen) <= set(everyone) and len(chosen) == min(bound, len(everyone))
        key = {0: lambda n: statuses[n].changed_at or -math.inf, 1: lambda n: evaluation._switched_at(statuses[n])}
        left_out = set(everyone) - set(chosen)
        assert all(key[flag](c) <= key[flag](o) for c in chosen for o in left_out)
        full = evaluation.control_group(statuses, node, BASELINE, NOW, have, min_controls, index)
        assert full[0] == flag and full[2] == baseline


def test_guard_mode_over_3000_nodes_builds_a_bounded_number_of_groups():
    """Every node Promoted at its own time over 50 minutes, all judged (guard mode): each group holds at
    most MAX_CONTROLS nodes, and nodes steady past the bound share one group, so the references built
    are at most MAX_CONTROLS + 1 (a scan gave each node its own group of every node before it: 2990
    references over up to 2400 controls each)."""
    statuses = {
        f"gpu-{i:05d}": gating.NodeStatus(
            gating.PROMOTED, changed_at=NOW - 3600 + i - 30, numbers={"sequential": {"switchedAt": NOW - 3600 + i}}
        )
        for i in range(3000)
    }
    index = evaluation.ControlIndex.of(statuses)
    groups = {n: evaluation.control_group(statuses, n, BASELINE, NOW, None, 3, index) for n in statuses}
    assert max(len(controls) for _, controls, _ in groups.values()) == evaluation.MAX_CONTROLS
    distinct = {(flag, tuple(controls)) for flag, controls, _ in groups.values()}
    assert len(distinct) <= evaluation.MAX_CONTROLS + 1
    earliest = sorted(statuses, key=lambda n: evaluation._switched_at(statuses[n]))[: evaluation.MAX_CONTROLS]
    assert groups["gpu-02999"] == (1, sorted(earliest), BASELINE)


def test_ties_are_broken_by_a_spread_of_names_not_their_order():
    """600 eligible nodes that never changed: the flag-0 group is 64 of them spread over the fleet,
    the same for every judged node, not the first 64 names."""
    statuses = {f"gpu-{i:04d}": gating.NodeStatus(gating.ELIGIBLE) for i in range(600)}
    statuses |= {f"canary-{i}": gating.NodeStatus(gating.ANALYZING, changed_at=NOW - 600) for i in range(2)}
    groups = [evaluation.control_group(statuses, f"canary-{i}", BASELINE, NOW) for i in range(2)]
    assert groups[0] == groups[1] and groups[0][0] == 0 and len(groups[0][1]) == evaluation.MAX_CONTROLS
    numbers = sorted(int(n.split("-")[1]) for n in groups[0][1])
    assert numbers != list(range(evaluation.MAX_CONTROLS)) and numbers[-1] > 400
