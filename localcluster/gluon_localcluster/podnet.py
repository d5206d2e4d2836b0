"""SIMULATION of pods' network namespaces: with no container runtime, the process standing in for a pod's
container listens on an address of its own (an agent on its node's address, an exporter or the operator on
127.0.0.1). So that Prometheus finds them where Kubernetes service discovery says they are (the pod's IP,
kwok's, from its node's podCIDR on the loopback, and the container port), a forwarder listens on each
running pod's IP and port and relays the connection to that process, as a pod's network would carry it.
Pods that stop running, or are deleted, lose their forwarders: their targets go down as on a cluster.

    with PodNetwork(api, routes).start():   # routes(pod) -> {container port: ("127.0.0.1", 34567)}
        ...
"""

from __future__ import annotations

import json
import selectors
import socket
import socketserver
import threading
from typing import Any, Callable

Routes = Callable[[dict[str, Any]], dict[int, tuple[str, int]]]


class _Relay(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        try:
            upstream = socket.create_connection(self.server.backend, timeout=5)  # type: ignore[attr-defined]
        except OSError:
            return  # the process behind the pod is down: the connection is refused, as a dead container's
        with upstream:
            pump(self.request, upstream)


def pump(a: socket.socket, b: socket.socket, idle_seconds: float = 30.0) -> None:
    """Copy bytes both ways until either side closes (or nothing moves for idle_seconds)."""
    with selectors.DefaultSelector() as selector:
        selector.register(a, selectors.EVENT_READ, b)
        selector.register(b, selectors.EVENT_READ, a)
        while True:
            ready = selector.select(idle_seconds)
            if not ready:
                return
            for key, _ in ready:
                try:
                    data = key.fileobj.recv(65536)  # type: ignore[union-attr]
                    if not data:
                        return
                    key.data.sendall(data)
                except OSError:  # either side reset: the connection ends, as a pod's would
                    return


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], backend: tuple[str, int]) -> None:
        self.backend = backend
        super().__init__(address, _Relay)


class Forwarder:
    """One pod port: listens on (pod IP, port), relays to backend."""

    def __init__(self, address: tuple[str, int], backend: tuple[str, int]) -> None:
        self.address, self.backend = address, backend
        self.server = _Server(address, backend)
        threading.Thread(target=self.server.serve_forever, args=(0.2,), daemon=True, name=f"pod-{address}").start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def running_ip(pod: dict[str, Any]) -> str | None:
    """The pod's IP while it runs (not being deleted); None otherwise."""
    status, meta = pod.get("status") or {}, pod.get("metadata") or {}
    if meta.get("deletionTimestamp") or status.get("phase") != "Running":
        return None
    return status.get("podIP") or None


class PodNetwork:
    """Keeps one Forwarder per (running pod, routed port), polling the pods every `period` seconds."""

    def __init__(self, api: Any, routes: Routes, period: float = 0.3) -> None:
        self.api, self.routes, self.period = api, routes, period
        self.forwarders: dict[tuple[str, int], tuple[str, Forwarder]] = {}  # (pod ip, port) -> (pod uid, ...)
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="pod-network")

    def start(self) -> "PodNetwork":
        self.sync()
        self._thread.start()
        return self

    def __enter__(self) -> "PodNetwork":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _loop(self) -> None:
        while not self._stop.wait(self.period):
            try:
                self.sync()
            except Exception as error:  # the API server may be halted by a fault test: keep what runs
                self.errors.append(repr(error))

    def sync(self) -> None:
        from kubernetes import client

        raw = client.CoreV1Api(self.api).list_pod_for_all_namespaces(_preload_content=False)
        wanted: dict[tuple[str, int], tuple[str, tuple[str, int]]] = {}
        for pod in json.loads(raw.data)["items"]:
            ip = running_ip(pod)
            if ip is None:
                continue
            for port, backend in self.routes(pod).items():
                wanted[(ip, port)] = (pod["metadata"]["uid"], backend)
        for key, (uid, forwarder) in list(self.forwarders.items()):
            if wanted.get(key, (None, None))[0] != uid or wanted[key][1] != forwarder.backend:
                forwarder.stop()
                del self.forwarders[key]
        for key, (uid, backend) in wanted.items():
            if key not in self.forwarders:
                try:
                    self.forwarders[key] = (uid, Forwarder(key, backend))
                except OSError as error:
                    self.errors.append(f"{key}: {error}")

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
        for _, forwarder in self.forwarders.values():
            forwarder.stop()
        self.forwarders.clear()
