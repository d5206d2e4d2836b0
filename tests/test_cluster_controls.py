"""The rollout's controls on the real control plane (localcluster): dry run, skip, cordon, percentages,
approval and batches, each shown by its effect on the Nodes and the GluonRollout's status. The operator
runs as a local process with its own ServiceAccount's token; agent pods are the chart's DaemonSet's, kept
Ready by kwok; node reports are what agents publish (self-test results a SIMULATION). No serving pods:
a node's analysis is reached at once, and Prometheus is a closed port, so every evaluation is
inconclusive and `onNoData: promote` with no deadline promotes it (the analysis path end to end)."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from pathlib import Path

import pytest
from kubernetes import client

from gluon_common import contract
from gluon_localcluster import fleet
from gluon_localcluster.processes import operator as start_operator
from gluon_operator.spec import GROUP, PLURAL, VERSION
from tests.helpers import wait_for

MERGE = "application/merge-patch+json"
PROMOTE_ON_NO_DATA = {
    "prometheusUrl": "http://127.0.0.1:9",
    "intervalSeconds": 1,
    "stepSeconds": 1,
    "windowSeconds": 10,
    "baselineSeconds": 10,
    "minSamples": 5,
    "onNoData": "promote",
    "noDataDeadlineSeconds": 0,
}
HOLD = {"onNoData": "hold"}
INDEX = iter(range(300, 400))  # node IPs of their own (fleet.node_ip)


@pytest.fixture(scope="module")
def operator(installed):
    # This checkout's code: the child's environment drops PYTHONPATH, and the shared venv's editable
    # install may point at another checkout.
    here = Path(__file__).resolve().parent.parent
    checkout = os.pathsep.join(str(here / d) for d in ("common", "agent", "operator", ""))
    process = start_operator(installed, reconcile_seconds=0.5, PYTHONPATH=checkout)
    yield process
    process.stop()
    assert "Traceback" not in process.tail(400), process.tail(80)


@pytest.fixture
def gpu_nodes(control_plane, installed, request):
    """make(count, **labels) -> names: kwok GPU nodes of this test, with agent pods, deleted afterwards."""
    core = client.CoreV1Api(control_plane.admin_client())
    made: list[str] = []
    tag = uuid.uuid4().hex[:6]

    def make(count: int, labels_of=lambda i: {}) -> list[str]:
        names = [f"ctl-{tag}-{len(made) + i}" for i in range(count)]
        for i, name in enumerate(names):
            node = fleet.gpu_node(name, next(INDEX))
            node["metadata"]["labels"].update({"ctl-test": tag, **labels_of(i)})
            core.create_node(node)
            made.append(name)
        for name in names:
            installed.agent_pod(name)
        return names

    make.tag = tag  # type: ignore[attr-defined]
    yield make
    for name in made:
        core.delete_node(name)


def create_rollout(control_plane, namespace: str, tag: str, strategy: dict, analysis: dict, **spec) -> None:
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "GluonRollout",
        "metadata": {"name": "ctl", "namespace": namespace},
        "spec": {
            "podSelector": {"matchLabels": {"app": "sglang", "serving": f"none-{tag}"}},
            "nodeSelector": {"matchLabels": {"ctl-test": tag}},
            "strategy": {"restartDelaySeconds": 0, **strategy},
            "analysis": analysis,
            **spec,
        },
    }
    client.CustomObjectsApi(control_plane.admin_client()).create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, body
    )


def status(control_plane, namespace: str) -> dict:
    obj = client.CustomObjectsApi(control_plane.admin_client()).get_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "ctl"
    )
    return obj.get("status") or {}


def annotate_rollout(control_plane, namespace: str, annotations: dict) -> None:
    client.CustomObjectsApi(control_plane.admin_client()).patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "ctl", {"metadata": {"annotations": annotations}}
    )


def node_meta(control_plane, name: str) -> dict:
    node = client.CoreV1Api(control_plane.admin_client()).read_node(name, _preload_content=False)
    return json.loads(node.data)["metadata"]


def states(control_plane, namespace: str) -> dict[str, str]:
    return {n: s["state"] for n, s in (status(control_plane, namespace).get("nodes") or {}).items()}


def record(control_plane, name: str) -> dict:
    return json.loads(node_meta(control_plane, name)["annotations"][contract.ANNOTATION_NODE_RECORD])


def test_dry_run_reports_and_changes_no_node(control_plane, namespace, operator, gpu_nodes):
    nodes = gpu_nodes(3)
    create_rollout(control_plane, namespace, gpu_nodes.tag, {"canaryNodes": 2}, HOLD, dryRun=True)

    def planned() -> list:  # once the agent pods are Ready (kwok), the nodes are eligible and the canaries planned
        current = status(control_plane, namespace)
        return (
            [(e["node"], e["action"]) for e in (current.get("dryRun") or {}).get("plan", [])]
            if current.get("phase") == "DryRun"
            else []
        )

    wait_for(
        lambda: planned() == [(nodes[0], "enable"), (nodes[1], "enable")],
        timeout=60,
        what="a dry-run plan enabling two canaries",
    )
    for name in nodes:
        meta = node_meta(control_plane, name)
        assert contract.LABEL_ENABLED not in meta["labels"] and contract.ANNOTATION_NODE_RECORD not in meta.get(
            "annotations", {}
        )
    events = client.CoreV1Api(control_plane.admin_client()).list_namespaced_event(namespace).items
    assert any(e.reason == "DryRun" and f"{nodes[0]}: enable" in e.message for e in events)


def test_skip_and_cordon_are_left_alone_and_do_not_block(control_plane, namespace, operator, gpu_nodes):
    skipped, cordoned, free = gpu_nodes(3, lambda i: {contract.LABEL_SKIP: "true"} if i == 0 else {})
    core = client.CoreV1Api(control_plane.admin_client())
    core.patch_node(cordoned, {"spec": {"unschedulable": True}})
    create_rollout(control_plane, namespace, gpu_nodes.tag, {"canaryNodes": 1}, HOLD)
    wait_for(
        lambda: states(control_plane, namespace).get(free) == "Analyzing", timeout=60, what="the free node enabled"
    )
    current = status(control_plane, namespace)["nodes"]
    assert current[skipped]["state"] == "Ineligible" and "skip" in current[skipped]["reason"]
    assert current[cordoned]["state"] == "Ineligible" and "cordoned" in current[cordoned]["reason"]
    assert node_meta(control_plane, skipped)["labels"][contract.LABEL_ENABLED] == "false"
    assert node_meta(control_plane, free)["labels"][contract.LABEL_ENABLED] == "true"
    assert record(control_plane, free)["state"] == "Analyzing"  # the durable record lives on the Node


def test_percentage_canaries_then_approval(control_plane, namespace, operator, gpu_nodes):
    nodes = gpu_nodes(4)
    create_rollout(
        control_plane,
        namespace,
        gpu_nodes.tag,
        {"canaryNodes": "50%", "maxParallel": "100%", "approval": "AfterCanary"},
        PROMOTE_ON_NO_DATA,
    )
    wait_for(
        lambda: (status(control_plane, namespace).get("approval") or {}).get("waitingFor") == "canary",
        timeout=90,
        what="the canary gate",
    )
    assert sorted(n for n, s in states(control_plane, namespace).items() if s == "Promoted") == nodes[:2]  # 50% of 4
    assert all(node_meta(control_plane, n)["labels"][contract.LABEL_ENABLED] == "false" for n in nodes[2:])
    annotate_rollout(control_plane, namespace, {contract.ANNOTATION_ROLLOUT_APPROVE: "canary"})
    wait_for(
        lambda: all(s == "Promoted" for s in states(control_plane, namespace).values()),
        timeout=90,
        what="the rest promoted",
    )
    assert [g["gate"] for g in status(control_plane, namespace)["approval"]["granted"]] == ["canary"]

    # An abort revokes the grant and the operator removes the spent approve annotation: resumed, the rollout
    # starts over from its canaries and waits at the gate for a new promote.
    annotate_rollout(control_plane, namespace, {contract.ANNOTATION_ROLLOUT_ABORT: "test"})
    wait_for(
        lambda: (
            status(control_plane, namespace).get("phase") == "Aborted"
            and contract.ANNOTATION_ROLLOUT_APPROVE not in rollout_annotations(control_plane, namespace)
        ),
        timeout=60,
        what="the abort, its grant revoked",
    )
    assert status(control_plane, namespace)["approval"].get("granted") in (None, [])
    annotate_rollout(control_plane, namespace, {contract.ANNOTATION_ROLLOUT_ABORT: None})
    wait_for(
        lambda: (status(control_plane, namespace).get("approval") or {}).get("waitingFor") == "canary",
        timeout=90,
        what="the canary gate again after the abort is lifted",
    )
    time.sleep(3)  # six reconciles: still waiting, nothing past the canaries enabled
    assert status(control_plane, namespace)["phase"] == "AwaitingApproval"
    assert all(node_meta(control_plane, n)["labels"][contract.LABEL_ENABLED] == "false" for n in nodes[2:])


def rollout_annotations(control_plane, namespace: str) -> dict:
    obj = client.CustomObjectsApi(control_plane.admin_client()).get_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "ctl"
    )
    return obj["metadata"].get("annotations") or {}


def test_batches_roll_out_in_order(control_plane, namespace, operator, gpu_nodes):
    zone = "topology.kubernetes.io/zone"
    nodes = gpu_nodes(4, lambda i: {zone: "b" if i < 2 else "a"})
    create_rollout(
        control_plane,
        namespace,
        gpu_nodes.tag,
        {"canaryNodes": 1, "maxParallel": 2, "batches": {"nodeLabel": zone, "order": ["a", "b"]}},
        PROMOTE_ON_NO_DATA,
    )
    wait_for(
        lambda: (
            len(states(control_plane, namespace)) == 4
            and all(s == "Promoted" for s in states(control_plane, namespace).values())
        ),
        timeout=120,
        what="every batch promoted",
    )
    promoted_a = max(record(control_plane, n)["since"] for n in nodes[2:])
    assert all(
        record(control_plane, n)["changedAt"] >= promoted_a for n in nodes[:2]
    )  # b enabled only after a was promoted


@pytest.fixture
def hanging_prometheus():
    """A port that accepts connections and never answers: each query waits out the client's timeouts."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join(5)
    for conn in held:
        conn.close()
    server.close()


