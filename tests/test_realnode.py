"""A real node (the kubelet of the pinned Kubernetes, Debian's containerd and runc, the CNI bridge) beside the
control plane: it registers Ready, runs a pod from an image built here, and its container's output comes back
through the API server from the kubelet."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from kubernetes import client

from gluon_common import contract
from gluon_localcluster import ControlPlane, fleet
from gluon_localcluster.images import (
    AGENT_IMAGE,
    AGENT_SIMULATION_ARGS,
    AGENT_SIMULATION_IMAGE,
    BASE_IMAGE,
    OPERATOR_IMAGE,
    SERVING_IMAGE,
    agent_image,
    agent_simulation_image,
    base_image,
    operator_image,
    serving_image,
)
from gluon_localcluster.install import image_values
from gluon_localcluster.realnode import CGROUP_FS, REAL_NODE_TAINT, RealNode
from tests.helpers import free_port, wait_for

NODE = "real-a"
GPUS = 2  # AMD GPU device files (SIMULATION) in the node's own /dev
# The label the AMD GPU operator's NFD rule puts on AMD GPU nodes: the agent DaemonSet's default nodeSelector.
NODE_LABELS = {"gluon-test/real": "yes", "feature.node.kubernetes.io/amd-gpu": "true"}


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    with ControlPlane(tmp_path_factory.mktemp("realnode-cp"), kwok=False) as cp:
        images = [base_image(), serving_image(), agent_image(), agent_simulation_image(), operator_image()]
        with RealNode(cp, NODE, images=images, labels=NODE_LABELS, gpus=GPUS) as real:
            yield real


@pytest.fixture
def core(node):
    return client.CoreV1Api(node.cp.admin_client())


def wait_for_phase(core, namespace: str, name: str, phases: set[str], timeout: float = 90) -> client.V1Pod:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pod = core.read_namespaced_pod(name, namespace)
        if pod.status.phase in phases:
            return pod
        time.sleep(0.5)
    raise AssertionError(f"pod {namespace}/{name} not in {phases} within {timeout} s: {pod.status}")


def test_the_node_is_a_real_kubelet_on_containerd(node, core):
    info = core.read_node(NODE).status.node_info
    assert info.kubelet_version == "v1.36.3"
    assert info.container_runtime_version.startswith("containerd://1.6.")
    taints = {t.key for t in core.read_node(NODE).spec.taints or []}
    assert REAL_NODE_TAINT in taints


def run_to_completion(core, namespace: str, name: str, container: client.V1Container) -> tuple[client.V1Pod, str]:
    """A pod of one container on the real node, run to its end: the pod and its container's output."""
    if namespace not in {n.metadata.name for n in core.list_namespace().items}:
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1PodSpec(
            node_selector={"gluon-test/real": "yes"},
            tolerations=[client.V1Toleration(key=REAL_NODE_TAINT, operator="Exists", effect="NoSchedule")],
            restart_policy="Never",
            containers=[container],
        ),
    )
    core.create_namespaced_pod(namespace, pod)
    done = wait_for_phase(core, namespace, name, {"Succeeded", "Failed"})
    return done, core.read_namespaced_pod_log(name, namespace, container=container.name)


def test_a_pod_runs_and_its_output_is_read_back(node, core):
    main = client.V1Container(
        name="main",
        image=BASE_IMAGE,
        image_pull_policy="Never",
        command=["python3", "-c", "import os, socket; print('hello', os.environ['WHO'], socket.gethostname())"],
        env=[client.V1EnvVar(name="WHO", value="from-a-real-node")],
    )
    done, output = run_to_completion(core, "hello", "hello", main)
    assert done.status.phase == "Succeeded", done.status
    assert done.spec.node_name == NODE
    assert output.strip() == "hello from-a-real-node hello"
    # The pod's address is on the node's bridge, inside the node's network namespace, not on this host.
    assert done.status.pod_ip.startswith(f"10.244.{node.index}.")
    host_addresses = subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True).stdout
    assert f" {done.status.pod_ip}/" not in host_addresses
    in_node = subprocess.run(node.in_netns("ip", "-o", "-4", "addr"), capture_output=True, text=True).stdout
    assert f" 10.244.{node.index}.1/24" in in_node  # the bridge's gateway


