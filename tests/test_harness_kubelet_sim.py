"""The harness's SIMULATION of the kubelet on kwok's nodes (kubelet_sim.py), on the test run's real control
plane: pods injected by the webhook's own mutation run their real init containers (the install, the real
preflight asking a real agent process), then each wired container gets a real process with the environment
that container gets (fileKeyRef read from the flag file, or the webhook's shell wrapper sourcing it), in the
pod's mounts and under its node's cgroup root, where the agent's own observer (gluon_agent.observe) and the
agent process itself (`gluon-agent run --observe-proc`) find it. A node whose kubelet ignores fileKeyRef hands
an empty value over, and the preflight's check holds the pod as a kubelet shows it (CrashLoopBackOff).

Also the pieces around it that need no cluster: the port of the kubelet's env-file reader, the environment
a container gets, kwok nodes' kubelet version, and the feature gates of the control plane and a real node
(their argv and config, built without starting anything)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator

import pytest
from kubernetes import client

from gluon_agent.observe import observe
from gluon_common import contract
from gluon_common.delivery import DeliveryReport, ObservedContainer
from gluon_localcluster import fleet, processes, realnode
from gluon_localcluster.binaries import kubernetes_version
from gluon_localcluster.controlplane import ControlPlane, feature_gate_args
from gluon_localcluster.envfile import parse_env_file
from gluon_localcluster.fakes.simulated import simulated_node
from gluon_localcluster.kubelet_sim import (
    SLEEPER,
    ContainerConfigError,
    Image,
    KubeletSim,
    container_env,
    main_argv,
)
from gluon_localcluster.sim_containers import CGROUP_FS
from gluon_localcluster.simcluster import SERVING_IMAGE, sim_images
from gluon_localcluster.stages import PREFLIGHT_MESSAGE
from gluon_operator import webhook
from tests.clusterkit import MERGE, Nodes, pods
from tests.helpers import http_json, wait_for

FLAG = contract.FLAG_ENV
ON, OLD = "on", "old"  # a node of the pinned kubelet, and one whose kubelet ignores fileKeyRef
INDEXES = {ON: 901, OLD: 902}  # node addresses of their own (fleet.node_ip)
INJECTION = webhook.Injection(agent_image=processes.AGENT_IMAGE)


# ---------------------------------------------------------------- no cluster: the kubelet's env-file reader


@pytest.mark.parametrize(
    "text, value",
    [
        ("SGLANG_AITER_MLA_GLUON='1'\n", "1"),
        ("# written by the preflight\n\n  SGLANG_AITER_MLA_GLUON='0'  # safe\n", "0"),
        ("OTHER='x'\nSGLANG_AITER_MLA_GLUON='1'", "1"),
        ("OTHER='x'\n", ""),  # absent: '' (the kubelet then refuses it unless optional)
        ("SGLANG_AITER_MLA_GLUON= '1'\n", ""),  # blank after '=': an empty assignment, as in a shell
        ("SGLANG_AITER_MLA_GLUON='a\nb'\n", "a\nb"),  # quotes span lines
        ("SGLANG_AITER_MLA_GLUON='1'\r\n", "1"),
    ],
)
def test_the_env_file_reads_as_the_kubelet_reads_it(text, value):
    assert parse_env_file(text, FLAG) == value


@pytest.mark.parametrize(
    "text, why",
    [
        ("SGLANG_AITER_MLA_GLUON=1\n", "single quotes"),
        ('SGLANG_AITER_MLA_GLUON="1"\n', "single quotes"),
        ("SGLANG_AITER_MLA_GLUON ='1'\n", "whitespace before '='"),
        ("SGLANG_AITER_MLA_GLUON='1' x\n", "after closing quote"),
        ("SGLANG_AITER_MLA_GLUON='1\n", "unclosed"),
        ("just words\n", "missing '='"),
    ],
)
def test_an_env_file_the_kubelet_refuses_is_refused(text, why):
    with pytest.raises(ValueError, match=why):
        parse_env_file(text, FLAG)


def env_pod(tmp_path: Path, text: str | None, optional: bool = False) -> tuple[dict, dict, dict[str, Path]]:
    """(container, pod, volumes) with a fileKeyRef to flag.env in the volume gluon-flag (holding `text`)."""
    volume = tmp_path / "gluon-flag"
    volume.mkdir()
    if text is not None:
        (volume / contract.FLAG_FILE).write_text(text)
    ref = {"volumeName": "gluon-flag", "path": contract.FLAG_FILE, "key": FLAG, "optional": optional}
    container = {
        "name": "sglang",
        "env": [{"name": "A", "value": "a"}, {"name": "EMPTY"}, {"name": FLAG, "valueFrom": {"fileKeyRef": ref}}],
    }
    pod = {"metadata": {"name": "p"}, "spec": {"nodeName": "n"}}
    return container, pod, {"gluon-flag": volume}


def test_file_key_ref_is_read_from_the_pods_volume(tmp_path):
    container, pod, volumes = env_pod(tmp_path, f"{FLAG}='1'\n")
    env = container_env(container, pod, {}, Image(env={"IMAGE": "i"}), volumes)
    assert (env[FLAG], env["A"], env["EMPTY"], env["IMAGE"]) == ("1", "a", "", "i")


def test_a_kubelet_that_ignores_file_key_ref_sets_the_variable_empty(tmp_path):
    container, pod, volumes = env_pod(tmp_path, f"{FLAG}='1'\n")
    assert container_env(container, pod, {}, Image(), volumes, reads_file_key_ref=False)[FLAG] == ""


def test_a_missing_key_is_a_config_error_unless_optional(tmp_path):
    container, pod, volumes = env_pod(tmp_path, "OTHER='1'\n")
    with pytest.raises(ContainerConfigError, match=f'key "{FLAG}" not found'):
        container_env(container, pod, {}, Image(), volumes)
    container["env"][-1]["valueFrom"]["fileKeyRef"]["optional"] = True
    assert FLAG not in container_env(container, pod, {}, Image(), volumes)


def test_a_missing_flag_file_is_a_config_error(tmp_path):
    container, pod, volumes = env_pod(tmp_path, None)
    with pytest.raises(ContainerConfigError, match="couldn't parse env file"):
        container_env(container, pod, {}, Image(), volumes)


def test_a_wired_container_runs_a_sleeper_or_the_wrapper_around_one():
    wrapped = {"command": ["/bin/sh", "-c", webhook.SHELL_WRAPPER, "sh", "python3", "-m", "sglang.launch_server"]}
    assert main_argv(wrapped) == ["/bin/sh", "-c", webhook.SHELL_WRAPPER, "sh", *SLEEPER]
    assert main_argv({"command": ["python3", "-m", "sglang.launch_server"]}) == list(SLEEPER)


# ---------------------------------------------------------------- no cluster: versions and feature gates


def test_kwok_nodes_report_the_pinned_kubelet_unless_told_another():
    assert fleet.kwok_node("a", 1)["status"]["nodeInfo"]["kubeletVersion"] == kubernetes_version()
    assert kubernetes_version().startswith("v1.")
    assert fleet.kwok_node("a", 1, kubelet_version="v1.34.2")["status"]["nodeInfo"]["kubeletVersion"] == "v1.34.2"


def test_the_control_plane_passes_its_feature_gates(tmp_path):
    assert feature_gate_args({}) == []
    assert feature_gate_args({"EnvFiles": False, "A": True}) == ["--feature-gates=A=true,EnvFiles=false"]
    cp = ControlPlane(tmp_path, feature_gates={"EnvFiles": False})
    cp._certificates()  # the certificates the argv names; nothing is started
    for argv in (cp._apiserver_args(), cp._controller_manager_args(), cp._scheduler_args()):
        assert "--feature-gates=EnvFiles=false" in argv
    plain = ControlPlane(tmp_path / "plain")
    plain._certificates()
    assert not any(a.startswith("--feature-gates") for a in plain._apiserver_args())


def test_a_real_nodes_kubelet_config_carries_its_feature_gates(tmp_path, monkeypatch):
    monkeypatch.setattr(realnode, "require_node_tools", lambda: None)  # nothing is started
    pki = SimpleNamespace(ca=SimpleNamespace(cert=tmp_path / "ca.crt"))
    cp = SimpleNamespace(dir=tmp_path, pki=pki, version=lambda: {"gitVersion": "v1.36.3"})
    gated = realnode.RealNode(cp, "real-a", feature_gates={"EnvFiles": False})
    assert gated.kubelet_config()["featureGates"] == {"EnvFiles": False}
    assert "with feature gates EnvFiles=false" in gated.summary()
    plain = realnode.RealNode(cp, "real-b")
    assert "featureGates" not in plain.kubelet_config() and "feature gates" not in plain.summary()


# ---------------------------------------------------------------- on the control plane


@pytest.fixture(scope="module")
def kwok_nodes(installed) -> Iterator[Nodes]:
    nodes = Nodes(installed, "hks")
    for short, index in INDEXES.items():
        nodes.create(short, index)
    yield nodes
    nodes.delete()


@pytest.fixture(scope="module")
def kubelet(installed, kwok_nodes, tmp_path_factory) -> Iterator[KubeletSim]:
    workdir = tmp_path_factory.mktemp("kubelet-sim")
    old = frozenset({kwok_nodes.name(OLD)})
    with KubeletSim(installed.cp.admin_client(), sim_images(workdir), workdir=workdir, ignores_file_key_ref=old) as sim:
        yield sim
    assert not (CGROUP_FS / "pids" / sim.cgroup_base.lstrip("/")).exists(), "the simulator's cgroups outlived it"


@pytest.fixture(scope="module")
def agents(installed, kwok_nodes, kubelet, tmp_path_factory) -> Iterator[dict[str, processes.Process]]:
    """A real `gluon-agent run` per node, observing /proc under its node's cgroup root. Node ON is enabled (as
    the operator would enable it), so a capable serving image's preflight there gets flag 1; OLD is not."""
    workdir = tmp_path_factory.mktemp("agents")
    started = {}
    for short, index in INDEXES.items():
        name = kwok_nodes.name(short)
        sim = workdir / f"{name}.json"
        sim.write_text(json.dumps(simulated_node()))
        started[short] = processes.agent(
            installed, name, fleet.node_ip(index), sim, None, None, "--observe-interval", "0.5",
            cgroup_root=kubelet.cgroup_root(name),
        )  # fmt: skip
    enabled = {"metadata": {"labels": {contract.LABEL_ENABLED: "true"}}}
    kwok_nodes.core.patch_node(kwok_nodes.name(ON), enabled, _content_type=MERGE)
    try:
        for short, index in INDEXES.items():
            url = f"http://{fleet.node_ip(index)}:{contract.AGENT_PORT}{contract.DECISION_PATH}"
            want = "1" if short == ON else "0"
            wait_for(lambda: answer(url).get("current") and answer(url).get("flag") == want, timeout=90,
                     interval=0.3, what=f"agent {short} to say {want}")  # fmt: skip
        yield started
    finally:
        for process in started.values():
            process.stop()
    for process in started.values():
        assert "Traceback" not in process.tail(400), process.tail(60)


