"""Self-tests in the serving image, on a real node (the kubelet of the pinned Kubernetes, Debian's containerd and
runc) with the chart's `selfTest.inServingImage`: the operator runs the self-test pod in the very image the
serving pod's runtime resolved, by its digest; the node's proofs record it; a serving pod gets flag 1 only when
its own image is proved there. A serving upgrade (the SIMULATION serving image rebuilt with another aiter
stand-in version: another digest) starts at 0, waits for its own self-test, and only then runs 1: the old
image's verdict never covers the new one.

SIMULATION: only the kernels' outcome (the serving image's node file: no AMD GPU runs them here); the probe is
the real one, in that image, and the pods, images, digests, kubelet, admission and RBAC are real.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import time
import urllib.request
from typing import Any, Iterator

import pytest
import yaml
from kubernetes import client

from gluon_common import contract
from gluon_common.report import NodeProofs
from gluon_localcluster import ControlPlane, fleet
from gluon_localcluster.images import (
    AGENT_IMAGE,
    AGENT_SIMULATION_ARGS,
    AGENT_SIMULATION_IMAGE,
    SELFTEST_SIMULATION_ARGS,
    SERVING_IMAGE,
    SERVING_IMAGE_NEXT,
    agent_image,
    agent_simulation_image,
    base_image,
    serving_image,
    serving_image_next,
)
from gluon_localcluster.install import CHART, LOCAL_VALUES, helm_binary, image_values, install, merge
from gluon_localcluster.processes import operator as start_operator
from gluon_localcluster.realnode import REAL_NODE_TAINT, RealNode
from gluon_operator import proving
from gluon_operator.kubectl_plugin import views
from gluon_operator.spec import GROUP, PLURAL, VERSION
from tests.clusterkit import finish
from tests.helpers import free_port, wait_for

NODE = "proof-a"
LABELS = {"gluon-test/proofs": "yes", "feature.node.kubernetes.io/amd-gpu": "true"}
TOLERATE = {"key": REAL_NODE_TAINT, "operator": "Exists", "effect": "NoSchedule"}
VALUES: dict[str, Any] = {
    "agent": {
        "image": {**image_values(AGENT_SIMULATION_IMAGE), "pullPolicy": "Never"},
        "extraArgs": list(AGENT_SIMULATION_ARGS),
        "tolerations": [{"key": "amd.com/gpu", "operator": "Exists", "effect": "NoSchedule"}, TOLERATE],
        "observer": {"interval": 1},
    },
    "selfTest": {
        "inServingImage": True,
        "extraArgs": list(SELFTEST_SIMULATION_ARGS),
        "deadlineSeconds": 120,
        "scheduleSeconds": 60,
        "startSeconds": 60,
        "retrySeconds": 30,
        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "1Gi"}},
    },
}


def operator_settings(extra: dict[str, Any] | None = None) -> str:
    """GLUON_SELFTEST_POD as the chart renders it for the operator's Deployment, with these values."""
    values = merge(merge(LOCAL_VALUES, VALUES), extra or {})
    done = subprocess.run(
        [helm_binary(), "template", "gluon-rollout", str(CHART), "--namespace", "gluon-system", "-f", "-"],
        input=json.dumps(values),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    for doc in yaml.safe_load_all(done.stdout):
        if doc and doc["kind"] == "Deployment" and doc["metadata"]["name"].endswith("-operator"):
            env = {e["name"]: e.get("value") for e in doc["spec"]["template"]["spec"]["containers"][0]["env"]}
            return env[proving.SETTINGS_ENV]
    raise AssertionError("the chart rendered no operator Deployment")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with ControlPlane(tmp_path_factory.mktemp("proofs-cp"), kwok=False) as cp:
        images = [base_image(), serving_image(), serving_image_next(), agent_image(), agent_simulation_image()]
        with RealNode(cp, NODE, images=images, labels=LABELS, gpus=2) as node:
            yield cp, install(cp, values=VALUES), node


@contextlib.contextmanager
def operator_with(installed: Any, extra: dict[str, Any] | None = None) -> Iterator[int]:
    """The operator, its self-test pods set as the chart renders them (with `extra` values), for one test;
    yields its metrics port."""
    port = free_port()
    operator = start_operator(
        installed,
        agent_image=AGENT_IMAGE,
        metrics_port=port,
        GLUON_NAMESPACE=installed.namespace,
        **{proving.SETTINGS_ENV: operator_settings(extra)},
    )
    try:
        yield port
    finally:
        print(operator.tail(60))
        operator.stop()


def start_rollout(core, custom, namespace: str, serving: dict[str, Any] | None = None) -> None:
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    silent = f"http://127.0.0.1:{free_port()}"  # nothing answers: the enabled node stays Analyzing (hold)
    body = fleet.rollout(
        "kimi",
        namespace,
        paused=False,
        analysis={"prometheusUrl": silent, "warmupSeconds": 0, "onNoData": "hold", "intervalSeconds": 3},
        strategy={"canaryNodes": 1, "maxParallel": 1, "holdoutNodes": 0, "restartDelaySeconds": 1},
    )
    if serving:
        body["spec"]["serving"] = serving
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)


