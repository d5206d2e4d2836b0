"""A real node (the kubelet of the pinned Kubernetes, Debian's containerd and runc, the CNI bridge) beside the
control plane: it registers Ready, runs a pod from an image built here, and its container's output comes back
through the API server from the kubelet."""

from __future__ import annotations

import json
import subprocess
import time

import pytest
from kubernetes import client

from gluon_localcluster import ControlPlane
from gluon_localcluster.images import (
    AGENT_IMAGE,
    BASE_IMAGE,
    OPERATOR_IMAGE,
    SERVING_IMAGE,
    agent_image,
    base_image,
    operator_image,
    serving_image,
)
from gluon_localcluster.realnode import REAL_NODE_TAINT, RealNode

NODE = "real-a"


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    with ControlPlane(tmp_path_factory.mktemp("realnode-cp"), kwok=False) as cp:
        images = [base_image(), serving_image(), agent_image(), operator_image()]
        with RealNode(cp, NODE, images=images, labels={"gluon-test/real": "yes"}) as real:
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
    probe = client.V1Container(name="probe", image=AGENT_IMAGE, image_pull_policy="Never", args=["probe", "--json"])
    done, output = run_to_completion(core, "images", "agent-probe", probe)
    report = json.loads(output)
    assert report["import_ok"] is True, report
    assert report["triton_cga_layout_ok"] is True, report
    assert [g["arch"] for g in report["gpus"]] and all(g["arch"].startswith("gfx950") for g in report["gpus"])
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
