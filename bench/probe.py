"""Wall time of `gluon-agent probe` on this machine. Prints JSON.

python bench/probe.py --json [--runs 5] [--python PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

from gluon_agent.probe import probe


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", action="store_true", help="print JSON (the only output format)")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--python", default=None)
    args = parser.parse_args()
    walls, report = [], {}
    for _ in range(args.runs):
        started = time.perf_counter()
        report = probe(python=args.python)
        walls.append(time.perf_counter() - started)
    print(
        json.dumps(
            {
                "bench": "probe",
                "machine": f"{platform.node()} {platform.machine()} cpus={os.cpu_count()}",
                "runs": args.runs,
                "wall_seconds_median": round(statistics.median(walls), 3),
                "wall_seconds_max": round(max(walls), 3),
                "check_seconds": {k: v["seconds"] for k, v in report["checks"].items()},
                "capable": report["capable"],
                "aiter_installed": report["aiter_version"] is not None,
                "target_seconds": 2.0,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
