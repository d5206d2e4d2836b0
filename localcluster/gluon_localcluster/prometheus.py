"""A real Prometheus server (Debian package) on 127.0.0.1, for tests, benches and the demo."""

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
    """A real Prometheus server (Debian package) on 127.0.0.1, scraping the given targets every second."""

    def __init__(
        self, targets: dict[str, list[Any]], scrape_interval: str = "1s", directory: Path | None = None
    ) -> None:
        """targets: job -> ["host:port", ...] or [{"targets": [...], "labels": {...}}, ...]."""
        binary = shutil.which("prometheus")
        if binary is None:
            raise RuntimeError("prometheus is not installed: `make test` installs it (.ci/install-tools)")
        self.dir = Path(directory or tempfile.mkdtemp(prefix="prom-"))
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        jobs = [
            {
                "job_name": job,
                "scrape_interval": scrape_interval,
                "static_configs": [h if isinstance(h, dict) else {"targets": [h]} for h in hosts],
            }
            for job, hosts in targets.items()
        ]
        (self.dir / "prometheus.yml").write_text(
            json.dumps({"global": {"scrape_interval": scrape_interval}, "scrape_configs": jobs})
        )
        self.argv = [
            binary,
            f"--config.file={self.dir / 'prometheus.yml'}",
            f"--storage.tsdb.path={self.dir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--web.enable-lifecycle",
        ]
        self.url = f"http://127.0.0.1:{self.port}"
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
        status, raw = _get(f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql}), 10)
        body = json.loads(raw or b"null")
        if status != 200 or body.get("status") != "success":
            raise RuntimeError(f"Prometheus query {promql!r} failed: {body}")
        return body["data"]["result"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.halt()
        shutil.rmtree(self.dir, ignore_errors=True)
