"""Start time of `kubectl gluon` (the console script's module, gluon_operator.kubectl_plugin.cli) in a fresh
interpreter, as a person's every `kubectl gluon ...` pays it. Prints JSON.

    python bench/plugin_start.py --json [--runs 10]

Each run starts `python -m gluon_operator.kubectl_plugin --version`: the interpreter, every import the
commands need (views, controls, the kubernetes client), argument parsing; no API call. Wall seconds and
the child's CPU seconds (user + system: what the plugin costs, apart from a busy machine's waiting), the
load average beside them, the slowest imports by `python -X importtime`, and whether a heavy module
(the operator's statistics stack, kopf, aiohttp) was imported. Target: < 0.5 s.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("scipy", "statsmodels", "numpy", "kopf", "aiohttp")
ENTRY = "gluon_operator.kubectl_plugin"


def environment() -> dict[str, str]:
    paths = [str(ROOT / p) for p in ("agent", "operator", "localcluster")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths + [os.environ.get("PYTHONPATH", "")])}


def one_start(env: dict[str, str]) -> tuple[float, float]:
    """(wall, cpu) seconds of one start."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", ENTRY, "--version"], check=True, capture_output=True, env=env)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def slowest_imports(env: dict[str, str], count: int = 6) -> tuple[list[dict[str, object]], list[str]]:
    """The top-level imports by cumulative microseconds, and the heavy modules imported at all."""
    probe = f"import sys, {ENTRY}.cli; print(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r})))"
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", probe], check=True, capture_output=True, text=True, env=env
    )
    rows = []
    for line in done.stderr.splitlines():
        parts = line.removeprefix("import time:").split("|")
        if len(parts) == 3 and parts[1].strip().isdigit():
            name = parts[2].rstrip()
            depth = (len(name) - len(name.lstrip())) // 2
            if depth <= 1:
                rows.append({"module": name.strip(), "cumulative_ms": round(int(parts[1]) / 1000, 1)})
    rows.sort(key=lambda r: -r["cumulative_ms"])
    return rows[:count], json.loads(done.stdout.strip().replace("'", '"'))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print JSON (the only output format)")
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    env = environment()
    one_start(env)  # warm the file cache and bytecode, as a person's second call finds them
    walls, cpus = zip(*(one_start(env) for _ in range(args.runs)))
    imports, heavy = slowest_imports(env)
    print(
        json.dumps(
            {
                "bench": "plugin_start",
                "command": f"python bench/plugin_start.py --json --runs {args.runs}",
                "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                "machine": f"{platform.node()} {platform.machine()} cpus={os.cpu_count()}",
                "python": platform.python_version(),
                "load_average_1m": round(os.getloadavg()[0], 2),
                "runs": args.runs,
                "wall_seconds_median": round(statistics.median(walls), 3),
                "wall_seconds_max": round(max(walls), 3),
                "cpu_seconds_median": round(statistics.median(cpus), 3),
                "slowest_imports": imports,
                "heavy_modules_imported": heavy,
                "target_seconds": 0.5,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
