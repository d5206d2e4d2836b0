import os
import sys
from pathlib import Path

import pytest

# Triton decides at decoration time whether a kernel is interpreted; no GPU exists where the suite runs,
# so every in-process kernel runs under the interpreter (TRITON_INTERPRET=1), set before any import.
os.environ["TRITON_INTERPRET"] = "1"
# The operator reads its reconcile interval when its handlers are imported: fast, for tests.
os.environ.setdefault("GLUON_RECONCILE_SECONDS", "0.3")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests.helpers, tests.objects, tests.clusterkit


@pytest.fixture
def clean_env():
    """Our environment without anything that would change what a probed interpreter imports."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SGLANG_AITER_MLA_GLUON")}
    return env


# ---------------------------------------------------------------- the real control plane, one per test run


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory):
    """etcd, kube-apiserver, controller-manager, scheduler and kwok on 127.0.0.1 (localcluster), shared by
    every test of the run; tests keep to namespaces and nodes of their own."""
    from gluon_localcluster import ControlPlane

    with ControlPlane(tmp_path_factory.mktemp("control-plane")) as cp:
        yield cp


@pytest.fixture(scope="session")
def installed(control_plane):
    """The chart installed for real with `helm install` (release gluon-rollout in gluon-system)."""
    from gluon_localcluster.install import install

    yield install(control_plane)


@pytest.fixture
def admin(control_plane):
    return control_plane.admin_client()


@pytest.fixture
def namespace(control_plane, request):
    """A namespace of this test's own, deleted afterwards."""
    import re
    import uuid

    from kubernetes import client

    core = client.CoreV1Api(control_plane.admin_client())
    name = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:40].strip("-") + "-" + uuid.uuid4().hex[:5]
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    yield name
    release_rollouts(control_plane.admin_client(), name)
    core.delete_namespace(name, _preload_content=False)


def release_rollouts(api, namespace: str) -> None:
    """Deletes the namespace's GluonRollouts, dropping a finalizer no operator is left to remove: a rollout
    left behind would claim nodes of later tests (the older rollout owns a node)."""
    from kubernetes import client

    from gluon_operator.spec import GROUP, PLURAL, VERSION

    custom = client.CustomObjectsApi(api)
    for item in custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"]:
        name = item["metadata"]["name"]
        if item["metadata"].get("finalizers"):
            custom.patch_namespaced_custom_object(
                GROUP,
                VERSION,
                namespace,
                PLURAL,
                name,
                {"metadata": {"finalizers": None}},
                _content_type="application/merge-patch+json",
            )
        try:
            custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        except client.ApiException as exc:
            if exc.status != 404:
                raise
