"""A whole gluon-rollout deployment on 127.0.0.1, for `make demo` and the end-to-end tests.

Real: the API emulator's HTTP API, one `gluon-agent run` process per node, the operator process
(`gluon-operator run`) with its TLS admission webhook, the preflight (installed and run as the init
containers would run it), Prometheus, the analysis. SIMULATION (named so everywhere): each agent's
self-test results (no AMD GPU here), the serving image's stack (fake aiter and a gfx950 torch on its
PYTHONPATH), the kubelet/ReplicaSet that runs pods, and SGLang's decode speed (FakeSglang).
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import ssl
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonpatch

from gluon_agent import contract
from gluon_agent.sources import simulated_node
from gluon_operator.spec import GROUP, KIND, VERSION
from tests.apiserver import ApiServerThread
from tests.cluster import AGENT_LABELS, AGENT_NS, NODES, PODS, ROLLOUTS, SERVING_LABELS, SERVING_NS, declare_rollouts
from tests.fake_sglang import FakeSglang, NodeModel
from tests.fakes.stacks import AITER_STACK, TORCH_GFX950, write_tree
from tests.helpers import Prometheus, free_port, http_json, wait_for

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class SimNode:
    name: str
    capable: bool = True
    fallback: str = "pass"
    flag_effect: float = 2.2  # decode speed with flag 1 / flag 0 in production (SIMULATION)
    kernel_fault: str | None = None  # "abort" | "hang": the real self-test runs, the (fake) aiter kernel crashes


DEMO_FLEET = (
    # gpu-03 is the control group (holdout: chosen by a stable hash of the name), gpu-02 regresses 15%.
    SimNode("gpu-01", flag_effect=2.3), SimNode("gpu-02", flag_effect=0.85), SimNode("gpu-03", flag_effect=1.9),
    SimNode("gpu-04", flag_effect=2.7), SimNode("gpu-05", flag_effect=2.1), SimNode("gpu-06", flag_effect=2.4),
    SimNode("gpu-07", capable=False), SimNode("gpu-08", fallback="fail"),
)
DEMO_ANALYSIS = {"intervalSeconds": 3, "stepSeconds": 2, "windowSeconds": 16, "warmupSeconds": 2,
                 "minSamples": 5, "consecutiveFailures": 2, "tolerance": 0.05, "confidence": 0.95}
KERNEL_FAULT_TIMEOUT = 15.0  # seconds per self-test child when a kernel hangs
DEMO_STRATEGY = {"canaryNodes": 1, "maxParallel": 2, "holdoutNodes": 1, "restart": "Evict", "restartDelaySeconds": 1}


def python_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", contract.FLAG_ENV, "TRITON_INTERPRET")}
    env.update(extra)
    return env


@dataclass
class Running:
    node: SimNode
    agent_port: int
    agent: subprocess.Popen | None = None
    exporter: FakeSglang | None = None
    flag: str = "0"  # the flag the node's serving pod really runs with (its flag.env)
    pod: str | None = None
    history: list[tuple[float, str]] = field(default_factory=list)  # (time, flag) changes


class SimCluster:
    def __init__(self, fleet: tuple[SimNode, ...] = DEMO_FLEET, workdir: Path | None = None, reconcile_seconds: float = 1.0) -> None:
        self.fleet = fleet
        # Absolute: PYTHONPATH entries given to the preflight's children must not depend on their cwd.
        self.dir = Path(workdir or tempfile.mkdtemp(prefix="gluon-sim-")).resolve()
        self.reconcile_seconds = reconcile_seconds
        self.nodes = {n.name: Running(n, free_port()) for n in fleet}
        self.stop_event = threading.Event()
        self.api: ApiServerThread | None = None
        self.operator: subprocess.Popen | None = None
        self.prometheus: Prometheus | None = None
        self.threads: list[threading.Thread] = []
        self.image_stack = write_tree(self.dir / "serving-image", TORCH_GFX950)  # SIMULATION: a gfx950 ROCm torch
        self.webhook_port, self.metrics_port = free_port(), free_port()
        self.pod_flags: dict[str, str] = {}  # serving pod name -> the flag its preflight gave it
        self.operator_starts = 0
        self.started = time.time()

    # ------------------------------------------------------------ start

    def start(self) -> "SimCluster":
        self.api = ApiServerThread().__enter__()
        declare_rollouts(self.api.server)
        for running in self.nodes.values():
            name = running.node.name
            self.api.call(lambda name=name: self.api.server.put_object(NODES, {"metadata": {"name": name, "labels": {
                "kubernetes.io/hostname": name, "feature.node.kubernetes.io/amd-gpu": "true"}}}))
            self._start_agent(running)
            running.exporter = FakeSglang(NodeModel(name, flag_effect=running.node.flag_effect, noise=0.02),
                                          lambda r=running: r.flag).start()
        self._start_operator()
        self.prometheus = Prometheus({
            "sglang": [f"127.0.0.1:{r.exporter.port}" for r in self.nodes.values()],
            "gluon-rollout-agent": [{"targets": [f"127.0.0.1:{r.agent_port}"], "labels": {"node": r.node.name}} for r in self.nodes.values()],
            "gluon-rollout-operator": [f"127.0.0.1:{self.metrics_port}"],
        })
        self._spawn(self._agent_pods_loop, "agent-pods-sim")
        for running in self.nodes.values():  # one kubelet per node: pods start in parallel, as on a cluster
            self._spawn(lambda r=running: self._kubelet_loop(r), f"kubelet-{running.node.name}")
        return self

    def _spawn(self, target: Any, name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self.threads.append(thread)

    def _start_agent(self, running: Running) -> None:
        spec = simulated_node(capable=running.node.capable, fallback=running.node.fallback, speedup=2.3)
        env = python_env()
        if running.node.kernel_fault:
            spec.update(selftest="cpu-interpret", selftest_timeout=KERNEL_FAULT_TIMEOUT)
            env.update(PYTHONPATH=str(AITER_STACK), FAKE_AITER_MODE=f"*:{running.node.kernel_fault}:mla_gluon")
        sim = self.dir / f"sim-{running.node.name}.json"
        sim.write_text(json.dumps(spec))
        log = (self.dir / f"agent-{running.node.name}.log").open("w")
        running.agent = subprocess.Popen(
            [sys.executable, "-m", "gluon_agent", "run", "--api-url", self.api.url, "--simulate", str(sim),
             "--node-name", running.node.name, "--host", "127.0.0.1", "--port", str(running.agent_port),
             "--tick", "0.2", "--probe-interval", "3600", "--watch-timeout", "10", "--log-level", "INFO"],
            env=env, stdout=log, stderr=subprocess.STDOUT)
        pod = {"metadata": {"name": f"agent-{running.node.name}", "namespace": AGENT_NS, "labels": dict(AGENT_LABELS)},
               "spec": {"nodeName": running.node.name, "containers": [{"name": "agent", "image": "gluon-agent"}]},
               "status": {"phase": "Pending"}}
        self.api.call(lambda: self.api.server.put_object(PODS, pod))

    def _certificate(self) -> tuple[Path, Path]:
        crt, key = self.dir / "tls.crt", self.dir / "tls.key"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                        "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(crt)], check=True, capture_output=True)
        return crt, key

    def _start_operator(self) -> None:
        crt, key = self._certificate()
        self.ca = ssl.create_default_context(cafile=str(crt))
        env = python_env(GLUON_API_URL=self.api.url, GLUON_SCANNING="off", GLUON_RECONCILE_SECONDS=str(self.reconcile_seconds),
                         GLUON_METRICS_PORT=str(self.metrics_port), GLUON_METRICS_ADDR="127.0.0.1", GLUON_WATCH_TIMEOUT="60",
                         GLUON_WEBHOOK_CERT=str(crt), GLUON_WEBHOOK_KEY=str(key), GLUON_WEBHOOK_ADDR="127.0.0.1",
                         GLUON_WEBHOOK_PORT=str(self.webhook_port), GLUON_AGENT_IMAGE="gluon-agent:demo")
        log = (self.dir / "operator.log").open("a")
        self.operator_starts += 1
        self.operator = subprocess.Popen(
            [sys.executable, "-m", "gluon_operator.cli", "run", "--standalone", "--liveness", f"http://127.0.0.1:{free_port()}/healthz"],
            env=env, stdout=log, stderr=subprocess.STDOUT)

    def kill_operator(self) -> None:
        """SIGKILL, as an OOM kill or a node loss would: no cleanup, no graceful shutdown."""
        if self.operator is not None:
            self.operator.kill()
            self.operator.wait(10)

    def restart_operator(self) -> None:
        self.kill_operator()
        self._start_operator()

    # ------------------------------------------------------------ the kubelet and ReplicaSet (SIMULATION)

    def _agent_pods_loop(self) -> None:
        while not self.stop_event.is_set():
            for running in self.nodes.values():
                self._guarded(running, self._mark_agent)
            self.stop_event.wait(0.2)

    def _kubelet_loop(self, running: Running) -> None:
        while not self.stop_event.is_set():
            self._guarded(running, self._keep_serving_pod)
            self.stop_event.wait(0.2)

    def _guarded(self, running: Running, step: Any) -> None:
        try:
            step(running)
        except Exception as exc:  # keep simulating; the operator sees what the API shows
            with (self.dir / "kubelet-errors.log").open("a") as log:
                log.write(f"{time.time():.1f} {running.node.name} {step.__name__}: {exc!r}\n")

    def _mark_agent(self, running: Running) -> None:
        healthy = running.agent is not None and running.agent.poll() is None
        if healthy:
            try:
                healthy = http_json(f"http://127.0.0.1:{running.agent_port}/readyz", timeout=1)[0] == 200
            except OSError:
                healthy = False
        name = f"agent-{running.node.name}"

        def update() -> None:
            pod = self.api.server.get_object(PODS, AGENT_NS, name)
            ready = "True" if healthy else "False"
            if pod and (pod.get("status", {}).get("conditions") or [{}])[0].get("status") != ready:
                pod["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": ready}]}
                self.api.server._replace(PODS, (PODS, AGENT_NS, name), pod, "status", None)
        self.api.call(update)

    def _keep_serving_pod(self, running: Running) -> None:
        name = running.pod
        exists = name is not None and self.api.call(lambda: self.api.server.get_object(PODS, SERVING_NS, name)) is not None
        if exists:
            return
        pod = self._admit({"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": f"sglang-{running.node.name}-{uuid.uuid4().hex[:5]}", "namespace": SERVING_NS, "labels": dict(SERVING_LABELS)},
            "spec": {"nodeName": running.node.name, "containers": [{"name": "sglang", "image": "lmsysorg/sglang:rocm-demo",
                                                                     "env": [{"name": contract.FLAG_ENV, "value": "0"}]}]}})
        created = self.api.call(lambda: self.api.server.put_object(PODS, pod))
        running.pod = created["metadata"]["name"]
        flag, message = self._run_init_containers(running, pod)
        statuses = [] if message is None else [{"name": "gluon-preflight", "image": pod["spec"]["containers"][0]["image"], "imageID": "",
                                                "ready": False, "restartCount": 0,
                                                "state": {"terminated": {"exitCode": 0, "reason": "Completed", "message": message}}}]

        def start() -> None:
            obj = self.api.server.get_object(PODS, SERVING_NS, running.pod)
            if obj is not None:
                obj["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}], "initContainerStatuses": statuses}
                self.api.server._replace(PODS, (PODS, SERVING_NS, running.pod), obj, "status", None)
        self.api.call(start)
        if flag != running.flag:
            running.history.append((time.time(), flag))
        running.flag = flag
        self.pod_flags[running.pod] = flag

    def _admit(self, pod: dict[str, Any]) -> dict[str, Any]:
        """The API server's call to the mutating webhook (failurePolicy Ignore: an unreachable webhook admits as is)."""
        review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
            "uid": str(uuid.uuid4()), "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"}, "namespace": SERVING_NS, "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"}, "object": pod, "oldObject": None, "dryRun": False}}
        request = urllib.request.Request(f"https://127.0.0.1:{self.webhook_port}/inject", data=json.dumps(review).encode(),
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, context=self.ca, timeout=5) as response:
                answer = json.loads(response.read())["response"]
        except OSError:
            return pod
        if answer.get("patch"):
            return jsonpatch.apply_patch(pod, json.loads(base64.b64decode(answer["patch"])))
        return pod

    def _run_init_containers(self, running: Running, pod: dict[str, Any]) -> tuple[str, str | None]:
        """Run the injected init containers' commands as the kubelet would: the install step, then the
        preflight with the serving image's python3 (SIMULATION: our interpreter with a fake aiter and a gfx950
        torch on its path). Returns the flag the serving container gets and the termination message."""
        names = [c["name"] for c in pod["spec"].get("initContainers", [])]
        if "gluon-preflight" not in names:
            return "0", None  # not injected: the template's value
        shared = Path(tempfile.mkdtemp(prefix="pod-", dir=self.dir))
        subprocess.run([sys.executable, "-m", "gluon_agent", "preflight", "--install", str(shared)], env=python_env(), check=True,
                       capture_output=True, timeout=60)
        termination = shared / "termination-log"
        image_path = os.pathsep.join([str(shared / "lib"), str(AITER_STACK), str(self.image_stack), triton_site()])
        subprocess.run([sys.executable, "-m", "gluon_agent.preflight", "--flag-dir", str(shared), "--termination-log", str(termination),
                        "--agent-url", f"http://127.0.0.1:{running.agent_port}{contract.DECISION_PATH}", "--probe-timeout", "30"],
                       env=python_env(PYTHONPATH=image_path), capture_output=True, timeout=90)
        flag = (shared / "flag.env").read_text().strip().split("=", 1)[1].strip("'")
        return flag, termination.read_text() if termination.exists() else None

    # ------------------------------------------------------------ the rollout

    def wait_for_agents(self, timeout: float = 90) -> None:
        def published() -> bool:
            return all(self.node(n)["metadata"].get("labels", {}).get(contract.LABEL_SELFTEST) in ("pass", "fail", "error")
                       for n in self.nodes)
        wait_for(published, timeout=timeout, interval=0.5, what="every agent's first publish")

    def create_rollout(self, name: str = "kimi-k3", analysis: dict | None = None, strategy: dict | None = None) -> None:
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "metadata": {"name": name, "namespace": SERVING_NS},
                "spec": {"podSelector": {"matchLabels": dict(SERVING_LABELS)},
                         "strategy": dict(DEMO_STRATEGY, **(strategy or {})),
                         "analysis": dict(DEMO_ANALYSIS, prometheusUrl=self.prometheus.url, **(analysis or {}))}}
        self.rollout_name = name
        self.rollout_created = time.time()
        self.api.call(lambda: self.api.server.put_object(ROLLOUTS, body))

    def node(self, name: str) -> dict[str, Any]:
        return self.api.call(lambda: self.api.server.get_object(NODES, None, name))

    def status(self) -> dict[str, Any]:
        obj = self.api.call(lambda: self.api.server.get_object(ROLLOUTS, SERVING_NS, self.rollout_name))
        return (obj or {}).get("status") or {}

    def settled(self, min_seconds: float = 20.0) -> bool:
        """Nothing left to enable, restart or judge (checked only after the rollout has had time to start)."""
        status = self.status()
        nodes = status.get("nodes", {})
        if len(nodes) < len(self.nodes) or time.time() - self.rollout_created < min_seconds or status.get("phase") not in ("Complete", "Idle", "Aborted"):
            return False
        moving = [n for n, s in nodes.items() if s["state"] in ("Enabling", "Analyzing") or (s["state"] == "Eligible" and not s["holdout"])]
        return not moving

    def events(self) -> list[dict[str, Any]]:
        return self.api.call(lambda: self.api.server.objects(("", "v1", "events")))

    def pods(self) -> list[dict[str, Any]]:
        return [p for p in self.api.call(lambda: self.api.server.objects(PODS)) if p["metadata"]["namespace"] == SERVING_NS]

    # ------------------------------------------------------------ stop

    def stop(self) -> None:
        self.stop_event.set()
        for thread in self.threads:
            thread.join(5)
        processes = [r.agent for r in self.nodes.values() if r.agent] + ([self.operator] if self.operator else [])
        for proc in processes:
            proc.terminate()
        for proc in processes:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
        for running in self.nodes.values():
            if running.exporter:
                running.exporter.stop()
        if self.prometheus:
            self.prometheus.stop()
        if self.api:
            self.api.__exit__(None, None, None)


def triton_site() -> str:
    """The serving image's Triton: the real PyPI one (Gluon with cga_layout), from our environment."""
    import triton

    return os.path.dirname(os.path.dirname(triton.__file__))
