"""The operator at fleet scale against the API emulator. Prints JSON.

    python bench/scale.py --json --nodes 1000 [--nodes 5000]

N simulated GPU nodes carrying real agent reports (80% eligible, the rest not capable), an agent pod and
a serving pod on each, one GluonRollout (canary 1, analysis pointed at a stub Prometheus that counts
queries). Measures: seconds from operator start until every node carries the right gating labels
(`state` and `enabled`), the operator process's peak RSS, API requests per node (reads and writes, from
the emulator's request log), node writes per node per state change, and PromQL queries per interval.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gluon_agent import contract  # noqa: E402
from tests.apiserver import ApiServerThread  # noqa: E402
from tests.cluster import NODES, PODS, ROLLOUTS, agent_pod, declare_rollouts, gpu_node, rollout, serving_pod  # noqa: E402
from tests.helpers import free_port, wait_for  # noqa: E402


class QueryCounter(BaseHTTPRequestHandler):
    count = 0

    def do_GET(self) -> None:  # noqa: N802
        type(self).count += 1
        body = json.dumps({"status": "success", "data": {"resultType": "matrix", "result": []}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def run(nodes: int, timeout: float, interval: int) -> dict:
    prom = ThreadingHTTPServer(("127.0.0.1", 0), QueryCounter)
    threading.Thread(target=prom.serve_forever, daemon=True).start()
    with ApiServerThread() as api:
        declare_rollouts(api.server)
        template_ok, template_bad = gpu_node("template"), gpu_node("template", capable=False)
        names = [f"node-{i:05d}" for i in range(nodes)]

        def build() -> None:
            for i, name in enumerate(names):
                body = json.loads(json.dumps(template_ok if i % 5 else template_bad))
                body["metadata"]["name"] = name
                body["metadata"]["labels"]["kubernetes.io/hostname"] = name
                api.server.put_object(NODES, body)
                api.server.put_object(PODS, agent_pod(name))
                if i != 1:  # node-00001, the canary, serves nothing: it reaches Analyzing and the queries start
                    api.server.put_object(PODS, serving_pod(name, flag="0"))
            api.server.put_object(ROLLOUTS, rollout(analysis={"prometheusUrl": f"http://127.0.0.1:{prom.server_address[1]}",
                                                              "intervalSeconds": interval, "stepSeconds": 2, "windowSeconds": max(10, interval)},
                                                    strategy={"restartDelaySeconds": 3600}))  # no pod restarts in this bench
        api.call(build)
        before = len(list(api.server._requests))
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env.update(GLUON_API_URL=api.url, GLUON_SCANNING="off", GLUON_METRICS_PORT="0", GLUON_RECONCILE_SECONDS="5", GLUON_WATCH_TIMEOUT="300")
        started = time.monotonic()
        operator = subprocess.Popen([sys.executable, "-m", "gluon_operator.cli", "run", "--standalone", "--log-level", "WARNING",
                                     "--liveness", f"http://127.0.0.1:{free_port()}/healthz"], env=env,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        expected = {name: ("Ineligible" if i % 5 == 0 else None) for i, name in enumerate(names)}

        def converged() -> bool:
            def check() -> bool:
                for name, want in expected.items():
                    labels = api.server.store[(NODES, None, name)]["metadata"].get("labels", {})
                    state = labels.get(contract.LABEL_STATE)
                    if state is None or (want and state != want) or (not want and state == "Ineligible"):
                        return False
                    if labels.get(contract.LABEL_ENABLED) != ("true" if state in ("Enabling", "Analyzing", "Promoted") else "false"):
                        return False
                return True
            return api.call(check)

        try:
            wait_for(converged, timeout=timeout, interval=1.0, what=f"{nodes} nodes gated")
            converge_s = time.monotonic() - started
            queries_before = QueryCounter.count
            time.sleep(3 * interval)  # steady state: count queries per interval
            queries = (QueryCounter.count - queries_before) / 3
            rss = peak_rss(operator.pid)
        finally:
            operator.terminate()
            operator.wait(30)
            prom.shutdown()
        requests = list(api.server._requests)[before:]
        node_writes = [r for r in requests if r.resource is not None and r.resource.plural == "nodes" and r.method.value in ("PATCH", "PUT")]
        reads = [r for r in requests if r.method.value == "GET"]
        writes = [r for r in requests if r.method.value in ("PATCH", "PUT", "POST", "DELETE")]
        changes = nodes  # every node had one state change: new -> its first state
        return {
            "nodes": nodes,
            "converge_seconds": round(converge_s, 1),
            "operator_peak_rss_mb": round(rss / 2**20, 1),
            "api_reads_per_node": round(len(reads) / nodes, 3),
            "api_writes_per_node": round(len(writes) / nodes, 3),
            "node_writes_per_node_per_state_change": round(len(node_writes) / changes, 3),
            "promql_queries_per_interval": round(queries, 2),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print JSON (the only output format)")
    parser.add_argument("--nodes", type=int, action="append", help="fleet sizes (repeatable); default 1000")
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--interval", type=int, default=5, help="analysis intervalSeconds")
    args = parser.parse_args()
    results = [run(n, args.timeout, args.interval) for n in (args.nodes or [1000])]
    print(json.dumps({
        "bench": "scale",
        "machine": f"{platform.machine()} cpus={os.cpu_count()} python={platform.python_version()}",
        "command": " ".join(["python", "bench/scale.py"] + sys.argv[1:]),
        "targets_at_5000": {"converge_seconds_max": 60, "operator_peak_rss_mb_max": 400,
                            "node_writes_per_node_per_state_change_max": 2, "promql_queries_per_interval": 1},
        "results": results,
    }, indent=2))


if __name__ == "__main__":
    main()
