"""Fault scenarios on the demo's cluster (simcluster.py: a real control plane), shared by bench/faults.py and
tests/test_faults.py. API faults come from the fault-injecting proxy in front of the real API server, which
every agent and the operator talk through. See bench/faults.py for each scenario and its invariants."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path
from typing import Any

from gluon_common import contract
from gluon_operator import gating

from .faultproxy import Rule, everything, path_is
from .simcluster import DEMO_FLEET, DEMO_STRATEGY, SimCluster, SimNode
from .waiting import wait_for

# The faults each rollout scenario injects (kills: how many; the benchmark's --kills replaces the count).
SCENARIO_FAULTS: dict[str, dict[str, Any]] = {
    "uninterrupted": {},
    "operator_kills": {"kills": 20},
    "api_faults": {"inject_api_faults": True},
    "prometheus_outage": {"outage": True},
    "apiserver_outage": {"control_plane_outage": "kube-apiserver"},
    "etcd_outage": {"control_plane_outage": "etcd"},
}
ROLLOUT_SCENARIOS = tuple(SCENARIO_FAULTS)
SCENARIOS = ROLLOUT_SCENARIOS + ("kernel_faults",)
MAX_IN_FLIGHT = max(DEMO_STRATEGY["canaryNodes"], DEMO_STRATEGY["maxParallel"])
OUTAGE_SECONDS = 20.0
CONTROL_PLANE_OUTAGE_SECONDS = 20.0
RECOVERY_BOUND_SECONDS = 15.0  # first operator write after the API server is back (docs/operating/failure-modes.md)
WATCH_DROP_SECONDS = 3.0
REGRESSING_NODES = tuple(n.name for n in DEMO_FLEET if n.flag_effect < 1.0)  # flag 1 makes them slower: never Promoted


class Recorder(threading.Thread):
    """Samples the rollout status: the most nodes in progress at once, and every node's state changes."""

    def __init__(self, cluster: SimCluster) -> None:
        super().__init__(daemon=True)
        self.cluster = cluster
        self.stop = threading.Event()
        self.max_in_flight = 0
        self.transitions: list[tuple[float, str, str]] = []  # (time, node, new state)
        self._last: dict[str, str] = {}

    def run(self) -> None:
        while not self.stop.wait(0.2):
            nodes = self.cluster.status().get("nodes") or {}
            self.max_in_flight = max(
                self.max_in_flight, sum(1 for s in nodes.values() if s["state"] in gating.IN_PROGRESS)
            )
            for name, node in nodes.items():
                if self._last.get(name) != node["state"]:
                    self.transitions.append((time.time(), name, node["state"]))
                    self._last[name] = node["state"]


def final_state(cluster: SimCluster) -> dict[str, dict[str, Any]]:
    nodes = cluster.status().get("nodes") or {}
    return {
        name: {
            "state": nodes.get(name, {}).get("state"),
            "holdout": nodes.get(name, {}).get("holdout"),
            "enabled": cluster.node(name)["metadata"].get("labels", {}).get(contract.LABEL_ENABLED),
        }
        for name in sorted(cluster.nodes)
    }


def max_in_flight(cluster: SimCluster) -> int:
    """The most nodes Enabling or Analyzing at once, from every change of the nodes' `state` labels (the
    node watch): the nodes themselves carry the durable state; the rollout status is a summary of them."""
    states: dict[str, str | None] = {}
    most = 0
    for _, node, labels in sorted(cluster.node_events, key=lambda e: e[0]):
        states[node] = labels.get(contract.LABEL_STATE)
        most = max(most, sum(1 for s in states.values() if s in gating.IN_PROGRESS))
    return most


def double_restarts(cluster: SimCluster) -> list[str]:
    """Evictions of a pod that already ran with the flag its node wanted at that moment."""
    found = []
    for at, pod in cluster.evictions():
        node = cluster.pod_node(pod)
        wanted = "1" if node and cluster.enabled_at(node, at) == "true" else "0"
        if cluster.pod_flags.get(pod) == wanted:
            found.append(f"{pod} on {node} evicted at flag {wanted}")
    return found


def api_faults(cluster: SimCluster, drop_seconds: float) -> None:
    """10% of requests answered 500, 5% of writes 409, every watch cut after `drop_seconds`."""
    assert cluster.proxy is not None
    writes = lambda m, p, q: m in ("PATCH", "PUT", "POST")  # noqa: E731
    cluster.proxy.rules[:] = [
        Rule(path_is(".", watch=True), cut_after=drop_seconds),
        Rule(everything, status=500, probability=0.10),
        Rule(writes, status=409, probability=0.05 / 0.90),
    ]


def injected(cluster: SimCluster) -> dict[str, int]:
    assert cluster.proxy is not None
    seen = cluster.proxy.requests()
    return {"requests": len(seen), "500": sum(s.status == 500 for s in seen), "409": sum(s.status == 409 for s in seen)}


