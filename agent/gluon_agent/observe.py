"""The flag each injected serving container on this node really runs, read from its processes.

How a process is tied to its pod and container (as cAdvisor does): its cgroup path, which the kubelet names
after the pod's UID and the runtime after the container's id, with the cgroupfs driver
(`<root>/kubepods/<qos>/pod<uid>/<id>`) and the systemd one
(`<root>/kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<uid_>.slice/cri-containerd-<id>.scope`, also
`crio-` and `docker-`). Of a container's processes, those whose environment names the container
(contract.ENV_FLAG_CONTAINER, which the webhook sets on each container it gives the flag) mark it as injected.

What is read, per process: /proc/PID/cgroup (world-readable), /proc/PID/stat (its parent), and
/proc/PID/environ, the environment the process was started with (execve): reading another user's needs
CAP_SYS_PTRACE. Of that environment exactly two values leave `flag_and_container`, SGLANG_AITER_MLA_GLUON's and
the container marker's; the rest, secrets included, is dropped there and never logged, reported or raised.
A change a process makes to its own environment later (os.environ[...] = ..., setenv) does not show in
/proc/PID/environ: SGLang reads the flag at import, so the value at exec is the one that counts unless the
serving code itself rewrites it, which this cannot see.

The intended flag is the pod's flag file as the preflight wrote it, read through the main process's own root
(/proc/PID/root, the container's mounts: the webhook mounts the flag volume read-only at contract.FLAG_MOUNT).

Only processes under the kubelet's cgroup root count (`root`): on a node that is the whole host; on a host
shared by several kubelets (the local-cluster harness) each observer reads its own root off its own cgroup.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from gluon_common import contract, sglang_env
from gluon_common.delivery import MAX_CONTAINERS, MAX_VALUES, DeliveryReport, ObservedContainer, shown

ENVIRON_LIMIT = 4 * 2**20  # bytes of one environment read: Linux caps argv and environ together near this
FLAG_FILE_LIMIT = 256
FLAG_PREFIX = (contract.FLAG_ENV + "=").encode()
CONTAINER_PREFIX = (contract.ENV_FLAG_CONTAINER + "=").encode()
KUBEPODS = re.compile(r"^kubepods(\.slice)?$")
POD = re.compile(
    r"^(?:kubepods-(?:[a-z]+-)?)?pod([0-9a-fA-F]{8}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{12})(?:\.slice)?$"
)
CONTAINER = re.compile(r"^(?:(?:cri-containerd|crio|docker)-)?([0-9a-f]{64})(?:\.scope)?$")
ID_CHARS = 12


@dataclass(frozen=True)
class ProcCgroup:
    root: str  # the cgroup path before the kubelet's kubepods ("" on a node with the default root)
    pod_uid: str
    container_id: str


def parse_cgroup(text: str) -> ProcCgroup | None:
    """The pod and container of a /proc/PID/cgroup, or None for a process outside any container of a pod
    (the host's, the runtime's, a pod's sandbox is a container too). Any hierarchy line serves (cgroup v1
    lists one per controller, v2 one `0::` line); paths relative to a cgroup namespace (`/../..`) too."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        parts = [p for p in path.split("/") if p and p != ".."]
        found = _in_pod(parts)
        if found is not None:
            return found
    return None


def _in_pod(parts: list[str]) -> ProcCgroup | None:
    if not parts:
        return None
    container = CONTAINER.match(parts[-1])
    pod = next((POD.match(p) for p in reversed(parts[:-1]) if POD.match(p)), None)
    if container is None or pod is None:
        return None
    start = next((i for i, p in enumerate(parts) if KUBEPODS.match(p)), None)
    root = "/" + "/".join(parts[:start]) if start else ""
    return ProcCgroup(root, pod.group(1).replace("_", "-").lower(), container.group(1))


def kubelet_root(own_cgroup: str) -> str | None:
    """The kubelet's cgroup root, read off the observer's own cgroup (it runs in a pod of that kubelet);
    None when it runs elsewhere (then every pod process of the host counts)."""
    found = parse_cgroup(own_cgroup)
    return found.root if found is not None else None


def flag_and_container(environ: bytes) -> tuple[str | None, str | None]:
    """SGLANG_AITER_MLA_GLUON's value and the container marker's in an environment block, and nothing else.
    A name set twice counts as its first entry, as getenv and Python's os.environ read it."""
    flag = container = None
    for entry in environ.split(b"\0"):
        if flag is None and entry.startswith(FLAG_PREFIX):
            flag = entry[len(FLAG_PREFIX) :].decode("utf-8", "replace")
        elif container is None and entry.startswith(CONTAINER_PREFIX):
            container = entry[len(CONTAINER_PREFIX) :].decode("utf-8", "replace")
    return flag, container


