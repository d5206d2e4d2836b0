"""One analysis look over a whole fleet in guard mode, without a cluster (SIMULATION: synthetic samples).
Prints JSON.

    python bench/guard_scale.py --json [--nodes 1000 --nodes 10000] [--groups-only]

A rollout where every node but the canaries was Promoted in the last 50 minutes, one every few seconds
(distinct switch times, the case where each node's steady flag-1 group differs), and two canaries in
Analyzing; 20 minutes of baseline, 15 s steps, 5% noise. Every Promoted and Analyzing node is judged (guard
mode), as evaluation.analyse does after its queries: the control groups (evaluation.control_group over one
ControlIndex), then one reference per distinct group and a judgement per node (evaluation.judge_fleet).
Two looks: the first (no kept state: every node's baseline is read) and the next (the kept state).

Measures per fleet size: CPU seconds of the control groups alone, of each look, the number of distinct
control groups (references built), and the largest group. --groups-only times the control groups only,
through the call that evaluation.control_group has had since the judge split by flag, so the same command
measures an earlier commit.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from clusterbench import provenance  # noqa: E402

from gluon_operator import evaluation, gating  # noqa: E402
from gluon_operator.spec import Analysis  # noqa: E402

NOW = 1_800_000_000.0
STEP = 15
BASELINE = 1200
PROMOTED_OVER = 3000  # seconds over which the Promoted nodes switched, ending 10 minutes ago
CANARIES = 2


def fleet(nodes: int) -> dict[str, gating.NodeStatus]:
    statuses = {}
    promoted = nodes - CANARIES
    for i in range(promoted):
        switched = NOW - 600 - PROMOTED_OVER + i * PROMOTED_OVER / max(1, promoted)
        numbers = {"sequential": {"switchedAt": switched}}
        statuses[f"gpu-{i:05d}"] = gating.NodeStatus(gating.PROMOTED, changed_at=switched - 30, numbers=numbers)
    for i in range(CANARIES):
        statuses[f"canary-{i}"] = gating.NodeStatus(gating.ANALYZING, changed_at=NOW - 600)
    return statuses


def samples(statuses: dict[str, gating.NodeStatus], seed: int) -> tuple[dict, dict]:
    """Decode speed per node (5% noise, x1.0 effect) and its flag code at every step since the baseline
    of the earliest flip."""
    rng = np.random.default_rng(seed)
    start = min(s.changed_at for s in statuses.values()) - BASELINE - 60
    times = np.arange(start, NOW + 1, STEP, dtype=float)
    speed, flags = {}, {}
    for name, status in statuses.items():
        values = 100.0 * (1 + 0.05 * rng.standard_normal(len(times)))
        switched = evaluation._switched_at(status) if status.state == gating.PROMOTED else status.changed_at
        codes = np.where(times >= switched, 1.0, 0.0)
        speed[name], flags[name] = np.column_stack([times, values]), np.column_stack([times, codes])
    return speed, flags


def groups_cpu(statuses: dict[str, gating.NodeStatus], judged: list[str], spec: Analysis) -> tuple[float, dict]:
    """The groups of every judged node, as evaluation.judge_fleet makes them (one index of the fleet per
    look), or where the index does not exist (an earlier commit), by the call it had."""
    began = time.process_time()
    index = evaluation.ControlIndex.of(statuses) if hasattr(evaluation, "ControlIndex") else None
    extra = (index,) if index else ()
    groups = {
        n: evaluation.control_group(statuses, n, spec.baselineSeconds, NOW, None, spec.minControls, *extra)
        for n in judged
    }
    return time.process_time() - began, groups


def one_size(nodes: int, groups_only: bool) -> dict:
    spec = Analysis(baselineSeconds=BASELINE, stepSeconds=STEP)
    statuses = fleet(nodes)
    judged = evaluation.judged_nodes(statuses)
    cpu, groups = groups_cpu(statuses, judged, spec)
    row = {
        "nodes": nodes,
        "judged": len(judged),
        "groups_cpu_seconds": round(cpu, 3),
        "distinct_groups": len({(flag, tuple(controls)) for flag, controls, _ in groups.values()}),
        "largest_group": max(len(controls) for _, controls, _ in groups.values()),
    }
    if groups_only:
        return row
    speed, flags = samples(statuses, seed=nodes)
    states: dict = {n: statuses[n].numbers.get("sequential") for n in judged}
    for look in ("first_look", "next_look"):
        judgements, used, cpu = evaluation.judge_fleet(statuses, judged, speed, {}, flags, states, NOW, spec)
        results = [j.result for j in judgements.values()]
        row[look] = {
            "cpu_seconds": round(cpu, 3),
            "controls_used": len(used),
            "verdicts": {r: results.count(r) for r in sorted(set(results))},
        }
        states = {n: j.state for n, j in judgements.items()}
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="print JSON (the only output format)")
    parser.add_argument("--nodes", type=int, action="append", help="fleet sizes (repeatable)")
    parser.add_argument("--groups-only", action="store_true", help="time the control groups only")
    args = parser.parse_args()
    rows = [one_size(n, args.groups_only) for n in args.nodes or (1000, 2000, 5000, 10000)]
    report = provenance("guard_scale", "guard_scale.py") | {
        "max_controls": getattr(evaluation, "MAX_CONTROLS", None),
        "deadline_seconds": evaluation.DEFAULT_DEADLINE_SECONDS,
        "results": rows,
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
