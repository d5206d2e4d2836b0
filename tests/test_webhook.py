"""Flag delivery: the pod mutation and the admission decision (pure), and kopf's admission server's body
limit. The webhook over TLS and called by the real API server: tests/test_webhook_cluster.py."""

from __future__ import annotations

import copy
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gluon_common import contract
from gluon_operator import webhook
from tests.helpers import free_port
from tests.objects import REVIEW

CONFIG = webhook.Injection(agent_image="registry.example/gluon-agent:1.0")
SERVING_NS = "serving"
# A rollout whose pods the operator resolved to fileKeyRef (status.delivery.mode), on an API server that accepts it.
ROLLOUTS_HERE = {
    SERVING_NS: [{"name": "kimi", "podSelector": {"matchLabels": {"app": "sglang"}}, "delivery": webhook.FILEKEYREF}]
}
FILE_KEY_REF = {
    "valueFrom": {
        "fileKeyRef": {"volumeName": webhook.VOLUME, "path": "flag.env", "key": contract.FLAG_ENV, "optional": False}
    }
}

# What the preflight container sets itself, after the serving container's own env (fileKeyRef mode).
PREFLIGHT_OWN_ENV = [
    "HOST_IP",
    "NODE_NAME",
    contract.ENV_PREFLIGHT_POD_NAMESPACE,
    contract.ENV_PREFLIGHT_POD_NAME,
    contract.ENV_PREFLIGHT_POD_UID,
    contract.ENV_FILEKEYREF_CHECK,
]


def mutate(pod: dict, config: webhook.Injection = CONFIG, mode: str = webhook.FILEKEYREF) -> dict | None:
    changes, _ = webhook.mutation(pod, "kimi", config, mode)
    return changes


def sglang_pod(labels=None, env=None, command=None) -> dict:
    container = {
        "name": "sglang",
        "image": "lmsysorg/sglang:v0.5-rocm",
        "env": env or [{"name": "HF_HOME", "value": "/models"}],
    }
    if command:
        container["command"] = command
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "sglang-",
            "namespace": SERVING_NS,
            "labels": labels if labels is not None else {"app": "sglang"},
        },
        "spec": {
            "containers": [container, {"name": "sidecar", "image": "busybox"}],
            "volumes": [{"name": "models", "emptyDir": {}}],
        },
    }


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
    mutated = apply(pod, mutate(pod))
    spec = mutated["spec"]
    assert [v["name"] for v in spec["volumes"]] == ["models", webhook.VOLUME]
    install, preflight = spec["initContainers"]
    assert install["image"] == CONFIG.agent_image and install["command"] == [
        "gluon-agent",
        "preflight",
        "--install",
        "/gluon",
    ]
    assert preflight["image"] == "lmsysorg/sglang:v0.5-rocm"  # the serving container's own image
    assert preflight["command"] == [
        "/bin/sh",
        "-c",
        webhook.preflight_script(CONFIG.deadline_s, check_file_key_ref=True),
    ]
    # the serving container's env reaches the preflight (less the flag); ours comes last, with the kubelet's own
    # reading of the flag file (the preflight holds the pod where it is not '0')
    assert [e["name"] for e in preflight["env"]] == ["HF_HOME", *PREFLIGHT_OWN_ENV]
    assert preflight["env"][-1] == {"name": contract.ENV_FILEKEYREF_CHECK, **FILE_KEY_REF}
    serving, sidecar = spec["containers"]
    ours = [e for e in serving["env"] if e["name"] in (contract.FLAG_ENV, contract.ENV_FLAG_CONTAINER)]
    assert ours == [
        {"name": contract.ENV_FLAG_CONTAINER, "value": "sglang"},  # the agent finds its processes by it
        {"name": contract.FLAG_ENV, **FILE_KEY_REF},
    ]
    # the agent reads the flag its preflight chose there, through the process's own root
    assert serving["volumeMounts"] == [{"name": webhook.VOLUME, "mountPath": "/gluon", "readOnly": True}]
    assert sidecar == pod["spec"]["containers"][1]  # another image: the preflight did not check it
    assert {"name": "HF_HOME", "value": "/m"} in spec["containers"][0]["env"]  # the user's other env stays
    assert mutated["metadata"]["annotations"][contract.ANNOTATION_POD_INJECTED] == "kimi"
    assert mutate(mutated) is None  # re-invocation changes nothing
    assert (
        mutate(mutated, mode=webhook.SHELL) is not None
        and mutate(apply(mutated, mutate(mutated, mode=webhook.SHELL)), mode=webhook.SHELL) is None
    )


