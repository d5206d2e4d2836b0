"""SIMULATION of a fleet proving a new serving image in waves: the operator's own pure planner
(operator/gluon_operator/proving.py) looked at every reconcile, each self-test pod taking a start overhead plus
a self-test time drawn from the records of docs/benchmarks/ (no cluster, no GPU). Prints JSON: per fleet size,
the time from the new image to its first node proved and to all nodes proved, the largest wave, and the API
writes per node (pod create, pod delete, node patch).

    python bench/proving_waves.py [--nodes 100 1000 5000] [--parallel 10%] [--reconcile 10] [--seed 1]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "operator"), str(ROOT / "common")]

from gluon_common.report import NodeProofs  # noqa: E402
from gluon_operator import proving  # noqa: E402

DIGEST = "sha256:" + "b" * 64
STACK = proving.Stack(DIGEST, "registry.example/sglang@" + DIGEST, "cfg", "{}")
PASS = json.dumps({"probe": {"capable": True}, "selftest": {"result": "pass", "gpus": [{"index": 0}]}})


def run(
    nodes: int,
    parallel: int | str,
    reconcile: float,
    start_s: tuple[float, float],
    test_s: tuple[float, float],
    seed: int,
) -> dict:
    rng = random.Random(seed)
    limits = proving.Limits(max_parallel=parallel)
    demands = [proving.Demand(f"n{i:05d}", STACK) for i in range(nodes)]
    proofs: dict[str, NodeProofs] = {}
    pods: dict[str, tuple[proving.ProvingPod, float]] = {}  # name -> (pod, when it ends)
    writes = {"create": 0, "delete": 0, "node": 0}
    now, first, widest = 0.0, None, 0
    while len(proofs) < nodes:
        seen = [
            pod if now < ends else proving.ProvingPod(**{**pod.__dict__, "terminated": (0, "Completed", PASS)})
            for pod, ends in pods.values()
        ]
        plan = proving.plan(demands, seen, proofs, now, limits)
        for node, new in plan.record.items():
            proofs[node] = proving.merged(proofs.get(node, NodeProofs()), new)
            writes["node"] += 1
            first = now if first is None else first
        for name in plan.delete:
            pods.pop(name)
            writes["delete"] += 1
        for demand in plan.create:
            name = proving.pod_name(demand.node, demand.stack)
            pod = proving.ProvingPod(name, demand.node, DIGEST, "cfg", now)
            pods[name] = (pod, now + rng.uniform(*start_s) + rng.uniform(*test_s))
            writes["create"] += 1
        widest = max(widest, len(pods))
        now += reconcile
    return {
        "nodes": nodes,
        "first_proved_s": first,
        "all_proved_s": now - reconcile,
        "all_proved_s_per_100_nodes": round((now - reconcile) / nodes * 100, 1),
        "widest_wave": widest,
        "api_writes_per_node": {k: round(v / nodes, 3) for k, v in writes.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[100, 1000, 5000])
    parser.add_argument("--parallel", default="10%", help="a count or a percentage of the nodes (the chart's default)")
    parser.add_argument("--reconcile", type=float, default=10.0, help="seconds between the operator's looks")
    parser.add_argument("--start", type=float, nargs=2, default=(5.0, 20.0), help="pod start overhead, s (min max)")
    parser.add_argument("--test", type=float, nargs=2, default=(60.0, 120.0), help="self-test time, s (min max)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    parallel: int | str = args.parallel if args.parallel.endswith("%") else int(args.parallel)
    results = [run(n, parallel, args.reconcile, tuple(args.start), tuple(args.test), args.seed) for n in args.nodes]
    print(
        json.dumps(
            {
                "simulation": "SIMULATION: the operator's pure planner; pod times drawn, no cluster, no GPU",
                "parallel": args.parallel,
                "reconcile_s": args.reconcile,
                "start_s": args.start,
                "test_s": args.test,
                "results": results,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
