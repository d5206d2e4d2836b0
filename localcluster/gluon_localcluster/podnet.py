"""SIMULATION of pods' network: with no container runtime, the process standing in for a pod's container
listens on an address of its own (an agent on its node's address, an exporter or the operator on
127.0.0.1). So that Prometheus finds them where Kubernetes service discovery says they are (the pod's IP,
kwok's, from its node's podCIDR, and the container port), a forwarder listens on each running pod's IP and
port and relays the connection to that process, as a pod's network would carry it. Pods that stop
running, or are deleted, lose their forwarders: their targets go down as on a cluster.

The pod IPs live in a network namespace of the harness's own (NetNamespace: 10.244.0.0/16 on its
loopback), not on the host: Kubernetes refuses loopback addresses in EndpointSlices, so a Service (and a
ServiceMonitor) over pods on 127/8 would have no endpoints. Prometheus runs inside that namespace; the API
server and Prometheus's own port are relayed across it.

    with PodNetwork(api, routes).start():   # routes(pod) -> {container port: ("127.0.0.1", 34567)}
        ...
"""

from __future__ import annotations

import ctypes
import json
import os
import selectors
import socket
import socketserver
import subprocess
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

# A backend: (host, port), reached from this process's namespace, or (host, port, namespace): a real node's
# pod, reached inside that node's network namespace (realnode.py).
Backend = tuple[str, int] | tuple[str, int, "NetNamespace"]
Routes = Callable[[dict[str, Any]], dict[int, Backend]]
CLONE_NEWNET = 0x40000000
POD_NETWORK = "10.244.0.1/16"  # on the namespace's loopback: every 10.244.x.y is local there


class NetNamespace:
    """A network namespace held by an `unshare --net` process, its loopback up with POD_NETWORK on it."""

    def __init__(self, timeout: float = 10) -> None:
        from .controlplane import die_with_parent

        self.holder = subprocess.Popen(
            ["unshare", "--net", "sleep", "infinity"], start_new_session=True, preexec_fn=die_with_parent
        )
        self.path = f"/proc/{self.holder.pid}/ns/net"
        deadline = time.monotonic() + timeout
        while os.readlink(self.path) == os.readlink("/proc/self/ns/net"):
            if time.monotonic() > deadline or self.holder.poll() is not None:
                raise RuntimeError("unshare --net did not make a network namespace (needs root)")
            time.sleep(0.05)
        for command in (["ip", "link", "set", "lo", "up"], ["ip", "addr", "add", POD_NETWORK, "dev", "lo"]):
            subprocess.run(self.wrap(command), check=True, capture_output=True, timeout=10)

    @classmethod
    def at(cls, path: str) -> "NetNamespace":
        """A namespace that exists already (a real node's, held by `ip netns`): entered, never stopped here."""
        existing = cls.__new__(cls)
        existing.holder, existing.path = None, path
        return existing

    def __eq__(self, other: object) -> bool:
        """The same namespace when the same path names it: a route that names it again (NetNamespace.at on
        every sync) is the same route, and its forwarder stays."""
        return isinstance(other, NetNamespace) and other.path == self.path

    def __hash__(self) -> int:
        return hash(self.path)

    def wrap(self, argv: list[str]) -> list[str]:
        """A command run inside the namespace."""
        return ["nsenter", f"--net={self.path}", *argv]

    @contextmanager
    def entered(self) -> Iterator[None]:
        """This thread inside the namespace (sockets made meanwhile stay there), then back."""
        libc = ctypes.CDLL(None, use_errno=True)
        home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        target = os.open(self.path, os.O_RDONLY)
        try:
            if libc.setns(target, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns into the pod network namespace")
            yield
        finally:
            libc.setns(home, CLONE_NEWNET)
            os.close(home)
            os.close(target)

    def stop(self) -> None:
        if self.holder is not None and self.holder.poll() is None:
            self.holder.kill()
            self.holder.wait(5)


@contextmanager
def inside(netns: NetNamespace | None) -> Iterator[None]:
    if netns is None:
        yield
    else:
        with netns.entered():
            yield


class _Relay(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        try:
            with inside(self.server.connect_ns):  # type: ignore[attr-defined]
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

    def __init__(self, address: tuple[str, int], backend: tuple[str, int], connect_ns: NetNamespace | None) -> None:
        self.backend, self.connect_ns = backend, connect_ns
        super().__init__(address, _Relay)


class Forwarder:
    """Listens on `address` (inside `listen_ns` if given), relays to `backend` (reached from `connect_ns`)."""

    def __init__(
        self,
        address: tuple[str, int],
        backend: tuple[str, int],
        listen_ns: NetNamespace | None = None,
        connect_ns: NetNamespace | None = None,
    ) -> None:
        self.address, self.backend = address, backend
        with inside(listen_ns):
            self.server = _Server(address, backend, connect_ns)
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

    def __init__(self, api: Any, routes: Routes, netns: NetNamespace | None = None, period: float = 0.3) -> None:
        self.api, self.routes, self.netns, self.period = api, routes, netns, period
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
        wanted: dict[tuple[str, int], tuple[str, Backend]] = {}
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
                    host, port, *namespace = backend
                    forwarder = Forwarder(key, (host, port), self.netns, namespace[0] if namespace else None)
                    forwarder.backend = backend  # as routed, so that a change of namespace is seen too
                    self.forwarders[key] = (uid, forwarder)
                except OSError as error:
                    self.errors.append(f"{key}: {error}")

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
        for _, forwarder in self.forwarders.values():
            forwarder.stop()
        self.forwarders.clear()