def test_a_failing_node_is_disabled_at_once_despite_a_poisoned_node_and_a_hanging_prometheus(
    control_plane, namespace, operator, gpu_nodes, hanging_prometheus
):
    """issue 21: the disable never waits on the analysis, and one malformed report stops nothing else."""
    flagged, poisoned, other = gpu_nodes(3)
    analysis = dict(PROMOTE_ON_NO_DATA, prometheusUrl=hanging_prometheus, onNoData="hold")
    create_rollout(control_plane, namespace, gpu_nodes.tag, {"canaryNodes": 1}, analysis)
    wait_for(
        lambda: states(control_plane, namespace).get(flagged) == "Analyzing", timeout=60, what="the canary analyzing"
    )
    core = client.CoreV1Api(control_plane.admin_client())
    core.patch_node(
        poisoned, {"metadata": {"annotations": {contract.ANNOTATION_REPORT: json.dumps({"selftest": {"gpus": ["x"]}})}}}
    )
    time.sleep(1.0)  # an analysis is hanging on Prometheus by now
    started = time.monotonic()
    core.patch_node(flagged, {"metadata": {"labels": {contract.LABEL_SELFTEST: "fail"}}})
    wait_for(
        lambda: node_meta(control_plane, flagged)["labels"][contract.LABEL_ENABLED] == "false",
        timeout=30,
        what="the disable",
    )
    took = time.monotonic() - started
    assert took < 5.0, (
        f"the disable took {took:.1f} s: it waited on the analysis"
    )  # the hanging query takes 10 s or more
    # The node (its labels and record) is written first, then the status that summarizes it, in the same reconcile.
    current = wait_for(
        lambda: (lambda nodes: nodes if nodes[flagged]["state"] == "Disabled" else None)(
            status(control_plane, namespace)["nodes"]
        ),
        timeout=10,
        what="the status to follow the node",
    )
    assert "self-test not passed" in current[flagged]["reason"]
    assert current[poisoned]["state"] == "Ineligible" and "field selftest.gpus.0" in current[poisoned]["reason"]
    assert current[other]["state"] in ("Eligible", "Enabling", "Analyzing")


