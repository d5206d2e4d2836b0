"""A whole gluon-rollout deployment on a real control plane on 127.0.0.1, for `make demo`, the end-to-end
tests and bench/faults.py.

Real: etcd, kube-apiserver (RBAC, admission, the CRD's schema), the controller-manager (the serving
Deployments' ReplicaSets recreate evicted pods; a PodDisruptionBudget answers evictions), the scheduler,
the chart installed by helm, one `gluon-agent run` process per node with a token bound to its DaemonSet
pod, the operator process with its own token and its TLS webhook called by the API server, the preflight
(run from the injected init containers' own commands), Prometheus, the analysis.
SIMULATION (named so everywhere): kwok's nodes and pod lifecycle (no kubelet), the kubelet's part for
injected pods (their init containers, and a real process per serving container, which each node's agent
observes through /proc under that node's cgroup root) and the agents' readiness probes (kubelet_sim.py),
the pods' network (podnet.py: each
pod's port at its pod IP relays to the local process standing in for its container; Prometheus, run by the
harness on the Prometheus Operator's generated config, finds them by Kubernetes service discovery and
labels their series through the chart's monitors: monitoring.py), each agent's self-test results (no AMD
GPU here), the serving image's stack (a fake aiter and a gfx950 torch on its PYTHONPATH), and SGLang's
decode speed (fake_sglang.FakeSglang).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from gluon_common import contract
from gluon_operator.spec import GROUP, PLURAL, VERSION
from gluon_operator.world import preflight_verdict

from . import fleet, images, processes
from .controlplane import ControlPlane, free_port
from .fake_sglang import FakeSglang, NodeModel
from .fakes.simulated import simulated_node
from .faultproxy import FaultProxy
from .images import AGENT_SIMULATION_ARGS, AGENT_SIMULATION_IMAGE
from .install import Installed, image_values, install
from .kubelet_sim import Image, InitOutcome, KubeletSim
from .monitoring import MonitoringStack, monitoring_values
from .podnet import NetNamespace, PodNetwork
from .prometheus import Prometheus
from .realnode import REAL_NODE_TAINT, RealNode
from .stages import PREFLIGHT_CONTAINER
from .waiting import wait_for

SERVING_NS = "serving"
SERVING_IMAGE = "lmsysorg/sglang:rocm-demo"
KERNEL_FAULT_TIMEOUT = 15.0  # seconds per self-test child when a kernel hangs
MONITORING_RELEASE = "kube-prometheus-stack"  # the `release` label the Prometheus object selects (chart default)
AGENT_NAME, OPERATOR_NAME = "gluon-rollout-agent", "gluon-rollout-operator"  # app.kubernetes.io/name of their pods


@dataclass(frozen=True)
class SimNode:
    name: str
    capable: bool = True
    fallback: str = "pass"
    flag_effect: float = 2.2  # decode speed with flag 1 / flag 0 in production (SIMULATION)
    kernel_fault: str | None = None  # "abort" | "hang": the real self-test runs, the (fake) aiter kernel crashes


DEMO_FLEET = (
    # gpu-03 is the control group (holdout: chosen by a stable hash of the name), gpu-02 regresses 15%.
    SimNode("gpu-01", flag_effect=2.3),
    SimNode("gpu-02", flag_effect=0.85),
    SimNode("gpu-03", flag_effect=1.9),
    SimNode("gpu-04", flag_effect=2.7),
    SimNode("gpu-05", flag_effect=2.1),
    SimNode("gpu-06", flag_effect=2.4),
    SimNode("gpu-07", capable=False),
    SimNode("gpu-08", fallback="fail"),
)
DEMO_REAL_NODES = ("gpu-01", "gpu-02")  # the canary and the node that regresses: real kubelets (realnode.py)
# minControls 1: six eligible nodes and one holdout leave the last nodes one steady control of each flag
# (promoted nodes qualify only once steady for baselineSeconds); the demo's noise is 2% and independent.
DEMO_ANALYSIS = {
    "intervalSeconds": 3,
    "stepSeconds": 2,
    "windowSeconds": 16,
    "warmupSeconds": 2,
    "minSamples": 5,
    "consecutiveFailures": 2,
    "tolerance": 0.05,
    "confidence": 0.95,
    "minControls": 1,
}
DEMO_STRATEGY = {"canaryNodes": 1, "maxParallel": 2, "holdoutNodes": 1, "restart": "Evict", "restartDelaySeconds": 1}


REAL_NODE_TOLERATION = {"key": REAL_NODE_TAINT, "operator": "Exists", "effect": "NoSchedule"}
# The chart's agent on real nodes: the SIMULATION agent image (the agent's own probe of the node's device files,
# a simulated self-test outcome), imported there, never pulled. kwok's nodes run local agent processes instead.
REAL_NODE_AGENT = {
    "image": {**image_values(AGENT_SIMULATION_IMAGE), "pullPolicy": "Never"},
    "extraArgs": list(AGENT_SIMULATION_ARGS),
    "tolerations": [{"key": "amd.com/gpu", "operator": "Exists", "effect": "NoSchedule"}, REAL_NODE_TOLERATION],
}
SERVING_METRICS_PORT = 30000  # fleet.serving_deployment's `metrics` port


def real_serving_deployment(name: str, node: SimNode) -> dict[str, Any]:
    """A serving Deployment pinned to a real node: the SIMULATION serving image, whose serve.py prints the
    flag its process sees and serves SGLang's metrics with this node's decode-speed model."""
    deployment = fleet.serving_deployment(name, node=node.name, image=images.SERVING_IMAGE)
    spec = deployment["spec"]["template"]["spec"]
    spec["tolerations"].append(REAL_NODE_TOLERATION)
    container = spec["containers"][0]
    container.update(imagePullPolicy="Never", command=["python3", "/opt/simulation/serve.py"])
    container["env"] += [
        {"name": "SIM_NODE", "value": node.name},
        {"name": "SIM_FLAG_EFFECT", "value": str(node.flag_effect)},
        {"name": "SIM_METRICS_PORT", "value": str(SERVING_METRICS_PORT)},
    ]
    return deployment


def real_preflight(pod: dict[str, Any], real_nodes: frozenset[str]) -> InitOutcome | None:
    """A running pod's preflight verdict on a real node (its init container's termination message), or None."""
    meta, spec, status = pod["metadata"], pod["spec"], pod.get("status") or {}
    if spec.get("nodeName") not in real_nodes or status.get("phase") != "Running" or meta.get("deletionTimestamp"):
        return None
    verdict, problem = preflight_verdict(status)  # the operator's own reading of it
    if verdict is None and problem is None:
        return None  # no verdict yet
    message = next(
        c["state"]["terminated"]["message"] for c in status["initContainerStatuses"] if c["name"] == PREFLIGHT_CONTAINER
    )
    flag = (verdict.flag if verdict is not None else None) or "0"  # unreadable: the safe flag
    return InitOutcome(meta["name"], meta["namespace"], spec["nodeName"], flag, message, 0.0)


def fake_stacks() -> tuple[Path, dict[str, str]]:
    """The fake aiter package and the fake gfx950 torch (fakes/: SIMULATION of the serving image)."""
    from .fakes.stacks import AITER_STACK, TORCH_GFX950

    return AITER_STACK, TORCH_GFX950


def sim_images(directory: Path) -> dict[str, Image]:
    """The images kubelet_sim runs on kwok's nodes (their stacks written under `directory`)."""
    aiter, torch_files = fake_stacks()
    from .fakes.stacks import triton_site, write_tree

    torch_stack = write_tree(directory / "serving-image", torch_files)
    shim = directory / "serving-image-bin"
    shim.mkdir(parents=True, exist_ok=True)
    python3 = shim / "python3"
    if not python3.exists():
        python3.symlink_to(sys.executable)
    venv_bin = str(Path(sys.executable).parent)
    return {
        processes.AGENT_IMAGE: Image(path=(venv_bin,)),
        images.AGENT_IMAGE: Image(path=(venv_bin,)),  # the webhook's, once real nodes need it pullable
        # SIMULATION: the serving image's python3 with a fake aiter and a gfx950 torch on its PYTHONPATH
        # (its own ENV), and the real Triton of our environment (Gluon with cga_layout).
        SERVING_IMAGE: Image(
            env={"PYTHONPATH": os.pathsep.join([str(aiter), str(torch_stack), triton_site()])}, path=(str(shim),)
        ),
    }


