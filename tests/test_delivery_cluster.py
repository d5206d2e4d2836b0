"""Flag delivery against real API servers the chart admits: the operator asks the API server whether it
accepts fileKeyRef (a dry run under the operator's own token, which may do it in its namespace only), and
with an API server whose EnvFiles gate is off serving pods are still created, never refused: by the shell
wrapper in `auto`, uninjected at their template's flag in a forced `fileKeyRef`."""

from __future__ import annotations

import contextlib
import socket
import time

import pytest
from kubernetes import client

from gluon_common import contract
from gluon_localcluster import ControlPlane, fleet
from gluon_localcluster.install import install
from gluon_localcluster.processes import operator as start_operator
from gluon_operator import apiserver, webhook
from gluon_operator.spec import GROUP, PLURAL, VERSION
from tests.helpers import wait_for


@pytest.fixture(scope="module")
def gate_off(tmp_path_factory):
    """An API server as one of 1.35+ with its EnvFiles feature gate turned off (or one older than 1.35)."""
    with ControlPlane(tmp_path_factory.mktemp("envfiles-off"), kwok=False, feature_gates={"EnvFiles": False}) as cp:
        yield cp, install(cp)


def operator_api(installed) -> client.ApiClient:
    from kubernetes import config

    return config.new_client_from_config(config_file=str(installed.operator_kubeconfig()))


def test_the_operator_asks_the_api_server_itself_under_its_own_token(control_plane, installed, gate_off):
    accepts = apiserver.check(operator_api(installed), installed.namespace)
    assert accepts.file_key_ref is True and accepts.version == control_plane.version()["gitVersion"]
    cp_off, installed_off = gate_off
    refuses = apiserver.check(operator_api(installed_off), installed_off.namespace)
    assert refuses.file_key_ref is False and "fileKeyRef" in refuses.reason and refuses.version == "v1.36.3"
    # least privilege: the dry run in another namespace is refused (403), which leaves it unknown, never "yes"
    elsewhere = apiserver.check(operator_api(installed), "default")
    assert elsewhere.file_key_ref is None and "may not create pod templates" in elsewhere.reason
    # and nothing was stored
    core = client.CoreV1Api(control_plane.admin_client())
    assert not core.list_namespaced_pod_template(installed.namespace).items


def listening(installed) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", installed.webhook_port), timeout=1):
        return True
    return False


def serving_pod(name: str, command: bool = True) -> dict:
    container = {
        "name": "sglang",
        "image": "lmsysorg/sglang:rocm",
        "env": [{"name": contract.FLAG_ENV, "value": "0"}],
    }
    if command:
        container["command"] = ["python3", "-m", "sglang.launch_server"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": dict(fleet.SERVING_POD_LABELS)},
        "spec": {"containers": [container]},  # never scheduled: this cluster has no node
    }


@pytest.mark.parametrize("mode", ["auto", "fileKeyRef", "shell"])
def test_an_api_server_without_envfiles_never_refuses_a_serving_pod(gate_off, mode):
    cp, installed = gate_off
    core = client.CoreV1Api(cp.admin_client())
    namespace = f"serving-{mode.lower()}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    client.CustomObjectsApi(cp.admin_client()).create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, fleet.rollout("kimi", namespace)
    )
    operator = start_operator(installed, GLUON_INJECTION_MODE=mode, GLUON_NAMESPACE=installed.namespace)
    try:
        # the operator has checked the API server and its webhook listens: then pods are admitted
        wait_for(
            lambda: "fileKeyRef False" in operator.log.read_text(errors="replace") and listening(installed),
            timeout=60,
            what="the operator's check of the API server and its webhook",
        )
        created = [
            core.create_namespaced_pod(namespace, serving_pod(f"with-command-{int(time.time() * 1000) % 10**7}")),
            core.create_namespaced_pod(namespace, serving_pod("without-command", command=False)),
        ]
    finally:
        operator.stop()
    for pod in created:  # created at all: the API server accepted what the webhook made of it
        env = {e.name: e for e in pod.spec.containers[0].env}
        assert all(e.value_from is None or e.value_from.file_key_ref is None for e in env.values())
        injected = contract.ANNOTATION_POD_INJECTED in (pod.metadata.annotations or {})
        if mode == "fileKeyRef":  # forced, where the API server drops the field: its template's flag, uninjected
            assert not injected and env[contract.FLAG_ENV].value == "0" and not pod.spec.init_containers
        elif pod.spec.containers[0].command and pod.metadata.name != "without-command":
            assert injected
            assert pod.spec.containers[0].command[:3] == ["/bin/sh", "-c", webhook.SHELL_WRAPPER]
            assert env[contract.ENV_FLAG_CONTAINER].value == "sglang"
        else:  # shell cannot wrap an image's entrypoint it does not know: a plain 0
            assert injected and env[contract.FLAG_ENV].value == "0" and contract.ENV_FLAG_CONTAINER not in env