def test_the_agent_image_built_from_the_dockerfile_sees_the_simulated_serving_stack(node, core):
    """The Dockerfile's `agent` target FROM the SIMULATION serving image: its probe finds the fake aiter,
    the gfx950 torch stand-in and the real Triton with Gluon's cga_layout, as on a capable node."""
    probe = client.V1Container(
        name="probe",
        image=AGENT_IMAGE,
        image_pull_policy="Never",
        args=["probe", "--json"],
        security_context=client.V1SecurityContext(privileged=True),  # every device of the node's /dev
    )
    done, output = run_to_completion(core, "images", "agent-probe", probe)
    report = json.loads(output)
    assert report["import_ok"] is True, report
    assert report["triton_cga_layout_ok"] is True, report
    assert report["kfd_access"] == "ok", report
    assert len(report["gpus"]) == GPUS and all(g["arch"].startswith("gfx950") for g in report["gpus"]), report
    assert done.status.container_statuses[0].state.terminated.exit_code in (0, 1)  # capable or not: it ran


def test_the_serving_image_reports_the_flag_its_process_sees(node, core):
    serving = client.V1Container(
        name="serving",
        image=SERVING_IMAGE,
        image_pull_policy="Never",
        command=["timeout", "2", "python3", "/opt/simulation/serve.py"],
        env=[client.V1EnvVar(name="SGLANG_AITER_MLA_GLUON", value="1")],
    )
    _, output = run_to_completion(core, "images", "serving", serving)
    assert output.splitlines()[0] == "SGLANG_AITER_MLA_GLUON=1"


def test_the_operator_image_runs_as_its_non_root_user(node, core):
    operator = client.V1Container(
        name="operator",
        image=OPERATOR_IMAGE,
        image_pull_policy="Never",
        command=["python3", "-c", "import os, gluon_operator; print(os.getuid(), gluon_operator.__file__)"],
    )
    done, output = run_to_completion(core, "images", "operator", operator)
    assert done.status.phase == "Succeeded", output
    uid, module = output.split()
    assert uid == "65532" and module.startswith("/usr/local/lib/python3")


# ---------------------------------------------------------------- serving pods through the chart's webhook


@pytest.fixture(scope="module")
def installed_real(node):
    """The chart installed with `helm install` (its webhook at the operator's 127.0.0.1 address)."""
    from gluon_localcluster.install import install

    return install(node.cp)


def serving_pod(name: str) -> dict:
    """A serving pod of the SIMULATION image on the real node, opted in, its template's flag 0."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": dict(fleet.SERVING_POD_LABELS)},
        "spec": {
            "nodeSelector": {"gluon-test/real": "yes"},
            "tolerations": [{"key": REAL_NODE_TAINT, "operator": "Exists", "effect": "NoSchedule"}],
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "sglang",
                    "image": SERVING_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["python3", "/opt/simulation/serve.py"],
                    "env": [{"name": contract.FLAG_ENV, "value": "0"}],
                }
            ],
        },
    }


def serving_namespace(core, installed_real, tag: str) -> str:
    from gluon_operator.spec import GROUP, PLURAL, VERSION

    namespace = f"serving-{tag}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    custom = client.CustomObjectsApi(installed_real.cp.admin_client())
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, fleet.rollout("kimi", namespace))
    return namespace


def first_log_line(core, namespace: str, name: str, timeout: float = 90) -> str:
    """The serving process's first line (the flag it sees), once its container runs."""
    wait_for_phase(core, namespace, name, {"Running", "Succeeded", "Failed"}, timeout)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        lines = core.read_namespaced_pod_log(name, namespace, container="sglang").splitlines()
        if lines:
            return lines[0]
        time.sleep(0.5)
    raise AssertionError(f"{namespace}/{name} printed nothing within 30 s")