def serving_deployment(image: str) -> dict[str, Any]:
    labels = {**fleet.SERVING_POD_LABELS, "serving": "sglang"}
    container = {
        "name": "sglang",
        "image": image,
        "imagePullPolicy": "Never",
        "command": ["python3", "/opt/simulation/serve.py"],
        "env": [{"name": contract.FLAG_ENV, "value": "0"}],
    }
    spec = {
        "nodeSelector": {"kubernetes.io/hostname": NODE},
        "tolerations": [TOLERATE],
        "terminationGracePeriodSeconds": 1,
        "containers": [container],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "sglang"},
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": spec},
        },
    }


def proofs(core) -> NodeProofs:
    annotations = core.read_node(NODE).metadata.annotations or {}
    return NodeProofs.parse(annotations.get(contract.ANNOTATION_PROOFS))[0]


def serving_pods(core, namespace: str) -> list[Any]:
    return [p for p in core.list_namespaced_pod(namespace).items if p.metadata.deletion_timestamp is None]


def running_digest(pod: Any) -> str | None:
    for status in pod.status.container_statuses or []:
        if status.name == "sglang" and status.image_id:
            return status.image_id.rsplit("@", 1)[-1] if "@" in status.image_id else status.image_id
    return None


def preflight_verdict(pod: Any) -> dict[str, Any] | None:
    for status in pod.status.init_container_statuses or []:
        terminated = status.state.terminated if status.state else None
        if status.name == "gluon-preflight" and terminated is not None and terminated.message:
            return json.loads(terminated.message)
    return None


def test_the_flag_follows_the_proof_of_the_image_each_pod_runs(cluster):
    cp, installed, _ = cluster
    api = cp.admin_client()
    core, apps, custom = client.CoreV1Api(api), client.AppsV1Api(api), client.CustomObjectsApi(api)
    namespace = "proofs"
    with operator_with(installed) as port:
        start_rollout(core, custom, namespace)
        apps.create_namespaced_deployment(namespace, serving_deployment(SERVING_IMAGE))
        upgrade_and_check(api, core, apps, custom, installed, namespace)
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        passed = re.search(rf'^{contract.M_ROLLOUT_PROOFS}_total{{result="pass"}} ([0-9.]+)$', metrics, re.M)
        assert passed and float(passed.group(1)) >= 2, metrics[:2000]
        assert re.search(rf'^{contract.M_ROLLOUT_SELFTEST_PODS}{{state="waiting"}} 0.0$', metrics, re.M)
        finish(core, custom, namespace)


