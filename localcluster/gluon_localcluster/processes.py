"""The operator and agents as local processes (there is no container runtime here), each with the
credentials of its own ServiceAccount (install.Installed)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gluon_common import contract

from .controlplane import die_with_parent, free_port
from .fakes.simulated import agent_arguments
from .install import Installed

# This checkout's packages: a child runs the code under test, not whatever checkout the venv installed.
CHECKOUT_PATH = os.pathsep.join(
    str(Path(__file__).resolve().parents[2] / part) for part in ("common", "agent", "operator", "localcluster")
)


def python_env(**extra: str) -> dict[str, str]:
    """Our environment without what would change what a child imports or which cluster it talks to."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "KUBECONFIG", "SGLANG_AITER_MLA_GLUON", "TRITON_INTERPRET")
    }
    env["PYTHONPATH"] = CHECKOUT_PATH
    env.update(extra)
    return env


@dataclass
class Process:
    argv: list[str]
    env: dict[str, str]
    log: Path
    proc: subprocess.Popen | None = None

    def start(self) -> "Process":
        # Started from the main thread, it dies with its starter even when that is SIGKILLed (a bench
        # killed by a test's timeout). The signal follows the starting thread, so a process a helper
        # thread starts (faultsim's restarts) is left to stop() alone.
        dies_with_starter = die_with_parent if threading.current_thread() is threading.main_thread() else None
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                self.argv,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=dies_with_starter,
            )
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL, as an OOM kill or a node loss would: no cleanup."""
        if self.alive():
            os.killpg(self.proc.pid, signal.SIGKILL)  # type: ignore[union-attr]
            self.proc.wait(10)  # type: ignore[union-attr]

    def stop(self, timeout: float = 15) -> None:
        if not self.alive():
            return
        os.killpg(self.proc.pid, signal.SIGTERM)  # type: ignore[union-attr]
        try:
            self.proc.wait(timeout)  # type: ignore[union-attr]
        except subprocess.TimeoutExpired:
            self.kill()

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:]) if self.log.exists() else ""


def operator(
    installed: Installed,
    reconcile_seconds: float = 1.0,
    server: str | None = None,
    metrics_port: int = 0,
    agent_image: str | None = None,
    peering: str | None = None,
    **env: str,
) -> Process:
    """`gluon-operator run` with the operator ServiceAccount's token and the webhook's TLS on 127.0.0.1;
    `peering`: a replica of that kopf peering (as the chart's Deployment runs it), else standalone."""
    tls = installed.webhook_tls
    defaults = dict(
        KUBECONFIG=str(installed.operator_kubeconfig(server)),
        GLUON_RECONCILE_SECONDS=str(reconcile_seconds),
        GLUON_METRICS_PORT=str(metrics_port),
        GLUON_METRICS_ADDR="127.0.0.1",
        GLUON_WATCH_TIMEOUT="60",
        GLUON_WEBHOOK_CERT=str(tls.cert),
        GLUON_WEBHOOK_KEY=str(tls.key),
        GLUON_WEBHOOK_ADDR="127.0.0.1",
        GLUON_WEBHOOK_PORT=str(installed.webhook_port),
        GLUON_AGENT_IMAGE=agent_image or AGENT_IMAGE,  # a real node runs images.AGENT_IMAGE
        GLUON_NAMESPACE=installed.namespace,  # the chart's (downward API): where it checks fileKeyRef (apiserver.py)
    )
    settings = python_env(**{**defaults, **env})
    argv = [
        sys.executable,
        "-m",
        "gluon_operator.cli",
        "run",
        *(["--peering", peering] if peering else ["--standalone"]),
        "--liveness",
        f"http://127.0.0.1:{free_port()}/healthz",
    ]
    return Process(argv, settings, installed.cp.dir / f"operator-{free_port()}.log").start()


OBSERVE_SECONDS = 2  # the harness's agents read their pods' processes this often (the chart's observer: 5 s)


def agent(
    installed: Installed,
    node: str,
    host: str,
    simulate: Path,
    server: str | None = None,
    env: dict[str, str] | None = None,
    *extra: Any,
    cgroup_root: str | None = None,
) -> Process:
    """`gluon-agent run` for `node` with a token bound to its DaemonSet pod, listening on `host` (the node's IP).
    `cgroup_root`: the node's kubelet cgroup root (kubelet_sim.KubeletSim.cgroup_root): the agent observes the
    flag its serving processes run by reading /proc itself (it runs as root on this host), under that root."""
    observing = ["--observe-proc", "/proc", "--observe-cgroup-root", cgroup_root] if cgroup_root else []
    observing += ["--observe-interval", str(OBSERVE_SECONDS)] if cgroup_root else []
    argv = [
        sys.executable,
        "-m",
        "gluon_agent",
        "run",
        "--kubeconfig",
        str(installed.agent_kubeconfig(node, server)),
        *agent_arguments(simulate),
        "--node-name",
        node,
        "--host",
        host,
        "--port",
        str(contract.AGENT_PORT),
        "--tick",
        "0.2",
        "--probe-interval",
        "3600",
        "--watch-timeout",
        "10",
        "--log-level",
        "INFO",
        *observing,
        *map(str, extra),
    ]
    return Process(argv, python_env(**(env or {})), installed.cp.dir / f"agent-{node}.log").start()


AGENT_IMAGE = "ghcr.io/gluon-rollout/agent:localcluster"  # the agent image the webhook injects (kubelet_sim runs it)