def test_with_the_operator_stopped_a_serving_pod_starts_unmodified(node, core, installed_real):
    namespace = serving_namespace(core, installed_real, "no-operator")
    created = core.create_namespaced_pod(namespace, serving_pod("plain"))
    assert not created.spec.init_containers  # failurePolicy Ignore: nothing listens where the webhook points
    assert first_log_line(core, namespace, "plain") == f"{contract.FLAG_ENV}=0"


@pytest.mark.parametrize("mode", ["fileKeyRef", "shell"])
def test_an_injected_pod_runs_the_real_preflight_and_serves_the_flag_it_wrote(node, core, installed_real, mode):
    """The webhook injects; the kubelet runs the install container (agent image) and the preflight (serving
    image), then hands the flag file's value to the serving process: through fileKeyRef (the kubelet's own
    env-file reading) or the shell wrapper. No agent answers on this node, so the preflight says 0 and why."""
    from gluon_localcluster.images import AGENT_IMAGE
    from gluon_localcluster.processes import operator as start_operator

    namespace = serving_namespace(core, installed_real, mode.lower())
    operator = start_operator(installed_real, agent_image=AGENT_IMAGE, GLUON_INJECTION_MODE=mode)
    try:
        created = wait_for(
            lambda: injected_pod(core, namespace),
            timeout=60,
            interval=1.0,
            what=f"an injected pod (operator log:\n{operator.tail()})",
        )
        name = created.metadata.name
        line = first_log_line(core, namespace, name)
    finally:
        operator.stop()
    pod = core.read_namespaced_pod(name, namespace)
    preflight = {s.name: s for s in pod.status.init_container_statuses}["gluon-preflight"]
    verdict = json.loads(preflight.state.terminated.message)
    assert preflight.state.terminated.exit_code == 0
    assert verdict["flag"] == "0" and f"{node.ip}:{contract.AGENT_PORT}" in verdict["reason"], verdict
    assert line == f"{contract.FLAG_ENV}=0"
    env = {e.name: e for e in pod.spec.containers[0].env}
    if mode == "fileKeyRef":
        assert env[contract.FLAG_ENV].value_from.file_key_ref.path == "flag.env"
    else:
        assert pod.spec.containers[0].command[:2] == ["/bin/sh", "-c"]


def test_a_preflight_refusal_serves_the_safe_path_and_shows_its_reason(node, core, installed_real):
    """A serving container whose PATH holds no python3 (its env, which the preflight copies): the preflight's
    shell refuses for good (`final`), writes 0, and says why in the termination message; the serving process
    (started by absolute path) runs on the safe path."""
    from gluon_localcluster.images import AGENT_IMAGE
    from gluon_localcluster.processes import operator as start_operator

    namespace = serving_namespace(core, installed_real, "refusal")
    pod = serving_pod("x")
    serving = pod["spec"]["containers"][0]
    serving["command"] = ["/usr/bin/python3", "/opt/simulation/serve.py"]
    serving["env"].append({"name": "PATH", "value": "/nowhere"})
    operator = start_operator(installed_real, agent_image=AGENT_IMAGE)
    try:
        created = wait_for(
            lambda: injected_pod(core, namespace, pod),
            timeout=60,
            interval=1.0,
            what=f"an injected pod (operator log:\n{operator.tail()})",
        )
        line = first_log_line(core, namespace, created.metadata.name)
    finally:
        operator.stop()
    status = core.read_namespaced_pod(created.metadata.name, namespace).status
    preflight = {s.name: s for s in status.init_container_statuses}["gluon-preflight"].state.terminated
    verdict = json.loads(preflight.message)
    assert verdict == {
        "flag": "0",
        "final": True,
        "agent": {"asked": False},
        "reason": "the serving image has no python3 on PATH",
    }
    assert line == f"{contract.FLAG_ENV}=0"


def injected_pod(core, namespace: str, pod: dict | None = None):
    body = dict(pod or serving_pod("x"))
    body["metadata"] = {**body["metadata"], "name": f"sglang-{int(time.monotonic() * 1000) % 10**8}"}
    created = core.create_namespaced_pod(namespace, body)
    if contract.ANNOTATION_POD_INJECTED in (created.metadata.annotations or {}):
        return created
    core.delete_namespaced_pod(created.metadata.name, namespace, grace_period_seconds=0)
    return None


