"""Small shared test helpers: bounded waiting, free ports, HTTP JSON, a running agent."""

from __future__ import annotations

import json
import socket
import threading
import urllib.parse
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from gluon_localcluster.waiting import wait_for

NODES = ("", "v1", "nodes")


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


@contextmanager
def running_agent(kubeconfig: Path, node_name: str, simulate: Path, **overrides: Any) -> Iterator[Any]:
    """A real agent (the daemon's own Agent.run) in a thread, with `kubeconfig`'s credentials (on the local
    control plane: installed.agent_kubeconfig(node), a token bound to the node's agent pod). It observes this
    host's /proc under a cgroup root of its node's own, where no serving process runs (a node without
    serving pods), unless `observation` says otherwise."""
    from gluon_agent.daemon import Agent, AgentConfig
    from gluon_agent.delivery import InlineObservation
    from gluon_common.kube import NodeApi, make_api_client
    from gluon_localcluster.fakes.simulated import SimulatedSource

    settings = dict(
        node_name=node_name,
        host="127.0.0.1",
        port=0,
        tick=0.05,
        watch_timeout=2,
        api_backoff_base=0.05,
        api_backoff_cap=0.5,
        probe_interval=3600.0,
    )
    observation = overrides.pop("observation", None) or InlineObservation(Path("/proc"), f"/gluon-test-{node_name}")
    settings.update(overrides)
    agent = Agent(
        AgentConfig(**settings),
        NodeApi(make_api_client(kubeconfig=str(kubeconfig)), node_name),
        SimulatedSource(simulate),
        observation=observation,
    )
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
