"""The agent's observation of the flag each injected serving process runs (agent/gluon_agent/observe.py,
delivery.py): the cgroup layouts of the kubelet's two drivers and the runtimes, the one-variable read of an
environment (a planted secret never leaves it), and real processes in real cgroups of this machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from gluon_agent import delivery, observe
from gluon_common import contract, sglang_env
from gluon_common.delivery import UNSET, DeliveryReport, ObservedContainer, shown

UID = "8a5b2c3d-1111-2222-3333-444455556666"
CID = "0123456789abcdef" * 4


@pytest.mark.parametrize(
    "text,root",
    [
        # cgroupfs driver, cgroup v1 (one line per hierarchy) and v2
        (f"12:pids:/kubepods/besteffort/pod{UID}/{CID}\n11:memory:/kubepods/besteffort/pod{UID}/{CID}", ""),
        (f"0::/kubepods/burstable/pod{UID}/{CID}", ""),
        (f"0::/kubepods/pod{UID}/{CID}", ""),  # Guaranteed QoS has no class folder
        # a kubelet with its own cgroup root (--cgroup-root, as the local cluster's real nodes run)
        (f"8:pids:/gluon-node-a/kubepods/besteffort/pod{UID}/{CID}", "/gluon-node-a"),
        # systemd driver: slices with the uid's dashes as underscores, the runtime's scope
        (
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
            + UID.replace("-", "_")
            + f".slice/cri-containerd-{CID}.scope",
            "",
        ),
        (f"0::/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/crio-{CID}.scope", ""),
        (f"1:name=systemd:/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/docker-{CID}.scope", ""),
        # read from inside a cgroup namespace: the path is relative to the reader's own cgroup
        (f"0::/../../kubepods-besteffort-pod{UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope", ""),
    ],
)
def test_every_cgroup_layout_names_the_pod_and_its_container(text, root):
    found = observe.parse_cgroup(text)
    assert found == observe.ProcCgroup(root, UID, CID)


@pytest.mark.parametrize(
    "text",
    [
        "0::/",  # the host
        "0::/system.slice/containerd.service",  # the runtime
        f"0::/kubepods/besteffort/pod{UID}",  # a pod's own cgroup, no container
        f"0::/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/crio-conmon-{CID}.scope",  # CRI-O's monitor
        f"0::/kubepods/besteffort/pod{UID}/{CID[:-1]}",  # not a container id
        "",
        "garbage without colons",
    ],
)
def test_processes_outside_a_pods_container_are_not_ours(text):
    assert observe.parse_cgroup(text) is None


def test_the_kubelet_root_is_read_off_the_observers_own_cgroup():
    assert observe.kubelet_root(f"8:pids:/gluon-x-1/kubepods/besteffort/pod{UID}/{CID}") == "/gluon-x-1"
    assert observe.kubelet_root(f"0::/kubepods/pod{UID}/{CID}") == ""
    assert observe.kubelet_root("0::/") is None  # not in a pod (a cgroup namespace's root): every pod counts


SECRET = "hunter2-do-not-leak"


def environ(*entries: str) -> bytes:
    return b"\0".join(e.encode() for e in entries) + b"\0"


@pytest.mark.parametrize(
    "entries,flag,container",
    [
        ((f"TOKEN={SECRET}", f"{contract.FLAG_ENV}=1", f"{contract.ENV_FLAG_CONTAINER}=sglang"), "1", "sglang"),
        ((f"{contract.FLAG_ENV}=", f"{contract.ENV_FLAG_CONTAINER}=sglang"), "", "sglang"),  # fileKeyRef ignored
        ((f"{contract.ENV_FLAG_CONTAINER}=sglang", f"X={SECRET}"), None, "sglang"),  # unset: SGLang's default
        ((f"{contract.FLAG_ENV}=0", f"{contract.FLAG_ENV}=1"), "0", None),  # getenv and os.environ read the first
        ((f"NOT_{contract.FLAG_ENV}=1", f"{contract.FLAG_ENV}X=1"), None, None),
    ],
)
def test_only_the_flag_and_the_marker_leave_an_environment(entries, flag, container):
    assert observe.flag_and_container(environ(*entries)) == (flag, container)


@pytest.mark.parametrize(
    "raw,runs",
    [
        (None, "1"),  # unset: EnvBool(True)'s default
        ("", "1"),  # what a kubelet that ignores fileKeyRef hands over
        ("1", "1"),
        ("true", "1"),
        ("Y", "1"),
        ("0", "0"),
        ("False", "0"),
        ("n", "0"),
        (" 0", "1"),  # SGLang does not strip: a warning and the default
        ("0 ", "1"),
        ("off", "1"),  # not one of SGLang's words
        ("'0'", "1"),  # quotes from a file nobody parsed
    ],
)
def test_what_sglang_runs_for_each_value(raw, runs):
    """sglang python/sglang/srt/environ.py (0003215c): EnvBool lower-cases, never strips, and any other value
    warns and gives the default, on."""
    assert sglang_env.flag_runs(raw) == runs


def test_shown_values_are_bounded_and_printable():
    assert shown(None) == UNSET and shown("") == "" and shown("1") == "1"
    assert shown("x" * 100) == "x" * 16 + "..." and shown("a\nb\x00") == "a?b?"


@pytest.mark.parametrize(
    "text,flag",
    [
        (f"{contract.FLAG_ENV}='1'\n", "1"),
        (f"{contract.FLAG_ENV}='0'", "0"),
        (f"# comment\n{contract.FLAG_ENV}='0'\n", "0"),
        (f"{contract.FLAG_ENV}='2'", None),
        ("root:x:0:0::/root:/bin/sh", None),  # a symlink to another file would not be followed anyway
        ("", None),
    ],
)
def test_the_flag_file_as_the_preflight_writes_it(text, flag):
    assert observe.flag_file_value(text) == flag


def test_the_parent_is_read_past_a_command_name_with_spaces_and_parentheses():
    assert observe.parent_of("4242 (python3 (x) y) S 17 4242 4242 0 -1") == 17
    assert observe.parent_of("garbage") is None


def container(**fields) -> ObservedContainer:
    base = dict(pod_uid=UID, container="sglang", container_id=CID[:12], intended="0", delivered="0", runs=["0"])
    return ObservedContainer(**{**base, **fields})


def test_since_is_kept_while_a_container_is_seen_unchanged_so_an_idle_node_is_not_written():
    first = delivery.with_since(None, DeliveryReport(available=True, containers=[container()]), 100.0)
    again = delivery.with_since(first, DeliveryReport(available=True, containers=[container()]), 200.0)
    assert again == first and again.containers[0].since == 100.0
    changed = delivery.with_since(
        again, DeliveryReport(available=True, containers=[container(runs=["1"], delivered="")]), 300.0
    )
    assert changed.containers[0].since == 300.0
    restarted = delivery.with_since(
        again, DeliveryReport(available=True, containers=[container(container_id="f" * 12)]), 400.0
    )
    assert restarted.containers[0].since == 400.0  # its kubelet restarted it: a new container


def test_the_counts_and_mismatches():
    report = DeliveryReport(
        available=True,
        containers=[
            container(),
            container(container="b", runs=["1"], delivered=""),
            container(container="c", intended=None),
        ],
    )
    assert delivery.counts(report) == {"match": 1, "mismatch": 1, "unknown": 1}
    assert [c.container for c in delivery.mismatched(report)] == ["b"]


def test_the_observers_file_is_read_while_fresh(tmp_path):
    path = tmp_path / "delivery.json"
    files = delivery.FileObservation(path, interval=5.0)
    report, _ = files.read(1000.0)
    assert not report.available and "has written no report" in report.problem
    written = DeliveryReport(available=True, containers=[container()])
    delivery.write_report(path, written, 2, 1000.0)
    assert files.read(1010.0) == (written, 2)
    report, _ = files.read(1000.0 + 3 * 5 + 6)
    assert not report.available and "has not written for 21 s" in report.problem
    path.write_text("{not json")
    assert "is unreadable: JSONDecodeError" in files.read(1001.0)[0].problem


# ---------------------------------------------------------------- real processes in real cgroups (root)


def pids_root() -> Path:
    return Path("/sys/fs/cgroup/pids") if Path("/sys/fs/cgroup/pids/cgroup.procs").exists() else Path("/sys/fs/cgroup")


@pytest.fixture
def pod_processes(tmp_path):
    """Serving-container stand-ins: real processes with a planted secret beside the flag, each in a cgroup laid
    out as the kubelet's cgroupfs driver does under a root of this test's own, with the pod's flag file at
    /gluon in a mount namespace of their own (as a container sees its flag volume)."""
    if os.geteuid() != 0:
        raise RuntimeError("this test makes cgroups and mount namespaces: it needs root (as make test runs)")
    root = f"/gluon-observe-test-{os.getpid()}"
    made: list[tuple[subprocess.Popen, Path]] = []

    def start(flag_file: str, env: dict[str, str], uid: str | None = None, user: int = 0) -> tuple[str, str]:
        uid, cid = uid or str(uuid.uuid4()), uuid.uuid4().hex + uuid.uuid4().hex
        cgroup = pids_root() / root.lstrip("/") / "kubepods" / "besteffort" / f"pod{uid}" / cid
        cgroup.mkdir(parents=True)
        volume = tmp_path / cid
        volume.mkdir()
        (volume / contract.FLAG_FILE).write_text(flag_file)
        run_as = f"setpriv --reuid={user} --regid={user} --clear-groups " if user else ""
        script = (
            f"mkdir -p /gluon && mount --bind {volume} /gluon && echo $$ > {cgroup}/cgroup.procs && "
            f"exec {run_as}sleep 600"
        )
        process = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c", script], env=env)
        made.append((process, cgroup))
        deadline = time.monotonic() + 10
        while not (cgroup / "cgroup.procs").read_text().strip() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)  # the exec after joining
        return uid, cid

    yield root, start
    for process, cgroup in made:
        process.kill()
        process.wait()
    time.sleep(0.2)
    top = pids_root() / root.lstrip("/")
    for folder in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        folder.rmdir()
    top.rmdir()


def test_real_processes_are_observed_and_no_secret_leaves(pod_processes, tmp_path, caplog):
    root, start = pod_processes
    base = {"PATH": os.environ["PATH"], "TOKEN": SECRET, contract.ENV_FLAG_CONTAINER: "sglang"}
    ok_uid, _ = start(f"{contract.FLAG_ENV}='1'\n", {**base, contract.FLAG_ENV: "1"})
    empty_uid, cid = start(f"{contract.FLAG_ENV}='0'\n", {**base, contract.FLAG_ENV: ""})
    start(f"{contract.FLAG_ENV}='0'\n", {"PATH": os.environ["PATH"], contract.FLAG_ENV: "1"})  # not injected: no marker
    report, unreadable = observe.observe(Path("/proc"), root)
    assert report.available and unreadable == 0
    seen = {c.pod_uid: c for c in report.containers}
    assert set(seen) == {ok_uid, empty_uid}  # the unmarked container is not ours
    assert (seen[ok_uid].intended, seen[ok_uid].delivered, seen[ok_uid].runs) == ("1", "1", ["1"])
    empty = seen[empty_uid]
    assert (empty.intended, empty.delivered, empty.runs, empty.container_id) == ("0", "", ["1"], cid[:12])
    assert empty.mismatch() and empty.processes == 1
    # every place the agent writes to: the annotation, the observer's file, its metrics, its log
    from prometheus_client import generate_latest

    from gluon_agent.metrics import AgentMetrics

    metrics = AgentMetrics()
    published = delivery.with_since(None, report, time.time())
    metrics.observe_delivery(published, unreadable, delivery.counts(published))
    delivery.write_report(tmp_path / "observed.json", report, unreadable, time.time())
    stop = __import__("threading").Event()
    stop.set()
    delivery.run_observer(Path("/proc"), tmp_path / "looped.json", 1.0, root, stop)  # logs its start only, stopped
    written = [
        delivery.annotation(published),
        (tmp_path / "observed.json").read_text(),
        generate_latest(metrics.registry).decode(),
        caplog.text,
        json.dumps(report.model_dump()),
    ]
    assert all(SECRET not in text for text in written)
    # elsewhere on the host (another kubelet's root) nothing of this test's pods is seen
    assert not [c for c in observe.observe(Path("/proc"), "/another-root")[0].containers if c.pod_uid in seen]


def test_an_observer_without_cap_sys_ptrace_says_it_cannot_see(pod_processes):
    """A serving process of another user, read without CAP_SYS_PTRACE (as the daemon's own UID 65532 with no
    capabilities would): the report says so, and the operator keeps such nodes Ineligible rather than
    trusting intentions."""
    root, start = pod_processes
    start(f"{contract.FLAG_ENV}='0'\n", {"PATH": os.environ["PATH"], contract.ENV_FLAG_CONTAINER: "sglang"}, user=65533)
    code = (
        "import json, sys; from pathlib import Path; from gluon_agent import observe\n"
        f"r, n = observe.observe(Path('/proc'), {root!r}); print(json.dumps([r.available, r.problem, n]))"
    )
    argv = ["setpriv", "--bounding-set=-sys_ptrace,-dac_override,-dac_read_search", sys.executable, "-c", code]
    done = subprocess.run(argv, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    available, problem, unreadable = json.loads(done.stdout.strip().splitlines()[-1])
    assert available is False and "needs CAP_SYS_PTRACE" in problem and unreadable >= 1
    with_the_capability, _ = observe.observe(Path("/proc"), root)  # this test's own root: CAP_SYS_PTRACE
    assert with_the_capability.available and len(with_the_capability.containers) == 1
