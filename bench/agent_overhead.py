"""The idle agent daemon's cost: RSS, CPU seconds per idle minute, /metrics latency. Prints JSON.

    python bench/agent_overhead.py --json [--idle-seconds 30] [--requests 500] [--pods 40]
    python bench/agent_overhead.py --json --quick      # 5 s idle, 50 requests (CI)

Runs the real `gluon-agent run` (a SIMULATION result source: no GPU here) against a real kube-apiserver
(gluon_localcluster, the chart installed by helm) for one kwok node, with the agent ServiceAccount's
token bound to its agent pod on that node (the pod made from the chart's DaemonSet template, as the
DaemonSet controller would), listening on the node's own address. Waits for its first publish, then
measures it at rest. With --pods N the node runs N injected serving containers of 10 processes each (real
processes in cgroups, bench/delivery.py's Pods) and the agent observes them itself every 5 s (the chart
leaves that to its observer container: this is the daemon's worst case).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "localcluster"))  # the harness: not in the wheel

from clusterbench import (
    agent_daemonset,
    agent_pod_from_daemonset,
    child_pythonpath,
    cpu_seconds,
    exit_cleanly_on_sigterm,
    provenance,
    rss_bytes,
    wait_until,
)
from delivery import Pods

from gluon_common import contract  # noqa: E402
from gluon_localcluster import fleet, processes  # noqa: E402
from gluon_localcluster.controlplane import ControlPlane  # noqa: E402
from gluon_localcluster.fakes.simulated import agent_arguments, simulated_node  # noqa: E402
from gluon_localcluster.install import install  # noqa: E402

NODE, NODE_INDEX = "bench-node", 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print JSON (the only output format)")
    parser.add_argument("--idle-seconds", type=float, default=30.0)
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--quick", action="store_true", help="5 s idle and 50 requests (CI)")
    parser.add_argument("--pods", type=int, default=0, help="serving pods the agent observes itself")
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    exit_cleanly_on_sigterm()
    idle, requests = (5.0, 50) if args.quick else (args.idle_seconds, args.requests)
    workdir = (args.workdir or Path(tempfile.mkdtemp(prefix="gluon-agent-overhead-"))).resolve()
    from kubernetes import client

    pods = Pods(args.pods, 10, workdir / "pods") if args.pods else None
    observing = ["--observe-proc", "/proc", "--observe-cgroup-root", pods.root] if pods else []
    with ControlPlane(workdir / "cp", controllers=False, scheduler=False) as cp:
        installed = install(cp)
        core = client.CoreV1Api(cp.admin_client())
        core.create_node(fleet.kwok_node(NODE, NODE_INDEX))
        core.create_namespaced_pod(
            installed.namespace, agent_pod_from_daemonset(agent_daemonset(cp, installed.namespace), NODE)
        )
        sim = workdir / "sim.json"
        sim.write_text(json.dumps(simulated_node()))
        host = fleet.node_ip(NODE_INDEX)
        argv = [
            sys.executable,
            "-m",
            "gluon_agent",
            "run",
            "--kubeconfig",
            str(installed.agent_kubeconfig(NODE)),
            *agent_arguments(sim),
            "--node-name",
            NODE,
            "--host",
            host,
            "--port",
            str(contract.AGENT_PORT),
            "--log-level",
            "WARNING",
            *observing,
        ]
        agent = processes.Process(
            argv, processes.python_env(PYTHONPATH=child_pythonpath()), workdir / "agent.log"
        ).start()
        try:

            def published() -> bool:
                labels = core.read_node(NODE).metadata.labels or {}
                return labels.get(contract.LABEL_SELFTEST) == "pass" or not agent.alive()

            wait_until(published, 90, "the agent's first publish")
            if not agent.alive():
                raise RuntimeError(f"the agent exited:\n{agent.tail()}")
            time.sleep(2)  # settle
            pid = agent.proc.pid  # type: ignore[union-attr]
            cpu_before, started = cpu_seconds(pid), time.monotonic()
            time.sleep(idle)
            idle_cpu, idle_wall = cpu_seconds(pid) - cpu_before, time.monotonic() - started
            rss_idle = rss_bytes(pid)
            latencies = []
            for _ in range(requests):
                t0 = time.perf_counter()
                with urllib.request.urlopen(f"http://{host}:{contract.AGENT_PORT}/metrics", timeout=5) as response:
                    response.read()
                latencies.append((time.perf_counter() - t0) * 1e3)
            latencies.sort()
            rss_after = rss_bytes(pid)
            version = cp.version()["gitVersion"]
            observed = json.loads(core.read_node(NODE).metadata.annotations[contract.ANNOTATION_DELIVERY])
        finally:
            agent.stop()
            if pods is not None:
                pods.close()
    print(
        json.dumps(
            {
                **provenance("agent_overhead", "agent_overhead.py"),
                "apiserver_version": version,
                "observed_pods": len(observed.get("containers", [])),
                "idle_seconds": idle,
                "idle_rss_mb": round(rss_idle / 2**20, 1),
                "rss_after_metrics_mb": round(rss_after / 2**20, 1),
                "cpu_seconds_per_idle_minute": round(idle_cpu / idle_wall * 60, 3),
                "metrics_requests": requests,
                "metrics_latency_ms_p50": round(statistics.median(latencies), 2),
                "metrics_latency_ms_p99": round(latencies[int(0.99 * (len(latencies) - 1))], 2),
                "targets": {"idle_rss_mb_max": 120, "metrics_latency_ms_p99_max": 20},
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
