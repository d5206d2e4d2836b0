"""Time from a serving pod's start to its first sample in Prometheus, through the Prometheus Operator's
generated config (Kubernetes service discovery, the chart's PodMonitor, 1 s scrape interval). Prints JSON.

    python bench/first_sample.py --json [--pods 5]

The harness's SimCluster (2 kwok nodes: SIMULATION of kubelets; pods reached at their loopback pod IPs by
podnet.py; SGLang-shaped exporters). Each round deletes the serving pod of one node; its Deployment makes
a new one. Measured per pod: created (the API server's creationTimestamp, 1 s resolution) and Running (the
moment this script's watch saw kwok report it) to the timestamp of the pod's first `up` sample.
Its nodes' loopback addresses (indexes 230, 231) are clear of the demo's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from clusterbench import provenance  # noqa: E402

from gluon_localcluster.monitoring import built_versions  # noqa: E402
from gluon_localcluster.simcluster import SERVING_NS, SimCluster, SimNode  # noqa: E402
from gluon_localcluster.waiting import wait_for  # noqa: E402


def serving_pod(cluster: SimCluster, node: str, exclude: set[str]) -> dict | None:
    pods = [p for p in cluster.pods() if p["spec"].get("nodeName") == node and p["metadata"]["name"] not in exclude]
    return pods[0] if pods else None


def first_sample(cluster: SimCluster, pod: str) -> float | None:
    """The timestamp of the pod's first `up` sample (a range-vector instant query returns raw samples)."""
    assert cluster.prometheus is not None
    series = cluster.prometheus.api(f'query?query=up{{pod="{pod}"}}[5m]')["result"]
    stamps = [float(t) for s in series for t, _ in s["values"]]
    return min(stamps) if stamps else None


def measure(cluster: SimCluster, node: str, timeout: float) -> dict:
    old = serving_pod(cluster, node, set())
    assert old is not None, f"no serving pod on {node}"
    cluster.core.delete_namespaced_pod(old["metadata"]["name"], SERVING_NS, grace_period_seconds=0)
    new = wait_for(
        lambda: (
            (p := serving_pod(cluster, node, {old["metadata"]["name"]})) and p["status"].get("phase") == "Running" and p
        ),
        timeout,
        interval=0.05,
        what=f"a new Running serving pod on {node}",
    )
    running_seen = time.time()
    name = new["metadata"]["name"]
    sample = wait_for(lambda: first_sample(cluster, name), timeout, interval=0.2, what=f"a sample of {name}")
    created = datetime.fromisoformat(new["metadata"]["creationTimestamp"].replace("Z", "+00:00")).timestamp()
    return {
        "pod": name,
        "created_to_first_sample_s": round(sample - created, 2),
        "running_to_first_sample_s": round(sample - running_seen, 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--pods", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=90)
    args = parser.parse_args()
    cluster = SimCluster(
        (SimNode("fs-a"), SimNode("fs-b")),
        workdir=Path(tempfile.mkdtemp(prefix="first-sample-")),
        first_index=230,
    )
    try:
        cluster.start()
        cluster.wait_for_agents()
        for node in cluster.nodes:  # the first pods' series, so each round measures a new pod's own
            wait_for(
                lambda n=node: (p := serving_pod(cluster, n, set())) and first_sample(cluster, p["metadata"]["name"]),
                args.timeout,
            )
        rounds = [measure(cluster, list(cluster.nodes)[i % 2], args.timeout) for i in range(args.pods)]
    finally:
        cluster.stop()
    running = [r["running_to_first_sample_s"] for r in rounds]
    created = [r["created_to_first_sample_s"] for r in rounds]
    result = {
        "versions": built_versions(),
        "scrape_interval_s": 1,
        "pods": len(rounds),
        "running_to_first_sample_s": {"median": statistics.median(running), "max": max(running)},
        "created_to_first_sample_s": {"median": statistics.median(created), "max": max(created)},
        "rounds": rounds,
        **provenance("first_sample", "first_sample.py"),
    }
    print(json.dumps(result, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
