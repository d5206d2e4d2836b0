"""States written by the operator of 2026-12-02 (tests/judge_states.py recorded them, before the judge's state
became a typed model) are read by today's judge: the next look gives the same judgement, numbers and state."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest

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