def test_the_agent_port_is_passed_to_the_preflight_only_when_not_the_default():
    """issue 34: the chart's agent.port (GLUON_AGENT_PORT) reaches the preflight's command line."""
    from gluon_operator.webhook import agent_port

    pod = sglang_pod()
    moved = webhook.Injection(agent_image=CONFIG.agent_image, agent_port=9555)
    preflight = apply(pod, mutate(pod, moved, webhook.SHELL))["spec"]["initContainers"][1]
    assert preflight["command"] == ["/bin/sh", "-c", webhook.preflight_script(moved.deadline_s, agent_port=9555)]
    assert " --agent-port 9555 &\n" in preflight["command"][2]
    default = apply(pod, mutate(pod))["spec"]["initContainers"][1]
    assert (
        "--agent-port" not in default["command"][2]
    )  # an agent image older than the option still serves a default install
    assert agent_port(None) == agent_port("") == contract.AGENT_PORT and agent_port("9555") == 9555
    for bad in ("0", "65536", "http", "-1"):
        with pytest.raises(ValueError, match="GLUON_AGENT_PORT=.*is not a TCP port"):
            agent_port(bad)


def test_shell_mode_wraps_the_command_and_round_trips():
    shell = webhook.Injection(agent_image="a", mode="shell")
    pod = sglang_pod(command=["python3", "-m", "sglang.launch_server"])
    pod["spec"]["containers"] = pod["spec"]["containers"][:1]
    mutated = apply(pod, mutate(pod, shell, webhook.SHELL))
    container = mutated["spec"]["containers"][0]
    assert container["command"][:3] == ["/bin/sh", "-c", webhook.SHELL_WRAPPER]
    assert container["command"][4:] == ["python3", "-m", "sglang.launch_server"]
    assert {"name": webhook.VOLUME, "mountPath": "/gluon", "readOnly": True} in container["volumeMounts"]
    assert container["env"][-2:] == [
        {"name": contract.ENV_FLAG_CONTAINER, "value": "sglang"},
        {"name": contract.FLAG_ENV, "value": "0"},  # what a wrapper that never ran leaves: the safe path
    ]
    assert all(e["name"] != contract.ENV_FILEKEYREF_CHECK for e in mutated["spec"]["initContainers"][1]["env"])
    assert mutate(mutated, shell, webhook.SHELL) is None
    back = apply(mutated, mutate(mutated, CONFIG, webhook.FILEKEYREF))["spec"]["containers"][0]
    assert back["command"] == ["python3", "-m", "sglang.launch_server"]  # the mode changed: unwrapped again


def test_shell_mode_runs_a_container_without_a_command_at_0_and_says_why():
    """Its image's entrypoint is unknown to the webhook, which cannot wrap it: a plain '0', no marker."""
    pod = sglang_pod(env=[{"name": contract.FLAG_ENV, "value": "1"}])
    changes, warnings = webhook.mutation(pod, "kimi", CONFIG, webhook.SHELL)
    container = apply(pod, changes)["spec"]["containers"][0]
    assert container["env"] == [{"name": contract.FLAG_ENV, "value": "0"}]
    assert "command" not in container and not container.get("volumeMounts")
    assert "has no command" in warnings[0] and "runs at SGLANG_AITER_MLA_GLUON=0" in warnings[0]
    answer = webhook.admit(pod, SERVING_NS, ROLLOUTS_HERE, webhook.Injection("a", mode="shell"))
    assert answer.outcome == "injected" and answer.warnings[0].startswith("gluon-rollout: container 'sglang'")


def admit(pod: dict, config: webhook.Injection = CONFIG, api_accepts: bool | None = True) -> webhook.Admission:
    return webhook.admit(pod, SERVING_NS, ROLLOUTS_HERE, config, api_accepts)