@dataclass
class Running:
    node: SimNode
    index: int
    agent: processes.Process | None = None
    exporter: FakeSglang | None = None
    flag: str = "0"  # the flag the node's serving pod really runs with (its flag file)
    history: list[tuple[float, str]] = field(default_factory=list)  # (time, flag) changes
    real: RealNode | None = None  # a real kubelet and runtime (realnode.py); None: a kwok node (SIMULATION)

    @property
    def ip(self) -> str:
        return self.real.ip if self.real is not None else fleet.node_ip(self.index)

    @property
    def agent_url(self) -> str:
        return f"http://{self.ip}:{contract.AGENT_PORT}"


class SimCluster:
    def __init__(
        self,
        fleet_nodes: tuple[SimNode, ...] = DEMO_FLEET,
        workdir: Path | None = None,
        reconcile_seconds: float = 1.0,
        proxy: bool = False,
        seed: int = 0,
        first_index: int = 1,
        real_nodes: tuple[str, ...] = (),
    ) -> None:
        """`first_index`: the first node's index, hence its loopback address (fleet.node_ip): a test may keep
        clear of the demo's fixed addresses (1..8)."""
        unknown = sorted(set(real_nodes) - {n.name for n in fleet_nodes})
        if unknown:
            raise ValueError(f"real_nodes {unknown}: each must name a node of the fleet")
        self.real_names = frozenset(real_nodes)
        self.fleet = fleet_nodes
        self.dir = Path(workdir or tempfile.mkdtemp(prefix="gluon-sim-")).resolve()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.reconcile_seconds = reconcile_seconds
        self.nodes = {n.name: Running(n, i + first_index) for i, n in enumerate(fleet_nodes)}
        self.want_proxy, self.seed = proxy, seed
        self.cp: ControlPlane | None = None
        self.installed: Installed | None = None
        self.proxy: FaultProxy | None = None
        self.kubelet: KubeletSim | None = None
        self.operator: processes.Process | None = None
        self.prometheus: Prometheus | None = None
        self.monitoring: MonitoringStack | None = None
        self.podnet: PodNetwork | None = None
        self.netns: NetNamespace | None = None
        self.metrics_port = free_port()
        self.pod_flags: dict[str, str] = {}  # serving pod name -> the flag its preflight gave it
        self.real_outcomes: list[InitOutcome] = []  # the preflights that real nodes' kubelets ran
        self.node_events: list[tuple[float, str, dict[str, str]]] = []  # (time, node, our labels) from a watch
        self.operator_starts = 0
        self.started = time.time()
        self.stop_event = threading.Event()
        self.threads: list[threading.Thread] = []

    # ------------------------------------------------------------ start

    def start(self, stage: Callable[[str], None] = lambda _: None) -> "SimCluster":
        """`stage` is told each setup stage as it starts (the demo prints them: demo.py, progress.py)."""
        stage("setup: starting the control plane (etcd, kube-apiserver, controller-manager, scheduler, kwok)")
        self.cp = ControlPlane(self.dir / "control-plane").start()
        self.admin = self.cp.admin_client()
        from kubernetes import client

        self.core, self.apps, self.custom = (
            client.CoreV1Api(self.admin),
            client.AppsV1Api(self.admin),
            client.CustomObjectsApi(self.admin),
        )
        stage("setup: the Prometheus Operator v0.93.1, its CRDs and a Prometheus object")
        self.monitoring = MonitoringStack(self.cp, MONITORING_RELEASE).start()
        values = monitoring_values(MONITORING_RELEASE, serving_labels=dict(fleet.SERVING_LABELS))
        if self.real_names:
            values["agent"] = REAL_NODE_AGENT
            self._start_real_nodes(stage)
        stage("setup: helm install of the chart, its ServiceMonitor, PodMonitors and rules on")
        self.installed = install(self.cp, values=values)
        if self.want_proxy:
            self.proxy = FaultProxy(self.cp.url, str(self.cp.pki.ca.cert), seed=self.seed).start()
        self.core.create_namespace({"metadata": {"name": SERVING_NS}})
        kwok_count = len(self.nodes) - len(self.real_names)
        stage(f"setup: {kwok_count} kwok GPU nodes (SIMULATION) and the simulated kubelets")
        for running in self.nodes.values():
            if running.real is not None:
                continue
            self.core.create_node(
                fleet.kwok_node(
                    running.node.name,
                    running.index,
                    labels={"gluonrollout.io/demo": "true"},
                    pod_index=running.index % 256,  # in this cluster's own pod network namespace
                )
            )
        self._spawn(self._watch_nodes, "node-watch")
        self.kubelet = KubeletSim(
            self.admin,
            self.images(),
            self._on_init,
            workdir=self.dir / "kubelet",
            readiness={"app.kubernetes.io/name=gluon-rollout-agent": "/readyz"},
            real_nodes=self.real_names,
        ).__enter__()
        if self.real_names:
            self._spawn(self._watch_real_preflights, "real-preflights")
        stage(f"setup: {kwok_count} gluon-agent daemons and SGLang-shaped exporters (SIMULATION) for them")
        for running in self.nodes.values():
            if running.real is not None:  # the chart's agent DaemonSet and the serving image's own exporter
                continue
            self._start_agent(running)
            running.exporter = FakeSglang(
                NodeModel(running.node.name, flag_effect=running.node.flag_effect, noise=0.02),
                lambda r=running: r.flag,
            ).start()
        stage("setup: the operator and its admission webhook")
        self.start_operator()
        stage("setup: the pod network, and Prometheus on the config the Prometheus Operator generated")
        self.netns = NetNamespace()
        self.podnet = PodNetwork(self.admin, self.pod_routes, netns=self.netns).start()
        self.prometheus = self.monitoring.prometheus(netns=self.netns)
        if self.real_names:  # as on kwok's nodes, whose agents run first: each preflight finds its agent
            stage("setup: waiting for the real nodes' agent pods to be Ready (the kubelet's readiness probe)")
            wait_for(
                lambda: all(self._agent_pod_ready(n) for n in self.real_names),
                timeout=180,
                interval=0.5,
                what="the real nodes' agent pods Ready",
                error=TimeoutError,
            )
        stage("setup: the serving Deployments (their pods through the webhook)")
        self._serving_workloads()
        return self

    def pod_routes(self, pod: dict[str, Any]) -> dict[int, tuple[str, int]]:
        """Where a pod's named ports lead (podnet.py): an agent's to its process on the node's address, the
        operator's metrics to its process, a serving pod's metrics to its node's exporter (SIMULATION)."""
        meta, spec = pod["metadata"], pod["spec"]
        running = self.nodes.get(spec.get("nodeName") or "")
        assert self.installed is not None
        if running is None:
            return {}
        ports = {p.get("name"): p["containerPort"] for c in spec["containers"] for p in c.get("ports") or []}
        if running.real is not None:  # the pod itself, at its address inside the node's network namespace
            inside = NetNamespace.at(running.real.netns_path)
            return {port: (pod["status"]["podIP"], port, inside) for port in ports.values()}
        name, ns = (meta.get("labels") or {}).get("app.kubernetes.io/name"), meta["namespace"]
        if ns == self.installed.namespace and name == AGENT_NAME and "http" in ports:
            return {ports["http"]: (running.ip, contract.AGENT_PORT)}
        if ns == self.installed.namespace and name == OPERATOR_NAME and "metrics" in ports:
            return {ports["metrics"]: ("127.0.0.1", self.metrics_port)}
        serving = all((meta.get("labels") or {}).get(k) == v for k, v in fleet.SERVING_LABELS.items())
        if ns != self.installed.namespace and serving and "metrics" in ports and running.exporter is not None:
            return {ports["metrics"]: ("127.0.0.1", running.exporter.port)}
        return {}

    def _start_real_nodes(self, stage: Callable[[str], None]) -> None:
        """The fleet's real nodes: each a kubelet and containerd in a network namespace of its
        own, with 8 GPUs' device files (SIMULATION), the serving and agent images imported."""
        names = ", ".join(sorted(self.real_names))
        stage(f"setup: REAL nodes {names}: the kubelet, containerd and runc, images imported (about a minute)")
        built = [images.serving_image(), images.agent_image(), images.agent_simulation_image()]
        for running in self.nodes.values():  # from this thread: each node's daemons die with their parent thread
            if running.node.name in self.real_names:
                running.real = RealNode(
                    self.cp,
                    running.node.name,
                    images=built,
                    labels={"gluonrollout.io/demo": "true", **fleet.GPU_NODE_LABEL},
                    gpus=8,
                    pod_network=fleet.pod_cidr(running.index % 256),  # the range kwok would give it
                )
                running.real.start()

    def _watch_real_preflights(self) -> None:
        """What kubelet_sim reports for kwok's nodes, read from real nodes' pods: each serving pod's preflight
        verdict (its termination message) once the pod runs, and so the flag its process got."""
        seen: set[str] = set()
        while not self.stop_event.wait(0.5):
            try:
                pods = json.loads(self.core.list_namespaced_pod(SERVING_NS, _preload_content=False).data)["items"]
            except Exception:
                continue
            for pod in pods:
                outcome = real_preflight(pod, self.real_names)
                if outcome is not None and pod["metadata"]["uid"] not in seen:
                    seen.add(pod["metadata"]["uid"])
                    self.real_outcomes.append(outcome)
                    self._on_init(outcome)

    def images(self) -> dict[str, Image]:
        return sim_images(self.dir)

    def _spawn(self, target: Any, name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self.threads.append(thread)

    def _server(self) -> str | None:
        return self.proxy.url if self.proxy else None

    def _start_agent(self, running: SimNode | Running) -> None:
        assert isinstance(running, Running) and self.installed is not None
        spec = simulated_node(capable=running.node.capable, fallback=running.node.fallback, speedup=2.3)
        env: dict[str, str] = {}
        if running.node.kernel_fault:
            aiter, _ = fake_stacks()
            spec.update(selftest="cpu-interpret", selftest_timeout=KERNEL_FAULT_TIMEOUT)
            # the fake aiter first, then this checkout (the agent's --source is the harness's)
            env.update(
                PYTHONPATH=os.pathsep.join([str(aiter), processes.CHECKOUT_PATH]),
                FAKE_AITER_MODE=f"*:{running.node.kernel_fault}:mla_gluon",
            )
        sim = self.dir / f"sim-{running.node.name}.json"
        sim.write_text(json.dumps(spec))
        running.agent = processes.agent(
            self.installed,
            running.node.name,
            running.ip,
            sim,
            server=self._server(),
            env=env,
            cgroup_root=self.kubelet.cgroup_root(running.node.name) if self.kubelet else None,
        )

    def start_operator(self) -> None:
        assert self.installed is not None
        self.operator_starts += 1
        self.operator = processes.operator(
            self.installed,
            self.reconcile_seconds,
            server=self._server(),
            metrics_port=self.metrics_port,
            agent_image=images.AGENT_IMAGE if self.real_names else None,
        )

    def kill_operator(self) -> None:
        """SIGKILL, as an OOM kill or a node loss would: no cleanup, no graceful shutdown."""
        if self.operator is not None:
            self.operator.kill()

    def restart_operator(self) -> None:
        self.kill_operator()
        self.start_operator()

    def _serving_workloads(self) -> None:
        """One serving Deployment per node (pinned), and a PodDisruptionBudget over them all."""
        for running in self.nodes.values():
            name = f"sglang-{running.node.name}"
            self.apps.create_namespaced_deployment(
                SERVING_NS,
                real_serving_deployment(name, running.node)
                if running.real is not None
                else fleet.serving_deployment(name, node=running.node.name, image=SERVING_IMAGE),
            )
        from kubernetes import client

        client.PolicyV1Api(self.admin).create_namespaced_pod_disruption_budget(
            SERVING_NS,
            {
                "metadata": {"name": "sglang"},
                "spec": {"maxUnavailable": 2, "selector": {"matchLabels": dict(fleet.SERVING_LABELS)}},
            },
        )

    # ------------------------------------------------------------ what the simulated kubelets report

    def _on_init(self, outcome: InitOutcome) -> None:
        running = self.nodes.get(outcome.node)
        if running is None or outcome.namespace != SERVING_NS:
            return
        flag = outcome.flag or "0"
        if flag != running.flag:
            running.history.append((time.time(), flag))
        running.flag = flag
        self.pod_flags[outcome.pod] = flag

    def _watch_nodes(self) -> None:
        from kubernetes import watch

        while not self.stop_event.is_set():
            try:
                for event in watch.Watch().stream(
                    self.core.list_node,
                    label_selector="gluonrollout.io/demo=true",
                    timeout_seconds=5,
                    _preload_content=False,
                ):
                    meta = event["raw_object"]["metadata"]
                    ours = {k: v for k, v in (meta.get("labels") or {}).items() if contract.is_ours(k)}
                    self.node_events.append((time.time(), meta["name"], ours))
                    if self.stop_event.is_set():
                        return
            except Exception:
                self.stop_event.wait(0.2)

    # ------------------------------------------------------------ the rollout

    def wait_for_agents(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(
                self.node(n)["metadata"].get("labels", {}).get(contract.LABEL_SELFTEST) in ("pass", "fail", "error")
                for n in self.nodes
            ) and all(self._agent_pod_ready(n) for n in self.real_names):
                return
            time.sleep(0.5)
        logs = {n: r.agent.tail(5) if r.agent else "" for n, r in self.nodes.items()}
        raise TimeoutError(f"not every agent published within {timeout} s: {logs}")

    def _agent_pod_ready(self, node: str) -> bool:
        """A real node's agent pod is Ready (the kubelet's readiness probe; the operator waits for it too)."""
        assert self.installed is not None
        pod = self.installed.agent_pod(node)
        conditions = (pod.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def wait_for_serving_series(self, timeout: float = 90) -> None:
        """Until Prometheus has the judge's series of every node: service discovery found each serving pod,
        the chart's PodMonitor labelled it, and a scrape landed."""
        from gluon_operator import analysis

        assert self.prometheus is not None
        query = analysis.render(analysis.DEFAULT_QUERY, SERVING_NS, fleet.SERVING_LABELS, DEMO_ANALYSIS["stepSeconds"])
        seen: set[str] = set()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            seen = {item["metric"].get("node") for item in self.prometheus.query(query)}
            if seen >= set(self.nodes):
                return
            time.sleep(0.5)
        raise TimeoutError(f"Prometheus has no serving series for {sorted(set(self.nodes) - seen)} after {timeout} s")

    def create_rollout(self, name: str = "kimi-k3", analysis: dict | None = None, strategy: dict | None = None) -> None:
        assert self.prometheus is not None
        body = fleet.rollout(
            name,
            SERVING_NS,
            nodeSelector={"matchLabels": {"gluonrollout.io/demo": "true"}},
            strategy=dict(DEMO_STRATEGY, **(strategy or {})),
            analysis=dict(DEMO_ANALYSIS, prometheusUrl=self.prometheus.url, **(analysis or {})),
        )
        self.rollout_name = name
        self.rollout_created = time.time()
        self.custom.create_namespaced_custom_object(GROUP, VERSION, SERVING_NS, PLURAL, body)

    def node(self, name: str) -> dict[str, Any]:
        return json.loads(self.core.read_node(name, _preload_content=False).data)

    def status(self) -> dict[str, Any]:
        try:
            obj = self.custom.get_namespaced_custom_object(GROUP, VERSION, SERVING_NS, PLURAL, self.rollout_name)
        except Exception:
            return {}
        return obj.get("status") or {}

    def settled(self, min_seconds: float = 20.0) -> bool:
        """Nothing left to enable, restart or judge (checked only after the rollout has had time to start)."""
        status = self.status()
        nodes = status.get("nodes", {})
        if (
            len(nodes) < len(self.nodes)
            or time.time() - self.rollout_created < min_seconds
            or status.get("phase") not in ("Complete", "Idle", "Aborted")
        ):
            return False
        moving = [
            n
            for n, s in nodes.items()
            if s["state"] in ("Enabling", "Analyzing") or (s["state"] == "Eligible" and not s["holdout"])
        ]
        return not moving and all(
            r.flag == ("1" if nodes[n]["state"] == "Promoted" else "0") for n, r in self.nodes.items()
        )

    def events(self) -> list[dict[str, Any]]:
        return json.loads(self.core.list_namespaced_event(SERVING_NS, _preload_content=False).data)["items"]

    def pods(self) -> list[dict[str, Any]]:
        items = json.loads(
            self.core.list_namespaced_pod(SERVING_NS, label_selector="app=sglang", _preload_content=False).data
        )["items"]
        return [p for p in items if not p["metadata"].get("deletionTimestamp")]

    def evictions(self) -> list[tuple[float, str]]:
        """(time, pod) of every eviction the operator asked for (the proxy saw them; needs proxy=True)."""
        assert self.proxy is not None, "evictions are counted by the fault proxy: SimCluster(proxy=True)"
        return [
            (s.at, s.path.split("/")[-2])
            for s in self.proxy.requests("POST", r"/pods/[^/]+/eviction$")
            if s.status < 300
        ]

    def enabled_at(self, node: str, when: float) -> str | None:
        """The node's `enabled` label at a moment, from the node watch."""
        value = None
        for at, name, labels in self.node_events:
            if name == node and at <= when:
                value = labels.get(contract.LABEL_ENABLED)
        return value

    def pod_node(self, pod: str) -> str | None:
        outcomes = [*(self.kubelet.outcomes if self.kubelet else []), *self.real_outcomes]
        outcome = next((o for o in outcomes if o.pod == pod), None)
        return outcome.node if outcome else None

    # ------------------------------------------------------------ stop

    def stop(self) -> None:
        self.stop_event.set()  # the node watch ends within its 5-s stream timeout, while the processes stop
        everything = [r.agent for r in self.nodes.values() if r.agent] + ([self.operator] if self.operator else [])
        if everything:  # all at once: each drains for about 5 s after SIGTERM; one by one took ~30 s
            with ThreadPoolExecutor(len(everything)) as pool:
                list(pool.map(lambda proc: proc.stop(), everything))
        for thread in self.threads:
            thread.join(5)
        for running in self.nodes.values():
            if running.exporter:
                running.exporter.stop()
        if self.kubelet is not None:
            self.kubelet.__exit__(None, None, None)
        if self.proxy is not None:
            self.proxy.stop()
        if self.podnet is not None:
            self.podnet.stop()
        if self.monitoring is not None:
            self.monitoring.stop()  # Prometheus with it
        if self.netns is not None:
            self.netns.stop()
        for running in self.nodes.values():
            if running.real is not None:
                running.real.stop()
        if self.cp:
            self.cp.stop()
