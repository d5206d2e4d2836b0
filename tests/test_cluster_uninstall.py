"""`helm uninstall` on a real control plane of its own: the chart's post-delete Job really runs
`gluon-operator prune-nodes` (the simulated kubelet runs its container with the Job's own ServiceAccount
token), our labels and annotations leave every node, nothing else does, no webhook configuration is
left that could block pod creation, and no GluonRollout keeps a finalizer that nothing would remove: one
deleted while the operator was gone goes, and one deleted after the uninstall does not hang."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from kubernetes import client

from gluon_common import contract
from gluon_localcluster import ControlPlane, fleet
from gluon_localcluster.install import install
from gluon_localcluster.kubelet_sim import Image, KubeletSim
from gluon_operator.spec import GROUP, PLURAL, ROLLOUT_FINALIZER, VERSION
from tests.clusterkit import create_when_served
from tests.helpers import wait_for

OPERATOR_IMAGE = {"repository": "sim.local/gluon-operator", "tag": "uninstall-test"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with ControlPlane(tmp_path_factory.mktemp("uninstall-cp")) as cp:
        yield cp


def test_uninstall_prunes_our_keys_and_leaves_no_webhook(cluster, tmp_path):
    admin = cluster.admin_client()
    core = client.CoreV1Api(admin)
    installed = install(cluster, values={"operator": {"image": OPERATOR_IMAGE}})
    ours_labels, ours_annotations = fleet.agent_published("un-1")
    node = fleet.kwok_node(
        "un-1",
        1,
        {**ours_labels, contract.LABEL_ENABLED: "true", "example.com/keep": "yes"},
        {**ours_annotations, "example.com/note": "kept"},
    )
    core.create_node(node)
    core.create_node(fleet.kwok_node("un-2", 2, {"example.com/keep": "yes"}))
    custom = client.CustomObjectsApi(admin)
    core.create_namespace({"metadata": {"name": "apps"}})
    for name in ("kept", "deleting"):
        body = fleet.rollout(name, "apps")
        body["metadata"]["finalizers"] = [ROLLOUT_FINALIZER]  # as the operator puts it on every rollout
        wait_for(lambda: create_when_served(custom, body), timeout=30, what="the GluonRollout CRD established")
    custom.delete_namespaced_custom_object(GROUP, VERSION, "apps", PLURAL, "deleting")  # hangs: no operator runs
    assert rollouts(custom) == {"kept": [ROLLOUT_FINALIZER], "deleting": [ROLLOUT_FINALIZER]}
    # This checkout's code in the hook's container (the shared venv's editable install may point elsewhere).
    here = Path(__file__).resolve().parent.parent
    image = Image(
        path=(str(Path(sys.executable).parent),),
        entrypoint=("gluon-operator",),
        env={"PYTHONPATH": os.pathsep.join(str(here / d) for d in ("agent", "operator", ""))},
    )
    with KubeletSim(
        admin,
        {f"{OPERATOR_IMAGE['repository']}:{OPERATOR_IMAGE['tag']}": image},
        workdir=tmp_path / "kubelet",
        api_server=("127.0.0.1", cluster.port, cluster.pki.ca.cert),
        token_for=cluster.token_for,
    ) as kubelet:
        installed.uninstall()
    assert kubelet.errors == []
    assert rollouts(custom) == {"kept": []}  # Helm keeps the CRD, so the rollout; its finalizer is gone
    custom.delete_namespaced_custom_object(GROUP, VERSION, "apps", PLURAL, "kept")
    assert rollouts(custom) == {}
    labels = core.read_node("un-1").metadata.labels
    annotations = core.read_node("un-1").metadata.annotations
    assert not [k for k in labels if contract.is_ours(k)] and not [k for k in annotations if contract.is_ours(k)], (
        labels,
        annotations,
    )
    assert labels["example.com/keep"] == "yes" and annotations["example.com/note"] == "kept"
    assert core.read_node("un-2").metadata.labels["example.com/keep"] == "yes"
    reg = client.AdmissionregistrationV1Api(admin)
    hooks = [w.metadata.name for w in reg.list_mutating_webhook_configuration().items]
    assert not [h for h in hooks if h.startswith(installed.release)], hooks
    # the hook Job ran once and succeeded (helm deletes it on success: hook-delete-policy hook-succeeded)
    assert len(kubelet.started) == 1
    core.create_namespace({"metadata": {"name": "after"}})
    created = core.create_namespaced_pod(
        "after",
        {
            "metadata": {"name": "p", "labels": dict(fleet.SERVING_LABELS)},
            "spec": {"containers": [{"name": "c", "image": "i"}]},
        },
    )
    assert not created.spec.init_containers
    assert json.loads(core.read_namespaced_pod("p", "after", _preload_content=False).data)["metadata"]["name"] == "p"


def rollouts(custom: client.CustomObjectsApi) -> dict[str, list[str]]:
    items = custom.list_namespaced_custom_object(GROUP, VERSION, "apps", PLURAL)["items"]
    return {r["metadata"]["name"]: r["metadata"].get("finalizers") or [] for r in items}