def test_env_null_is_read_as_empty_and_injected():
    pod = sglang_pod()
    pod["spec"]["containers"][0]["env"] = None
    pod["spec"]["containers"][0]["volumeMounts"] = None
    answer = admit(pod)
    assert answer.outcome == "injected" and answer.warnings == ()
    serving = apply(pod, answer.changes)["spec"]["containers"][0]
    assert [e["name"] for e in serving["env"]] == [contract.ENV_FLAG_CONTAINER, contract.FLAG_ENV]


@pytest.mark.parametrize(
    "configured,api,resolved,mode",
    [
        ("shell", True, "fileKeyRef", "shell"),
        ("fileKeyRef", None, None, "fileKeyRef"),  # admit refuses to inject it while not known to be accepted
        ("auto", True, "fileKeyRef", "fileKeyRef"),
        ("auto", True, "shell", "shell"),
        ("auto", True, None, "shell"),  # the operator has not resolved this rollout yet
        ("auto", False, "fileKeyRef", "shell"),  # this replica found the API server refusing it meanwhile
        ("auto", None, "fileKeyRef", "shell"),
        ("auto", True, "bogus", "shell"),
    ],
)
def test_the_mode_for_a_pod(configured, api, resolved, mode):
    assert webhook.mode_for(configured, api, resolved) == mode


@pytest.mark.parametrize("api_accepts", [False, None])
def test_forced_file_key_ref_where_the_api_server_may_refuse_it_admits_the_pod_uninjected(api_accepts):
    """An API server without EnvFiles drops the field and fails the pod's validation: never refuse a pod."""
    forced = webhook.Injection("a", mode="fileKeyRef")
    answer = admit(sglang_pod(), forced, api_accepts)
    assert answer.outcome == "not-injected" and answer.changes is None
    assert "injectionMode fileKeyRef" in answer.warnings[0] and "at its template's flag" in answer.warnings[0]


def test_auto_turns_to_shell_where_the_api_server_refuses_file_key_ref():
    pod = sglang_pod(command=["python3", "-m", "sglang.launch_server"])
    answer = admit(pod, webhook.Injection("a", mode="auto"), api_accepts=False)
    container = apply(pod, answer.changes)["spec"]["containers"][0]
    assert answer.outcome == "injected" and container["command"][2] == webhook.SHELL_WRAPPER
    assert all("fileKeyRef" not in json.dumps(c) for c in apply(pod, answer.changes)["spec"]["initContainers"])


def test_an_unknown_injection_mode_stops_the_start_named():
    with pytest.raises(ValueError, match="GLUON_INJECTION_MODE='fileRef' is not one of auto, fileKeyRef, shell"):
        webhook.injection_from_env({"GLUON_INJECTION_MODE": "fileRef", "GLUON_AGENT_IMAGE": "a"})
    assert webhook.injection_from_env({"GLUON_AGENT_IMAGE": "a"}).mode == "auto"
    with pytest.raises(ValueError, match="GLUON_AGENT_IMAGE is not set: the chart sets it from agent.image"):
        webhook.injection_from_env({})  # issue 44: never an image nobody publishes


@pytest.mark.parametrize("check,held", [(None, True), ("", True), ("'0'", True), ("1", True), ("0", False)])
def test_the_preflight_holds_its_pod_unless_the_kubelet_read_the_flag_file(tmp_path, check, held):
    """fileKeyRef mode: a kubelet that ignores fileKeyRef hands the preflight's own check variable an empty
    value, and would hand the serving container one: the script exits HOLD_EXIT before anything else runs."""
    import os
    import subprocess

    script = webhook.preflight_script(
        90, mount=str(tmp_path), termination_log=str(tmp_path / "t"), check_file_key_ref=True
    )
    head = script.split("\npy=")[0] + "\necho went-on\n"  # the check, and then where Python would start
    env = {k: v for k, v in os.environ.items() if k != contract.ENV_FILEKEYREF_CHECK}
    if check is not None:
        env[contract.ENV_FILEKEYREF_CHECK] = check
    done = subprocess.run(["/bin/sh", "-c", head], env=env, capture_output=True, text=True)
    assert done.returncode == (webhook.HOLD_EXIT if held else 0), done.stderr
    assert ("went-on" in done.stdout) is not held
    if held:
        verdict = json.loads((tmp_path / "t").read_text())
        assert verdict["held"] is True and verdict["flag"] == "0" and "ignores fileKeyRef" in verdict["reason"]


