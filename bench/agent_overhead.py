"""The idle agent daemon's cost: RSS, CPU seconds per idle minute, /metrics latency. Prints JSON.

    python bench/agent_overhead.py --json [--idle-seconds 30] [--requests 500]

Runs the real `gluon-agent run` (a SIMULATION result source: no GPU here) against the API emulator on
127.0.0.1, waits for its first publish, then measures it at rest.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gluon_agent import contract  # noqa: E402
from gluon_agent.sources import simulated_node  # noqa: E402
from tests.apiserver import ApiServerThread  # noqa: E402
from tests.helpers import NODES, free_port, wait_for  # noqa: E402

TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS_PER_SECOND  # utime + stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", action="store_true", help="print JSON (the only output format)")
    parser.add_argument("--idle-seconds", type=float, default=30.0)
    parser.add_argument("--requests", type=int, default=500)
    args = parser.parse_args()
    with ApiServerThread() as api, tempfile.TemporaryDirectory() as tmp:
        api.call(lambda: api.server.put_object(NODES, {"metadata": {"name": "bench-node"}}))
        sim = Path(tmp) / "sim.json"
        sim.write_text(json.dumps(simulated_node()))
        port = free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "gluon_agent", "run", "--api-url", api.url, "--simulate", str(sim),
             "--node-name", "bench-node", "--host", "127.0.0.1", "--port", str(port), "--log-level", "WARNING"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        try:
            def published() -> bool:
                node = api.call(lambda: api.server.get_object(NODES, None, "bench-node"))
                return node["metadata"].get("labels", {}).get(contract.LABEL_SELFTEST) == "pass"

            wait_for(published, timeout=60, what="first publish")
            time.sleep(2)  # settle
            cpu_before, started = cpu_seconds(proc.pid), time.monotonic()
            time.sleep(args.idle_seconds)
            idle_cpu = cpu_seconds(proc.pid) - cpu_before
            idle_wall = time.monotonic() - started
            rss_idle = rss_bytes(proc.pid)
            latencies = []
            for _ in range(args.requests):
                t0 = time.perf_counter()
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
                    response.read()
                latencies.append((time.perf_counter() - t0) * 1e3)
            latencies.sort()
            rss_after = rss_bytes(proc.pid)
        finally:
            proc.terminate()
            proc.wait(15)
    print(json.dumps({
        "bench": "agent_overhead",
        "machine": f"{platform.machine()} cpus={os.cpu_count()} python={platform.python_version()}",
        "command": " ".join(["python", "bench/agent_overhead.py"] + sys.argv[1:]),
        "idle_rss_mb": round(rss_idle / 2**20, 1),
        "rss_after_metrics_mb": round(rss_after / 2**20, 1),
        "cpu_seconds_per_idle_minute": round(idle_cpu / idle_wall * 60, 3),
        "metrics_requests": args.requests,
        "metrics_latency_ms_p50": round(statistics.median(latencies), 2),
        "metrics_latency_ms_p99": round(latencies[int(0.99 * (len(latencies) - 1))], 2),
        "targets": {"idle_rss_mb_max": 120, "metrics_latency_ms_p99_max": 20},
    }, indent=2))


if __name__ == "__main__":
    main()
