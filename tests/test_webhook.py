"""Flag delivery: the pod mutation (pure) and the operator's admission webhook over TLS, called with
AdmissionReview JSON as the API server sends it."""

from __future__ import annotations

import base64
import copy
import json
import ssl
import subprocess
import urllib.request
import uuid

import jsonpatch
import pytest
from kopf.testing import KopfRunner

from gluon_agent import contract
from gluon_operator import webhook
from tests.apiserver import ApiServerThread
from tests.cluster import ROLLOUTS, SERVING_NS, declare_rollouts, rollout
from tests.helpers import free_port, wait_for

CONFIG = webhook.Injection(agent_image="registry.example/gluon-agent:1.0")


def sglang_pod(labels=None, env=None, command=None) -> dict:
    container = {"name": "sglang", "image": "lmsysorg/sglang:v0.5-rocm", "env": env or [{"name": "HF_HOME", "value": "/models"}]}
    if command:
        container["command"] = command
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"generateName": "sglang-", "namespace": SERVING_NS, "labels": labels if labels is not None else {"app": "sglang"}},
            "spec": {"containers": [container, {"name": "sidecar", "image": "busybox"}], "volumes": [{"name": "models", "emptyDir": {}}]}}


def apply(pod: dict, changes: dict | None) -> dict:
    out = copy.deepcopy(pod)
    for key, value in (changes or {}).items():
        if key == "spec":
            out["spec"].update(value)
        else:
            out["metadata"].setdefault("annotations", {}).update(value["annotations"])
    return out


def test_mutation_injects_and_is_idempotent():
    pod = sglang_pod(env=[{"name": contract.FLAG_ENV, "value": "1"}, {"name": "HF_HOME", "value": "/m"}])
    mutated = apply(pod, webhook.mutation(pod, "kimi", CONFIG))
    spec = mutated["spec"]
    assert [v["name"] for v in spec["volumes"]] == ["models", webhook.VOLUME]
    install, preflight = spec["initContainers"]
    assert install["image"] == CONFIG.agent_image and install["command"] == ["gluon-agent", "preflight", "--install", "/gluon"]
    assert preflight["image"] == "lmsysorg/sglang:v0.5-rocm"  # the serving container's own image
    assert "python3 -m gluon_agent.preflight" in preflight["command"][2] and preflight["command"][2].endswith("exit 0")
    assert {e["name"] for e in preflight["env"]} == {"HOST_IP", "NODE_NAME"}
    for container in spec["containers"]:
        flags = [e for e in container["env"] if e["name"] == contract.FLAG_ENV]
        assert flags == [{"name": contract.FLAG_ENV, "valueFrom": {"fileKeyRef": {
            "volumeName": webhook.VOLUME, "path": "flag.env", "key": contract.FLAG_ENV, "optional": False}}}]
    assert {"name": "HF_HOME", "value": "/m"} in spec["containers"][0]["env"]  # the user's other env stays
    assert mutated["metadata"]["annotations"][contract.ANNOTATION_POD_INJECTED] == "kimi"
    assert webhook.mutation(mutated, "kimi", CONFIG) is None  # re-invocation changes nothing


def test_shell_mode_wraps_the_command_and_round_trips():
    shell = webhook.Injection(agent_image="a", mode="shell")
    pod = sglang_pod(command=["python3", "-m", "sglang.launch_server"])
    pod["spec"]["containers"] = pod["spec"]["containers"][:1]
    mutated = apply(pod, webhook.mutation(pod, "kimi", shell))
    container = mutated["spec"]["containers"][0]
    assert container["command"][:3] == ["/bin/sh", "-c", webhook.SHELL_WRAPPER]
    assert container["command"][4:] == ["python3", "-m", "sglang.launch_server"]
    assert {"name": webhook.VOLUME, "mountPath": "/gluon", "readOnly": True} in container["volumeMounts"]
    assert webhook.mutation(mutated, "kimi", shell) is None
    without_command = sglang_pod()
    with pytest.raises(webhook.NotInjectable, match="has no command"):
        webhook.mutation(without_command, "kimi", shell)


