"""The flag delivery's costs and latencies (docs/using/flag-delivery.md). Prints JSON.

    python bench/delivery.py --json                      # both parts: 40 pods x 10 processes; 20 pods on a real node
    python bench/delivery.py --json --part observe       # the observation's cost alone (no cluster, about 1 min)
    python bench/delivery.py --json --quick              # 10 pods x 4 processes, 5 pods (CI)

1. observe: a node with N serving pods of P processes each (real processes in cgroups laid out as the kubelet's
   cgroupfs driver lays them, each with the webhook's container marker and a secret beside the flag, the
   pod's flag file at /gluon in a mount namespace of its own). Measured: one scan's wall time (p50, p99 over
   repeated scans, in this process), the `gluon-agent observe` program (what the chart's observer container
   runs) over a minute at the chart's 5 s interval: CPU seconds per minute and RSS; the agent's annotation in
   bytes; whether the secret appears anywhere written.
2. cluster: two real nodes (the pinned kubelet v1.36.3, Debian containerd; one with its EnvFiles gate off, as
   a kubelet older than 1.35), the chart installed with its agent DaemonSet and observer at their defaults,
   the operator at the chart's reconcile interval (10 s), injectionMode auto. Measured:
   - from each of M serving pods' container start (the kubelet's startedAt, whole seconds) to its flag label,
     which the operator writes from the agent's observation (seen by a watch): p50, p99; and from the agent's
     observation (`since`) to the label;
   - from a serving Deployment made on the EnvFiles-off node to that node safe: its first pod held at its
     preflight, the rollout turned to shell, the replacement's process verified at 0;
   - from a pod whose own command sets the flag to the rollout's FlagDeliveryMismatch condition.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "localcluster"))  # the harness: not in the wheel

from clusterbench import child_pythonpath, cpu_seconds, exit_cleanly_on_sigterm, mb, provenance, rss_bytes

from gluon_agent import delivery, observe  # noqa: E402
from gluon_common import contract  # noqa: E402
from gluon_localcluster import sim_containers  # noqa: E402

SECRET = "bench-secret-beside-the-flag"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))]


# ---------------------------------------------------------------- 1. the observation's cost


class Pods:
    """N pods' serving containers, each a main process and P-1 children, under a cgroup root of its own."""

    def __init__(self, pods: int, processes: int, workdir: Path) -> None:
        self.root = f"/gluon-bench-delivery-{os.getpid()}"
        self.procs: list[subprocess.Popen] = []
        for i in range(pods):
            uid, cid = str(uuid.uuid4()), sim_containers.new_container_id()
            cgroup = sim_containers.container_cgroup(self.root, "Burstable", uid, cid)
            (directory,) = sim_containers.make_cgroups(cgroup)
            volume = workdir / f"pod-{i}"
            volume.mkdir(parents=True)
            (volume / contract.FLAG_FILE).write_text(f"{contract.FLAG_ENV}='{i % 2}'\n")
            children = " ".join(["sleep 3600 &"] * (processes - 1))
            script = (
                f"mkdir -p /gluon && mount --bind {volume} /gluon && echo $$ > {directory}/cgroup.procs || exit 1; "
                f"{children} exec sleep 3600"
            )
            env = {
                "PATH": os.environ["PATH"],
                "TOKEN": SECRET,
                contract.FLAG_ENV: str(i % 2),
                contract.ENV_FLAG_CONTAINER: "sglang",
            }
            self.procs.append(
                subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c", script], env=env)
            )

    def close(self) -> None:
        for proc in self.procs:
            proc.kill()
        for directory in sim_containers.cgroup_dirs(self.root):
            sim_containers.remove_tree(directory)


def observe_part(pods: int, processes: int, scans: int, seconds: float, workdir: Path) -> dict[str, Any]:
    made = Pods(pods, processes, workdir)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            report, _ = observe.observe(Path("/proc"), made.root)
            if len(report.containers) == pods and all(c.processes == processes for c in report.containers):
                break
            time.sleep(0.2)
        else:
            raise RuntimeError(f"not every pod observed: {report.model_dump_json()[:500]}")
        times = []
        for _ in range(scans):
            started = time.perf_counter()
            report, _ = observe.observe(Path("/proc"), made.root)
            times.append((time.perf_counter() - started) * 1e3)
        annotation = delivery.annotation(delivery.with_since(None, report, time.time()))
        out = workdir / "observed.json"
        env = {**os.environ, "PYTHONPATH": child_pythonpath()}
        argv = [sys.executable, "-m", "gluon_agent", "observe", "--proc", "/proc", "--out", str(out)]
        observer = subprocess.Popen(
            [*argv, "--interval", "5", "--cgroup-root", made.root, "--log-level", "WARNING"], env=env
        )
        try:
            time.sleep(3)  # started, first scan written
            before, started = cpu_seconds(observer.pid), time.monotonic()
            time.sleep(seconds)
            cpu = (cpu_seconds(observer.pid) - before) / (time.monotonic() - started) * 60
            rss = rss_bytes(observer.pid)
        finally:
            observer.terminate()
            observer.wait(10)
        written = out.read_text()
        return {
            "pods": pods,
            "processes_per_pod": processes,
            "pod_processes": pods * processes,
            "host_processes": sum(1 for p in Path("/proc").iterdir() if p.name.isdigit()),
            "scan_ms_p50": round(statistics.median(times), 2),
            "scan_ms_p99": round(percentile(times, 0.99), 2),
            "scans": scans,
            "observer_cpu_seconds_per_minute_at_5s": round(cpu, 3),
            "observer_rss_mb": mb(rss),
            "annotation_bytes": len(annotation),
            "secret_in_anything_written": SECRET in annotation + written,
        }
    finally:
        made.close()


