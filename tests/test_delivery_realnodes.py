"""Flag delivery on real kubelets, the versions users run side by side: two real nodes of the pinned
kubelet (v1.36.3, Debian containerd and runc) beside one control plane, one with its EnvFiles feature gate at
its default (on) and one with it off, which is how a kubelet older than 1.35 treats `fileKeyRef` (it ignores
the field: k8s pkg/kubelet/kubelet_pods.go). The chart's agent DaemonSet runs on both, with its observer
container reading the serving processes' own environment; the serving pods run the SIMULATION serving image,
whose process prints the SGLANG_AITER_MLA_GLUON it got.

- What each kubelet hands the process, for pods made by hand (the table in docs/using/flag-delivery.md).
- `auto` across both nodes: no serving process on a node that was not enabled ever runs flag 1 (the EnvFiles-off
  node's first pod is held at its preflight, the rollout turns to shell), and the enabled node's runs 1.
- Forced `fileKeyRef`: the EnvFiles-off node is Ineligible and its pods held, never started on an empty value.
- Hostile pods: a command that sets the flag itself, envFrom, two serving containers, a container its kubelet
  restarts, a process that rewrites its own environment, a secret beside the flag.
"""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any

import pytest
from kubernetes import client

from gluon_common import contract
from gluon_localcluster import ControlPlane, fleet
from gluon_localcluster.images import (
    AGENT_IMAGE,
    AGENT_SIMULATION_ARGS,
    AGENT_SIMULATION_IMAGE,
    BASE_IMAGE,
    SERVING_IMAGE,
    agent_image,
    agent_simulation_image,
    base_image,
    serving_image,
)
from gluon_localcluster.install import image_values, install
from gluon_localcluster.processes import operator as start_operator
from gluon_localcluster.realnode import REAL_NODE_TAINT, RealNode
from gluon_operator import webhook
from gluon_operator.spec import GROUP, PLURAL, VERSION
from tests.clusterkit import finish
from tests.helpers import free_port, wait_for

ON, OFF = "kubelet-on", "kubelet-off"
LABELS = {"gluon-test/delivery": "yes", "feature.node.kubernetes.io/amd-gpu": "true"}
TOLERATE = {"key": REAL_NODE_TAINT, "operator": "Exists", "effect": "NoSchedule"}
SECRET = "s3cr3t-beside-the-flag"
AGENT = {
    "image": {**image_values(AGENT_SIMULATION_IMAGE), "pullPolicy": "Never"},
    "extraArgs": list(AGENT_SIMULATION_ARGS),
    "tolerations": [{"key": "amd.com/gpu", "operator": "Exists", "effect": "NoSchedule"}, TOLERATE],
    "observer": {"interval": 1},
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with ControlPlane(tmp_path_factory.mktemp("delivery-cp"), kwok=False) as cp:
        images = [base_image(), serving_image(), agent_image(), agent_simulation_image()]
        with (
            RealNode(cp, ON, images=images, labels=LABELS, gpus=2) as on,
            RealNode(cp, OFF, images=images, labels=LABELS, gpus=2, feature_gates={"EnvFiles": False}) as off,
        ):
            installed = install(cp, values={"agent": AGENT})
            yield cp, installed, {ON: on, OFF: off}


@pytest.fixture
def core(cluster):
    return client.CoreV1Api(cluster[0].admin_client())


def namespace_of(core, name: str) -> str:
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    return name


def first_line(core, namespace: str, pod: str, container: str = "sglang", timeout: float = 90) -> str:
    """The serving process's first line: the SGLANG_AITER_MLA_GLUON it got."""
    return wait_for(
        lambda: next(iter(logs(core, namespace, pod, container).splitlines()), None),
        timeout=timeout,
        interval=0.5,
        what=f"{namespace}/{pod} printing its flag",
    )


def logs(core, namespace: str, pod: str, container: str) -> str:
    try:
        return core.read_namespaced_pod_log(pod, namespace, container=container)
    except client.ApiException:
        return ""


# ---------------------------------------------------------------- the table, with no webhook at all


def hand_made_pod(name: str, node: str, delivery: str) -> dict[str, Any]:
    """A pod shaped as the webhook shapes one (an init container writes the flag file's '0'), without it."""
    write = f"printf \"{contract.FLAG_ENV}='0'\\n\" > /gluon/{contract.FLAG_FILE}"
    serving: dict[str, Any] = {
        "name": "sglang",
        "image": SERVING_IMAGE,
        "imagePullPolicy": "Never",
        "command": ["python3", "/opt/simulation/serve.py"],
        "volumeMounts": [{"name": "flag", "mountPath": "/gluon", "readOnly": True}],
    }
    from_file = {"name": contract.FLAG_ENV, **webhook.file_key_ref()}
    from_file["valueFrom"]["fileKeyRef"]["volumeName"] = "flag"
    if delivery == "fileKeyRef":
        serving["env"] = [from_file]
    elif delivery == "fileKeyRef after the template's 0":
        serving["env"] = [{"name": contract.FLAG_ENV, "value": "0"}, from_file]
    else:
        serving["env"] = [{"name": contract.FLAG_ENV, "value": "0"}]
        serving["command"] = ["/bin/sh", "-c", webhook.SHELL_WRAPPER, "sh", *serving["command"]]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeName": node,
            "tolerations": [TOLERATE],
            "terminationGracePeriodSeconds": 1,
            "volumes": [{"name": "flag", "emptyDir": {"medium": "Memory"}}],
            "initContainers": [
                {
                    "name": "write",
                    "image": BASE_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["/bin/sh", "-c", write],
                    "volumeMounts": [{"name": "flag", "mountPath": "/gluon"}],
                }
            ],
            "containers": [serving],
        },
    }


