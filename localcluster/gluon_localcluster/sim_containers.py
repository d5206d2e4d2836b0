"""SIMULATION of the container runtime's part for the serving containers of pods on kwok's nodes: a real,
long-lived process per container, placed where a real node's processes are, so the agent's observer
(gluon_agent.observe) reads them as it reads a real node's:

- in a cgroup named as the kubelet's cgroupfs driver and the runtime name a container's,
  `<root>/kubepods[/<qos>]/pod<pod uid>/<64 hex container id>` under /sys/fs/cgroup/<hierarchy> for each
  of CGROUP_HIERARCHIES, where `<root>` is the node's own cgroup root (kubelet_sim.KubeletSim.cgroup_root);
- in a mount namespace of its own with the pod's volumes bind-mounted at their mountPaths (kubelet_sim's
  mount_script), so /proc/PID/root shows the container's view of them;
- with the environment the container gets (kubelet_sim.container_env), at exec.

The process dies with the thread that started it (setpriv --pdeathsig), so a harness killed without its
teardown leaves none behind; its cgroups are removed when it stops, and stale roots by `sweep_stale`.
This machine runs cgroup v1 (hybrid): one directory tree per hierarchy.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

CGROUP_FS = Path("/sys/fs/cgroup")
# The hierarchies a container process joins: the observer needs one line of /proc/PID/cgroup in a pod's
# container, and pids is that line. The memory hierarchy is left alone: the processes stay under the
# harness's own memory limits.
CGROUP_HIERARCHIES = ("pids",)
ROOT_PREFIX = "gluon-kwok-"  # <prefix><harness pid>-<n>: a root the harness made (see sweep_stale)
STALE_ROOT = re.compile(rf"^{ROOT_PREFIX}(\d+)-\d+$")
# The kubelet's cgroupfs names per QoS class (pod.status.qosClass, which the API server sets).
QOS_PATHS = {"Guaranteed": "kubepods", "Burstable": "kubepods/burstable", "BestEffort": "kubepods/besteffort"}


def container_cgroup(root: str, qos_class: str | None, pod_uid: str, container_id: str) -> str:
    """The container's cgroup path as the kubelet (cgroupfs driver) and the runtime name it, from `root`."""
    qos = QOS_PATHS.get(qos_class or "BestEffort", QOS_PATHS["BestEffort"])
    return f"{root.rstrip('/')}/{qos}/pod{pod_uid}/{container_id}"


def new_container_id() -> str:
    """A container id as containerd makes them: 64 lowercase hex digits."""
    return secrets.token_hex(32)


def cgroup_dirs(path: str) -> list[Path]:
    """The directories of cgroup `path` in each hierarchy a container process joins."""
    return [CGROUP_FS / hierarchy / path.lstrip("/") for hierarchy in CGROUP_HIERARCHIES]


def make_cgroups(path: str) -> list[Path]:
    dirs = cgroup_dirs(path)
    for directory in dirs:
        directory.mkdir(parents=True, exist_ok=True)
    return dirs


def cgroup_pids(directory: Path) -> set[int]:
    """Every process in a cgroup and the cgroups below it."""
    pids: set[int] = set()
    for procs in directory.rglob("cgroup.procs") if directory.is_dir() else ():
        with contextlib.suppress(OSError, ValueError):
            pids.update(int(p) for p in procs.read_text().split())
    return pids


def remove_tree(directory: Path, timeout: float = 10.0) -> None:
    """Kill what still runs in a cgroup tree (a stopped pod's strays, a dead harness's sleepers), then remove
    it, deepest first. Never a hierarchy's root cgroup: every process of the host is there."""
    if directory.parent == CGROUP_FS or directory == CGROUP_FS or not directory.is_dir():
        return
    deadline = time.monotonic() + timeout
    while (pids := cgroup_pids(directory)) and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
    for path in sorted((p for p in directory.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        with contextlib.suppress(OSError):
            path.rmdir()
    with contextlib.suppress(OSError):
        directory.rmdir()


def remove_empty_parents(directory: Path, stop: int) -> None:
    """rmdir each parent of `directory` up to `stop` levels that has become empty (a pod's cgroup after its
    last container): an rmdir of a cgroup that still has children or processes fails, and is left."""
    for parent in list(directory.parents)[:stop]:
        try:
            parent.rmdir()
        except OSError:
            return


def sweep_stale() -> None:
    """Removes the cgroup roots of harnesses whose process is gone (killed before their teardown ran)."""
    for hierarchy in CGROUP_HIERARCHIES:
        base = CGROUP_FS / hierarchy
        for entry in base.glob(f"{ROOT_PREFIX}*") if base.is_dir() else ():
            match = STALE_ROOT.match(entry.name)
            if match and not Path(f"/proc/{match.group(1)}").exists():
                remove_tree(entry)


@dataclass
class ContainerProcess:
    """One serving container's main process (SIMULATION: a sleeper, or the webhook's shell wrapper exec-ing a
    sleeper), and the cgroups it runs in."""

    pod_uid: str
    pod: str  # namespace/name
    container: str
    container_id: str
    cgroup: str  # its cgroup path (below the hierarchy)
    proc: subprocess.Popen
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait_running(self, argv: tuple[str, ...], timeout: float = 10.0) -> None:
        """Until the process runs `argv` (cgroups joined, mounts made, a wrapper's exec done), as the runtime's
        StartContainer returns once the container runs; RuntimeError if it exits first."""
        want = "".join(f"{arg}\0" for arg in argv).encode()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                tail = self.log.read_text(errors="replace")[-800:] if self.log.exists() else ""
                raise RuntimeError(f"container {self.container!r} of {self.pod} exited {self.proc.returncode}: {tail}")
            with contextlib.suppress(OSError):
                if Path(f"/proc/{self.pid}/cmdline").read_bytes() == want:
                    return
            time.sleep(0.02)
        raise RuntimeError(f"container {self.container!r} of {self.pod} did not start {argv} within {timeout} s")

    def stop(self, grace: float = 2.0) -> None:
        """SIGTERM, then SIGKILL after `grace` seconds (the pod's grace, shortened), then its cgroups removed."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        for directory in cgroup_dirs(self.cgroup):
            remove_tree(directory)
            remove_empty_parents(directory, stop=1)  # the pod's cgroup, once its last container went


def start(argv: list[str], env: dict[str, str], cwd: Path, log: Path) -> subprocess.Popen:
    """`argv` (which joins its cgroups and makes its mounts itself: kubelet_sim.mount_script) in a session of
    its own, killed when the thread that starts it ends."""
    with log.open("ab") as out:
        return subprocess.Popen(
            ["setpriv", "--pdeathsig", "KILL", *argv],
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
