"""Small shared test helpers: bounded waiting, free ports, a real Prometheus process, a running agent."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

NODES = ("", "v1", "nodes")


def wait_for(predicate: Callable[[], Any], timeout: float = 15.0, interval: float = 0.05, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_json(url: str, timeout: float = 5.0) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")


def http_text(url: str, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read().decode()


class Prometheus:
    """A real Prometheus server (Debian package) on 127.0.0.1, scraping the given targets every second."""

    def __init__(self, targets: dict[str, list[Any]], scrape_interval: str = "1s") -> None:
        """targets: job -> ["host:port", ...] or [{"targets": [...], "labels": {...}}, ...]."""
        binary = shutil.which("prometheus")
        if binary is None:
            raise RuntimeError("prometheus is not installed: `make test` installs it (.ci/install-tools)")
        self.dir = Path(tempfile.mkdtemp(prefix="prom-"))
        self.port = free_port()
        jobs = [
            {"job_name": job, "scrape_interval": scrape_interval,
             "static_configs": [h if isinstance(h, dict) else {"targets": [h]} for h in hosts]}
            for job, hosts in targets.items()
        ]
        (self.dir / "prometheus.yml").write_text(json.dumps({"global": {"scrape_interval": scrape_interval}, "scrape_configs": jobs}))
        self.argv = [binary, f"--config.file={self.dir / 'prometheus.yml'}", f"--storage.tsdb.path={self.dir / 'data'}",
                     f"--web.listen-address=127.0.0.1:{self.port}", "--web.enable-lifecycle"]
        self.url = f"http://127.0.0.1:{self.port}"
        self.start()

    def start(self) -> None:
        """Start (or start again, on the same port and data) and wait until it answers."""
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.DEVNULL, stderr=(self.dir / "log.txt").open("a"))
        wait_for(self._ready, timeout=30, what="prometheus to start")

    def halt(self) -> None:
        """Stop the process, keeping its data (an outage, not a teardown)."""
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)

    def _ready(self) -> bool:
        try:
            return http_text(self.url + "/-/ready", timeout=1).strip() != ""
        except OSError:
            return False

    def query(self, promql: str) -> list[dict[str, Any]]:
        status, body = http_json(f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
        assert status == 200 and body["status"] == "success", body
        return body["data"]["result"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.halt()
        shutil.rmtree(self.dir, ignore_errors=True)


@contextmanager
def prometheus(targets: dict[str, list[Any]]) -> Iterator[Prometheus]:
    server = Prometheus(targets)
    try:
        yield server
    finally:
        server.stop()


@contextmanager
def running_agent(kubeconfig: Path, node_name: str, simulate: Path, **overrides: Any) -> Iterator[Any]:
    """A real agent (the daemon's own Agent.run) in a thread, with `kubeconfig`'s credentials (on the local
    control plane: installed.agent_kubeconfig(node), a token bound to the node's agent pod)."""
    from gluon_agent.daemon import Agent, AgentConfig
    from gluon_agent.kube import NodeApi, make_api_client
    from gluon_agent.sources import SimulatedSource

    settings = dict(node_name=node_name, host="127.0.0.1", port=0, tick=0.05, watch_timeout=2,
                    api_backoff_base=0.05, api_backoff_cap=0.5, probe_interval=3600.0)
    settings.update(overrides)
    agent = Agent(AgentConfig(**settings), NodeApi(make_api_client(kubeconfig=str(kubeconfig)), node_name), SimulatedSource(simulate))
    thread = threading.Thread(target=agent.run, name=f"agent-{node_name}", daemon=True)
    thread.start()
    wait_for(lambda: agent.http is not None, what="agent http server")
    agent.url = f"http://127.0.0.1:{agent.http.server_address[1]}"
    try:
        yield agent
    finally:
        agent.stop.set()
        thread.join(15)
        assert not thread.is_alive(), "agent did not stop within 15 s"
