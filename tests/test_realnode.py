"""A real node (the kubelet of the pinned Kubernetes, Debian's containerd and runc, the CNI bridge) beside the
control plane: it registers Ready, runs a pod from an image built here, and its container's output comes back
through the API server from the kubelet."""

from __future__ import annotations

import subprocess
import time

import pytest
from kubernetes import client

from gluon_localcluster import ControlPlane
from gluon_localcluster.images import BASE_IMAGE, base_image
from gluon_localcluster.realnode import REAL_NODE_TAINT, RealNode

NODE = "real-a"


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    with ControlPlane(tmp_path_factory.mktemp("realnode-cp"), kwok=False) as cp:
        with RealNode(cp, NODE, images=[base_image()], labels={"gluon-test/real": "yes"}) as real:
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


def test_a_pod_runs_and_its_output_is_read_back(node, core):
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name="hello")))
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(name="hello"),
        spec=client.V1PodSpec(
            node_selector={"gluon-test/real": "yes"},
            tolerations=[client.V1Toleration(key=REAL_NODE_TAINT, operator="Exists", effect="NoSchedule")],
            restart_policy="Never",
            containers=[
                client.V1Container(
                    name="main",
                    image=BASE_IMAGE,
                    image_pull_policy="Never",
                    command=[
                        "python3",
                        "-c",
                        "import os, socket; print('hello', os.environ['WHO'], socket.gethostname())",
                    ],
                    env=[client.V1EnvVar(name="WHO", value="from-a-real-node")],
                )
            ],
        ),
    )
    core.create_namespaced_pod("hello", pod)
    done = wait_for_phase(core, "hello", "hello", {"Succeeded", "Failed"})
    assert done.status.phase == "Succeeded", done.status
    assert done.spec.node_name == NODE
    assert core.read_namespaced_pod_log("hello", "hello", container="main").strip() == "hello from-a-real-node hello"
    # The pod's address is on the node's bridge, inside the node's network namespace, not on this host.
    assert done.status.pod_ip.startswith(f"10.244.{node.index}.")
    host_addresses = subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True).stdout
    assert f" {done.status.pod_ip}/" not in host_addresses
    in_node = subprocess.run(node.in_netns("ip", "-o", "-4", "addr"), capture_output=True, text=True).stdout
    assert f" 10.244.{node.index}.1/24" in in_node  # the bridge's gateway