DELIVERIES = ("fileKeyRef", "fileKeyRef after the template's 0", "shell")
# What the docs say (docs/using/flag-delivery.md), and what this test finds.
TABLE = {
    ON: {"fileKeyRef": "0", "fileKeyRef after the template's 0": "0", "shell": "0"},
    OFF: {"fileKeyRef": "", "fileKeyRef after the template's 0": "", "shell": "0"},
}


def test_what_each_kubelet_hands_the_process(cluster, core):
    namespace = namespace_of(core, "by-hand")
    for node in (ON, OFF):
        for i, delivery in enumerate(DELIVERIES):
            core.create_namespaced_pod(namespace, hand_made_pod(f"{node}-{i}", node, delivery))
    seen = {
        node: {d: first_line(core, namespace, f"{node}-{i}").partition("=")[2] for i, d in enumerate(DELIVERIES)}
        for node in (ON, OFF)
    }
    print(json.dumps({"what the serving process saw": seen}, indent=1))
    assert seen == TABLE


# ---------------------------------------------------------------- through the chart, the operator, the agents


def serving_deployment(name: str, node: str, **container: Any) -> dict[str, Any]:
    spec = {
        "nodeSelector": {"kubernetes.io/hostname": node},
        "tolerations": [TOLERATE],
        "terminationGracePeriodSeconds": 1,
        "containers": [
            {
                "name": "sglang",
                "image": SERVING_IMAGE,
                "imagePullPolicy": "Never",
                "command": ["python3", "/opt/simulation/serve.py"],
                "env": [{"name": contract.FLAG_ENV, "value": "0"}, {"name": "TOKEN", "value": SECRET}],
                **container,
            }
        ],
    }
    labels = {**fleet.SERVING_POD_LABELS, "serving": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": spec},
        },
    }


def rollout(custom, namespace: str, paused: bool) -> None:
    """The one rollout over both nodes (each test removes its own: `finish`); wait until the operator has
    reconciled it, so that its webhook knows it before serving pods are made."""
    silent = f"http://127.0.0.1:{free_port()}"  # nothing answers: enabled nodes stay Analyzing (onNoData hold)
    body = fleet.rollout(
        "kimi",
        namespace,
        paused=paused,
        analysis={"prometheusUrl": silent, "warmupSeconds": 0, "onNoData": "hold", "intervalSeconds": 3},
        strategy={"canaryNodes": 1, "maxParallel": 1, "holdoutNodes": 0, "restartDelaySeconds": 1},
    )
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    wait_for(lambda: status(custom, namespace).get("delivery"), timeout=60, what="the rollout reconciled")


def status(custom, namespace: str) -> dict[str, Any]:
    return custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "kimi").get("status") or {}


