"""A real Prometheus server process on 127.0.0.1, running a given config file (the harness's: the Prometheus
Operator's generated config, monitoring.py), for tests, benches and the demo."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from .controlplane import free_port


def _get(url: str, timeout: float) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


class Prometheus:
    """A real Prometheus server on 127.0.0.1 running `config_file`; halt() and start() make an outage."""

    def __init__(
        self,
        config_file: Path,
        directory: Path | None = None,
        binary: str | None = None,
        netns: Any = None,
    ) -> None:
        """`binary`: another Prometheus than Debian's on PATH (monitoring.py's, built with Kubernetes service
        discovery). `netns`: a podnet.NetNamespace to run in, its port relayed to the same port on the host's
        127.0.0.1."""
        binary = binary or shutil.which("prometheus")
        if binary is None:
            raise RuntimeError("prometheus is not installed: `make test` installs it (.ci/install-tools)")
        self.dir = Path(directory or tempfile.mkdtemp(prefix="prom-"))
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.argv = [
            binary,
            f"--config.file={config_file}",
            f"--storage.tsdb.path={self.dir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--web.enable-lifecycle",
        ]
        self.url = f"http://127.0.0.1:{self.port}"
        self.relay = None
        if netns is not None:
            from .podnet import Forwarder

            self.argv = netns.wrap(self.argv)
            self.relay = Forwarder(("127.0.0.1", self.port), ("127.0.0.1", self.port), connect_ns=netns)
        self.start()

    def start(self) -> None:
        """Start (or start again, on the same port and data) and wait until it answers."""
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.DEVNULL, stderr=(self.dir / "log.txt").open("a"))
        deadline = time.monotonic() + 30
        while not self._ready():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"prometheus did not start: {(self.dir / 'log.txt').read_text()[-1000:]}")
            time.sleep(0.1)

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
            return _get(self.url + "/-/ready", 1)[0] == 200
        except OSError:
            return False

    def query(self, promql: str) -> list[dict[str, Any]]:
        return self.api("query?" + urllib.parse.urlencode({"query": promql}))["result"]

    def api(self, path: str) -> Any:
        """GET /api/v1/<path>: its data, or an error naming the path and Prometheus's answer."""
        status, raw = _get(f"{self.url}/api/v1/{path}", 10)
        body = json.loads(raw or b"null")
        if status != 200 or body.get("status") != "success":
            raise RuntimeError(f"Prometheus /api/v1/{path} failed: {body}")
        return body["data"]

    def alerts(self) -> list[dict[str, Any]]:
        """/api/v1/alerts: every pending or firing alert, with its labels and state."""
        return self.api("alerts")["alerts"]

    def rule_names(self) -> set[str]:
        return {rule["name"] for group in self.api("rules")["groups"] for rule in group["rules"]}

    def reload(self) -> None:
        """POST /-/reload (what the config-reloader does); a config Prometheus refuses is an error."""
        request = urllib.request.Request(self.url + "/-/reload", method="POST")
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                response.read()
        except urllib.error.HTTPError as error:
            raise RuntimeError(f"Prometheus refused the reloaded config: {error.read().decode()[-1000:]}") from None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.halt()
        if self.relay is not None:
            self.relay.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