@pytest.mark.parametrize(
    "spoil,why",
    [
        (
            lambda pod: pod["spec"]["containers"][0].pop("image"),
            "the serving container 'sglang' has no image to run the preflight in",
        ),
        (
            lambda pod: pod["spec"]["containers"][0].update(env="HF_HOME=/m"),
            "spec.containers[0].env is not a list of objects",
        ),
        (
            lambda pod: pod["spec"]["containers"][0].update(command="python3 -m sglang"),
            "spec.containers[0].command is not a list of strings",
        ),
        (lambda pod: pod["spec"].update(containers=None), "the pod has no containers"),
        (lambda pod: pod["spec"].update(containers=["sglang"]), "spec.containers is not a list of objects"),
        (lambda pod: pod["spec"].update(volumes={"name": "x"}), "spec.volumes is not a list of objects"),
        (lambda pod: pod["metadata"].update(annotations=["x"]), "metadata.annotations is not an object"),
        (lambda pod: pod.pop("spec"), "the pod has no spec"),
    ],
)
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
    assert answer.warnings[0].startswith(
        "gluon-rollout did not inject (internal error, pod admitted as it is): KeyError"
    )


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=12,
)


def pod_fields():
    """Pods whose every field the webhook reads may hold any JSON value."""
    container = st.fixed_dictionaries(
        {"name": st.sampled_from(["sglang", "istio-proxy"]) | JSON},
        optional={k: JSON | st.just([]) for k in ("image", "env", "envFrom", "volumeMounts", "command")},
    )
    spec = st.fixed_dictionaries(
        {"containers": st.lists(container | JSON, max_size=3) | JSON},
        optional={"initContainers": JSON, "volumes": JSON},
    )
    meta = st.fixed_dictionaries(
        {"labels": st.just({"app": "sglang"}) | JSON},
        optional={
            "annotations": st.dictionaries(
                st.sampled_from(
                    [
                        contract.ANNOTATION_POD_INJECTED,
                        contract.ANNOTATION_POD_SERVING_CONTAINER,
                        contract.FOREIGN_ANNOTATION_DEFAULT_CONTAINER,
                    ]
                ),
                JSON,
            )
            | JSON
        },
    )
    return st.fixed_dictionaries({"metadata": meta}, optional={"spec": spec | JSON})


@settings(max_examples=400, deadline=None)
@given(pod=pod_fields(), shell=st.booleans())
def test_admit_never_raises_and_never_denies(pod, shell):
    config = webhook.Injection(agent_image="a", mode="shell") if shell else CONFIG
    answer = admit(pod, config)
    assert answer.outcome in webhook.OUTCOMES
    assert (answer.changes is None) == (answer.outcome != "injected")
    assert all(w.startswith("gluon-rollout") for w in answer.warnings)
    if answer.outcome == "error":  # a shape admit() does not check is a bug to find here, not in a cluster
        pytest.fail(answer.warnings[0])
    if answer.outcome == "injected":
        assert mutate(apply(pod, answer.changes), config, webhook.SHELL if shell else webhook.FILEKEYREF) is None


@pytest.mark.parametrize("where", ["initContainers", "volumes"])
def test_a_user_object_with_our_name_is_kept_and_warned_about(where):
    pod = sglang_pod()
    name = webhook.PREFLIGHT_CONTAINER if where == "initContainers" else webhook.VOLUME
    pod["spec"][where] = pod["spec"].get(where, []) + [
        {"name": name, "image": "mine"} if where == "initContainers" else {"name": name, "emptyDir": {}}
    ]
    answer = admit(pod)
    assert answer.outcome == "not-injected" and answer.changes is None  # never removed, never reused
    assert name in answer.warnings[0] and "a name the injection uses" in answer.warnings[0]


