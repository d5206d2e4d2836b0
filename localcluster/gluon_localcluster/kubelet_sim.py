"""SIMULATION of the kubelet's part for pods our webhook injected (kwok does the rest of the lifecycle).

A real kubelet runs a pod's init containers before its app containers. For each injected pod bound to a
node, this simulator runs the pod's own init containers one after the other, as processes here:
- each container's own `command`/`args`, unmodified, with its env (values and the downward API fields a
  kubelet resolves: spec.nodeName, status.hostIP from the node's InternalIP, metadata.*);
- its emptyDir volumes at their mountPaths and its termination-message path, bind-mounted in a private
  mount namespace (`unshare --mount`), so the preflight writes where it would in a container;
- the image's own environment from `images` (e.g. a serving image's PYTHONPATH with a fake aiter and a
  gfx950 torch: the serving image is a SIMULATION too), and the image's `python3` and `gluon-agent`.
Then it records the preflight's termination message in the pod annotation stages.PREFLIGHT_MESSAGE, and
kwok's preflight-aware stage reports the pod Running with that message, in one status write.

It serves kwok's nodes only: on a real node (realnode.py) the kubelet of the pinned Kubernetes runs the
same pods from images built here, and tests/test_realnode.py proves there what this simulates (the flag's
delivery, the preflight, the agent DaemonSet, the chart's post-delete Job).
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gluon_common import contract

from .background import Background, list_then_watch
from .stages import PREFLIGHT_CONTAINER, PREFLIGHT_MESSAGE

log = logging.getLogger("kubelet-sim")
DEFAULT_TERMINATION_PATH = "/dev/termination-log"
FLAG_FILE = "flag.env"
SYNC_RETRY_SECONDS = 120.0  # a kubelet keeps syncing a pod through an API-server outage; so does this, this long


@dataclass(frozen=True)
class Image:
    """What an image brings: environment variables (as its ENV lines), folders put first on PATH, and its
    ENTRYPOINT (used when a container gives `args` but no `command`)."""

    env: dict[str, str] = field(default_factory=dict)
    path: tuple[str, ...] = ()
    entrypoint: tuple[str, ...] = ()


@dataclass(frozen=True)
class InitOutcome:
    pod: str
    namespace: str
    node: str
    flag: str | None  # what the serving containers get from the flag file (None: no flag file)
    message: str  # the preflight's termination message
    seconds: float


def downward(pod: dict[str, Any], node: dict[str, Any], field_path: str) -> str:
    if field_path == "spec.nodeName":
        return pod["spec"].get("nodeName", "")
    if field_path in ("status.hostIP", "status.podIP"):
        addresses = (node.get("status") or {}).get("addresses") or []
        return next((a["address"] for a in addresses if a.get("type") == "InternalIP"), "127.0.0.1")
    if field_path.startswith("metadata."):
        return str(pod["metadata"].get(field_path.split(".", 1)[1], ""))
    raise ValueError(f"downward API field {field_path!r} is not simulated")


def container_env(container: dict[str, Any], pod: dict[str, Any], node: dict[str, Any], image: Image) -> dict[str, str]:
    env = {"PATH": os.pathsep.join([*image.path, "/usr/local/bin", "/usr/bin", "/bin"]), "HOME": "/tmp", **image.env}
    for item in container.get("env") or []:
        if "value" in item:
            env[item["name"]] = item["value"]
        elif "fieldRef" in (item.get("valueFrom") or {}):
            env[item["name"]] = downward(pod, node, item["valueFrom"]["fieldRef"]["fieldPath"])
    return env


def mount_script(binds: list[tuple[Path, str]], argv: list[str]) -> list[str]:
    """`unshare --mount` running argv after bind-mounting each (host folder or file, container path)."""
    steps = []
    for source, target in binds:
        kind = "-d" if source.is_dir() else "-f"
        make = f"mkdir -p {shlex.quote(target)}" if source.is_dir() else f"touch {shlex.quote(target)}"
        steps.append(
            f"[ {kind} {shlex.quote(target)} ] || {make}; mount --bind {shlex.quote(str(source))} {shlex.quote(target)}"
        )
    script = " && ".join(steps + ['exec "$@"'])
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", *argv]


class KubeletSim(Background):
    """Watches pods with the injected annotation and runs their init containers (see the module doc)."""

    def __init__(
        self,
        api: Any,
        images: dict[str, Image],
        on_outcome: Callable[[InitOutcome], None] | None = None,
        workdir: Path | None = None,
        timeout: float = 120.0,
        parallel: int = 8,
        readiness: dict[str, str] | None = None,
        real_nodes: frozenset[str] = frozenset(),
    ) -> None:
        """`readiness`: label selector -> HTTP path probed on the pod's first container port at its node's
        address, once a second, as the kubelet's readiness probe would (kwok alone reports every pod Ready).
        `real_nodes`: nodes with a kubelet of their own (realnode.py), whose pods are left to it."""
        from kubernetes import client

        super().__init__(("kubelet-sim", self._watch), ("kubelet-sim-probes", self._probe_loop))
        self.core = client.CoreV1Api(api)
        self.images, self.on_outcome, self.timeout = images, on_outcome, timeout
        self.dir = Path(workdir or tempfile.mkdtemp(prefix="kubelet-sim-"))
        self.dir.mkdir(parents=True, exist_ok=True)
        self.pool = ThreadPoolExecutor(parallel, thread_name_prefix="kubelet-sim")
        self.started: set[str] = set()
        self.outcomes: list[InitOutcome] = []
        self.errors: list[str] = []
        self.readiness = readiness or {}
        self.real_nodes = real_nodes
        self.lock = threading.Lock()

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        self.pool.shutdown(wait=True, cancel_futures=True)

    # ------------------------------------------------------------ the watch

    def _watch(self) -> None:
        list_then_watch(
            self.core.list_pod_for_all_namespaces, self._listed, self._changed, self.stop_event, retry_seconds=0.2
        )

    def _listed(self, pods: list[dict[str, Any]]) -> None:
        for pod in pods:
            self._consider(pod)

    def _changed(self, kind: str, pod: dict[str, Any]) -> None:
        if kind != "DELETED":
            self._consider(pod)

    def _consider(self, pod: dict[str, Any]) -> None:
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        annotations = meta.get("annotations") or {}
        if not spec.get("nodeName") or spec["nodeName"] in self.real_nodes or meta.get("deletionTimestamp"):
            return
        if contract.ANNOTATION_POD_INJECTED not in annotations or PREFLIGHT_MESSAGE in annotations:
            return
        with self.lock:
            if meta["uid"] in self.started:
                return
            self.started.add(meta["uid"])
        self.pool.submit(self._run_pod, pod)

    # ------------------------------------------------------------ readiness probes

    def _probe_loop(self) -> None:
        while not self.stop_event.wait(1.0):
            for selector, path in self.readiness.items():
                try:
                    self._probe(selector, path)
                except Exception as exc:
                    log.debug("kubelet-sim probes: %s", exc)

    def _probe(self, selector: str, path: str) -> None:
        import urllib.request

        pods = json.loads(self.core.list_pod_for_all_namespaces(label_selector=selector, _preload_content=False).data)[
            "items"
        ]
        addresses = {}
        for pod in pods:
            node_name = pod["spec"].get("nodeName")
            status = pod.get("status") or {}
            if (
                not node_name
                or node_name in self.real_nodes
                or status.get("phase") != "Running"
                or pod["metadata"].get("deletionTimestamp")
            ):
                continue
            if node_name not in addresses:
                addresses[node_name] = downward(
                    pod, json.loads(self.core.read_node(node_name, _preload_content=False).data), "status.hostIP"
                )
            port = (pod["spec"]["containers"][0].get("ports") or [{}])[0].get("containerPort")
            try:
                with urllib.request.urlopen(f"http://{addresses[node_name]}:{port}{path}", timeout=1) as response:
                    ready = response.status == 200
            except OSError:
                ready = False
            conditions = {c["type"]: c.get("status") for c in status.get("conditions") or []}
            wanted = "True" if ready else "False"
            if conditions.get("Ready") != wanted:
                now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
                patch = {
                    "status": {
                        "conditions": [
                            {"type": kind, "status": wanted, "lastTransitionTime": now}
                            for kind in ("Ready", "ContainersReady")
                        ]
                    }
                }
                self.core.patch_namespaced_pod_status(
                    pod["metadata"]["name"],
                    pod["metadata"]["namespace"],
                    patch,
                    _content_type="application/strategic-merge-patch+json",
                    _preload_content=False,
                )

    # ------------------------------------------------------------ one pod

    def _run_pod(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        started = time.monotonic()
        try:
            node = json.loads(self._synced(self.core.read_node, pod["spec"]["nodeName"], _preload_content=False).data)
            root = Path(tempfile.mkdtemp(prefix=f"{meta['name']}-", dir=self.dir))
            volumes = {
                v["name"]: root / "volumes" / v["name"] for v in pod["spec"].get("volumes") or [] if "emptyDir" in v
            }
            for folder in volumes.values():
                folder.mkdir(parents=True)
            message = ""
            for container in pod["spec"].get("initContainers") or []:
                text = self._run_container(container, pod, node, volumes, root)
                if container["name"] == PREFLIGHT_CONTAINER:
                    message = text
            flag = self._flag(volumes)
            self._synced(
                self.core.patch_namespaced_pod,
                meta["name"],
                meta["namespace"],
                {"metadata": {"annotations": {PREFLIGHT_MESSAGE: message}}},
                _content_type="application/merge-patch+json",
                _preload_content=False,
            )
            outcome = InitOutcome(
                meta["name"], meta["namespace"], pod["spec"]["nodeName"], flag, message, time.monotonic() - started
            )
            self.outcomes.append(outcome)
            if self.on_outcome:
                self.on_outcome(outcome)
        except Exception as exc:  # a pod deleted meanwhile, or a broken command: reported, never fatal
            self.errors.append(f"{meta.get('namespace')}/{meta.get('name')}: {type(exc).__name__}: {exc}")
            log.warning("kubelet-sim: %s", self.errors[-1])

    def _synced(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """One API call of a pod's sync, retried through an API-server outage for SYNC_RETRY_SECONDS, as a
        kubelet's sync loop would (a pod whose run met an outage would otherwise never become Ready).
        A 404 (the pod or node is gone) is not retried."""
        deadline = time.monotonic() + SYNC_RETRY_SECONDS
        while True:
            try:
                return call(*args, **kwargs)
            except Exception as exc:
                if getattr(exc, "status", None) == 404 or time.monotonic() > deadline or self.stop_event.is_set():
                    raise
                log.debug("kubelet-sim: retrying %s: %s", getattr(call, "__name__", call), exc)
            self.stop_event.wait(1.0)

    def _run_container(
        self, container: dict[str, Any], pod: dict[str, Any], node: dict[str, Any], volumes: dict[str, Path], root: Path
    ) -> str:
        binds = [
            (volumes[m["name"]], m["mountPath"]) for m in container.get("volumeMounts") or [] if m["name"] in volumes
        ]
        code, output, termination = self._execute(container, pod, node, binds, root)
        if code != 0:
            raise RuntimeError(f"init container {container['name']!r} exited {code}: {output.strip()[-800:]}")
        return termination

    def _execute(
        self,
        container: dict[str, Any],
        pod: dict[str, Any],
        node: dict[str, Any],
        binds: list[tuple[Path, str]],
        root: Path,
    ) -> tuple[int, str, str]:
        """(exit code, output, termination message) of one container run as a process here."""
        image = self.images.get(container["image"])
        if image is None:
            raise RuntimeError(f"container {container['name']!r}: image {container['image']!r} is not simulated")
        termination = root / f"{container['name']}.termination-log"
        termination.write_text("")
        binds = binds + [(termination, container.get("terminationMessagePath") or DEFAULT_TERMINATION_PATH)]
        argv = list(container.get("command") or image.entrypoint) + list(container.get("args") or [])
        if not argv:
            raise RuntimeError(f"container {container['name']!r} has no command and its image no entrypoint")
        argv[0] = shutil.which(argv[0], path=os.pathsep.join(image.path)) or argv[0]
        result = subprocess.run(
            mount_script(binds, argv),
            env=container_env(container, pod, node, image),
            capture_output=True,
            text=True,
            timeout=self.timeout,
            cwd=root,
        )
        (root / f"{container['name']}.log").write_text(result.stdout + result.stderr)
        return result.returncode, result.stdout + result.stderr, termination.read_text()[:4096]

    @staticmethod
    def _flag(volumes: dict[str, Path]) -> str | None:
        for folder in volumes.values():
            path = folder / FLAG_FILE
            if path.is_file():
                line = path.read_text().strip()
                return line.split("=", 1)[1].strip("'\"") if "=" in line else None
        return None
