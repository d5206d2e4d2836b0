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
from hypothesis import given, settings
from hypothesis import strategies as st
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
    assert preflight["command"] == ["/bin/sh", "-c", webhook.preflight_script(CONFIG.deadline_s)]
    # the serving container's env reaches the preflight (less the flag); ours comes last
    assert [e["name"] for e in preflight["env"]] == ["HF_HOME", "HOST_IP", "NODE_NAME"]
    serving, sidecar = spec["containers"]
    flags = [e for e in serving["env"] if e["name"] == contract.FLAG_ENV]
    assert flags == [{"name": contract.FLAG_ENV, "valueFrom": {"fileKeyRef": {
        "volumeName": webhook.VOLUME, "path": "flag.env", "key": contract.FLAG_ENV, "optional": False}}}]
    assert sidecar == pod["spec"]["containers"][1]  # another image: the preflight did not check it
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


# ---------------------------------------------------------------- hardening: odd pods, names, the serving container (pure)

ROLLOUTS_HERE = {SERVING_NS: [{"name": "kimi", "podSelector": {"matchLabels": {"app": "sglang"}}}]}


def admit(pod: dict, config: webhook.Injection = CONFIG) -> webhook.Admission:
    return webhook.admit(pod, SERVING_NS, ROLLOUTS_HERE, config)


def test_env_null_is_read_as_empty_and_injected():
    pod = sglang_pod()
    pod["spec"]["containers"][0]["env"] = None
    pod["spec"]["containers"][0]["volumeMounts"] = None
    answer = admit(pod)
    assert answer.outcome == "injected" and answer.warnings == ()
    serving = apply(pod, answer.changes)["spec"]["containers"][0]
    assert [e["name"] for e in serving["env"]] == [contract.FLAG_ENV]


@pytest.mark.parametrize("spoil,why", [
    (lambda pod: pod["spec"]["containers"][0].pop("image"), "the serving container 'sglang' has no image to run the preflight in"),
    (lambda pod: pod["spec"]["containers"][0].update(env="HF_HOME=/m"), "spec.containers[0].env is not a list of objects"),
    (lambda pod: pod["spec"]["containers"][0].update(command="python3 -m sglang"), "spec.containers[0].command is not a list of strings"),
    (lambda pod: pod["spec"].update(containers=None), "the pod has no containers"),
    (lambda pod: pod["spec"].update(containers=["sglang"]), "spec.containers is not a list of objects"),
    (lambda pod: pod["spec"].update(volumes={"name": "x"}), "spec.volumes is not a list of objects"),
    (lambda pod: pod["metadata"].update(annotations=["x"]), "metadata.annotations is not an object"),
    (lambda pod: pod.pop("spec"), "the pod has no spec"),
])
def test_odd_pods_are_admitted_unchanged_with_a_warning(spoil, why):
    pod = sglang_pod()
    spoil(pod)
    answer = admit(pod)
    assert answer.outcome == "not-injected" and answer.changes is None
    assert answer.warnings == (f"gluon-rollout did not inject: {why}",)


def test_an_internal_error_is_admitted_with_a_warning():
    broken = {SERVING_NS: [{"name": "kimi", "podSelector": {"matchExpressions": [{"operator": "In"}]}}]}  # no key
    answer = webhook.admit(sglang_pod(), SERVING_NS, broken, CONFIG)
    assert answer.outcome == "error" and answer.changes is None
    assert answer.warnings[0].startswith("gluon-rollout did not inject (internal error, pod admitted as it is): KeyError")


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                    max_leaves=12)


def pod_fields():
    """Pods whose every field the webhook reads may hold any JSON value."""
    container = st.fixed_dictionaries({"name": st.sampled_from(["sglang", "istio-proxy"]) | JSON},
                                      optional={k: JSON | st.just([]) for k in ("image", "env", "envFrom", "volumeMounts", "command")})
    spec = st.fixed_dictionaries({"containers": st.lists(container | JSON, max_size=3) | JSON},
                                 optional={"initContainers": JSON, "volumes": JSON})
    meta = st.fixed_dictionaries({"labels": st.just({"app": "sglang"}) | JSON},
                                 optional={"annotations": st.dictionaries(st.sampled_from([
                                     contract.ANNOTATION_POD_INJECTED, contract.ANNOTATION_POD_SERVING_CONTAINER,
                                     contract.FOREIGN_ANNOTATION_DEFAULT_CONTAINER]), JSON) | JSON})
    return st.fixed_dictionaries({"metadata": meta}, optional={"spec": spec | JSON})