def upgrade_and_check(api, core, apps, custom, installed, namespace: str) -> None:

    # 1. The first image: its self-test pod runs in it, by digest, on the node; the proof is recorded
    first = wait_for(
        lambda: next((running_digest(p) for p in serving_pods(core, namespace) if running_digest(p)), None),
        timeout=180,
        what="the serving pod running, its image resolved",
    )
    selftests = wait_for(
        lambda: (
            core.list_namespaced_pod(installed.namespace, label_selector=f"{contract.LABEL_SELFTEST_POD}=true").items
        ),
        timeout=120,
        what="the self-test pod created",
    )
    assert selftests[0].spec.containers[0].image.endswith(first)
    proved = wait_for(
        lambda: proofs(core).find(first, proofs(core).proofs[0].serving) if proofs(core).proofs else None,
        timeout=240,
        what="the first image proved",
    )
    assert proved.result == "pass", proved

    # 2. The node is enabled, its pod restarted; the new pod's own image is proved: flag 1
    def flag_one() -> Any:
        for pod in serving_pods(core, namespace):
            verdict = preflight_verdict(pod)
            if verdict and verdict.get("flag") == "1":
                return pod, verdict
        return None

    pod, verdict = wait_for(flag_one, timeout=240, what="a serving pod at flag 1")
    assert verdict["agent"]["image"] == first and verdict["agent"]["proved"] is True

    # 3. A serving upgrade: another digest. Its pod starts at 0 ("not proved"), never rolled back for it ...
    apps.patch_namespaced_deployment(
        "sglang",
        namespace,
        {"spec": {"template": {"spec": {"containers": [{"name": "sglang", "image": SERVING_IMAGE_NEXT}]}}}},
    )
    seen: dict[str, tuple[str, str | None]] = {}

    def upgraded_flag_one() -> Any:
        for pod in serving_pods(core, namespace):
            verdict = preflight_verdict(pod)
            digest = running_digest(pod)
            if verdict and digest and digest != first:
                seen[pod.metadata.name] = (verdict["flag"], (verdict.get("agent") or {}).get("proved"))
                if verdict["flag"] == "1":
                    return pod, digest
        state = (core.read_node(NODE).metadata.labels or {}).get(contract.LABEL_STATE)
        assert state != "RolledBack", "a pod waiting for its image's proof was taken for a refusal"
        return None

    pod, second = wait_for(upgraded_flag_one, timeout=420, what="the upgraded image proved, its pod at flag 1")
    assert second != first
    assert ("0", False) in seen.values(), seen  # the first pod of the new image waited at 0 for its proof
    held = proofs(core)
    assert {p.digest for p in held.proofs if p.result == "pass"} >= {first, second}

    # 4. `kubectl gluon explain` names the images the node proved and which one its pods run
    node = api.sanitize_for_serialization(core.read_node(NODE))
    rollout = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "kimi")
    pods = [api.sanitize_for_serialization(p) for p in serving_pods(core, namespace)]
    record = views.explain(rollout, node, pods, [], time.time())
    lines = views.proof_lines(record["proofs"])
    assert any(second[:19] in line and "pass" in line and "served here" in line for line in lines), lines
    assert any(first[:19] in line for line in lines), lines


def test_a_self_test_pod_that_cannot_be_scheduled_leaves_its_pods_at_0_with_the_reason(cluster):
    """Serving keeps the node: the self-test pod asks for more memory than the node has, waits unscheduled
    (it never preempts: priority -10, preemptionPolicy Never), and ends as an `error` proof naming the
    scheduler's reason; the serving pod runs 0 with that reason; the node is never rolled back for it."""
    cp, installed, _ = cluster
    api = cp.admin_client()
    core, apps, custom = client.CoreV1Api(api), client.AppsV1Api(api), client.CustomObjectsApi(api)
    namespace = "proofs-unschedulable"
    huge = {
        "selfTest": {"scheduleSeconds": 15, "resources": {"requests": {"memory": "64Ti"}, "limits": {"memory": "64Ti"}}}
    }
    with operator_with(installed, huge):
        start_rollout(core, custom, namespace, serving={"pageSize": 64})  # a configuration no proof covers yet
        apps.create_namespaced_deployment(namespace, serving_deployment(SERVING_IMAGE))
        digest = wait_for(
            lambda: next((running_digest(p) for p in serving_pods(core, namespace) if running_digest(p)), None),
            timeout=180,
            what="the serving pod running, its image resolved",
        )

        def error_proof() -> Any:
            return next((p for p in proofs(core).proofs if p.digest == digest and p.result == "error"), None)

        proof = wait_for(error_proof, timeout=180, what="the unschedulable self-test read as an error proof")
        assert "could not be scheduled within 15 s" in proof.reason and "Insufficient memory" in proof.reason, proof
        assert not core.list_namespaced_pod(
            installed.namespace, label_selector=f"{contract.LABEL_SELFTEST_POD}=true"
        ).items or wait_for(
            lambda: (
                not core.list_namespaced_pod(
                    installed.namespace, label_selector=f"{contract.LABEL_SELFTEST_POD}=true"
                ).items
            ),
            timeout=30,
            what="the read pod deleted",
        )

        def waiting_at_zero() -> Any:
            for pod in serving_pods(core, namespace):
                verdict = preflight_verdict(pod)
                if verdict and verdict["flag"] == "0" and (verdict.get("agent") or {}).get("proved") is False:
                    return verdict
            return None

        verdict = wait_for(waiting_at_zero, timeout=120, what="the serving pod at 0, waiting for its image's proof")
        assert digest in verdict["reason"], verdict
        node = api.sanitize_for_serialization(core.read_node(NODE))
        rollout = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "kimi")
        record = views.explain(rollout, node, [], [], time.time())
        assert any(
            "error (the self-test pod could not be scheduled" in line for line in views.proof_lines(record["proofs"])
        )
        assert (core.read_node(NODE).metadata.labels or {}).get(contract.LABEL_STATE) != "RolledBack"
        finish(core, custom, namespace)
