"""`make demo`: the whole mission on this machine, on 127.0.0.1, in a few minutes.

On a real Kubernetes control plane (etcd, kube-apiserver, controller-manager, scheduler; kwok's nodes are a
SIMULATION of kubelets) with the chart installed by helm: 8 GPU nodes (their self-test results are a
SIMULATION: 5 pass, 1 is not capable, 1 fails its fallback self-test, 1 passes but regresses in production)
each run the real agent daemon; serving Deployments' pods go through the real webhook (called by the API
server) and the real preflight; a real Prometheus scrapes SGLang-shaped exporters (SIMULATION); the real
operator rolls the flag out node by node and rolls back the regressing node. Prints the API server's
version, a live table and a summary, writes a PNG timeline.

    python -m gluon_localcluster.demo [--out out/demo] [--timeout 300]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from gluon_common import contract
from gluon_operator import gating

from .simcluster import SERVING_NS, SimCluster

STATE_MARK = {
    "Promoted": "PROMOTED",
    "RolledBack": "ROLLED BACK",
    "Analyzing": "analyzing",
    "Enabling": "enabling",
    "Eligible": "eligible",
    "Ineligible": "ineligible",
    "Disabled": "disabled",
}


def table(cluster: SimCluster) -> str:
    status = cluster.status()
    lines = [
        f"t={time.time() - cluster.started:5.0f}s  phase={status.get('phase', '-'):<12} counts="
        + " ".join(f"{k}:{v}" for k, v in (status.get("counts") or {}).items() if v)
    ]
    for name, running in cluster.nodes.items():
        node = (status.get("nodes") or {}).get(name, {})
        labels = cluster.node(name)["metadata"].get("labels", {})
        state = STATE_MARK.get(node.get("state"), "-") + (" (holdout)" if node.get("holdout") else "")
        numbers = node.get("numbers") or {}
        effect = gating.effect_text(numbers, "")
        lines.append(
            f"  {name}  selftest={labels.get(contract.LABEL_SELFTEST, '-'):<8} flag={running.flag}  "
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


def timeline(cluster: SimCluster, path: Path) -> None:
    """Per-node decode speed from Prometheus, flag flips and the rollback marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from gluon_operator import analysis

    from . import fleet
    from .simcluster import DEMO_ANALYSIS

    end = time.time()
    # the judge's own query (split by node and flag) at the judge's step: the plot shows the samples it judged,
    # a step where pods of both flags served blank (analysis.split_by_flag), as the judge leaves it out
    step = DEMO_ANALYSIS["stepSeconds"]
    query = analysis.render(analysis.DEFAULT_QUERY, SERVING_NS, fleet.SERVING_LABELS, step)
    import urllib.parse
    import urllib.request

    params = urllib.parse.urlencode({"query": query, "start": cluster.started, "end": end, "step": step})
    with urllib.request.urlopen(f"{cluster.prometheus.url}/api/v1/query_range?{params}", timeout=10) as response:
        series, _ = analysis.split_by_flag(json.loads(response.read())["data"]["result"])
    nodes = cluster.status().get("nodes", {})
    fig, ax = plt.subplots(figsize=(12, 6.5))
    for name in sorted(series):
        points = series[name]
        (line,) = ax.plot(
            [t - cluster.started for t, _ in points],
            [v for _, v in points],
            label=f"{name} ({nodes.get(name, {}).get('state', '?')})",
        )
        for when, flag in cluster.nodes[name].history:
            ax.axvline(when - cluster.started, color=line.get_color(), linestyle=":", alpha=0.7)
            ax.annotate(
                f"flag {flag}",
                (when - cluster.started, np.nanmax(points[:, 1])),
                rotation=90,
                fontsize=7,
                color=line.get_color(),
                va="top",
            )
        if nodes.get(name, {}).get("state") == "RolledBack":
            at = nodes[name]["since"] - cluster.started
            effect = gating.effect_text(nodes[name].get("numbers"))
            ax.axvline(at, color="red", linewidth=2)
            ax.annotate(f"ROLLBACK {name}: effect {effect}", (at, ax.get_ylim()[1] * 0.9), color="red", fontsize=9)
    ax.set_xlabel("seconds since start")
    ax.set_ylabel("decode tokens/s per sequence (Prometheus)")
    ax.set_title("gluon-rollout demo: per-node decode speed, flag flips (dotted), rollback (red)")
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def run(out: Path, timeout: float, quiet: bool = False) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(out / "work", ignore_errors=True)  # every demo starts from an empty cluster (etcd's data lives there)
    cluster = SimCluster(workdir=out / "work")
    try:
        cluster.start()
        version = cluster.cp.version()
        if not quiet:
            print(
                f"kube-apiserver {version['gitVersion']} ({version['platform']}, {version['goVersion']}) on "
                f"{cluster.cp.url}",
                flush=True,
            )
        cluster.wait_for_agents()
        time.sleep(8)  # a baseline of serving metrics before any flag flips
        cluster.create_rollout()
        deadline = time.time() + timeout
        last = 0.0
        while time.time() < deadline:
            if not quiet and time.time() - last >= 3:
                print(table(cluster), flush=True)
                last = time.time()
            if cluster.settled():
                break
            time.sleep(0.5)
        result = summary(cluster)
        result["settled"] = cluster.settled()
        result["apiserver_version"] = version
        timeline(cluster, out / "timeline.png")
        result["timeline"] = str(out / "timeline.png")
        result["events"] = [e.get("message") for e in cluster.events()]
        result["node_labels"] = {
            name: {k: v for k, v in cluster.node(name)["metadata"].get("labels", {}).items() if contract.is_ours(k)}
            for name in cluster.nodes
        }
        result["pod_flags"] = {
            p["spec"]["nodeName"]: p["metadata"].get("labels", {}).get(contract.LABEL_POD_FLAG) for p in cluster.pods()
        }
        if cluster.monitoring is not None:
            result["dashboard"] = dashboard_series(cluster)
        (out / "summary.json").write_text(json.dumps(result, indent=2))
        if not quiet:
            plugin_pass(cluster, result)
        return result
    finally:
        cluster.stop()


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="out/demo")
    parser.add_argument("--timeout", type=float, default=240)
    args = parser.parse_args()
    result = run(Path(args.out), args.timeout)
    print("\nSUMMARY")
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
    print(f"  timeline:    {result['timeline']}   summary: {Path(args.out) / 'summary.json'}   ({result['seconds']} s)")
    return 0 if result["settled"] and result["rolled_back"] else 1


if __name__ == "__main__":
    sys.exit(main())