# ---------------------------------------------------------------- the agent DaemonSet, in each GPU access mode

AGENT_ON_THE_REAL_NODE = {
    "agent": {
        "image": {**image_values(AGENT_IMAGE), "pullPolicy": "Never"},
        "tolerations": [{"key": REAL_NODE_TAINT, "operator": "Exists", "effect": "NoSchedule"}],
        "selftestTimeout": 60,
    }
}
MODES = {
    "hostDevices": {"gpuAccess": "hostDevices", "privileged": False},
    "hostDevices, privileged": {"gpuAccess": "hostDevices", "privileged": True},
    "resource": {"gpuAccess": "resource", "privileged": False, "gpuResourceCount": 1},
}


def process_status(node, pod_uid: str) -> dict[str, str]:
    """/proc/<pid>/status of the pod's agent process (`gluon-agent run`; its observer container runs as root
    beside it), found by its cgroup under the node's own root: what the runtime really enforced (user,
    capabilities, no_new_privs, seccomp), whatever the pod spec asked."""
    root = CGROUP_FS / "pids" / node.cgroup
    pod_dirs = [d for d in root.rglob(f"*{pod_uid.replace('-', '_')}*") if d.is_dir()]
    pod_dirs += [d for d in root.rglob(f"*{pod_uid}*") if d.is_dir()]
    for pod_dir in pod_dirs:
        for procs in pod_dir.rglob("cgroup.procs"):
            for pid in procs.read_text().split():
                status = Path(f"/proc/{pid}/status").read_text()
                fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                if any(a.endswith(b"gluon-agent") for a in argv) and b"run" in argv:  # the agent, not its observer
                    return {k: v.strip() for k, v in fields.items()}
    raise AssertionError(f"no gluon-agent process in a cgroup of pod {pod_uid} under {root}")


def agent_verdict(core, mode: str) -> tuple[str, str] | None:
    """(capable label, why not) once the agent of this mode has written its probe's verdict, else None."""
    node = core.read_node(NODE)
    labels, annotations = node.metadata.labels or {}, node.metadata.annotations or {}
    if contract.LABEL_CAPABLE not in labels or contract.ANNOTATION_REPORT not in annotations:
        return None
    missing = " ".join(json.loads(annotations[contract.ANNOTATION_REPORT])["probe"]["missing_for_capable"])
    expected = {"hostDevices": "EPERM", "hostDevices, privileged": None, "resource": "no GPU visible)"}[mode]
    capable = labels[contract.LABEL_CAPABLE]
    if (expected is None and capable == "true") or (expected is not None and expected in missing):
        return capable, missing
    return None


def test_the_agent_runs_in_each_gpu_access_mode_as_the_runtime_enforces_it(node, core, installed_real):
    """The chart's agent DaemonSet on the real node, switched by `helm upgrade` through the three modes. The
    node has 2 GPUs' device files. Unprivileged hostDevices: the device cgroup refuses /dev/kfd (EPERM), as
    containerd does on a real AMD node, and the agent says so and which values fix it; privileged: the GPUs
    are seen; resource: no host path at all (no AMD device plugin here adds the devices), the pod admitted
    against the node's amd.com/gpu."""
    core.patch_node_status(NODE, {"status": {"capacity": {"amd.com/gpu": str(GPUS)}}})
    seen: dict[str, tuple] = {}
    for mode, access in MODES.items():
        installed_real.upgrade(values={"agent": {**AGENT_ON_THE_REAL_NODE["agent"], **access}})
        verdict = wait_for(
            lambda: agent_verdict(core, mode), timeout=120, interval=1.0, what=f"the agent's verdict in {mode}"
        )
        pod = client.CoreV1Api(node.cp.admin_client()).read_namespaced_pod(
            installed_real.agent_pod(NODE)["metadata"]["name"], installed_real.namespace
        )
        status = process_status(node, pod.metadata.uid)
        seen[mode] = (verdict, status["Uid"].split()[0], status["CapEff"], status["NoNewPrivs"], status["Seccomp"])
    (capable, why), uid, caps, no_new_privs, seccomp = seen["hostDevices"]
    assert capable == "false" and "/dev/kfd was denied (EPERM)" in why and "agent.privileged" in why
    assert (uid, caps, no_new_privs, seccomp) == ("65532", "0000000000000000", "1", "2")  # 2: seccomp filter on
    (capable, why), uid, caps, _, seccomp = seen["hostDevices, privileged"]
    assert capable == "true" and uid == "65532" and seccomp == "0"
    (capable, why), uid, caps, no_new_privs, seccomp = seen["resource"]
    assert capable == "false" and "EPERM" not in why
    assert (uid, caps, no_new_privs, seccomp) == ("65532", "0000000000000000", "1", "2")