def flag_file_value(text: str) -> str | None:
    """'0' or '1' from the flag file's SGLANG_AITER_MLA_GLUON='...' line; None for anything else."""
    for line in text.splitlines():
        key, _, value = line.strip().partition("=")
        if key == contract.FLAG_ENV:
            value = value.strip().strip("'\"")
            return value if value in ("0", "1") else None
    return None


def parent_of(stat: str) -> int | None:
    """The parent pid in /proc/PID/stat (after the command name, which may hold spaces and parentheses)."""
    fields = stat[stat.rfind(")") + 2 :].split()
    return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None


# ---------------------------------------------------------------- reading /proc


@dataclass
class Seen:
    """One process of a pod's container, as far as it is needed."""

    pid: int
    parent: int | None
    flag: str | None
    container: str | None


@dataclass
class Scan:
    """One pass over /proc: the injected containers' processes by container id, and what could not be read."""

    by_container: dict[ProcCgroup, list[Seen]] = field(default_factory=dict)
    unreadable: int = 0  # pod processes whose environment could not be read (no CAP_SYS_PTRACE)
    readable: int = 0


def _read(path: Path, limit: int) -> bytes:
    with open(path, "rb") as handle:
        return handle.read(limit)


def scan(proc: Path, root: str | None) -> Scan:
    """Every process under the kubelet's cgroup `root` (None: any) that runs in a pod's container."""
    out = Scan()
    for entry in os.scandir(proc):
        if not entry.name.isdigit():
            continue
        base = proc / entry.name
        try:
            cgroup = parse_cgroup(_read(base / "cgroup", 64 * 1024).decode("utf-8", "replace"))
            if cgroup is None or root is not None and cgroup.root != root:
                continue
            stat = _read(base / "stat", 4096).decode("utf-8", "replace")
            try:
                flag, container = flag_and_container(_read(base / "environ", ENVIRON_LIMIT))
            except PermissionError:
                out.unreadable += 1
                continue
        except (FileNotFoundError, ProcessLookupError):  # the process ended while we read it
            continue
        except OSError:
            out.unreadable += 1
            continue
        out.readable += 1
        out.by_container.setdefault(cgroup, []).append(Seen(int(entry.name), parent_of(stat), flag, container))
    return out


def intended_flag(proc: Path, pid: int) -> str | None:
    """The pod's flag file, through the process's root; None when absent or not ours (a symlink is not followed)."""
    path = proc / str(pid) / "root" / contract.FLAG_MOUNT.lstrip("/") / contract.FLAG_FILE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        return flag_file_value(os.read(fd, FLAG_FILE_LIMIT).decode("utf-8", "replace"))
    except OSError:
        return None
    finally:
        os.close(fd)


def container_of(cgroup: ProcCgroup, seen: list[Seen], proc: Path) -> ObservedContainer | None:
    """One injected container from its processes (None when none carries the marker: not ours)."""
    name = next((s.container for s in seen if s.container), None)
    if name is None:
        return None
    pids = {s.pid for s in seen}
    mains = sorted((s for s in seen if s.parent not in pids), key=lambda s: s.pid) or sorted(seen, key=lambda s: s.pid)
    main = mains[0]
    values = sorted({shown(s.flag) for s in seen})
    return ObservedContainer(
        pod_uid=cgroup.pod_uid,
        container=name,
        container_id=cgroup.container_id[:ID_CHARS],
        intended=intended_flag(proc, main.pid),  # type: ignore[arg-type]
        delivered=shown(main.flag),
        runs=sorted({sglang_env.flag_runs(s.flag) for s in seen}),  # type: ignore[misc]
        values=values[:MAX_VALUES],
        processes=len(seen),
    )


def observe(proc: Path = Path("/proc"), root: str | None = None) -> tuple[DeliveryReport, int]:
    """(what every injected serving container under `root` runs, with `since` left to the caller; how many pod
    processes' environments could not be read). Unavailable when none could: the reader lacks CAP_SYS_PTRACE."""
    try:
        found = scan(proc, root)
    except OSError as exc:
        return DeliveryReport(available=False, problem=f"cannot list {proc}: {exc.strerror}", cgroup_root=root), 0
    if found.unreadable and not found.readable:
        problem = (
            f"cannot read the environment of the pod processes under {proc}: the observer needs CAP_SYS_PTRACE "
            "(the chart's agent runs an observer container with it)"
        )
        return DeliveryReport(available=False, problem=problem, cgroup_root=root), found.unreadable
    containers = [
        c for cg, seen in sorted(found.by_container.items(), key=_order) if (c := container_of(cg, seen, proc))
    ]
    report = DeliveryReport(
        available=True,
        cgroup_root=root,
        containers=containers[:MAX_CONTAINERS],
        omitted=max(0, len(containers) - MAX_CONTAINERS),
    )
    return report, found.unreadable


def _order(item: tuple[ProcCgroup, list[Seen]]) -> tuple[str, str]:
    return item[0].pod_uid, item[0].container_id
