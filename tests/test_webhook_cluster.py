"""The operator's admission webhook over TLS (under KopfRunner, with its own ServiceAccount's token and the
certificate the chart's webhook configuration trusts): called with AdmissionReview JSON as the API server
sends it, and by the real API server for a pod CREATE."""

from __future__ import annotations

import base64
import json
import ssl
import urllib.error
import urllib.request
import uuid

import jsonpatch
import pytest
from kubernetes import client

from gluon_common import contract
from gluon_localcluster import fleet
from gluon_operator import webhook
from tests.clusterkit import create_rollout, kopf_operator
from tests.helpers import wait_for


def sglang_pod(namespace: str, labels=None, env=None) -> dict:
    container = {
        "name": "sglang",
        "image": "lmsysorg/sglang:v0.5-rocm",
        "env": env or [{"name": "HF_HOME", "value": "/models"}],
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "sglang-",
            "namespace": namespace,
            "labels": labels if labels is not None else dict(fleet.SERVING_POD_LABELS),
        },
        "spec": {
            "containers": [container, {"name": "sidecar", "image": "busybox"}],
            "volumes": [{"name": "models", "emptyDir": {}}],
        },
    }


def review(url: str, context: ssl.SSLContext, pod: dict, probe: bool = False) -> dict:
    """POST an AdmissionReview exactly as the API server sends one for a pod CREATE."""
    body = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": pod["metadata"]["namespace"],
            "operation": "CREATE",
            "userInfo": {
                "username": "system:serviceaccount:kube-system:replicaset-controller",
                "groups": ["system:serviceaccounts"],
            },
            "object": pod,
            "oldObject": None,
            "dryRun": False,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }
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


@pytest.fixture
def webhook_url(monkeypatch, installed, namespace, admin):
    create_rollout(admin, fleet.rollout("kimi", namespace))
    with kopf_operator(monkeypatch, installed, namespace, webhook=True):
        url = f"https://127.0.0.1:{installed.webhook_port}/inject"
        context = ssl.create_default_context(cafile=str(installed.cp.pki.ca.cert))  # the caBundle the chart was given
        wait_for(
            lambda: review(url, context, sglang_pod(namespace, labels={"app": "x"}), probe=True),
            timeout=30,
            what="webhook up",
        )
        wait_for(  # the rollout reconciled: its delivery (auto: fileKeyRef here) is known to the webhook
            lambda: (
                "fileKeyRef" in json.dumps(patched(sglang_pod(namespace), review(url, context, sglang_pod(namespace))))
            ),
            timeout=30,
            what="rollout indexed and its delivery resolved",
        )
        yield url, context


def test_webhook_over_tls(webhook_url, namespace):
    url, context = webhook_url
    pod = sglang_pod(namespace, env=[{"name": contract.FLAG_ENV, "value": "1"}])
    answer = review(url, context, pod)
    assert answer["kind"] == "AdmissionReview" and answer["response"]["uid"]
    mutated = patched(pod, answer)
    assert mutated["metadata"]["annotations"][contract.ANNOTATION_POD_INJECTED] == "kimi"
    assert [c["name"] for c in mutated["spec"]["initContainers"]] == [
        webhook.INSTALL_CONTAINER,
        webhook.PREFLIGHT_CONTAINER,
    ]
    env = mutated["spec"]["containers"][0]["env"]
    assert [e for e in env if e["name"] == contract.FLAG_ENV][0]["valueFrom"]["fileKeyRef"]["path"] == "flag.env"
    assert len([e for e in env if e["name"] == contract.FLAG_ENV]) == 1  # the template's value replaced

    again = review(url, context, mutated)  # re-invocation (reinvocationPolicy: IfNeeded)
    assert again["response"]["allowed"] is True and "patch" not in again["response"]

    other = review(url, context, sglang_pod(namespace, labels={"app": "vllm"}))
    assert other["response"]["allowed"] is True and "patch" not in other["response"]