def test_the_serving_config_reaches_the_agent_and_a_node_proven_for_another_is_kept_out(
    control_plane, namespace, installed, operator, gpu_nodes, tmp_path
):
    """The rollout's serving config (here from spec.serving: no serving pods) is written on its node; the
    node's report proves another config, so it stays out; its real agent reads the annotation, self-tests
    that config (SIMULATION) and publishes the digest; then the node is enabled."""
    from gluon_common.sglang_routes import ServingConfig
    from gluon_localcluster.fakes.simulated import simulated_node
    from tests.helpers import running_agent

    (name,) = gpu_nodes(1)
    wanted = ServingConfig(verify_q_lens=(4,), page_size=64)
    create_rollout(
        control_plane, namespace, gpu_nodes.tag, {"canaryNodes": 1}, HOLD, serving={"verifyQLens": [4], "pageSize": 64}
    )
    wait_for(
        lambda: (
            node_meta(control_plane, name).get("annotations", {}).get(contract.ANNOTATION_SERVING_CONFIG) is not None
        ),
        timeout=60,
        what="the serving config annotation on the node",
    )
    assert (
        json.loads(node_meta(control_plane, name)["annotations"][contract.ANNOTATION_SERVING_CONFIG])
        == wanted.as_dict()
    )
    wait_for(
        lambda: (
            "re-test requested"
            in ((status(control_plane, namespace).get("nodes") or {}).get(name) or {}).get("reason", "")
        ),
        timeout=60,
        what="the node kept out for its proof of another serving config",
    )
    assert (
        states(control_plane, namespace)[name] == "Ineligible"
        and status(control_plane, namespace)["serving"]["digest"] == wanted.digest
    )
    assert node_meta(control_plane, name)["labels"].get(contract.LABEL_ENABLED) != "true"
    sim = tmp_path / "sim.json"
    sim.write_text(json.dumps(simulated_node()))
    with running_agent(installed.agent_kubeconfig(name), name, sim):

        def proved() -> str | None:
            report = json.loads(node_meta(control_plane, name)["annotations"][contract.ANNOTATION_REPORT])
            return ((report.get("selftest") or {}).get("serving") or {}).get("digest")

        wait_for(
            lambda: proved() == wanted.digest, timeout=60, what="the agent's proof of the rollout's serving config"
        )
        wait_for(
            lambda: states(control_plane, namespace).get(name) in ("Enabling", "Analyzing"),
            timeout=60,
            what="the node enabled",
        )