# ---------------------------------------------------------------- the flag through an enable and a rollback

SERVING_NS = "serving-flag"


def serving_deployment() -> dict:
    pod = serving_pod("x")
    template = {"metadata": {"labels": pod["metadata"]["labels"]}, "spec": pod["spec"]}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "sglang"},
        "spec": {"replicas": 1, "selector": {"matchLabels": dict(fleet.SERVING_LABELS)}, "template": template},
    }


def seen_flags(core, namespace: str) -> dict[str, str]:
    """Each running serving pod's name -> the SGLANG_AITER_MLA_GLUON its serving process printed at start."""
    seen = {}
    for pod in core.list_namespaced_pod(namespace).items:
        if pod.status.phase == "Running" and not pod.metadata.deletion_timestamp:
            lines = core.read_namespaced_pod_log(pod.metadata.name, namespace, container="sglang").splitlines()
            if lines:
                seen[pod.metadata.name] = lines[0].partition("=")[2]
    return seen


def node_state(custom, namespace: str) -> str:
    from gluon_operator.spec import GROUP, PLURAL, VERSION

    rollout = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "kimi")
    return ((rollout.get("status") or {}).get("nodes") or {}).get(NODE, {}).get("state", "")


def steady(core, custom, state: str, flag: str) -> tuple[str, dict[str, str]] | None:
    """(the node's enabled label, each serving process's flag) once the node is in `state` and its one
    serving pod runs with `flag`; else None."""
    seen = seen_flags(core, SERVING_NS)
    if node_state(custom, SERVING_NS) != state or list(seen.values()) != [flag]:
        return None
    return (core.read_node(NODE).metadata.labels or {}).get(contract.LABEL_ENABLED, ""), seen


def delete_other_rollouts(custom) -> None:
    """The serving tests above leave their rollouts, which select this node too (the oldest would claim it)."""
    from gluon_operator.spec import GROUP, PLURAL, VERSION

    for rollout in custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)["items"]:
        meta = rollout["metadata"]
        custom.delete_namespaced_custom_object(GROUP, VERSION, meta["namespace"], PLURAL, meta["name"])
    wait_for(
        lambda: not custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)["items"],
        timeout=30,
        what="the other rollouts gone (the operator removes its finalizer)",
    )