def kill_repeatedly(
    cluster: SimCluster, kills: int, rng: random.Random, done: threading.Event, log: list[float]
) -> None:
    for _ in range(kills):
        if done.wait(rng.uniform(0.5, 3.0)):
            return
        cluster.restart_operator()
        log.append(round(time.time() - cluster.rollout_created, 2))


def prometheus_outage(cluster: SimCluster, done: threading.Event, record: dict[str, Any]) -> None:
    """The Prometheus process (on the Prometheus Operator's generated config) stopped for OUTAGE_SECONDS once a
    node is being analysed, then started again on the same port, data and config (the harness's reloader keeps
    running: a config change while it is down is applied once it answers)."""
    assert cluster.prometheus is not None
    wait_for(lambda: analysing(cluster, done), timeout=120, interval=0.2, what="a node in Analyzing")
    record["down_at"] = time.time()
    cluster.prometheus.halt()
    time.sleep(OUTAGE_SECONDS)
    cluster.prometheus.start()
    record["up_at"] = time.time()


def analysing(cluster: SimCluster, done: threading.Event) -> bool:
    return any(s["state"] == gating.ANALYZING for s in (cluster.status().get("nodes") or {}).values()) or done.is_set()


def component_outage(cluster: SimCluster, component: str, done: threading.Event, record: dict[str, Any]) -> None:
    """`component` ("kube-apiserver" or "etcd") stopped for CONTROL_PLANE_OUTAGE_SECONDS once a node is being
    analysed (its verdict comes from Prometheus, not the API: work is due the moment the API is back), then
    started again; `up_at` is when the API server answers /readyz again."""
    assert cluster.cp is not None
    wait_for(lambda: analysing(cluster, done), timeout=120, interval=0.2, what="a node in Analyzing")
    record["down_at"] = time.time()
    cluster.cp.halt(component)
    time.sleep(CONTROL_PLANE_OUTAGE_SECONDS)
    cluster.cp.resume(component)
    record["up_at"] = time.time()


def recovery(cluster: SimCluster, up_at: float) -> dict[str, Any]:
    """Seconds from the API server's return to the operator's first write that landed: a status write or an
    eviction (only the operator makes these; a node write could be an agent's)."""
    assert cluster.proxy is not None
    status = rf"/gluonrollouts/{cluster.rollout_name}/status$"
    writes = [
        s.at
        for s in cluster.proxy.requests("PATCH", status) + cluster.proxy.requests("POST", r"/pods/[^/]+/eviction$")
        if s.at > up_at and s.status < 300
    ]
    return {"first_write_seconds": round(min(writes) - up_at, 1) if writes else None}


def regressing_promoted(cluster: SimCluster, recorder: Recorder) -> list[str]:
    """The first sight of each regressing node as Promoted in the rollout status, and in its node's label."""
    status = {n: t for t, n, s in reversed(recorder.transitions) if n in REGRESSING_NODES and s == gating.PROMOTED}
    label = {
        n: t
        for t, n, labels in reversed(cluster.node_events)
        if n in REGRESSING_NODES and labels.get(contract.LABEL_STATE) == gating.PROMOTED
    }
    return [
        f"{n} Promoted in the {where} at {t:.1f}"
        for where, first in (("status", status), ("state label", label))
        for n, t in sorted(first.items())
    ]


def run_rollout(
    scenario: str,
    workdir: Path,
    seed: int,
    timeout: float,
    kills: int = 0,
    inject_api_faults: bool = False,
    outage: bool = False,
    control_plane_outage: str | None = None,
) -> dict[str, Any]:
    """One rollout on a fresh cluster (in workdir/scenario) with the faults asked for: `kills` operator
    SIGKILLs, API faults, a Prometheus outage, an outage of a control-plane component."""
    cluster = SimCluster(workdir=workdir / scenario, proxy=True, seed=seed)
    recorder, done, extra = Recorder(cluster), threading.Event(), {}
    started = time.monotonic()
    try:
        cluster.start()
        cluster.wait_for_agents()
        cluster.wait_for_serving_series()  # service discovery found every serving pod: each node has a baseline
        if inject_api_faults:
            api_faults(cluster, WATCH_DROP_SECONDS)
        cluster.create_rollout()
        recorder.start()
        action: threading.Thread | None = None
        if kills:
            extra["kill_times"] = []
            action = threading.Thread(
                target=kill_repeatedly,
                args=(cluster, kills, random.Random(seed), done, extra["kill_times"]),
                daemon=True,
            )
        elif outage:
            action = threading.Thread(target=prometheus_outage, args=(cluster, done, extra), daemon=True)
        if action:
            action.start()
        if (
            control_plane_outage
        ):  # on this thread: a component lives only as long as the thread that started it (PR_SET_PDEATHSIG)
            component_outage(cluster, control_plane_outage, done, extra)
        try:
            wait_for(
                lambda: cluster.settled() and (action is None or not action.is_alive()),
                timeout=timeout,
                interval=0.5,
                what="the rollout to settle",
            )
            settled = True
        except AssertionError:
            settled = False
        done.set()
        if action:
            action.join(60)
        recorder.stop.set()
        recorder.join(5)
        outcome = {
            "settled": settled,
            "seconds": round(time.monotonic() - started, 1),
            "final": final_state(cluster),
            "max_in_flight": max_in_flight(cluster),
            "max_in_flight_in_status": recorder.max_in_flight,
            "double_restarts": double_restarts(cluster),
            "evictions": len(cluster.evictions()),
            "operator_starts": cluster.operator_starts,
            "regressing_promoted": regressing_promoted(cluster, recorder),
        }
        if "kill_times" in extra:
            outcome["kills"] = len(extra["kill_times"])
            outcome["kill_seconds_after_rollout_created"] = extra["kill_times"]
        if control_plane_outage and "up_at" in extra:
            outcome.update(
                outage_component=control_plane_outage,
                outage_seconds=round(extra["up_at"] - extra["down_at"], 1),
                **recovery(cluster, extra["up_at"]),
            )
        elif "down_at" in extra:
            grace = cluster.reconcile_seconds + 1.0  # a verdict computed just before the outage lands in that reconcile
            decided = [
                (round(t - extra["down_at"], 1), n, s)
                for t, n, s in recorder.transitions
                if extra["down_at"] + grace <= t <= extra["up_at"] and s in (gating.PROMOTED, gating.ROLLED_BACK)
            ]
            outcome["outage_seconds"] = round(extra["up_at"] - extra["down_at"], 1)
            outcome["decisions_during_outage"] = decided
        if inject_api_faults:
            outcome["injected"] = dict(injected(cluster), watch_drop_seconds=WATCH_DROP_SECONDS)
        return outcome
    finally:
        done.set()
        cluster.stop()