@pytest.mark.parametrize("name", [webhook.PREFLIGHT_CONTAINER, webhook.INSTALL_CONTAINER])
@pytest.mark.parametrize("injected", [False, True])
def test_a_regular_container_with_our_name_is_left_alone_so_the_api_server_accepts_the_pod(name, injected):
    """Injected, the pod would have a container and an init container of one name: 422 "Duplicate value"."""
    pod = sglang_pod()
    pod["spec"]["containers"].append({"name": name, "image": "mine"})
    if injected:  # re-created from an injected pod, or a reinvocation: the annotation does not make it ours
        pod["metadata"]["annotations"] = {contract.ANNOTATION_POD_INJECTED: "kimi"}
    answer = admit(pod)
    assert answer.outcome == "not-injected" and answer.changes is None
    assert answer.warnings == (
        f"gluon-rollout did not inject: the pod already has a container named {name!r} (a name the injection uses)",
    )


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


@pytest.mark.parametrize(
    "containers,annotations,serving",
    [
        ([PROXY, SGLANG], {}, "sglang"),  # Istio's proxy first (holdApplicationUntilProxyStarts)
        ([TOOLS, SGLANG], {contract.ANNOTATION_POD_SERVING_CONTAINER: "sglang"}, "sglang"),
        ([TOOLS, SGLANG], {contract.FOREIGN_ANNOTATION_DEFAULT_CONTAINER: "sglang"}, "sglang"),
        ([TOOLS, SGLANG], {contract.FOREIGN_ANNOTATION_DEFAULT_CONTAINER: "gone"}, "tools"),  # kubectl's: a hint only
        ([SGLANG, TOOLS], {}, "sglang"),
    ],
)
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


def test_an_annotation_that_is_not_a_string_is_a_warning_not_an_internal_error():
    """Found by the property test below: a review whose annotation value is a list (no API server sends one)."""
    answer = admit(pod_with([SGLANG], {contract.ANNOTATION_POD_SERVING_CONTAINER: []}))
    assert answer.outcome == "not-injected" and "names no container" in answer.warnings[0]
    answer = admit(pod_with([PROXY, SGLANG], {contract.FOREIGN_ANNOTATION_DEFAULT_CONTAINER: ["sglang"]}))
    assert answer.outcome != "error"


def test_shell_mode_leaves_a_sidecar_without_a_command_alone():
    shell = webhook.Injection(agent_image="a", mode="shell")
    pod = pod_with([PROXY, SGLANG])
    spec = apply(pod, admit(pod, shell).changes)["spec"]
    assert spec["containers"][0] == PROXY and spec["containers"][1]["command"][2] == webhook.SHELL_WRAPPER


def test_the_preflight_sees_the_serving_containers_env_and_mounts():
    serving = {
        **SGLANG,
        "env": [
            {"name": "PYTHONPATH", "value": "/models/code"},
            {"name": "HOST_IP", "value": "spoofed"},
            {"name": contract.FLAG_ENV, "value": "1"},
        ],
        "envFrom": [{"configMapRef": {"name": "serving-env"}}],
        "volumeMounts": [{"name": "models", "mountPath": "/models", "mountPropagation": "HostToContainer"}],
    }
    pod = pod_with([serving])
    preflight = apply(pod, admit(pod).changes)["spec"]["initContainers"][1]
    assert preflight["env"][0] == {"name": "PYTHONPATH", "value": "/models/code"}
    assert [e["name"] for e in preflight["env"]] == [
        "PYTHONPATH",
        *PREFLIGHT_OWN_ENV,
    ]
    assert preflight["env"][1]["valueFrom"]["fieldRef"]["fieldPath"] == "status.hostIP"  # ours, not the spoof
    assert preflight["envFrom"] == serving["envFrom"]
    assert preflight["volumeMounts"] == [
        {"name": "models", "mountPath": "/models", "readOnly": True},
        {"name": webhook.VOLUME, "mountPath": webhook.MOUNT},
    ]