def test_the_flag_each_serving_process_sees_equals_its_nodes_label_through_an_enable_and_a_rollback(
    node, core, installed_real
):
    """The chart's agent (the SIMULATION agent image: its own probe of the node's devices, a simulated
    self-test outcome) makes the node eligible; the operator enables it, restarting the serving Deployment's
    pod, whose real preflight asks that agent and hands the kubelet the flag; with no Prometheus answering
    and onNoData=rollback, the analysis rolls the node back and the pod restarts again. In each steady state
    the serving process sees what the node's label says: 0 before, 1 enabled, 0 rolled back."""
    from gluon_localcluster.processes import operator as start_operator
    from gluon_operator.spec import GROUP, PLURAL, VERSION

    custom = client.CustomObjectsApi(node.cp.admin_client())
    apps = client.AppsV1Api(node.cp.admin_client())
    agent = {
        **AGENT_ON_THE_REAL_NODE["agent"],
        "image": {**image_values(AGENT_SIMULATION_IMAGE), "pullPolicy": "Never"},
        "gpuAccess": "hostDevices",
        "privileged": True,
        "extraArgs": list(AGENT_SIMULATION_ARGS),
    }
    installed_real.upgrade(values={"agent": agent})
    operator = start_operator(installed_real, agent_image=AGENT_IMAGE)
    try:
        delete_other_rollouts(custom)
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=SERVING_NS)))
        apps.create_namespaced_deployment(SERVING_NS, serving_deployment())
        wait_for(
            lambda: list(seen_flags(core, SERVING_NS).values()) == ["0"], timeout=90, what="the serving pod at flag 0"
        )
        before = (core.read_node(NODE).metadata.labels or {}).get(contract.LABEL_ENABLED, "")
        silent = f"http://127.0.0.1:{free_port()}"  # nothing listens: every analysis is inconclusive
        body = fleet.rollout(
            "kimi",
            SERVING_NS,
            analysis={
                "prometheusUrl": silent,
                "warmupSeconds": 0,
                "onNoData": "rollback",
                "intervalSeconds": 3,
                "noDataDeadlineSeconds": 10,
            },
        )
        custom.create_namespaced_custom_object(GROUP, VERSION, SERVING_NS, PLURAL, body)
        enabled = wait_for(
            lambda: steady(core, custom, "Analyzing", "1"),
            timeout=150,
            interval=0.5,
            what=f"the node enabled and its pod at flag 1 (operator log:\n{operator.tail()})",
        )
        rolled_back = wait_for(
            lambda: steady(core, custom, "RolledBack", "0"),
            timeout=90,
            interval=0.5,
            what=f"the node rolled back and its pod at flag 0 (operator log:\n{operator.tail()})",
        )
        status = custom.get_namespaced_custom_object(GROUP, VERSION, SERVING_NS, PLURAL, "kimi")["status"]
    finally:
        operator.stop()
    assert before in ("", "false")
    assert enabled[0] == "true" and rolled_back[0] == "false"
    assert set(enabled[1]).isdisjoint(rolled_back[1]), (enabled, rolled_back)  # the rollback restarted the pod
    assert "onNoData=rollback" in status["nodes"][NODE]["reason"], status["nodes"][NODE]


# ---------------------------------------------------------------- the operator as the chart's two pods

RECONCILED = "Timer 'reconcile' succeeded"  # kopf's line for each reconcile of a rollout


def operator_pods(core, installed_real) -> list[client.V1Pod]:
    pods = core.list_namespaced_pod(
        installed_real.namespace, label_selector="app.kubernetes.io/name=gluon-rollout-operator"
    ).items
    return sorted(
        (p for p in pods if not p.metadata.deletion_timestamp and p.status.phase == "Running"),
        key=lambda p: p.metadata.name,
    )


def reconciles(core, installed_real, pod: str) -> int:
    return core.read_namespaced_pod_log(pod, installed_real.namespace, container="operator").count(RECONCILED)


def test_the_operator_runs_as_two_pods_and_one_takes_over_when_the_other_goes(node, core, installed_real):
    """The chart's Deployment (2 replicas, kopf peering) from the operator image, in-cluster (its
    ServiceAccount's projected token, the `kubernetes` Service's address): one pod reconciles the rollouts of
    the tests above, the other waits; deleted (a drain's SIGTERM), the active one leaves the peering and the
    waiting one takes over; the Deployment's new pod waits in turn."""
    serving_namespace(core, installed_real, "peering")  # a rollout to reconcile, whichever tests ran before
    installed_real.upgrade(
        values={
            "operator": {
                "image": {**image_values(OPERATOR_IMAGE), "pullPolicy": "Never"},
                "nodeSelector": {"gluon-test/real": "yes"},
                "tolerations": [{"key": REAL_NODE_TAINT, "operator": "Exists", "effect": "NoSchedule"}],
                "reconcileSeconds": 1,
            }
        }
    )
    pods = wait_for(
        lambda: (found := operator_pods(core, installed_real)) and len(found) == 2 and found,
        timeout=120,
        interval=1.0,
        what="two operator pods running",
    )
    names = [p.metadata.name for p in pods]

    def working() -> list[str]:
        before = {name: reconciles(core, installed_real, name) for name in names}
        time.sleep(4)
        return [name for name in names if reconciles(core, installed_real, name) > before[name]]

    active = wait_for(lambda: (w := working()) and len(w) == 1 and w[0], timeout=90, interval=0.5, what="one active")
    waiting = next(name for name in names if name != active)
    core.delete_namespaced_pod(active, installed_real.namespace)
    wait_for(
        lambda: reconciles(core, installed_real, waiting) > 0,
        timeout=60,
        interval=1.0,
        what=f"{waiting} taking over from {active}",
    )
    log = core.read_namespaced_pod_log(waiting, installed_real.namespace, container="operator")
    assert "Resuming operations" in log and "Possibly conflicting operators" not in log