class Witness:
    """Every serving process that ran: (node, pod, the flag it printed, whether its node was enabled when the
    pod was made), read as the test goes (a pod restarted away is gone from the API afterwards)."""

    def __init__(self, core, namespace: str) -> None:
        self.core, self.namespace = core, namespace
        self.seen: dict[str, tuple[str, str, bool]] = {}
        self.enabled_at: dict[str, float] = {}

    def look(self) -> None:
        for node in (ON, OFF):
            labels = self.core.read_node(node).metadata.labels or {}
            if labels.get(contract.LABEL_ENABLED) == "true":
                self.enabled_at.setdefault(node, time.time())
            else:
                self.enabled_at.pop(node, None)
        for pod in self.core.list_namespaced_pod(self.namespace).items:
            name = pod.metadata.name
            if name in self.seen or pod.status.phase != "Running":
                continue
            line = next(iter(logs(self.core, self.namespace, name, "sglang").splitlines()), None)
            if line is not None:
                made = pod.metadata.creation_timestamp.timestamp()
                enabled = self.enabled_at.get(pod.spec.node_name)
                self.seen[name] = (pod.spec.node_name, line.partition("=")[2], enabled is not None and enabled <= made)

    def unsafe(self) -> list[tuple[str, str, str, bool]]:
        """Processes that ran the accelerated path (SGLang: '1', or empty) on a node that was not enabled."""
        return [(p, n, f, e) for p, (n, f, e) in self.seen.items() if f in ("1", "") and not e]


def watch_until(witness: Witness, done, timeout: float, what: str) -> Any:
    def check() -> Any:
        witness.look()
        return done()

    return wait_for(check, timeout=timeout, interval=0.5, what=what)


def test_auto_across_both_kubelets_never_runs_flag_1_where_not_enabled(cluster, core):
    cp, installed, nodes = cluster
    custom, apps = client.CustomObjectsApi(cp.admin_client()), client.AppsV1Api(cp.admin_client())
    namespace = namespace_of(core, "auto")
    operator = start_operator(installed, agent_image=AGENT_IMAGE, GLUON_NAMESPACE=installed.namespace)
    witness = Witness(core, namespace)
    try:
        rollout(custom, namespace, paused=True)  # first the delivery alone: nothing is enabled
        assert status(custom, namespace)["delivery"]["mode"] == "fileKeyRef"  # both kubelets report v1.36.3
        started = time.time()
        for node in (ON, OFF):
            apps.create_namespaced_deployment(namespace, serving_deployment(f"sglang-{node}", node))
        # the EnvFiles-off node's pod is held at its preflight, the rollout turns to shell, the pod is replaced
        watch_until(
            witness,
            lambda: (
                status(custom, namespace)["delivery"]["mode"] == "shell"
                and sorted(f for n, f, _ in witness.seen.values()) == ["0", "0"]
                and status(custom, namespace)["delivery"]["pods"].get("verified") == 2
            ),
            timeout=120,
            what=f"both pods verified at 0, the rollout at shell (operator:\n{operator.tail()})",
        )
        safe_after = time.time() - started
        delivered = status(custom, namespace)["delivery"]
        assert delivered["ignoredBy"] == {OFF: "v1.36.3"} and "ignored fileKeyRef" in delivered["reason"]
        held = [
            e for e in core.list_namespaced_event(namespace).items if e.reason in ("BackOff", "Failed")
        ]  # the held preflight was retried by its kubelet, never the serving container
        assert all("sglang" not in (e.involved_object.field_path or "") for e in held)
        # now enable: the canary (the first eligible by name, kubelet-off) restarts at 1 through the wrapper;
        # both nodes Eligible first (an agent pod Ready late leaves kubelet-off Ineligible a while, and the
        # canary would be kubelet-on)
        wait_for(
            lambda: (
                {n: s.get("state") for n, s in (status(custom, namespace).get("nodes") or {}).items()}
                == {OFF: "Eligible", ON: "Eligible"}
            ),
            timeout=60,
            interval=0.5,
            what="both nodes Eligible before the rollout starts",
        )
        custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "kimi", {"spec": {"paused": False}})
        watch_until(
            witness,
            lambda: (status(custom, namespace).get("nodes") or {}).get(OFF, {}).get("state") == "Analyzing",
            timeout=150,
            what=f"{OFF} enabled and analyzing (operator:\n{operator.tail()})",
        )
        for _ in range(6):  # a few more looks while it runs
            witness.look()
            time.sleep(0.5)
        final = status(custom, namespace)
        labels = {
            p.spec.node_name: (p.metadata.labels or {}).get(contract.LABEL_POD_FLAG)
            for p in core.list_namespaced_pod(namespace).items
            if not p.metadata.deletion_timestamp
        }
        finish(core, custom, namespace)
    finally:
        operator.stop()
    assert witness.unsafe() == []
    on_enabled = [f for n, f, e in witness.seen.values() if n == OFF and e]
    assert on_enabled and set(on_enabled) == {"1"}  # the enabled node's process sees 1
    assert labels == {ON: "0", OFF: "1"}  # what the processes were seen to run
    assert final["nodes"][ON]["state"] in ("Eligible", "Enabling", "Analyzing")
    mismatch = next(c for c in final["conditions"] if c["type"] == "FlagDeliveryMismatch")
    assert mismatch["status"] == "False"
    print(json.dumps({"auto": {"seconds from the pods' creation to both verified safe": round(safe_after, 1)}}))