@settings(max_examples=400, deadline=None)
@given(pod=pod_fields(), shell=st.booleans())
def test_admit_never_raises_and_never_denies(pod, shell):
    config = webhook.Injection(agent_image="a", mode="shell") if shell else CONFIG
    answer = admit(pod, config)
    assert answer.outcome in webhook.OUTCOMES
    assert (answer.changes is None) == (answer.outcome != "injected")
    assert all(w.startswith("gluon-rollout did not inject") for w in answer.warnings)
    if answer.outcome == "error":  # a shape admit() does not check is a bug to find here, not in a cluster
        pytest.fail(answer.warnings[0])
    if answer.outcome == "injected":
        assert webhook.mutation(apply(pod, answer.changes), "kimi", config) is None  # idempotent


@pytest.mark.parametrize("where", ["initContainers", "volumes"])
def test_a_user_object_with_our_name_is_kept_and_warned_about(where):
    pod = sglang_pod()
    name = webhook.PREFLIGHT_CONTAINER if where == "initContainers" else webhook.VOLUME
    pod["spec"][where] = pod["spec"].get(where, []) + [{"name": name, "image": "mine"} if where == "initContainers" else {"name": name, "emptyDir": {}}]
    answer = admit(pod)
    assert answer.outcome == "not-injected" and answer.changes is None  # never removed, never reused
    assert name in answer.warnings[0] and "a name the injection uses" in answer.warnings[0]


def test_our_own_earlier_injection_is_no_clash():
    pod = sglang_pod()
    mutated = apply(pod, admit(pod).changes)
    assert admit(mutated).outcome == "unchanged"


def pod_with(containers: list[dict], annotations: dict | None = None) -> dict:
    pod = sglang_pod()
    pod["spec"]["containers"] = containers
    pod["metadata"]["annotations"] = annotations or {}
    return pod


PROXY = {"name": "istio-proxy", "image": "istio/proxyv2:1.24"}
SGLANG = {"name": "sglang", "image": "lmsysorg/sglang:v0.5-rocm", "command": ["python3", "-m", "sglang.launch_server"]}
TOOLS = {"name": "tools", "image": "busybox"}


@pytest.mark.parametrize("containers,annotations,serving", [
    ([PROXY, SGLANG], {}, "sglang"),  # Istio's proxy first (holdApplicationUntilProxyStarts)
    ([TOOLS, SGLANG], {contract.ANNOTATION_POD_SERVING_CONTAINER: "sglang"}, "sglang"),
    ([TOOLS, SGLANG], {contract.FOREIGN_ANNOTATION_DEFAULT_CONTAINER: "sglang"}, "sglang"),
    ([TOOLS, SGLANG], {contract.FOREIGN_ANNOTATION_DEFAULT_CONTAINER: "gone"}, "tools"),  # kubectl's: a hint only
    ([SGLANG, TOOLS], {}, "sglang"),
])
def test_the_serving_container_is_found_by_name(containers, annotations, serving):
    pod = pod_with(containers, annotations)
    spec = apply(pod, admit(pod).changes)["spec"]
    image = {c["name"]: c["image"] for c in containers}[serving]
    assert spec["initContainers"][1]["image"] == image
    flagged = [c["name"] for c in spec["containers"] if any(e["name"] == contract.FLAG_ENV for e in c.get("env", []))]
    assert flagged == [serving]  # only the image the preflight checked gets the flag


def test_an_annotation_naming_no_container_is_a_warning():
    answer = admit(pod_with([PROXY, SGLANG], {contract.ANNOTATION_POD_SERVING_CONTAINER: "sglang-main"}))
    assert answer.outcome == "not-injected"
    assert "names no container of this pod (it has istio-proxy, sglang)" in answer.warnings[0]


