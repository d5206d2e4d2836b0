"""The judge with few controls, with pods that switch late, and over a whole rollout (SIMULATION:
bench/judge.py's simulated samples, not a cluster). Only ours: the anchors have no control set.

    python bench/judge_controls.py --json [--runs 100] [--workers 2] [--quick]

study     the treated node against 1, 2, 3 and 7 controls: the issue's series (AR(1) wander on every
          node, phi 0.95 per 15 s step, sd 4%, with bench/judge.py's 5% tailed noise, outliers, missing
          samples and a scrape gap) and independent 5% noise; no change (harmless: the horizon and 2 h of
          guard mode) and a 10% regression (the horizon). Rollbacks counted as in bench/judge.py.
late      the treated node's pods run flag 1 U(3, 15) min after its label flipped (5% independent noise,
          7 controls, a 15% regression): judged with the samples split by flag (the default query) and
          blind to it (a query without the flag label: every sample after the flip counts as flag 1).
          A regression promoted (a pass before any rollback) is the bug this split fixes.
rollout   a whole rollout, holdoutNodes 0, canary 1, maxParallel 2, 10 and 50 nodes, every node x1.9 from
          its flip (a rollback is false, a pass is what completes it) at 5% independent noise and under
          the issue's AR(1) wander; each node judged every interval from its flip against the control
          group evaluation.control_group gives it from the rollout's node states (flag-0 nodes not
          enabled, or Promoted nodes steady since before its baseline, or since a shortened baseline where
          the rollout moved faster than one), minControls as the spec's default.
          Time to complete (all judged), and how many nodes were judged against how many controls of
          which flag. Promoted nodes are not judged again (no guard mode here).
"""

from __future__ import annotations

import argparse
import os
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor

import judge as bench
import numpy as np

from gluon_operator import analysis, evaluation, gating
from gluon_operator.analysis import JudgeConfig
from gluon_operator.evaluation import decide
from gluon_operator.spec import Analysis

GUARD_STUDY = 120  # 2 h of guard mode after the horizon on harmless runs (the counting)
DEFAULT_MIN_CONTROLS = Analysis().minControls
CONTROL_COUNTS = (1, 2, 3, 7)
ROLLOUT_EFFECT = 1.9  # every node's flag effect in the whole-rollout scenario (the demo's are x1.9..x2.7)


def study_cells(runs: int) -> list[bench.Scenario]:
    out, seed = [], 500000
    for controls in CONTROL_COUNTS:
        for family, noise in (("ar1_every", 0.05), ("iid", 0.05)):
            for name, effect in (("none", 1.0), ("regression_10pct", 0.9)):
                for _ in range(runs):
                    seed += 1
                    out.append(bench.Scenario(family, name, noise, effect, seed, controls))
    return out


def study_one(s: bench.Scenario) -> int | None:
    sim = bench.simulate(s, guard=s.harmless)
    return bench.ours(sim, bench.HORIZON + (GUARD_STUDY if s.harmless else 0), flags=True)


def late_one(s: bench.Scenario) -> dict:
    sim = bench.simulate(s, guard=False)
    return {
        "split": bench.ours(sim, bench.HORIZON, flags=True, until_pass=True),
        "blind": bench.ours(sim, bench.HORIZON, flags=False, until_pass=True),
    }


