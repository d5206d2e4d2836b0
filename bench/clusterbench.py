"""What the benches on the local control plane (gluon_localcluster) share: process costs from /proc, the
machine and date a record carries, a Prometheus stand-in that counts queries, a node-label watch, and
the environment that makes child processes run this checkout's code."""

from __future__ import annotations

import json
import os
import platform
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "localcluster"))  # the harness: not in the wheel

from gluon_localcluster.background import Background, list_then_watch
from gluon_localcluster.waiting import wait_for

ROOT = Path(__file__).resolve().parent.parent
AGENT_LABEL = "app.kubernetes.io/name=gluon-rollout-agent"  # the chart's agent pods
TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")
STARTED_UTC = time.strftime(
    "%Y-%m-%d %H:%M", time.gmtime()
)  # when the bench began (its record's date is the day it ended)


# ---------------------------------------------------------------- a process's cost, from /proc


def _status_kb(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/{pid}/status has no {key}")


def rss_bytes(pid: int) -> int:
    return _status_kb(pid, "VmRSS") * 1024


def peak_rss_bytes(pid: int) -> int:
    """The high-water mark of the resident set (VmHWM) since the process started."""
    return _status_kb(pid, "VmHWM") * 1024


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS_PER_SECOND  # utime + stime


def exit_cleanly_on_sigterm() -> None:
    """SIGTERM (e.g. `timeout`) becomes SystemExit, so context managers stop the control plane."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


def mb(value: float) -> float:
    return round(value / 2**20, 1)


def wait_until(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.5) -> Any:
    return wait_for(predicate, timeout, interval, what, error=TimeoutError)


# ---------------------------------------------------------------- the record


def machine() -> dict[str, Any]:
    memory = subprocess.run(["free", "-g"], capture_output=True, text=True).stdout.split("\n")[1].split()
    return {
        "arch": platform.machine(),
        "nproc": int(subprocess.run(["nproc"], capture_output=True, text=True).stdout),
        "memory_gib_total": int(memory[1]),
        "python": platform.python_version(),
        "load_average_1m_at_end": round(os.getloadavg()[0], 2),
    }  # the cores are shared: what else ran


def provenance(bench: str, script: str) -> dict[str, Any]:
    return {
        "bench": bench,
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "started_utc": STARTED_UTC,
        "machine": machine(),
        "command": " ".join([f"python bench/{script}", *sys.argv[1:]]),
    }


def child_pythonpath() -> str:
    """This checkout's packages first: the venv's editable install points at another checkout."""
    return os.pathsep.join(str(ROOT / part) for part in ("common", "agent", "operator", "localcluster"))


# ---------------------------------------------------------------- agent pods


def agent_pod_from_daemonset(daemonset: dict[str, Any], node: str) -> dict[str, Any]:
    """The pod the DaemonSet controller would make for `node` (its template, owned by it, bound there)."""
    meta = daemonset["metadata"]
    template = json.loads(json.dumps(daemonset["spec"]["template"]))
    template["metadata"].update(
        name=f"{meta['name']}-{node}",
        namespace=meta["namespace"],
        ownerReferences=[
            {
                "apiVersion": "apps/v1",
                "kind": "DaemonSet",
                "name": meta["name"],
                "uid": meta["uid"],
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
    )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": template["metadata"],
        "spec": {**template["spec"], "nodeName": node},
    }


def agent_daemonset(cp: Any, namespace: str) -> dict[str, Any]:
    from kubernetes import client

    listing = client.AppsV1Api(cp.admin_client()).list_namespaced_daemon_set(
        namespace, label_selector=AGENT_LABEL, _preload_content=False
    )
    return json.loads(listing.data)["items"][0]


# ---------------------------------------------------------------- Prometheus stand-in


class QueryCounter(BaseHTTPRequestHandler):
    """Answers every PromQL query with an empty matrix (no data: inconclusive) and counts them."""

    count = 0
    lock = threading.Lock()

    def do_GET(self) -> None:  # noqa: N802
        with type(self).lock:
            type(self).count += 1
        body = json.dumps({"status": "success", "data": {"resultType": "matrix", "result": []}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET  # noqa: N815 - PromQL over POST is the same query

    def log_message(self, *args: object) -> None:
        pass


def start_prometheus_stub() -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", 0), QueryCounter)
    threading.Thread(target=server.serve_forever, name="prometheus-stub", daemon=True).start()
    return server


# ---------------------------------------------------------------- nodes' labels, from one watch


class NodeLabels(Background):
    """Every node's labels, kept current by one list and watch (admin), so checks cost no requests."""

    join_seconds = 40.0

    def __init__(self, api: Any) -> None:
        from kubernetes import client

        super().__init__(("node-labels", self._watch))
        self.core = client.CoreV1Api(api)
        self.labels: dict[str, dict[str, str]] = {}
        self.lock = threading.Lock()

    def snapshot(self) -> dict[str, dict[str, str]]:
        with self.lock:
            return dict(self.labels)

    def _listed(self, nodes: list[dict[str, Any]]) -> None:
        with self.lock:
            self.labels = {n["metadata"]["name"]: dict(n["metadata"].get("labels") or {}) for n in nodes}

    def _changed(self, kind: str, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        with self.lock:
            if kind == "DELETED":
                self.labels.pop(name, None)
            else:
                self.labels[name] = dict(obj["metadata"].get("labels") or {})

    def _watch(self) -> None:
        list_then_watch(self.core.list_node, self._listed, self._changed, self.stop_event)