def test_shell_mode_leaves_a_sidecar_without_a_command_alone():
    shell = webhook.Injection(agent_image="a", mode="shell")
    pod = pod_with([PROXY, SGLANG])
    spec = apply(pod, admit(pod, shell).changes)["spec"]
    assert spec["containers"][0] == PROXY and spec["containers"][1]["command"][2] == webhook.SHELL_WRAPPER


def test_the_preflight_sees_the_serving_containers_env_and_mounts():
    serving = {**SGLANG, "env": [{"name": "PYTHONPATH", "value": "/models/code"}, {"name": "HOST_IP", "value": "spoofed"},
                                 {"name": contract.FLAG_ENV, "value": "1"}],
               "envFrom": [{"configMapRef": {"name": "serving-env"}}],
               "volumeMounts": [{"name": "models", "mountPath": "/models", "mountPropagation": "HostToContainer"}]}
    pod = pod_with([serving])
    preflight = apply(pod, admit(pod).changes)["spec"]["initContainers"][1]
    assert preflight["env"][0] == {"name": "PYTHONPATH", "value": "/models/code"}
    assert [e["name"] for e in preflight["env"]] == ["PYTHONPATH", "HOST_IP", "NODE_NAME"]
    assert preflight["env"][1]["valueFrom"]["fieldRef"]["fieldPath"] == "status.hostIP"  # ours, not the spoof
    assert preflight["envFrom"] == serving["envFrom"]
    assert preflight["volumeMounts"] == [{"name": "models", "mountPath": "/models", "readOnly": True},
                                         {"name": webhook.VOLUME, "mountPath": webhook.MOUNT}]


# ---------------------------------------------------------------- the admission server's body limit (kopf + aiohttp, no API server)


def test_reviews_over_aiohttps_1_mib_default_are_read():
    """A review the API server can send (its request bodies go to 3 MiB) reaches the handler; a body past
    any API server's is refused unread and counted."""
    import asyncio

    import aiohttp

    from gluon_operator.admission import REVIEW_LIMIT, AdmissionServer
    from gluon_operator.metrics import METRICS

    seen: list[int] = []

    async def fn(review, **_):
        seen.append(len(json.dumps(review)))
        return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": {"uid": review["request"]["uid"], "allowed": True}}

    def too_large() -> float:
        return METRICS.registry.get_sample_value(contract.M_ROLLOUT_WEBHOOK_REVIEWS + "_total", {"outcome": webhook.TOO_LARGE})

    async def main():
        server = AdmissionServer(addr="127.0.0.1", port=free_port(), insecure=True)
        serving = server(fn)
        config = await serving.__anext__()
        try:
            async with aiohttp.ClientSession() as session:
                big = {"request": {"uid": "u1", "object": {"pad": "x" * (3 * 1024 * 1024)}}}
                async with session.post(config["url"].rstrip("/") + "/inject", json=big) as answer:
                    assert answer.status == 200 and (await answer.json())["response"]["uid"] == "u1"
                before = too_large()
                huge = {"request": {"uid": "u2", "object": {"pad": "x" * REVIEW_LIMIT}}}
                async with session.post(config["url"].rstrip("/") + "/inject", json=huge) as answer:
                    assert answer.status == 413
                assert too_large() == before + 1
        finally:
            await serving.aclose()

    asyncio.run(asyncio.wait_for(main(), 30))
    assert seen and seen[0] > 3 * 1024 * 1024


def test_odd_and_large_pods_are_allowed_over_tls(webhook_url):
    """Through kopf's real admission path: allowed, unchanged, with the warning (not 500, not 413)."""
    url, context = webhook_url
    no_image = sglang_pod()
    no_image["spec"]["containers"][0].pop("image")
    answer = review(url, context, no_image)["response"]
    assert answer["allowed"] is True and "patch" not in answer and "status" not in answer
    assert answer["warnings"] == ["gluon-rollout did not inject: the serving container 'sglang' has no image to run the preflight in"]
    large = sglang_pod()
    large["metadata"]["annotations"] = {"example.com/blob": "x" * (1536 * 1024)}  # etcd's 1.5 MiB object limit
    mutated = patched(large, review(url, context, large))
    assert mutated["metadata"]["annotations"][contract.ANNOTATION_POD_INJECTED] == "kimi"