# ---------------------------------------------------------------- 2. on real nodes


def cluster_part(latency_pods: int, workdir: Path) -> dict[str, Any]:
    from kubernetes import client, watch

    from gluon_localcluster import ControlPlane, fleet
    from gluon_localcluster.images import (
        AGENT_IMAGE,
        AGENT_SIMULATION_ARGS,
        AGENT_SIMULATION_IMAGE,
        SERVING_IMAGE,
        agent_image,
        agent_simulation_image,
        base_image,
        serving_image,
    )
    from gluon_localcluster.install import image_values, install
    from gluon_localcluster.processes import operator as start_operator
    from gluon_localcluster.realnode import REAL_NODE_TAINT, RealNode
    from gluon_operator.spec import GROUP, PLURAL, VERSION

    tolerate = {"key": REAL_NODE_TAINT, "operator": "Exists", "effect": "NoSchedule"}
    labels = {"feature.node.kubernetes.io/amd-gpu": "true"}
    agent = {
        "image": {**image_values(AGENT_SIMULATION_IMAGE), "pullPolicy": "Never"},
        "extraArgs": list(AGENT_SIMULATION_ARGS),
        "tolerations": [{"key": "amd.com/gpu", "operator": "Exists", "effect": "NoSchedule"}, tolerate],
    }

    def deployment(name: str, node: str, replicas: int, command: list[str] | None = None) -> dict[str, Any]:
        pod_labels = {**fleet.SERVING_POD_LABELS, "serving": name}
        container = {
            "name": "sglang",
            "image": SERVING_IMAGE,
            "imagePullPolicy": "Never",
            "command": command or ["python3", "/opt/simulation/serve.py"],
            "env": [{"name": contract.FLAG_ENV, "value": "0"}],
            "resources": {"requests": {"cpu": "1m", "memory": "16Mi"}},
        }
        spec = {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": [tolerate],
            "terminationGracePeriodSeconds": 1,
            "containers": [container],
        }
        return {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": pod_labels},
                "template": {"metadata": {"labels": pod_labels}, "spec": spec},
            },
        }

    images = [base_image(), serving_image(), agent_image(), agent_simulation_image()]
    with ExitStack() as stack:
        cp = stack.enter_context(ControlPlane(workdir / "cp", kwok=False))
        stack.enter_context(RealNode(cp, "kubelet-on", images=images, labels=labels, gpus=2))
        stack.enter_context(
            RealNode(cp, "kubelet-off", images=images, labels=labels, gpus=2, feature_gates={"EnvFiles": False})
        )
        installed = install(cp, values={"agent": agent})
        admin = cp.admin_client()
        core, apps, custom = client.CoreV1Api(admin), client.AppsV1Api(admin), client.CustomObjectsApi(admin)
        namespace = "bench"
        core.create_namespace({"metadata": {"name": namespace}})
        operator = start_operator(
            installed, reconcile_seconds=10, agent_image=AGENT_IMAGE, GLUON_NAMESPACE=installed.namespace
        )
        stack.callback(operator.stop)
        body = fleet.rollout("kimi", namespace, paused=True)  # delivery only: nothing is enabled
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)

        def rollout_status() -> dict[str, Any]:
            return custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "kimi").get("status") or {}

        wait(lambda: rollout_status().get("delivery"), 90, "the rollout reconciled")
        labelled: dict[str, float] = {}

        def watch_labels() -> None:
            try:
                for event in watch.Watch().stream(core.list_namespaced_pod, namespace, timeout_seconds=900):
                    pod = event["object"]
                    if (pod.metadata.labels or {}).get(contract.LABEL_POD_FLAG):
                        labelled.setdefault(pod.metadata.name, time.time())
            except Exception:  # noqa: BLE001 - the control plane stopping under the watch ends the bench anyway
                return

        threading.Thread(target=watch_labels, daemon=True).start()
        # (a) start -> known, on the node that honours fileKeyRef
        apps.create_namespaced_deployment(namespace, deployment("latency", "kubelet-on", latency_pods))
        pods = wait(
            lambda: (
                (found := pods_of(core, namespace, "latency"))
                and len(found) == latency_pods
                and all(p.metadata.name in labelled for p in found)
                and found
            ),
            600,
            f"{latency_pods} pods labelled",
        )
        observed = {c["pod_uid"]: c["since"] for c in node_observation(core, "kubelet-on")}
        start_to_known = [labelled[p.metadata.name] - started_at(p) for p in pods]
        seen_to_label = [
            labelled[p.metadata.name] - observed[p.metadata.uid] for p in pods if p.metadata.uid in observed
        ]
        # (b) a Deployment on the node that ignores fileKeyRef: held, shell, verified at 0
        made = time.time()
        apps.create_namespaced_deployment(namespace, deployment("skewed", "kubelet-off", 1))
        wait(
            lambda: (
                rollout_status()["delivery"]["mode"] == "shell"
                and any(labelled.get(p.metadata.name) for p in pods_of(core, namespace, "skewed"))
            ),
            180,
            "the skewed node's replacement verified",
        )
        skewed = [p for p in pods_of(core, namespace, "skewed") if labelled.get(p.metadata.name)]
        made_safe = labelled[skewed[0].metadata.name] - made
        # (c) a command that sets the flag itself
        own = ["/bin/sh", "-c", f"{contract.FLAG_ENV}=1 exec python3 /opt/simulation/serve.py"]
        made = time.time()
        apps.create_namespaced_deployment(namespace, deployment("own-flag", "kubelet-on", 1, own))
        wait(
            lambda: any(
                c["type"] == "FlagDeliveryMismatch" and c["status"] == "True"
                for c in rollout_status().get("conditions") or []
            ),
            180,
            "the mismatch condition",
        )
        mismatch_seen = time.time() - made
        version = cp.version()["gitVersion"]
    return {
        "kubelet": version,
        "observer_interval_seconds": 5,
        "reconcile_seconds": 10,
        "latency_pods": latency_pods,
        "start_to_known_seconds_p50": round(statistics.median(start_to_known), 1),
        "start_to_known_seconds_p99": round(percentile(start_to_known, 0.99), 1),
        "start_to_known_seconds_max": round(max(start_to_known), 1),
        "observed_to_label_seconds_p50": round(statistics.median(seen_to_label), 1) if seen_to_label else None,
        "observed_to_label_seconds_p99": round(percentile(seen_to_label, 0.99), 1) if seen_to_label else None,
        "envfiles_off_node_deployment_to_verified_safe_seconds": round(made_safe, 1),
        "own_flag_pod_to_mismatch_condition_seconds": round(mismatch_seen, 1),
        "note": "startedAt has whole seconds: each start-to-known figure is within +-1 s",
    }


def wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.25)
    raise TimeoutError(f"{what}: not within {timeout} s")


def pods_of(core, namespace: str, serving: str) -> list:
    return [
        p
        for p in core.list_namespaced_pod(namespace, label_selector=f"serving={serving}").items
        if not p.metadata.deletion_timestamp
    ]


def started_at(pod) -> float:
    state = (pod.status.container_statuses or [None])[0]
    running = state.state.running if state is not None else None
    return running.started_at.timestamp() if running else pod.metadata.creation_timestamp.timestamp()


def node_observation(core, node: str) -> list[dict[str, Any]]:
    raw = (core.read_node(node).metadata.annotations or {}).get(contract.ANNOTATION_DELIVERY)
    return json.loads(raw).get("containers", []) if raw else []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print JSON (the only output format)")
    parser.add_argument("--part", choices=("observe", "cluster", "both"), default="both")
    parser.add_argument("--pods", type=int, default=40)
    parser.add_argument("--processes", type=int, default=10, help="per serving container (TP8 SGLang runs about 10)")
    parser.add_argument("--latency-pods", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=60.0, help="the observer program's measured window")
    parser.add_argument("--quick", action="store_true", help="10 pods x 4 processes, 5 latency pods, 10 s (CI)")
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    exit_cleanly_on_sigterm()
    if args.quick:
        args.pods, args.processes, args.latency_pods, args.seconds = 10, 4, 5, 10.0
    workdir = (args.workdir or Path(tempfile.mkdtemp(prefix="gluon-delivery-"))).resolve()
    record: dict[str, Any] = provenance("delivery", "delivery.py")
    if args.part in ("observe", "both"):
        record["observe"] = observe_part(args.pods, args.processes, 50, args.seconds, workdir / "observe")
    if args.part in ("cluster", "both"):
        record["cluster"] = cluster_part(args.latency_pods, workdir / "cluster")
    print(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