def test_api_server_applies_the_webhook_patch(webhook_url, namespace, admin):
    """The same pod through the API server (a dry run: admission runs, nothing is stored): the API server's
    answer is what the webhook's patch makes of it, and a pod outside the rollout's selector is left alone."""
    url, context = webhook_url
    core = client.CoreV1Api(admin)
    pod = sglang_pod(namespace, env=[{"name": contract.FLAG_ENV, "value": "1"}])
    expected = patched(pod, review(url, context, pod))
    created = client.ApiClient().sanitize_for_serialization(core.create_namespaced_pod(namespace, pod, dry_run="All"))
    assert created["metadata"]["annotations"][contract.ANNOTATION_POD_INJECTED] == "kimi"
    assert [c["name"] for c in created["spec"]["initContainers"]] == [
        c["name"] for c in expected["spec"]["initContainers"]
    ]
    assert {v["name"] for v in expected["spec"]["volumes"]} <= {v["name"] for v in created["spec"]["volumes"]}
    for got, want in zip(created["spec"]["containers"], expected["spec"]["containers"]):
        assert [e for e in got.get("env", []) if e["name"] == contract.FLAG_ENV] == [
            e for e in want.get("env", []) if e["name"] == contract.FLAG_ENV
        ]
    other = core.create_namespaced_pod(namespace, sglang_pod(namespace, labels={"app": "vllm"}), dry_run="All")
    assert not other.spec.init_containers and contract.ANNOTATION_POD_INJECTED not in (other.metadata.annotations or {})
    # a regular container named like our init containers: left as it is, so the API server accepts it (not 422
    # Duplicate value)
    clash = sglang_pod(namespace)
    clash["spec"]["containers"].append({"name": webhook.PREFLIGHT_CONTAINER, "image": "busybox"})
    kept = core.create_namespaced_pod(namespace, clash, dry_run="All")
    assert not kept.spec.init_containers and [c.name for c in kept.spec.containers] == [
        "sglang",
        "sidecar",
        webhook.PREFLIGHT_CONTAINER,
    ]


def test_odd_and_large_pods_are_allowed_over_tls(webhook_url, namespace):
    """Through kopf's real admission path: allowed, unchanged, with the warning (not 500, not 413)."""
    url, context = webhook_url
    no_image = sglang_pod(namespace)
    no_image["spec"]["containers"][0].pop("image")
    answer = review(url, context, no_image)["response"]
    assert answer["allowed"] is True and "patch" not in answer and "status" not in answer
    assert answer["warnings"] == [
        "gluon-rollout did not inject: the serving container 'sglang' has no image to run the preflight in"
    ]
    large = sglang_pod(namespace)
    large["metadata"]["annotations"] = {"example.com/blob": "x" * (1536 * 1024)}  # etcd's 1.5 MiB object limit
    mutated = patched(large, review(url, context, large))
    assert mutated["metadata"]["annotations"][contract.ANNOTATION_POD_INJECTED] == "kimi"
    for body in (
        b"[]",
        b'{"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": {"uid": "u"}}',
        b"[" * 5000,
    ):
        request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, context=context, timeout=5)
        assert refused.value.code == 400 and refused.value.read().startswith(b"not an AdmissionReview: ")


def test_the_api_server_passes_on_the_warning_for_a_pod_whose_flag_0_has_no_route(webhook_url, namespace, admin):
    """A DCP pod (PR #34432's `--dcp-size 8`) whose template carries SGLANG_AITER_MLA_GLUON=0: admitted and
    injected, and the API server hands the webhook's warning to the client (the `Warning` header)."""
    pod = sglang_pod(namespace, env=[{"name": contract.FLAG_ENV, "value": "0"}])
    pod["spec"]["containers"][0]["command"] = [
        "python3",
        "-m",
        "sglang.launch_server",
        "--tp-size",
        "8",
        "--dcp-size",
        "8",
    ]
    created, _, headers = client.CoreV1Api(admin).create_namespaced_pod_with_http_info(namespace, pod, dry_run="All")
    assert created.metadata.annotations[contract.ANNOTATION_POD_INJECTED] == "kimi"
    warning = headers.get("Warning") or ""
    assert (
        "no working route at SGLANG_AITER_MLA_GLUON=0" in warning
        and "the template's SGLANG_AITER_MLA_GLUON=0 would crash serving" in warning
    )
    plain = sglang_pod(namespace)
    _, _, quiet = client.CoreV1Api(admin).create_namespaced_pod_with_http_info(namespace, plain, dry_run="All")
    assert "no working route" not in (quiet.get("Warning") or "")
