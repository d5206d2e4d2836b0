"""`make demo`: the whole mission on this machine, on 127.0.0.1, in a few minutes.

On a real Kubernetes control plane (etcd, kube-apiserver, controller-manager, scheduler) with the chart
installed by helm, 8 GPU nodes. The canary gpu-01 and the regressing gpu-02 are REAL nodes (a kubelet of
the pinned Kubernetes, Debian's containerd and runc; the agent DaemonSet's pod and the serving pods run
from images built here; their GPUs are SIMULATION device files); the 6 others are kwok's (a SIMULATION of
kubelets, with an agent process each). The self-test outcomes are a SIMULATION (5 pass, 1 is not capable,
1 fails its fallback self-test, 1 passes but regresses in production). Serving pods go through the real
webhook (called by the API server) and the real preflight; SGLang-shaped exporters (SIMULATION) are
scraped by a real Prometheus running the config a real Prometheus Operator generated from the chart's
ServiceMonitor and PodMonitors (Kubernetes service discovery; the serving PodMonitor turns the pods' flag
label into `flag`: monitoring.py); the real operator rolls the flag out node by node and rolls back the
regressing node.
Prints each setup stage as it starts and a line at least every few seconds (progress.py), a live table, a
summary, and writes a PNG timeline (timeline.py).

    python -m gluon_localcluster.demo [--out out/demo] [--timeout 240]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import time
import urllib.parse
import urllib.request
from datetime import datetime
from pathlib import Path
from typing import Callable

from gluon_common import contract
from gluon_operator import gating

from . import timeline
from .progress import Progress
from .simcluster import DEMO_ANALYSIS, DEMO_REAL_NODES, DEMO_STRATEGY, SERVING_NS, SimCluster

STATE_MARK = {
    "Promoted": "PROMOTED",
    "RolledBack": "ROLLED BACK",
    "Analyzing": "analyzing",
    "Enabling": "enabling",
    "Eligible": "eligible",
    "Ineligible": "ineligible",
    "Disabled": "disabled",
}


# Serving history at flag 0 before the rollout begins: the first nodes enabled judge their baseline on it.
BASELINE_SECONDS = 8


def table(cluster: SimCluster) -> str:
    status = cluster.status()
    lines = [
        f"phase={status.get('phase', '-'):<12} counts="
        + " ".join(f"{k}:{v}" for k, v in (status.get("counts") or {}).items() if v)
    ]
    for name, running in cluster.nodes.items():
        node = (status.get("nodes") or {}).get(name, {})
        labels = cluster.node(name)["metadata"].get("labels", {})
        state = STATE_MARK.get(node.get("state"), "-") + (" (holdout)" if node.get("holdout") else "")
        numbers = node.get("numbers") or {}
        effect = gating.effect_text(numbers, "")
        kind = "REAL" if running.real is not None else "kwok"
        lines.append(
            f"  {name} {kind:<4}  selftest={labels.get(contract.LABEL_SELFTEST, '-'):<8} flag={running.flag}  "
            f"{state:<22} {effect:<7} {node.get('reason', '')[:70]}"
        )
    return "\n".join(lines)


def summary(cluster: SimCluster) -> dict:
    nodes = cluster.status().get("nodes", {})
    out = {"promoted": [], "holdout": [], "ineligible": {}, "rolled_back": {}, "other": {}}
    for name, node in sorted(nodes.items()):
        if node["state"] == "Promoted":
            out["promoted"].append({"node": name, "effect": gating.recorded_effect(node.get("numbers"))})
        elif node["state"] == "Eligible" and node["holdout"]:
            out["holdout"].append(name)
        elif node["state"] == "Ineligible":
            out["ineligible"][name] = node["reason"]
        elif node["state"] == "RolledBack":
            n = node["numbers"]
            out["rolled_back"][name] = {
                "reason": node["reason"],
                "effect": gating.recorded_effect(n),
                "ci": [n.get("ci_low"), n.get("ci_high")],
                "threshold": n.get("threshold"),
                "n_post": n.get("n_post"),
                "n_pre": n.get("n_pre"),
                "p_worse": n.get("p_worse"),
            }
        else:
            out["other"][name] = node["state"]
    out["seconds"] = round(time.time() - cluster.started, 1)
    return out


def judged_speeds(cluster: SimCluster, end: float) -> dict[str, list[tuple[float, float]]]:
    """Per-node decode speed from Prometheus: the judge's own query (split by node and flag) at the judge's
    step, so the plot shows the samples it judged; a step where pods of both flags served is blank
    (analysis.split_by_flag), as the judge leaves it out. Times in seconds since the demo started."""
    from gluon_operator import analysis

    from . import fleet

    assert cluster.prometheus is not None
    step = DEMO_ANALYSIS["stepSeconds"]
    query = analysis.render(analysis.DEFAULT_QUERY, SERVING_NS, fleet.SERVING_LABELS, step)
    params = urllib.parse.urlencode({"query": query, "start": cluster.started, "end": end, "step": step})
    with urllib.request.urlopen(f"{cluster.prometheus.url}/api/v1/query_range?{params}", timeout=10) as response:
        series, _ = analysis.split_by_flag(json.loads(response.read())["data"]["result"])
    return {name: [(t - cluster.started, float(v)) for t, v in points] for name, points in series.items()}


def node_facts(cluster: SimCluster) -> list[timeline.NodeFacts]:
    """The timeline's plain facts: final states from the rollout's status, flag switches from the simulated
    kubelets, state changes from the node watch (the operator's state label), in seconds since the start."""
    nodes = cluster.status().get("nodes", {})
    facts = []
    for name, running in cluster.nodes.items():
        record = nodes.get(name, {})
        states: list[tuple[float, str]] = []
        for at, who, labels in cluster.node_events:
            state = labels.get(contract.LABEL_STATE)
            if who == name and state and (not states or states[-1][1] != state):
                states.append((at - cluster.started, state))
        facts.append(
            timeline.NodeFacts(
                name=name,
                state=record.get("state", "?"),
                holdout=bool(record.get("holdout")),
                effect=gating.effect_text(record.get("numbers"), ""),
                flags=tuple((at - cluster.started, flag) for at, flag in running.history),
                states=tuple(states),
            )
        )
    return facts


def approvals(cluster: SimCluster) -> list[tuple[float, str]]:
    """(seconds since the start, the gate granted) of the rollout's Approved events."""
    out = []
    for event in cluster.events():
        if event.get("reason") == "Approved":
            stamp = event.get("lastTimestamp") or event.get("firstTimestamp") or event.get("eventTime")
            when = datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() if stamp else time.time()
            gate = re.search(r"gate '([^']+)'", event.get("message", ""))
            out.append((when - cluster.started, gate.group(1) if gate else event.get("message", "")[:40]))
    return out


def draw_timeline(cluster: SimCluster, path: Path) -> None:
    end = time.time()
    speeds = judged_speeds(cluster, end)
    created = cluster.rollout_created - cluster.started
    first = min((points[0][0] for points in speeds.values() if points), default=created)
    the_plan = timeline.plan(
        node_facts(cluster),
        created=created,
        end=end - cluster.started,
        canary_nodes=DEMO_STRATEGY["canaryNodes"],
        approvals=approvals(cluster),
        start=max(0.0, min(first, created) - 2),  # from the first sample: the setup before it is not drawn
    )
    title = (
        "gluon-rollout demo: decode speed, state and flag per node\n"
        "SIMULATION of the GPU nodes and SGLang; real control plane, operator, Prometheus Operator and Prometheus"
    )
    timeline.draw(the_plan, speeds, path, title)


def run(
    out: Path,
    timeout: float,
    emit: Callable[[str], None] = print,
    plugin: bool = True,
    before_stop: Callable[[dict], None] = lambda _: None,
    real_nodes: tuple[str, ...] = DEMO_REAL_NODES,
) -> dict:
    """The whole demo; every line goes through `emit` with its elapsed seconds (progress.py), at least one
    every few seconds. `plugin`: end with `kubectl gluon status` and `explain` (printed to stdout).
    `real_nodes`: the fleet's nodes that run as real nodes (the others are kwok's).
    `before_stop`: given the result before the cluster stops (stopping takes about 15 s), e.g. to print it."""
    with Progress(emit) as progress:
        out.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(out / "work", ignore_errors=True)  # every demo starts from an empty cluster (etcd's data)
        cluster = SimCluster(workdir=out / "work", real_nodes=real_nodes)
        try:
            result = _run(cluster, out, timeout, progress, plugin)
            before_stop(result)
            return result
        finally:
            progress.stage("stopping the cluster (the result above is final)")
            cluster.stop()


def _run(cluster: SimCluster, out: Path, timeout: float, progress: Progress, plugin: bool) -> dict:
    cluster.start(stage=progress.stage)
    version = cluster.cp.version()
    progress.say(
        f"kube-apiserver {version['gitVersion']} ({version['platform']}, {version['goVersion']}) on {cluster.cp.url}"
    )
    progress.stage("waiting for every agent's self-test result (SIMULATION) on its node's labels")
    cluster.wait_for_agents()
    progress.stage("waiting for Prometheus to scrape every node's serving pod")
    cluster.wait_for_serving_series()
    progress.stage(f"baseline: {BASELINE_SECONDS} s of serving metrics at flag 0 before any flag flips")
    time.sleep(BASELINE_SECONDS)
    progress.stage("creating the GluonRollout (canary 1, maxParallel 2, holdout 1)")
    cluster.create_rollout()
    deadline, last = time.time() + timeout, 0.0
    while time.time() < deadline:
        if time.time() - last >= 3:
            progress.say(table(cluster))
            last = time.time()
        if cluster.settled():
            break
        time.sleep(0.5)
    progress.stage("settled: writing the summary and the timeline")
    result = summary(cluster)
    result["settled"] = cluster.settled()
    result["real_nodes"] = sorted(name for name, running in cluster.nodes.items() if running.real is not None)
    result["apiserver_version"] = version
    draw_timeline(cluster, out / "timeline.png")
    result["timeline"] = str(out / "timeline.png")
    result["events"] = [e.get("message") for e in cluster.events()]
    result["node_labels"] = {
        name: {k: v for k, v in cluster.node(name)["metadata"].get("labels", {}).items() if contract.is_ours(k)}
        for name in cluster.nodes
    }
    result["pod_flags"] = {
        p["spec"]["nodeName"]: p["metadata"].get("labels", {}).get(contract.LABEL_POD_FLAG) for p in cluster.pods()
    }
    result["dashboard"] = dashboard_series(cluster)
    if plugin:
        progress.stage("what a person types next: kubectl gluon")
        plugin_pass(cluster, result)
    result["progress"] = [[round(at, 2), line.splitlines()[0][:120]] for at, line in progress.lines]
    (out / "summary.json").write_text(json.dumps(result, indent=2))
    return result


def dashboard_series(cluster: SimCluster) -> list[dict]:
    """Every panel query of the chart's dashboard ConfigMap (as installed), with $namespace set to the
    rollout's namespace as a person would pick it, against the demo's Prometheus: how many series each got."""
    from .monitoring import dashboard_queries

    assert cluster.installed is not None and cluster.prometheus is not None
    config = cluster.core.read_namespaced_config_map(
        f"{cluster.installed.release}-dashboard", cluster.installed.namespace
    )
    dashboard = json.loads(next(iter(config.data.values())))
    return [
        {"panel": title, "query": expr, "series": len(cluster.prometheus.query(expr))}
        for title, expr in dashboard_queries(dashboard, {"namespace": SERVING_NS})
    ]


def plugin_pass(cluster: SimCluster, result: dict) -> None:
    """What a person types next: `kubectl gluon status`, then `explain` on each rolled-back node."""
    from gluon_operator.kubectl_plugin.cli import main as kubectl_gluon

    flags = ["--kubeconfig", str(cluster.cp.kubeconfig), "-n", SERVING_NS]
    print(f"\n$ kubectl gluon status -n {SERVING_NS}", flush=True)
    kubectl_gluon([*flags, "status"])
    for name in result["rolled_back"]:
        print(f"\n$ kubectl gluon explain {name} -n {SERVING_NS}", flush=True)
        kubectl_gluon([*flags, "explain", name])


def print_summary(result: dict, out: Path) -> None:
    print("\nSUMMARY", flush=True)
    if result.get("real_nodes"):
        real = ", ".join(result["real_nodes"])
        print(f"  real nodes:  {real} (a kubelet, containerd and runc each); the others are kwok's SIMULATION")
    promoted = ", ".join(f"{p['node']} ({gating.effect_text(p)})" for p in result["promoted"])
    print(f"  promoted:    {promoted}")
    print(f"  holdout:     {', '.join(result['holdout'])} (kept at flag 0 as the control group)")
    for name, reason in result["ineligible"].items():
        print(f"  ineligible:  {name}: {reason[:110]}")
    for name, r in result["rolled_back"].items():
        if r["effect"] is None:  # rolled back without an analysis (e.g. the serving image's preflight said 0)
            print(f"  rolled back: {name}: {r['reason'][:150]}")
            continue
        print(
            f"  rolled back: {name}: effect {gating.effect_text(r)} (CI x{r['ci'][0]:.3f}..x{r['ci'][1]:.3f}), "
            f"threshold x{r['threshold']}, n={r['n_post']} after / {r['n_pre']} before, p={r['p_worse']:.2g}"
        )
    print(f"  timeline:    {result['timeline']}   summary: {out / 'summary.json'}   ({result['seconds']} s)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="out/demo")
    parser.add_argument("--timeout", type=float, default=240)
    args = parser.parse_args()
    out = Path(args.out)
    result = run(
        out,
        args.timeout,
        before_stop=lambda result: print_summary(result, out),
    )
    return 0 if result["settled"] and result["rolled_back"] else 1


if __name__ == "__main__":
    sys.exit(main())