def answer(url: str) -> dict[str, Any]:
    try:
        return http_json(url, timeout=2)[1] or {}
    except OSError:
        return {}


def injected_pod(name: str, node: str, mode: str, check: bool = True) -> dict[str, Any]:
    """A serving pod as the webhook injects it (its own mutation) for `mode`, bound to `node`. Without the
    label the chart's webhook selects (no operator serves it here). `check` False: a fileKeyRef injection
    whose preflight does not check the kubelet's reading (so the serving container starts on an old one)."""
    template = fleet.serving_deployment(name, node=node, image=SERVING_IMAGE)["spec"]["template"]
    pod = {"metadata": {"name": name, "labels": {"app": "harness-kubelet-sim"}}, "spec": template["spec"]}
    spec, warnings = webhook.mutated_spec(pod, INJECTION, mode)
    assert warnings == []
    if not check:
        preflight = next(c for c in spec["initContainers"] if c["name"] == webhook.PREFLIGHT_CONTAINER)
        preflight["env"] = [e for e in preflight["env"] if e["name"] != contract.ENV_FILEKEYREF_CHECK]
        preflight["command"][2] = webhook.preflight_script(INJECTION.deadline_s)
    spec["nodeName"] = node
    pod["metadata"]["annotations"] = {contract.ANNOTATION_POD_INJECTED: "harness-test"}
    return {"apiVersion": "v1", "kind": "Pod", **pod, "spec": spec}