def test_forced_file_key_ref_holds_the_pods_of_the_node_that_ignores_it(cluster, core):
    cp, installed, _ = cluster
    custom, apps = client.CustomObjectsApi(cp.admin_client()), client.AppsV1Api(cp.admin_client())
    namespace = namespace_of(core, "forced")
    operator = start_operator(
        installed, agent_image=AGENT_IMAGE, GLUON_NAMESPACE=installed.namespace, GLUON_INJECTION_MODE="fileKeyRef"
    )
    try:
        rollout(custom, namespace, paused=True)
        started = time.time()
        for node in (ON, OFF):
            apps.create_namespaced_deployment(namespace, serving_deployment(f"sglang-{node}", node))

        def held() -> bool:
            nodes = status(custom, namespace).get("nodes") or {}
            return (
                "ignored fileKeyRef" in nodes.get(OFF, {}).get("reason", "")
                and status(custom, namespace)["delivery"]["pods"].get("held") == 1
            )

        wait_for(held, timeout=60, what=f"{OFF} Ineligible with its pod held (operator:\n{operator.tail()})")
        safe_after = time.time() - started
        pods = {p.spec.node_name: p for p in core.list_namespaced_pod(namespace).items}
        off_pod = pods[OFF]
        forced_status = status(custom, namespace)
        finish(core, custom, namespace)
    finally:
        operator.stop()
    assert forced_status["nodes"][OFF]["state"] == "Ineligible"
    assert off_pod.status.phase == "Pending" and not logs(core, namespace, off_pod.metadata.name, "sglang")
    preflight = {s.name: s for s in off_pod.status.init_container_statuses}[webhook.PREFLIGHT_CONTAINER]
    verdict = json.loads((preflight.last_state.terminated or preflight.state.terminated).message)
    assert verdict["held"] is True and "ignores fileKeyRef" in verdict["reason"]
    assert contract.LABEL_POD_FLAG not in (off_pod.metadata.labels or {})  # no samples, no flag: never judged
    assert safe_after < 30
    print(
        json.dumps(
            {"forced fileKeyRef": {"seconds from the pods' creation to the node held safe": round(safe_after, 1)}}
        )
    )


# ---------------------------------------------------------------- hostile pods, on the node that honours fileKeyRef


def observation(core, node: str) -> dict[str, Any]:
    raw = (core.read_node(node).metadata.annotations or {}).get(contract.ANNOTATION_DELIVERY)
    return json.loads(raw) if raw else {}


def observed_for(core, node: str, pod: client.V1Pod) -> list[dict[str, Any]]:
    return [c for c in observation(core, node).get("containers", []) if c["pod_uid"] == pod.metadata.uid]