@pytest.mark.parametrize("selector,labels,matches", [
    ({"matchLabels": {"app": "sglang"}}, {"app": "sglang", "x": "y"}, True),
    ({"matchLabels": {"app": "sglang"}}, {"app": "vllm"}, False),
    ({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["a", "b"]}]}, {"tier": "b"}, True),
    ({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["a"]}]}, {"tier": "a"}, False),
    ({"matchExpressions": [{"key": "tier", "operator": "Exists"}]}, {}, False),
    ({"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]}, {}, True),
    ({}, {"app": "sglang"}, False),
])
def test_selector_semantics(selector, labels, matches):
    assert webhook.selector_matches(selector, labels) is matches


# ---------------------------------------------------------------- the real webhook server over TLS


@pytest.fixture(scope="module")
def certificate(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tls")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
                    "-keyout", str(folder / "tls.key"), "-out", str(folder / "tls.crt")], check=True, capture_output=True)
    return folder / "tls.crt", folder / "tls.key"


@pytest.fixture
def webhook_url(certificate, monkeypatch):
    port = free_port()
    with ApiServerThread() as api:
        declare_rollouts(api.server)
        api.call(lambda: api.server.put_object(ROLLOUTS, rollout()))
        env = {"GLUON_API_URL": api.url, "GLUON_SCANNING": "off", "GLUON_METRICS_PORT": "0",
               "GLUON_WEBHOOK_CERT": str(certificate[0]), "GLUON_WEBHOOK_KEY": str(certificate[1]),
               "GLUON_WEBHOOK_ADDR": "127.0.0.1", "GLUON_WEBHOOK_PORT": str(port),
               "GLUON_AGENT_IMAGE": CONFIG.agent_image}
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        with KopfRunner(["run", "-m", "gluon_operator.handlers", "--standalone", "-A"], timeout=60) as runner:
            url = f"https://127.0.0.1:{port}/inject"
            context = ssl.create_default_context(cafile=str(certificate[0]))
            wait_for(lambda: review(url, context, sglang_pod(labels={"app": "x"}), probe=True), timeout=30, what="webhook up")
            wait_for(lambda: "response" in review(url, context, sglang_pod()) and review(url, context, sglang_pod())["response"].get("patch"),
                     timeout=30, what="rollout indexed")
            yield url, context
        assert runner.exception is None


def review(url: str, context: ssl.SSLContext, pod: dict, probe: bool = False) -> dict:
    """POST an AdmissionReview exactly as the API server sends one for a pod CREATE."""
    body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": str(uuid.uuid4()), "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
        "requestResource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": SERVING_NS, "operation": "CREATE",
        "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller", "groups": ["system:serviceaccounts"]},
        "object": pod, "oldObject": None, "dryRun": False,
        "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
    }}
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, context=context, timeout=5) as response:
            return json.loads(response.read())
    except OSError:
        if probe:
            return {}
        raise


def patched(pod: dict, answer: dict) -> dict:
    response = answer["response"]
    assert response["allowed"] is True
    if "patch" not in response:
        return pod
    assert response["patchType"] == "JSONPatch"
    return jsonpatch.apply_patch(pod, json.loads(base64.b64decode(response["patch"])))


def test_webhook_over_tls(webhook_url):
    url, context = webhook_url
    pod = sglang_pod(env=[{"name": contract.FLAG_ENV, "value": "1"}])
    answer = review(url, context, pod)
    assert answer["kind"] == "AdmissionReview" and answer["response"]["uid"]
    mutated = patched(pod, answer)
    assert mutated["metadata"]["annotations"][contract.ANNOTATION_POD_INJECTED] == "kimi"
    assert [c["name"] for c in mutated["spec"]["initContainers"]] == [webhook.INSTALL_CONTAINER, webhook.PREFLIGHT_CONTAINER]
    env = mutated["spec"]["containers"][0]["env"]
    assert [e for e in env if e["name"] == contract.FLAG_ENV][0]["valueFrom"]["fileKeyRef"]["path"] == "flag.env"
    assert len([e for e in env if e["name"] == contract.FLAG_ENV]) == 1  # the template's value replaced

    again = review(url, context, mutated)  # re-invocation (reinvocationPolicy: IfNeeded)
    assert again["response"]["allowed"] is True and "patch" not in again["response"]

    other = review(url, context, sglang_pod(labels={"app": "vllm"}))
    assert other["response"]["allowed"] is True and "patch" not in other["response"]