def create(installed, namespace: str, pod: dict[str, Any]) -> dict[str, Any]:
    core = client.CoreV1Api(installed.cp.admin_client())
    return json.loads(core.create_namespaced_pod(namespace, pod, _preload_content=False).data)


def read(installed, namespace: str, name: str) -> dict[str, Any]:
    return next(p for p in pods(installed.cp.admin_client(), namespace) if p["metadata"]["name"] == name)


def running(installed, kubelet: KubeletSim, namespace: str, pod: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """(the pod once kwok reports it Running, its one wired container's process)."""
    created = create(installed, namespace, pod)
    name = created["metadata"]["name"]

    def errors() -> list[str]:
        return [e for e in kubelet.errors if e.startswith(f"{namespace}/{name}:")]

    wait_for(
        lambda: read(installed, namespace, name)["status"].get("phase") == "Running" or errors(),
        timeout=120,
        interval=0.3,
        what=f"{name} Running",
    )
    assert errors() == []
    (process,) = kubelet.processes(created["metadata"]["uid"])
    return read(installed, namespace, name), process


def environ(pid: int) -> dict[str, str]:
    entries = Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0")
    return dict(e.split("=", 1) for e in entries if "=" in e)


def flag_file(pid: int) -> str:
    """The flag file as the container sees it (through its own mount namespace)."""
    return (Path(f"/proc/{pid}/root") / contract.FLAG_MOUNT.lstrip("/") / contract.FLAG_FILE).read_text()


def observed(kubelet: KubeletSim, node: str, uid: str) -> ObservedContainer | None:
    report, unreadable = observe(Path("/proc"), kubelet.cgroup_root(node))
    assert report.available and unreadable == 0, report.problem
    return next((c for c in report.containers if c.pod_uid == uid), None)


def test_file_key_ref_hands_the_flag_files_value_to_a_real_process(installed, kwok_nodes, kubelet, agents, namespace):
    node = kwok_nodes.name(ON)
    pod, process = running(installed, kubelet, namespace, injected_pod("fkr", node, webhook.FILEKEYREF))
    uid = pod["metadata"]["uid"]
    assert flag_file(process.pid) == f"{FLAG}='1'\n"  # the real preflight's verdict, through the pod's volume
    env = environ(process.pid)
    assert env[FLAG] == "1" and env[contract.ENV_FLAG_CONTAINER] == "sglang"
    assert Path(f"/proc/{process.pid}/cmdline").read_bytes().split(b"\0")[:2] == [s.encode() for s in SLEEPER]
    pids_line = next(line for line in Path(f"/proc/{process.pid}/cgroup").read_text().splitlines() if ":pids:" in line)
    qos = {"Burstable": "/burstable", "BestEffort": "/besteffort", "Guaranteed": ""}[pod["status"]["qosClass"]]
    want = f"{kubelet.cgroup_root(node)}/kubepods{qos}/pod{uid}/{process.container_id}"
    assert pids_line.split(":", 2)[2] == want
    seen = observed(kubelet, node, uid)
    assert seen is not None and (seen.container, seen.intended, seen.delivered, seen.runs) == (
        "sglang",
        "1",
        "1",
        ["1"],
    )
    assert seen.container_id == process.container_id[:12] and not seen.mismatch()
    assert PREFLIGHT_MESSAGE in pod["metadata"]["annotations"]
    assert kwok_nodes.read(node)["status"]["nodeInfo"]["kubeletVersion"] == kubernetes_version()  # kwok kept it


def test_the_shell_wrapper_sources_the_flag_file_over_the_templates_zero(
    installed, kwok_nodes, kubelet, agents, namespace
):
    node = kwok_nodes.name(ON)
    pod, process = running(installed, kubelet, namespace, injected_pod("shell", node, webhook.SHELL))
    assert webhook.wrapped(pod["spec"]["containers"][0]["command"])
    assert environ(process.pid)[FLAG] == "1"  # the spec says 0; the real wrapper exported the file's 1
    seen = observed(kubelet, node, pod["metadata"]["uid"])
    assert seen is not None and (seen.intended, seen.delivered) == ("1", "1")


def test_a_kubelet_that_ignores_file_key_ref_hands_over_an_empty_value(
    installed, kwok_nodes, kubelet, agents, namespace
):
    node = kwok_nodes.name(OLD)
    pod, process = running(
        installed, kubelet, namespace, injected_pod("ignored", node, webhook.FILEKEYREF, check=False)
    )
    assert flag_file(process.pid) == f"{FLAG}='0'\n" and environ(process.pid)[FLAG] == ""
    seen = observed(kubelet, node, pod["metadata"]["uid"])
    assert seen is not None and (seen.intended, seen.delivered, seen.runs) == ("0", "", ["1"])  # '' runs as on
    assert seen.mismatch()


def test_the_preflights_check_holds_the_pod_where_the_kubelet_ignores_file_key_ref(
    installed, kwok_nodes, kubelet, agents, namespace
):
    created = create(installed, namespace, injected_pod("held", kwok_nodes.name(OLD), webhook.FILEKEYREF))

    def preflight() -> dict[str, Any] | None:
        statuses = read(installed, namespace, "held")["status"].get("initContainerStatuses") or []
        found = next((s for s in statuses if s["name"] == webhook.PREFLIGHT_CONTAINER), {})
        return found if "lastState" in found else None

    status = wait_for(preflight, timeout=120, interval=0.3, what="the held preflight's status")
    pod = read(installed, namespace, "held")
    last = status["lastState"]["terminated"]
    assert last["exitCode"] == webhook.HOLD_EXIT and last["reason"] == "Error"
    verdict = json.loads(last["message"])
    assert verdict["held"] is True and verdict["flag"] == "0" and "ignores fileKeyRef" in verdict["reason"]
    assert status["state"]["waiting"]["reason"] == "CrashLoopBackOff"
    assert pod["status"]["phase"] == "Pending" and PREFLIGHT_MESSAGE not in pod["metadata"]["annotations"]
    assert [s["state"]["waiting"]["reason"] for s in pod["status"]["containerStatuses"]] == ["PodInitializing"]
    assert kubelet.processes(created["metadata"]["uid"]) == []  # the serving container never started
    assert [(f.container, f.exit_code) for f in kubelet.failures if f.pod == "held"] == [
        (webhook.PREFLIGHT_CONTAINER, webhook.HOLD_EXIT)
    ]


def test_the_agent_process_publishes_what_it_observed(installed, kwok_nodes, kubelet, agents, namespace):
    node = kwok_nodes.name(ON)
    pod, _ = running(installed, kubelet, namespace, injected_pod("published", node, webhook.FILEKEYREF))
    uid = pod["metadata"]["uid"]

    def published() -> ObservedContainer | None:
        text = (kwok_nodes.annotations(node) or {}).get(contract.ANNOTATION_DELIVERY)
        report = DeliveryReport.model_validate_json(text) if text else None
        return next((c for c in report.containers if c.pod_uid == uid), None) if report else None

    seen = wait_for(published, timeout=30, interval=0.3, what="the agent's delivery annotation naming the pod")
    assert (seen.container, seen.intended, seen.delivered) == ("sglang", "1", "1")
    report = DeliveryReport.model_validate_json(kwok_nodes.annotations(node)[contract.ANNOTATION_DELIVERY])
    assert report.available and report.cgroup_root == kubelet.cgroup_root(node)


def test_deleting_the_pod_ends_its_process_and_its_cgroup(installed, kwok_nodes, kubelet, agents, namespace):
    node = kwok_nodes.name(ON)
    pod, process = running(installed, kubelet, namespace, injected_pod("deleted", node, webhook.SHELL))
    uid = pod["metadata"]["uid"]
    cgroup = CGROUP_FS / "pids" / process.cgroup.lstrip("/")
    assert cgroup.is_dir() and str(process.pid) in (cgroup / "cgroup.procs").read_text().split()
    client.CoreV1Api(installed.cp.admin_client()).delete_namespaced_pod("deleted", namespace, grace_period_seconds=0)
    wait_for(lambda: not os.path.exists(f"/proc/{process.pid}"), timeout=30, what="the process gone")
    wait_for(lambda: not cgroup.exists() and not cgroup.parent.exists(), timeout=10, what="its cgroups gone")
    assert kubelet.processes(uid) == [] and observed(kubelet, node, uid) is None


def test_a_key_missing_from_the_flag_file_leaves_the_container_waiting(
    installed, kwok_nodes, kubelet, agents, namespace
):
    pod = injected_pod("nokey", kwok_nodes.name(ON), webhook.FILEKEYREF)
    flag = next(e for e in pod["spec"]["containers"][0]["env"] if e["name"] == FLAG)
    flag["valueFrom"]["fileKeyRef"]["key"] = "NOT_IN_THE_FILE"
    created = create(installed, namespace, pod)

    def serving() -> dict[str, Any] | None:
        statuses = read(installed, namespace, "nokey")["status"].get("containerStatuses") or []
        return next((s for s in statuses if "CreateContainerConfigError" in json.dumps(s)), None)

    status = wait_for(serving, timeout=120, interval=0.3, what="the serving container's config error")
    assert 'key "NOT_IN_THE_FILE" not found' in status["state"]["waiting"]["message"]
    pod = read(installed, namespace, "nokey")
    conditions = {c["type"]: c["status"] for c in pod["status"]["conditions"]}
    assert pod["status"]["phase"] == "Pending" and conditions["Initialized"] == "True"
    assert [s["state"]["terminated"]["exitCode"] for s in pod["status"]["initContainerStatuses"]] == [0, 0]
    assert kubelet.processes(created["metadata"]["uid"]) == []