def test_hostile_serving_pods(cluster, core):
    cp, installed, nodes = cluster
    custom, apps = client.CustomObjectsApi(cp.admin_client()), client.AppsV1Api(cp.admin_client())
    namespace = namespace_of(core, "hostile")
    core.create_namespaced_config_map(
        namespace, {"metadata": {"name": "env"}, "data": {contract.FLAG_ENV: "1", "OTHER": "x"}}
    )
    second = {
        "name": "sglang-2",
        "image": SERVING_IMAGE,
        "imagePullPolicy": "Never",
        "command": ["python3", "/opt/simulation/serve.py"],
    }
    rewrite = (
        "import os, time, sys; print('SGLANG_AITER_MLA_GLUON=' + os.environ.get('SGLANG_AITER_MLA_GLUON', ''),"
        " flush=True); os.environ['SGLANG_AITER_MLA_GLUON'] = '1'; time.sleep(100000)"
    )
    cases = {
        "own-command": {"command": ["/bin/sh", "-c", f"{contract.FLAG_ENV}=1 exec python3 /opt/simulation/serve.py"]},
        "env-from": {"envFrom": [{"configMapRef": {"name": "env"}}]},
        "rewrites-env": {"command": ["python3", "-c", rewrite]},
        "restarted": {"command": ["/bin/sh", "-c", "python3 /opt/simulation/serve.py & sleep 8; exit 1"]},
    }
    operator = start_operator(installed, agent_image=AGENT_IMAGE, GLUON_NAMESPACE=installed.namespace)
    try:
        rollout(custom, namespace, paused=True)
        for name, fields in cases.items():
            apps.create_namespaced_deployment(namespace, serving_deployment(name, ON, **fields))
        two = serving_deployment("two-containers", ON)
        two["spec"]["template"]["spec"]["containers"].append({**second, "env": [{"name": "TOKEN", "value": SECRET}]})
        apps.create_namespaced_deployment(namespace, two)

        def pod(name: str) -> client.V1Pod | None:
            found = [
                p
                for p in core.list_namespaced_pod(namespace, label_selector=f"serving={name}").items
                if not p.metadata.deletion_timestamp
            ]
            return found[0] if found else None

        def settled() -> dict[str, list[dict[str, Any]]] | None:
            seen = {name: observed_for(core, ON, p) if (p := pod(name)) else [] for name in [*cases, "two-containers"]}
            restarted = pod("restarted")
            if not all(seen.values()) or not restarted or not restarted.status.container_statuses:
                return None
            return seen if restarted.status.container_statuses[0].restart_count >= 1 else None

        seen = wait_for(
            settled, timeout=150, interval=1.0, what=f"every hostile pod observed (operator:\n{operator.tail()})"
        )
        wait_for(
            lambda: (status(custom, namespace).get("delivery") or {}).get("mismatchedCount"),
            timeout=30,
            what="the mismatch in the rollout's status",
        )
        final = status(custom, namespace)
        own = pod("own-command")
        agent = installed.agent_pod(ON)
        agent_metrics = urllib.request.urlopen(f"http://{nodes[ON].ip}:{contract.AGENT_PORT}/metrics", timeout=5).read()
        agent_logs = logs(core, installed.namespace, agent["metadata"]["name"], "agent") + logs(
            core, installed.namespace, agent["metadata"]["name"], "observer"
        )
        finish(core, custom, namespace)
    finally:
        operator.stop()
    # a command that sets the flag itself: seen running 1 where 0 was chosen; its node out, its label what runs
    (c,) = seen["own-command"]
    assert (c["intended"], c["delivered"], c["runs"]) == ("0", "1", ["1"])
    assert final["nodes"][ON]["state"] == "Ineligible" and "flag delivery mismatch" in final["nodes"][ON]["reason"]
    assert (own.metadata.labels or {}).get(contract.LABEL_POD_FLAG) == "1"
    assert final["delivery"]["mismatchedCount"] == 1 and own.metadata.name in final["delivery"]["mismatched"][0]
    # envFrom cannot override the injected entry (env wins over envFrom): the preflight's 0 runs
    (c,) = seen["env-from"]
    assert (c["intended"], c["runs"]) == ("0", ["0"])
    # two serving containers of the image: both wired, both seen
    assert sorted(c["container"] for c in seen["two-containers"]) == ["sglang", "sglang-2"]
    assert all(c["runs"] == ["0"] for c in seen["two-containers"])
    # restarted by its kubelet: a new container, the same flag file, observed again
    (c,) = seen["restarted"]
    assert c["runs"] == ["0"] and c["processes"] >= 2  # the shell and its python: every process counts
    # a process that rewrites its own environment after start: /proc shows what it was started with (documented)
    (c,) = seen["rewrites-env"]
    assert c["delivered"] == "0"
    # the secret beside the flag is nowhere the agent writes
    everything = json.dumps(observation(core, ON)) + agent_metrics.decode() + agent_logs + json.dumps(final)
    assert SECRET not in everything