# ---------------------------------------------------------------- helm uninstall: its cleanup Job, a real pod


def test_uninstall_runs_its_cleanup_job_on_the_node_and_leaves_nothing_of_ours(node, core, installed_real):
    """`helm uninstall` with the operator scaled to none: the chart's post-delete Job runs `gluon-operator
    prune-nodes` from the operator image as a real pod on this tainted node (it takes the operator's
    tolerations), with its own ServiceAccount's token. Our labels and annotations leave the node, nothing
    else does; no webhook configuration is left to block pod creation; no rollout keeps the operator's
    finalizer (one deleted while no operator ran goes, the one left can be deleted)."""
    from gluon_operator.spec import GROUP, PLURAL, ROLLOUT_FINALIZER, VERSION

    admin = node.cp.admin_client()
    custom, apps = client.CustomObjectsApi(admin), client.AppsV1Api(admin)
    for deployment in apps.list_namespaced_deployment(installed_real.namespace).items:
        apps.patch_namespaced_deployment_scale(
            deployment.metadata.name, installed_real.namespace, {"spec": {"replicas": 0}}
        )
    wait_for(lambda: not operator_pods(core, installed_real), timeout=60, interval=1.0, what="no operator pod")
    ours_labels, ours_annotations = fleet.agent_published(NODE)  # what an agent writes (and the tests above)
    labels = {**ours_labels, contract.LABEL_ENABLED: "true", "example.com/keep": "yes"}
    annotations = {**ours_annotations, "example.com/note": "kept"}
    core.patch_node(NODE, {"metadata": {"labels": labels, "annotations": annotations}})
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name="apps")))
    for name in ("kept", "deleting"):
        body = fleet.rollout(name, "apps")
        body["metadata"]["finalizers"] = [ROLLOUT_FINALIZER]  # as the operator puts it on every rollout
        custom.create_namespaced_custom_object(GROUP, VERSION, "apps", PLURAL, body)
    custom.delete_namespaced_custom_object(GROUP, VERSION, "apps", PLURAL, "deleting")  # hangs: no operator

    installed_real.uninstall()

    left = {
        r["metadata"]["name"]: r["metadata"].get("finalizers") or []
        for r in custom.list_namespaced_custom_object(GROUP, VERSION, "apps", PLURAL)["items"]
    }
    assert left == {"kept": []}  # Helm keeps the CRD, so the rollout; its finalizer is gone
    meta = core.read_node(NODE).metadata
    assert [k for k in meta.labels if contract.is_ours(k)] == [], meta.labels
    assert [k for k in meta.annotations if contract.is_ours(k)] == [], meta.annotations
    assert meta.labels["example.com/keep"] == "yes" and meta.annotations["example.com/note"] == "kept"
    hooks = client.AdmissionregistrationV1Api(admin).list_mutating_webhook_configuration().items
    assert not [h.metadata.name for h in hooks if h.metadata.name.startswith(installed_real.release)]
    started = [
        e
        for e in core.list_namespaced_event(installed_real.namespace).items
        if e.reason == "Started" and e.involved_object.name.startswith(f"{installed_real.release}-cleanup-")
    ]
    assert len(started) == 1 and started[0].source.host == NODE, started  # once, by this node's kubelet