KERNEL_FLEET = (SimNode("gpu-ok"), SimNode("gpu-abort", kernel_fault="abort"), SimNode("gpu-hang", kernel_fault="hang"))


def run_kernel_faults(workdir: Path, timeout: float) -> dict[str, Any]:
    cluster = SimCluster(KERNEL_FLEET, workdir=workdir / "kernel_faults")
    started = time.monotonic()
    try:
        cluster.start()
        cluster.wait_for_agents(timeout=timeout)
        cluster.create_rollout(strategy={"holdoutNodes": 0})

        def judged() -> bool:
            nodes = cluster.status().get("nodes") or {}
            return all(nodes.get(n, {}).get("state") == gating.INELIGIBLE for n in ("gpu-abort", "gpu-hang"))

        wait_for(judged, timeout=60, interval=0.5, what="the faulty nodes judged")
        nodes = cluster.status()["nodes"]
        out: dict[str, Any] = {"seconds": round(time.monotonic() - started, 1)}
        for name, running in cluster.nodes.items():
            labels = cluster.node(name)["metadata"].get("labels", {})
            code = healthz(running.agent_url)
            out[name] = {
                "selftest": labels.get(contract.LABEL_SELFTEST),
                "state": nodes[name]["state"],
                "reason": nodes[name]["reason"],
                "agent_alive": running.agent is not None and running.agent.alive(),
                "agent_healthz": code,
            }
        return out
    finally:
        cluster.stop()


def healthz(url: str) -> int:
    import urllib.request

    try:
        with urllib.request.urlopen(url + "/healthz", timeout=2) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return 0


def check(results: dict[str, Any]) -> dict[str, bool]:
    """The invariants, one boolean each."""
    ok: dict[str, bool] = {}
    reference = results.get("uninterrupted", {}).get("final")
    for name in ROLLOUT_SCENARIOS:
        if name not in results:
            continue
        r = results[name]
        ok[f"{name}.settled"] = r["settled"]
        if reference is not None and name != "uninterrupted":
            ok[f"{name}.final_state_equals_uninterrupted"] = r["final"] == reference
        ok[f"{name}.no_double_restart"] = not r["double_restarts"]
        ok[f"{name}.max_in_flight_within_limit"] = r["max_in_flight"] <= MAX_IN_FLIGHT
        ok[f"{name}.regressing_node_never_promoted"] = not r.get("regressing_promoted")
        if SCENARIO_FAULTS.get(name, {}).get("control_plane_outage"):
            first = r.get("first_write_seconds")
            ok[f"{name}.recovered_within_{RECOVERY_BOUND_SECONDS:g}_s"] = (
                first is not None and first <= RECOVERY_BOUND_SECONDS
            )
    if "prometheus_outage" in results:
        ok["prometheus_outage.no_decision_while_down"] = not results["prometheus_outage"].get(
            "decisions_during_outage", [None]
        )
    if "kernel_faults" in results:
        k = results["kernel_faults"]
        for name in ("gpu-abort", "gpu-hang"):
            ok[f"kernel_faults.{name}.error_ineligible_agent_up"] = (
                k[name]["selftest"] == "error"
                and k[name]["state"] == gating.INELIGIBLE
                and k[name]["agent_alive"]
                and k[name]["agent_healthz"] == 200
            )
        ok["kernel_faults.gpu-ok.passes"] = k["gpu-ok"]["selftest"] == "pass"
    return ok
