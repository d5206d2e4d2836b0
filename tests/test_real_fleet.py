"""The demo fleet's real nodes, as plain data: what the harness reads from a real node's serving pod (its
preflight's verdict) and what it runs there (the SIMULATION serving image with that node's speed model)."""

from __future__ import annotations

import json

import pytest

from gluon_localcluster import images
from gluon_localcluster.realnode import REAL_NODE_TAINT
from gluon_localcluster.simcluster import DEMO_FLEET, SimCluster, real_preflight, real_serving_deployment

REAL = frozenset({"gpu-01"})


def pod(node: str = "gpu-01", phase: str = "Running", message: str | None = '{"flag": "1", "reason": "ok"}') -> dict:
    terminated = {"exitCode": 0, **({"message": message} if message is not None else {})}
    return {
        "metadata": {"name": "sglang-x", "namespace": "serving"},
        "spec": {"nodeName": node},
        "status": {
            "phase": phase,
            "initContainerStatuses": [
                {"name": "gluon-install", "state": {"terminated": {"exitCode": 0}}},
                {"name": "gluon-preflight", "state": {"terminated": terminated}},
            ],
        },
    }


def test_a_running_pods_preflight_verdict_is_its_flag():
    outcome = real_preflight(pod(), REAL)
    assert outcome is not None and (outcome.pod, outcome.node, outcome.flag) == ("sglang-x", "gpu-01", "1")
    assert json.loads(outcome.message)["reason"] == "ok"


@pytest.mark.parametrize(
    "case",
    [pod(node="gpu-03"), pod(phase="Pending"), pod(message=None)],
    ids=["a kwok node's pod (kubelet_sim reports it)", "not running yet", "no verdict"],
)
def test_no_outcome_before_the_kubelet_ran_the_preflight_on_a_real_node(case):
    assert real_preflight(case, REAL) is None


def test_an_unreadable_verdict_is_the_safe_flag():
    assert real_preflight(pod(message="Traceback ..."), REAL).flag == "0"


def test_a_real_nodes_serving_pod_runs_the_simulation_image_with_its_nodes_speed():
    node = DEMO_FLEET[1]
    spec = real_serving_deployment("sglang-gpu-02", node)["spec"]["template"]["spec"]
    container = spec["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert container["image"] == images.SERVING_IMAGE and container["imagePullPolicy"] == "Never"
    assert env["SIM_NODE"] == "gpu-02" and float(env["SIM_FLAG_EFFECT"]) == node.flag_effect
    assert env["SGLANG_AITER_MLA_GLUON"] == "0"  # the template's safe path, as on kwok's nodes
    assert any(t["key"] == REAL_NODE_TAINT for t in spec["tolerations"])
    assert spec["nodeSelector"] == {"kubernetes.io/hostname": "gpu-02"}


def test_real_nodes_must_name_fleet_nodes():
    with pytest.raises(ValueError, match="gpu-99"):
        SimCluster(real_nodes=("gpu-99",))