def study(runs: int, workers: int) -> dict:
    todo = study_cells(runs)
    with ProcessPoolExecutor(workers) as pool:
        results = list(pool.map(study_one, todo, chunksize=max(1, runs // 8)))
    cells: dict[str, list[int | None]] = {}
    for s, k in zip(todo, results):
        cells.setdefault(f"{s.controls}_controls:{s.key}", []).append(k)
    out = {}
    for key, ks in cells.items():
        rolled = [k for k in ks if k is not None]
        row = {
            "runs": len(ks),
            "rollback_rate": len(rolled) / len(ks),
            "within_10_intervals": sum(k <= 10 for k in rolled) / len(ks),
            "within_horizon": sum(k <= bench.HORIZON for k in rolled) / len(ks),
        }
        out[key] = row
    return out


def late(runs: int, workers: int) -> dict:
    todo = [bench.Scenario("iid", "regression_15pct", 0.05, 0.85, 700000 + i, switch_late=True) for i in range(runs)]
    with ProcessPoolExecutor(workers) as pool:
        results = list(pool.map(late_one, todo, chunksize=max(1, runs // 8)))
    out = {}
    for mode in ("split", "blind"):
        ks = [r[mode] for r in results]
        out[mode] = {
            "runs": runs,
            "rolled_back": sum(k is not None and k > 0 for k in ks) / runs,
            "promoted": sum(k is not None and k < 0 for k in ks) / runs,
            "undecided": sum(k is None for k in ks) / runs,
        }
    return out


def rollout_one(args: tuple[int, str, int]) -> dict:
    """One whole rollout of `nodes` nodes (canary 1, maxParallel 2, holdoutNodes 0), every node harmless."""
    nodes, family, seed = args
    horizon = 30 * nodes  # intervals the series lasts: far more than any rollout here needs
    s = bench.Scenario(
        family, "none", 0.05, 1.0, seed, nodes - 1
    )  # flag-0 speed; each node's x1.9 from its flip, below
    rng_guard = bench.GUARD_INTERVALS
    bench.GUARD_INTERVALS = horizon  # a series long enough for the whole rollout
    try:
        sim = bench.simulate(s, guard=True)
    finally:
        bench.GUARD_INTERVALS = rng_guard
    t, names = sim["t"], [f"n{i:02d}" for i in range(nodes)]
    cfg = JudgeConfig(tolerance=bench.TOLERANCE, confidence=0.95, min_samples=5, min_controls=DEFAULT_MIN_CONTROLS)
    warmup, baseline = bench.WARMUP_INTERVALS * bench.PER_INTERVAL * bench.STEP, bench.BASELINE * bench.STEP
    statuses = {n: gating.NodeStatus(gating.ELIGIBLE) for n in names}
    streaks: dict[str, int] = {}
    judged_with: list[tuple[int, int, str]] = []
    shortened: dict[str, bool] = {}  # (control flag, controls, verdict) at each node's decision
    enable_at: dict[str, float] = {}
    start = sim["enable"]
    interval = bench.PER_INTERVAL * bench.STEP
    order = iter(names)
    now, done = start, None
    for step in range(horizon):
        now = start + step * interval
        in_flight = [n for n, st in statuses.items() if st.state == gating.ANALYZING]
        promoted = sum(st.state == gating.PROMOTED for st in statuses.values())
        room = (1 if promoted == 0 else 2) - len(in_flight)
        for _ in range(max(room, 0)):
            node = next(order, None)
            if node is None:
                break
            statuses[node] = gating.NodeStatus(gating.ANALYZING, changed_at=now)
            enable_at[node] = now
        # the flag each node's samples came from: 1 from its flip on (the pods restart at once here)
        on = {n: (t >= enable_at[n]) if n in enable_at else np.zeros(len(t), bool) for n in names}
        analysing = [n for n, st in statuses.items() if st.state == gating.ANALYZING]
        if not analysing and next(iter([n for n in names if statuses[n].state == gating.ELIGIBLE]), None) is None:
            done = now
            break
        needing = [
            statuses[n].changed_at
            for n in analysing
            if not (statuses[n].numbers.get("sequential") or {}).get("baseline")
        ]
        lo_t = min(needing) - baseline if needing else now - bench.OURS_WINDOW
        lo, hi = np.searchsorted(t, lo_t), np.searchsorted(t, now, side="right")
        panel = analysis.Panel(
            t[lo:hi],
            {n: sim["speed"][i, lo:hi] * np.where(on[n][lo:hi], ROLLOUT_EFFECT, 1.0) for i, n in enumerate(names)},
            {n: np.column_stack([sim["running"][i, lo:hi], sim["usage"][i, lo:hi]]) for i, n in enumerate(names)},
            {n: np.where(on[n][lo:hi], analysis.FLAG_ON, analysis.FLAG_OFF) for n in names},
        )
        refs: dict = {}
        for node in analysing:
            st = statuses[node]
            state = st.numbers.get("sequential")
            flag, controls, seconds = evaluation.control_group(statuses, node, baseline, now, state, cfg.min_controls)
            key = (flag, tuple(controls))
            if key not in refs:
                refs[key] = analysis.reference(panel, controls, cfg, {c: float(flag) for c in controls})
            j = analysis.judge(panel, refs[key], node, st.changed_at, warmup, now, seconds, cfg, state)
            d = decide(j, streaks.get(node, 0), None, now, bench.OURS_CONSECUTIVE, "hold", 1e9)
            streaks[node] = d.streak
            numbers = {"sequential": j.state}
            shortened[node] = seconds < baseline
            if d.verdict == "pass":
                statuses[node] = gating.NodeStatus(gating.PROMOTED, changed_at=st.changed_at, numbers=numbers)
                judged_with.append((flag, j.n_controls, "pass"))
            elif d.verdict == "fail":
                statuses[node] = gating.NodeStatus(gating.ROLLED_BACK, changed_at=now, numbers=numbers)
                judged_with.append((flag, j.n_controls, "fail"))
            else:
                statuses[node] = gating.NodeStatus(gating.ANALYZING, changed_at=st.changed_at, numbers=numbers)
    states = Counter(st.state for st in statuses.values())
    return {
        "minutes": None if done is None else (done - start) / 60,
        "promoted": states[gating.PROMOTED],
        "rolled_back": states[gating.ROLLED_BACK],
        "judged_with": judged_with,
        "shortened_baselines": sum(shortened.values()),
    }


def rollout(runs: int, workers: int, sizes: tuple[int, ...] = (10, 50)) -> dict:
    out = {}
    for family in ("iid", "ar1_every"):
        for nodes in sizes:
            todo = [(nodes, family, 800000 + 1000 * nodes + i) for i in range(runs)]
            with ProcessPoolExecutor(workers) as pool:
                results = list(pool.map(rollout_one, todo))
            minutes = [r["minutes"] for r in results if r["minutes"] is not None]
            by_controls = Counter(
                f"flag {f}, {min(c, 10)}{'+' if c >= 10 else ''} controls"
                for r in results
                for f, c, _ in r["judged_with"]
            )
            out[f"{nodes}_nodes:{family}"] = {
                "runs": runs,
                "completed": len(minutes) / runs,
                "minutes_to_complete_median": float(np.median(minutes)) if minutes else None,
                "minutes_to_complete_max": float(max(minutes)) if minutes else None,
                "false_rollbacks_per_node": sum(r["rolled_back"] for r in results) / (runs * nodes),
                "runs_with_a_false_rollback": sum(r["rolled_back"] > 0 for r in results) / runs,
                "nodes_judged_on_a_shortened_baseline_per_run": sum(r["shortened_baselines"] for r in results) / runs,
                "nodes_judged_by_controls": dict(sorted(by_controls.items())),
                "fewest_controls_at_a_decision": min(
                    (c for r in results for _, c, _ in r["judged_with"]), default=None
                ),
            }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print JSON (the only output format)")
    parser.add_argument("--runs", type=int, default=100, help="runs per cell (the whole rollouts: a fifth of it)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--quick", action="store_true", help="a few runs of everything, for tests")
    parser.add_argument("--only", choices=("study", "late", "rollout"), action="append", help="run only these parts")
    args = parser.parse_args()
    started = time.monotonic()
    runs = 2 if args.quick else args.runs
    parts = args.only or ["study", "late", "rollout"]
    report: dict = {}
    if "study" in parts:
        report["study"] = study(runs, args.workers)
    if "late" in parts:
        report["late"] = late(runs, args.workers)
    if "rollout" in parts:
        report["rollout"] = rollout(max(1, runs // 5), args.workers, (10,) if args.quick else (10, 50))
    report["setup"] = {
        "runs_per_cell": runs,
        "guard_intervals_on_harmless_study_runs": GUARD_STUDY,
        "min_controls_in_rollouts": DEFAULT_MIN_CONTROLS,
        "tolerance": bench.TOLERANCE,
        "baseline_samples": bench.BASELINE,
        "step_seconds": bench.STEP,
        "simulation": "SIMULATION (bench/judge_controls.py docstring)",
    }
    bench.print_report(report, "judge_controls.py", started)


if __name__ == "__main__":
    main()
