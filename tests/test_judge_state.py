"""States written by the operator of 2026-12-02 (tests/judge_states.py recorded them, before the judge's state
became a typed model) are read by today's judge: the next look gives the same judgement, numbers and state."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest

from gluon_operator import analysis
from tests import judge_states

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "judge_states.json").read_text())
LOOKS = [(name, entry["look"]) for name, recorded in FIXTURE.items() for entry in recorded["looks"]]


@functools.cache
def series(name: str) -> tuple[list, dict]:
    return judge_states.series(FIXTURE[name]["case"])


def entry(name: str, number: int) -> dict[str, Any]:
    return next(e for e in FIXTURE[name]["looks"] if e["look"] == number)


@pytest.mark.parametrize("name, number", LOOKS)
def test_a_recorded_state_gives_the_recorded_judgement(name, number):
    recorded, case = entry(name, number), FIXTURE[name]["case"]
    judgement = json.loads(
        json.dumps(judge_states.look(case, *series(name), recorded["now"], recorded["state"]).to_dict())
    )
    assert judgement["sequential"].pop("version") == 1  # the one key the recorded states did not have
    assert judgement == recorded["judgement"]


def test_the_fixture_covers_every_part_of_the_state():
    """Waiting for the switch, batch means past their fifth batch, placebos, no baseline, the node's own load
    fit and the controls', a state from before the flag split and an unreadable one (a fresh start)."""
    judged = [e["judgement"] for recorded in FIXTURE.values() for e in recorded["looks"]]
    states = [j["sequential"] for j in judged]
    assert any(s["switchedAt"] is None for s in states) and any(s["baseline"] is None for s in states)
    assert any((s["post"].get("bm") or {}).get("k", 0) >= 5 for s in states)
    assert {s["baseline"]["pooled"] for s in states if s["baseline"]} >= {0, 7}
    assert {j["result"] for j in judged} == {"pass", "fail", "inconclusive"}
    assert all(e["judgement"]["looks"] == 1 for e in FIXTURE["baseline_without_load_means"]["looks"])
    assert all("switchedAt" not in e["state"] for e in FIXTURE["without_switched_at"]["looks"][1:])


def test_every_recorded_state_restores_to_the_same_keys_and_values_by_readable_names():
    """The typed state reads every key of the states written before it (nothing dropped, nothing added but
    the version), and names what the short keys meant: `pn` is p_not_worse at the top level, the open batch's
    count under `bm`; `s` is the clip scale in the baseline, the post-flip sum, a batch sum under `bm`."""
    states = [e["judgement"]["sequential"] for recorded in FIXTURE.values() for e in recorded["looks"]]
    for state in states:
        restored = analysis.restore(state, state["changedAt"])
        assert analysis.judgement.rounded(restored.kept()) == {"version": 1} | state
    state = next(s for s in states if (s["post"]["bm"] or {}).get("k", 0) >= 5)
    restored = analysis.restore(state, state["changedAt"])
    assert restored.p_not_worse == state["pn"] and restored.post.batches.open_count == state["post"]["bm"]["pn"]
    assert restored.baseline.clip_scale == state["baseline"]["s"] and restored.post.total == state["post"]["s"]
    assert restored.post.batches.sum_of_means == state["post"]["bm"]["s"] and restored.post.batches.full_batches >= 5
    assert restored.baseline.samples == state["baseline"]["n"] and restored.baseline.placebos == state["baseline"]["pl"]


def test_a_state_of_another_flip_version_or_shape_starts_afresh():
    state = FIXTURE["pooled_load_fit"]["looks"][-1]["judgement"]["sequential"]
    at = state["changedAt"]
    assert analysis.restore(state, at) is not None and analysis.restore({"version": 1} | state, at) is not None
    assert analysis.restore(state, at + 1) is None  # another flip
    assert analysis.restore({"version": 2} | state, at) is None  # a layout this judge does not know
    broken = json.loads(json.dumps(state))
    broken["baseline"]["beta"] = broken["baseline"]["beta"][:1]  # beta for one gauge, cols for two
    assert analysis.restore(broken, at) is None
    for unreadable in (None, [], "x", {"changedAt": at}, {"changedAt": at, "post": "x"}, {"changedAt": "x"}):
        assert analysis.restore(unreadable, at) is None
    # a placebo row fitted on other gauges is left out; the rest of the state is kept
    odd = json.loads(json.dumps(state))
    odd["baseline"]["pl"]["c0"] = odd["baseline"]["pl"]["c0"][:2]
    assert set(analysis.restore(odd, at).baseline.placebos) == set(state["baseline"]["pl"]) - {"c0"}


def test_a_state_from_before_the_flag_split_counts_from_its_flip():
    state = FIXTURE["pooled_load_fit"]["looks"][2]["judgement"]["sequential"]
    legacy = {key: value for key, value in state.items() if key not in ("switchedAt", "version")}
    assert analysis.restore(legacy, state["changedAt"]).switched_at == state["changedAt"]
    waiting = json.loads(json.dumps(legacy))
    waiting["post"]["n"] = 0
    assert analysis.restore(waiting, state["changedAt"]).switched_at is None
