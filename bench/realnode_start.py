"""A serving pod's added start time from the injected init containers on a real node: the time from the pod's
creation to its serving container's start, for pods the webhook injected (install container + the real
preflight, fileKeyRef) against pods admitted unmodified (no operator listening), one pod at a time. Prints
JSON: p50 and max of each, and of the difference of the medians.

python bench/realnode_start.py --json [--pods 20]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

from kubernetes import client

from gluon_common import contract
from gluon_localcluster import ControlPlane, fleet
from gluon_localcluster.images import AGENT_IMAGE, SERVING_IMAGE, agent_image, serving_image
from gluon_localcluster.install import install
from gluon_localcluster.processes import operator as start_operator
from gluon_localcluster.realnode import REAL_NODE_TAINT, RealNode
from gluon_operator.spec import GROUP, PLURAL, VERSION

NAMESPACE = "bench"


def pod(name: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": dict(fleet.SERVING_POD_LABELS)},
        "spec": {
            "nodeName": "bench-real",
            "tolerations": [{"key": REAL_NODE_TAINT, "operator": "Exists"}],
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "sglang",
                    "image": SERVING_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["python3", "/opt/simulation/serve.py"],
                    "env": [{"name": contract.FLAG_ENV, "value": "0"}],
                }
            ],
        },
    }


def start_seconds(core: client.CoreV1Api, name: str, want_injected: bool, timeout: float = 120) -> float:
    """Creation to the serving container's start (the kubelet's startedAt, second resolution, so timed here)."""
    begin = time.monotonic()
    created = core.create_namespaced_pod(NAMESPACE, pod(name))
    injected = contract.ANNOTATION_POD_INJECTED in (created.metadata.annotations or {})
    if injected != want_injected:
        raise RuntimeError(f"pod {name}: injected={injected}, wanted {want_injected}")
    while time.monotonic() - begin < timeout:
        status = core.read_namespaced_pod(name, NAMESPACE).status
        running = [s for s in status.container_statuses or [] if s.state.running]
        if running:
            seconds = time.monotonic() - begin
            core.delete_namespaced_pod(name, NAMESPACE, grace_period_seconds=0)
            return seconds
        time.sleep(0.05)
    raise RuntimeError(f"pod {name} did not start within {timeout} s")


def summary(values: list[float]) -> dict:
    return {"p50": round(statistics.median(values), 2), "max": round(max(values), 2), "n": len(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", action="store_true", help="print JSON (the only output format)")
    parser.add_argument("--pods", type=int, default=20)
    args = parser.parse_args()
    with ControlPlane(Path(tempfile.mkdtemp(prefix="gluon-bench-start-")), kwok=False) as cp:
        with RealNode(cp, "bench-real", images=[serving_image(), agent_image()]) as node:
            installed = install(cp)
            core = client.CoreV1Api(cp.admin_client())
            core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NAMESPACE)))
            custom = client.CustomObjectsApi(cp.admin_client())
            custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, fleet.rollout("kimi", NAMESPACE))
            plain = [start_seconds(core, f"plain-{i}", False) for i in range(args.pods)]
            operator = start_operator(installed, agent_image=AGENT_IMAGE)
            try:
                deadline = time.monotonic() + 60
                while True:  # the webhook answers once the operator is up
                    try:
                        start_seconds(core, "warm-up", True)
                        break
                    except RuntimeError:
                        core.delete_namespaced_pod("warm-up", NAMESPACE, grace_period_seconds=0)
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(1)
                injected = [start_seconds(core, f"injected-{i}", True) for i in range(args.pods)]
            finally:
                operator.stop()
            bringup = node.started_seconds
    added = [i - statistics.median(plain) for i in injected]
    report = {
        "bench": "realnode_start",
        "machine": f"{platform.node()} {platform.machine()} cpus={os.cpu_count()} load={os.getloadavg()[0]:.1f}",
        "node_bringup_seconds": round(bringup, 1),
        "plain_start_seconds": summary(plain),
        "injected_start_seconds": summary(injected),
        "added_by_init_containers_seconds": summary(added),
        "goal_seconds": 3.0,
    }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
