"""What admission costs a serving pod, through a real kube-apiserver (gluon_localcluster). Prints JSON.

    python bench/admission.py --json [--seconds 60] [--rate 20] [--starts 5]
    python bench/admission.py --json --quick        # 5 s at 20/s, 2 starts (CI)

1. The webhook's added latency per pod CREATE. The operator process serves the chart's webhook
   (https://127.0.0.1, called by the API server). For `--seconds` at `--rate` creates/s, every slot creates
   one pod in each of three arms, in random order, from a pool of threads (a late create never delays the
   next slot):
   - `injected`: a namespace the webhook sees, labels a GluonRollout selects (the pod is mutated);
   - `unmatched`: the same namespace, labels no GluonRollout selects (the webhook is called, answers no patch);
   - `unseen`: kube-system, which the chart's namespaceSelector leaves out (the webhook is not called).
   Latency is the client's, per create; `added_ms` = injected minus unseen (p50 and p99).
2. The seconds the injected init containers add to a serving pod's start. A kwok node with its agent
   (the real daemon, SIMULATION result source, token bound to its agent pod), and serving pods bound to
   it one after another; kubelet_sim (SIMULATION of the kubelet) runs each pod's init containers: the
   agent image's install step, then the real preflight in the serving image, which asks the agent and
   probes the image's own stack. The simulated serving image is this Python with its CPU torch and no
   aiter (so the probe pays torch's import, as a serving image would). `InitOutcome.seconds` per pod.
Goals: p99 added <= 50 ms; <= 3 s added per pod.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "localcluster"))  # the harness: not in the wheel

from clusterbench import (
    agent_daemonset,
    agent_pod_from_daemonset,
    child_pythonpath,
    exit_cleanly_on_sigterm,
    provenance,
    wait_until,
)

from gluon_common import contract  # noqa: E402
from gluon_localcluster import fleet, processes  # noqa: E402
from gluon_localcluster.controlplane import ControlPlane  # noqa: E402
from gluon_localcluster.fakes.simulated import simulated_node  # noqa: E402
from gluon_localcluster.install import install  # noqa: E402
from gluon_localcluster.kubelet_sim import Image, KubeletSim  # noqa: E402
from gluon_operator.spec import GROUP, PLURAL, VERSION  # noqa: E402

NAMESPACE, UNSEEN = "serving", "kube-system"
NODE, NODE_INDEX = "gpu-start", 252  # an address apart from the demo's (1..8) and the tests'
SERVING_IMAGE = "lmsysorg/sglang:rocm-demo"  # fleet.serving_deployment's image: simulated below
ARMS = {
    "injected": (NAMESPACE, fleet.SERVING_LABELS),
    "unmatched": (NAMESPACE, {"app": "other"}),
    "unseen": (UNSEEN, fleet.SERVING_LABELS),
}
WORKERS = 6
GOALS = {"added_ms_p99_max": 50, "init_seconds_added_max": 3}


def pod(name: str, labels: dict[str, str], node: str | None = None) -> dict[str, Any]:
    template = fleet.serving_deployment("sglang")["spec"]["template"]
    spec = {**template["spec"], **({"nodeName": node} if node else {})}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {**template["metadata"]["labels"], **labels}},
        "spec": spec,
    }


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))]


def summary(values: list[float]) -> dict[str, float]:
    return {
        "creates": len(values),
        "p50_ms": round(percentile(values, 0.5), 2),
        "p99_ms": round(percentile(values, 0.99), 2),
        "max_ms": round(max(values), 2),
    }


def create_latencies(cp: ControlPlane, seconds: float, rate: float) -> dict[str, Any]:
    from kubernetes import client

    local = threading.local()
    latencies: dict[str, list[float]] = {arm: [] for arm in ARMS}
    injected_ok: list[bool] = []
    lock = threading.Lock()

    def create(arm: str, index: int) -> None:
        if not hasattr(local, "core"):
            local.core = client.CoreV1Api(cp.admin_client())
        namespace, labels = ARMS[arm]
        started = time.perf_counter()
        response = local.core.create_namespaced_pod(
            namespace, pod(f"{arm}-{index:05d}", labels), _preload_content=False
        )
        elapsed = (time.perf_counter() - started) * 1e3
        annotations = json.loads(response.data)["metadata"].get("annotations") or {}
        with lock:
            latencies[arm].append(elapsed)
            injected_ok.append((contract.ANNOTATION_POD_INJECTED in annotations) == (arm == "injected"))

    slots, order = int(seconds * rate), random.Random(1)
    started = time.monotonic()
    with ThreadPoolExecutor(WORKERS) as pool:
        futures = []
        for index in range(slots):
            delay = started + index / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            for arm in order.sample(list(ARMS), len(ARMS)):
                futures.append(pool.submit(create, arm, index))
        for future in futures:
            future.result()
    wall = time.monotonic() - started
    arms = {arm: summary(values) for arm, values in latencies.items()}
    return {
        "seconds": round(wall, 1),
        "rate_per_arm_per_s": round(slots / wall, 2),
        "arms": arms,
        "every_pod_mutated_as_expected": all(injected_ok),
        "added_ms_p50": round(arms["injected"]["p50_ms"] - arms["unseen"]["p50_ms"], 2),
        "added_ms_p99": round(arms["injected"]["p99_ms"] - arms["unseen"]["p99_ms"], 2),
    }


def init_seconds(cp: ControlPlane, installed: Any, workdir: Path, starts: int) -> dict[str, Any]:
    from kubernetes import client

    core = client.CoreV1Api(cp.admin_client())
    core.create_node(fleet.kwok_node(NODE, NODE_INDEX))
    core.create_namespaced_pod(
        installed.namespace, agent_pod_from_daemonset(agent_daemonset(cp, installed.namespace), NODE)
    )
    simulate = workdir / "sim.json"
    simulate.write_text(json.dumps(simulated_node()))
    agent = processes.agent(
        installed, NODE, fleet.node_ip(NODE_INDEX), simulate, env={"PYTHONPATH": child_pythonpath()}
    )
    bin_dir = str(Path(sys.executable).parent)
    images = {
        processes.AGENT_IMAGE: Image(env={"PYTHONPATH": child_pythonpath()}, path=(bin_dir,)),
        SERVING_IMAGE: Image(path=(bin_dir,)),
    }  # SIMULATION of both images: this Python (CPU torch, no aiter)
    try:
        wait_until(
            lambda: (
                (core.read_node(NODE).metadata.labels or {}).get(contract.LABEL_SELFTEST) == "pass" or not agent.alive()
            ),
            90,
            "the agent's first publish",
        )
        if not agent.alive():
            raise RuntimeError(f"the agent exited:\n{agent.tail()}")
        (workdir / "kubelet-sim").mkdir(exist_ok=True)
        with KubeletSim(cp.admin_client(), images, workdir=workdir / "kubelet-sim", parallel=1) as kubelet:
            for index in range(starts):
                core.create_namespaced_pod(
                    NAMESPACE, pod(f"start-{index}", fleet.SERVING_LABELS, node=NODE), _preload_content=False
                )
                wait_until(
                    lambda: len(kubelet.outcomes) > index or kubelet.errors,
                    120,
                    f"start-{index}'s init containers",
                    0.1,
                )
                if kubelet.errors:
                    raise RuntimeError(f"kubelet_sim: {kubelet.errors}")
        outcomes = kubelet.outcomes
    finally:
        agent.stop()
    seconds = [o.seconds for o in outcomes]
    return {
        "starts": len(seconds),
        "init_seconds": [round(s, 2) for s in seconds],
        "init_seconds_median": round(sorted(seconds)[len(seconds) // 2], 2),
        "init_seconds_max": round(max(seconds), 2),
        "flags": sorted({str(o.flag) for o in outcomes}),
        "preflight_reason": json.loads(outcomes[-1].message).get("reason") if outcomes[-1].message else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print JSON (the only output format)")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--rate", type=float, default=20.0, help="creates per second in each arm")
    parser.add_argument("--starts", type=int, default=5, help="serving pod starts timed through kubelet_sim")
    parser.add_argument("--quick", action="store_true", help="5 s of creates and 2 starts (CI)")
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    exit_cleanly_on_sigterm()
    seconds, starts = (5.0, 2) if args.quick else (args.seconds, args.starts)
    if seconds <= 0 or args.rate <= 0 or starts < 1:
        parser.error("--seconds and --rate must be positive, --starts at least 1")
    workdir = (args.workdir or Path(tempfile.mkdtemp(prefix="gluon-admission-"))).resolve()
    from kubernetes import client

    with ControlPlane(workdir / "cp", controllers=False, scheduler=False) as cp:
        installed = install(cp)
        core = client.CoreV1Api(cp.admin_client())
        core.create_namespace({"metadata": {"name": NAMESPACE}})
        for namespace in (NAMESPACE, UNSEEN):  # the controller-manager's service-account controller would make them
            core.create_namespaced_service_account(namespace, {"metadata": {"name": "default"}})
        client.CustomObjectsApi(cp.admin_client()).create_namespaced_custom_object(
            GROUP, VERSION, NAMESPACE, PLURAL, fleet.rollout("admission", NAMESPACE)
        )
        operator = processes.operator(installed, reconcile_seconds=5, PYTHONPATH=child_pythonpath())
        try:

            def webhook_ready() -> bool:
                body = json.loads(
                    core.create_namespaced_pod(
                        NAMESPACE,
                        pod(f"ready-{time.monotonic_ns()}", fleet.SERVING_LABELS),
                        dry_run="All",
                        _preload_content=False,
                    ).data
                )
                return (
                    contract.ANNOTATION_POD_INJECTED in (body["metadata"].get("annotations") or {})
                    or not operator.alive()
                )

            wait_until(webhook_ready, 90, "the operator's webhook injecting")
            if not operator.alive():
                raise RuntimeError(f"the operator exited:\n{operator.tail()}")
            latency = create_latencies(cp, seconds, args.rate)
            starting = init_seconds(cp, installed, workdir, starts)
            version = cp.version()["gitVersion"]
        finally:
            operator.stop()
    print(
        json.dumps(
            {
                **provenance("admission", "admission.py"),
                "apiserver_version": version,
                "goals": GOALS,
                "create_latency": latency,
                "init_containers": starting,
                "goals_met": {
                    "added_ms_p99": latency["added_ms_p99"] <= GOALS["added_ms_p99_max"],
                    "init_seconds": starting["init_seconds_max"] <= GOALS["init_seconds_added_max"],
                },
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