# ------------------------------------------------ the admission server's body limit (kopf + aiohttp, no API server)


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
        return {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "response": {"uid": review["request"]["uid"], "allowed": True},
        }

    def too_large() -> float:
        return METRICS.registry.get_sample_value(
            contract.M_ROLLOUT_WEBHOOK_REVIEWS + "_total", {"outcome": webhook.TOO_LARGE}
        )

    async def main():
        server = AdmissionServer(addr="127.0.0.1", port=free_port(), insecure=True)
        serving = server(fn)
        config = await serving.__anext__()
        try:
            async with aiohttp.ClientSession() as session:
                big = spoiled("request.object", {"pad": "x" * (3 * 1024 * 1024)})
                async with session.post(config["url"].rstrip("/") + "/inject", json=big) as answer:
                    assert answer.status == 200 and (await answer.json())["response"]["uid"] == big["request"]["uid"]
                before = too_large()
                huge = spoiled("request.object", {"pad": "x" * REVIEW_LIMIT})
                async with session.post(config["url"].rstrip("/") + "/inject", json=huge) as answer:
                    assert answer.status == 413
                assert too_large() == before + 1
        finally:
            await serving.aclose()

    asyncio.run(asyncio.wait_for(main(), 30))
    assert seen and seen[0] > 3 * 1024 * 1024


def spoiled(path: str, value) -> dict:
    review = copy.deepcopy(REVIEW)
    *parents, last = path.split(".")
    target = review
    for key in parents:
        target = target[key]
    if value is KeyError:
        del target[last]
    else:
        target[last] = value
    return review


@pytest.mark.parametrize(
    "body,why",
    [
        (b"[1, 2]", "the body is a JSON list, not an AdmissionReview object"),
        (b'"x"', "the body is a JSON str"),
        (b"{}", "the body is not an AdmissionReview: apiVersion 'None', kind 'None'"),
        (json.dumps({**REVIEW, "kind": "Pod"}).encode(), "kind 'Pod'"),
        (json.dumps(spoiled("request", "x")).encode(), "the AdmissionReview has no request object"),
        (json.dumps(spoiled("request.uid", KeyError)).encode(), "request.uid is missing or not a string"),
        (json.dumps(spoiled("request.operation", 7)).encode(), "request.operation is missing or not a string"),
        (
            json.dumps(spoiled("request.resource", {"group": ""})).encode(),
            "request.resource is missing or not an object of strings",
        ),
        (json.dumps(spoiled("request.kind", None)).encode(), "request.kind is missing"),
        (json.dumps(spoiled("request.userInfo", KeyError)).encode(), "request.userInfo is missing or not an object"),
        (json.dumps(spoiled("request.object", [1])).encode(), "request.object is not an object"),
        (json.dumps(spoiled("request.object", None)).encode(), "the request carries neither object nor oldObject"),
        (json.dumps(spoiled("request.subResource", 1)).encode(), "request.subResource is not a string"),
        (b'{"apiVersion": ' * 3000, "the body is unreadable: it is"),
        (b"[" * 5000 + b"]" * 5000, "the body is unreadable: it is nested deeper than 64 levels"),
        (b"\xff", "the body is unreadable: it is not JSON"),
    ],
)
def test_a_body_that_is_not_an_admission_review_is_answered_400_with_why(body, why):
    """Before, kopf's KeyError or AttributeError on such a body was a 500 with a traceback in the log."""
    import asyncio

    import aiohttp

    from gluon_operator.admission import AdmissionServer
    from gluon_operator.metrics import METRICS

    called: list[dict] = []

    async def fn(review, **_):
        called.append(review)
        return {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "response": {"uid": review["request"]["uid"], "allowed": True},
        }

    def refused() -> float:
        return METRICS.registry.get_sample_value(
            contract.M_ROLLOUT_WEBHOOK_REVIEWS + "_total", {"outcome": webhook.NOT_A_REVIEW}
        )

    async def main():
        server = AdmissionServer(addr="127.0.0.1", port=free_port(), insecure=True)
        serving = server(fn)
        config = await serving.__anext__()
        try:
            async with aiohttp.ClientSession() as session:
                url = config["url"].rstrip("/") + "/inject"
                before = refused()
                async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as answer:
                    assert answer.status == 400 and why in await answer.text()
                assert refused() == before + 1
                async with session.post(url, json=REVIEW) as answer:  # a review still reaches the handler
                    assert answer.status == 200 and (await answer.json())["response"]["allowed"] is True
        finally:
            await serving.aclose()

    asyncio.run(asyncio.wait_for(main(), 30))
    assert called == [REVIEW]
