"""How the flag reaches a rollout's pods and whether it did (operator/gluon_operator/delivery.py), and what the
plan does with it: the mode auto chooses from the API server and the kubelets, a pod's state from its
node's observation, and a fleet whose processes run what was meant, or not (plan.py, on plain objects)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from gluon_common import contract
from gluon_common.delivery import UNSET, DeliveryReport, ObservedContainer
from gluon_operator import delivery, gating, world
from gluon_operator import plan as planner
from gluon_operator.delivery import FILEKEYREF, SHELL, Mode, resolve_mode
from gluon_operator.world_types import ApiFacts, World
from tests.objects import observed, serving_container
from tests.test_plan import Fleet, run_until

ACCEPTS = ApiFacts("v1.36.3", True, "a dry-run pod template with fileKeyRef was accepted")
REFUSES = ApiFacts("v1.36.3", False, "refused: EnvFiles off")
NEW = {"a": "v1.36.3", "b": "v1.35.0"}


@pytest.mark.parametrize(
    "version,minor,honours",
    [
        ("v1.36.3", (1, 36), True),
        ("v1.35.0", (1, 35), True),
        ("v1.34.2", (1, 34), False),  # EnvFiles alpha, off by default
        ("v1.33.5-eks-1a2b3c", (1, 33), False),
        ("1.37.0+k3s1", (1, 37), True),
        ("kwok-v0.8.0", None, False),
        ("", None, False),
        (None, None, False),
    ],
)
def test_which_kubelets_read_file_key_ref(version, minor, honours):
    assert delivery.minor(version) == minor and delivery.kubelet_honours(version) is honours


@pytest.mark.parametrize(
    "configured,api,kubelets,ignored,mode,words",
    [
        ("auto", ACCEPTS, NEW, {}, FILEKEYREF, "auto: fileKeyRef, as the API server v1.36.3 accepts it and all 2"),
        ("auto", REFUSES, NEW, {}, SHELL, "auto: shell, as the API server does not accept fileKeyRef (refused"),
        ("auto", ApiFacts(), NEW, {}, SHELL, "(not checked yet)"),
        ("auto", ACCEPTS, {**NEW, "c": "v1.33.5"}, {}, SHELL, "1 of the rollout's nodes run a kubelet older than 1.35"),
        ("auto", ACCEPTS, NEW, {"b": "v1.35.0"}, SHELL, "1 node(s) ignored fileKeyRef though their kubelet is 1.35"),
        # a kubelet upgraded since it was seen ignoring fileKeyRef is given its chance again
        ("auto", ACCEPTS, NEW, {"b": "v1.34.9"}, FILEKEYREF, "auto: fileKeyRef"),
        ("auto", ACCEPTS, NEW, {"gone": "v1.36.3"}, FILEKEYREF, "auto: fileKeyRef"),
        ("shell", ACCEPTS, NEW, {}, SHELL, "injectionMode shell"),
        ("fileKeyRef", ACCEPTS, {**NEW, "c": "v1.33.5"}, {}, FILEKEYREF, "injectionMode fileKeyRef"),
    ],
)
def test_the_mode_a_rollout_resolves(configured, api, kubelets, ignored, mode, words):
    resolved = resolve_mode(configured, api, kubelets, ignored)
    assert resolved.mode == mode and words in resolved.reason and resolved.undeliverable is None


def test_what_cannot_deliver_is_said_and_which_nodes_refuse():
    forced = resolve_mode("fileKeyRef", ACCEPTS, {**NEW, "c": "v1.33.5"}, {"b": "v1.35.0"})
    assert forced.refuses("a", "v1.36.3") is None
    assert "ignored fileKeyRef (EnvFiles off)" in forced.refuses("b", "v1.35.0")
    assert "older than 1.35 and ignores fileKeyRef" in forced.refuses("c", "v1.33.5")
    assert resolve_mode("shell", ACCEPTS, NEW, {}).refuses("c", "v1.20.0") is None  # every kubelet runs a shell
    refused = resolve_mode("fileKeyRef", REFUSES, NEW, {})
    assert "the API server does not accept fileKeyRef" in refused.undeliverable
    no_command = resolve_mode("auto", REFUSES, NEW, {}, ["sglang-0"])
    assert no_command.mode == SHELL and "sglang-0 has none" in no_command.undeliverable
    assert resolve_mode("auto", ACCEPTS, NEW, {}, ["sglang-0"]).undeliverable is None  # fileKeyRef needs none


# ---------------------------------------------------------------- one pod


UID = "11111111-2222-3333-4444-555555555555"


def pod(flag: str | None = "1", mode: str = FILEKEYREF, **meta) -> dict:
    status = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    if flag is not None:
        message = json.dumps({"flag": flag, "reason": "r", "agent": {"current": True, "enabled": flag == "1"}})
        status["initContainerStatuses"] = [{"name": "gluon-preflight", "state": {"terminated": {"message": message}}}]
    return {
        "metadata": {
            "name": "p",
            "namespace": "serving",
            "uid": UID,
            "creationTimestamp": "2026-12-04T00:00:00Z",
            **meta,
        },
        "spec": {"nodeName": "a", "containers": [serving_container(mode)]},
        "status": status,
    }


def seen(runs: str, delivered: str, intended: str | None = "1") -> DeliveryReport:
    c = ObservedContainer(
        pod_uid=UID, container="sglang", container_id="abc", intended=intended, delivered=delivered, runs=[runs]
    )
    return DeliveryReport(available=True, containers=[c])


@pytest.mark.parametrize(
    "flag,report,state,runs,ignores",
    [
        ("1", seen("1", "1"), "verified", "1", False),
        ("0", seen("0", "0", "0"), "verified", "0", False),
        ("0", seen("1", "", "0"), "mismatch", "1", True),  # a kubelet that ignores fileKeyRef: '' is on
        ("0", seen("1", UNSET, "0"), "mismatch", "1", True),
        ("1", seen("0", "0"), "mismatch", "0", False),  # its own command set 0: slower, judged by what runs
        ("1", DeliveryReport(available=True), "unobserved", None, False),  # not started yet
        ("1", DeliveryReport(available=False, problem="no CAP_SYS_PTRACE"), "unobserved", None, False),
        ("1", None, "unobserved", None, False),
    ],
)
def test_a_pods_delivery_is_what_its_processes_run(flag, report, state, runs, ignores):
    view = world.pod_view(pod(flag))
    assert view.wired == ("sglang",) and view.delivery_mode == FILEKEYREF and view.uid == UID
    found = delivery.pod_delivery(view, report)
    assert (found.state, found.flag, found.ignores_file_key_ref) == (state, runs, ignores)
    assert found.unsafe is (state == "mismatch" and runs == "1")


def test_a_shell_wired_pod_is_read_as_such_and_its_own_override_is_no_evidence_against_the_kubelet():
    view = world.pod_view(pod("0", SHELL))
    assert view.delivery_mode == SHELL and view.has_command
    found = delivery.pod_delivery(view, seen("1", "1", "0"))
    assert found.unsafe and not found.ignores_file_key_ref
    assert "runs 1 (SGLANG_AITER_MLA_GLUON='1') where its preflight chose 0, delivered by shell" in found.detail


def test_a_held_pod_is_evidence_and_restarts_only_under_another_mode():
    held = pod(None)
    verdict = {"flag": "0", "held": True, "final": True, "agent": {"asked": False}, "reason": "kubelet ignores it"}
    held["status"] = {
        "phase": "Pending",
        "initContainerStatuses": [
            {
                "name": "gluon-preflight",
                "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                "lastState": {"terminated": {"exitCode": 3, "message": json.dumps(verdict)}},
            }
        ],
    }
    view = world.pod_view(held)
    assert view.held == "kubelet ignores it"
    node = delivery.node_delivery([view], DeliveryReport(available=True))
    assert node.ignores_file_key_ref and node.pods["p"].state == "held" and not node.unsafe()
    assert delivery.to_restart([view], node, Mode(FILEKEYREF, "fileKeyRef", "")) == []  # forced: it stays held
    assert delivery.to_restart([view], node, Mode(SHELL, "auto", "")) == ["p"]


def test_an_uninjected_pod_is_read_from_its_template():
    plain = pod(None)
    plain["spec"]["containers"] = [{"name": "sglang", "image": "x", "env": [{"name": contract.FLAG_ENV, "value": "0"}]}]
    found = delivery.pod_delivery(world.pod_view(plain), DeliveryReport(available=True))
    assert (found.state, found.flag) == ("template", "0")


# ---------------------------------------------------------------- the plan over a small fleet


class Skewed(Fleet):
    """A Fleet whose nodes report kubelet versions, on an API server with known facts, whose agents see the
    processes run what the preflight chose except where `runs` says otherwise (pod name -> raw value)."""

    def __init__(self, *args, api: ApiFacts = ACCEPTS, configured: str = "auto", kubelets=None, **kw) -> None:
        super().__init__(*args, **kw)
        self.api, self.configured, self.runs = api, configured, {}
        for name, node in self.nodes.items():
            node.setdefault("status", {})["nodeInfo"] = {"kubeletVersion": (kubelets or {}).get(name, "v1.36.3")}

    def world(self) -> World:
        for name, node in self.nodes.items():
            node["metadata"]["annotations"][contract.ANNOTATION_DELIVERY] = observed(
                name, list(self.pods.values()), self.runs
            )
        seen = world.world_from_objects(
            list(self.nodes.values()),
            self.agents + list(self.pods.values()),
            [planner.claim_of(planner.rollout_view(self.rollout))],
        )
        return World(seen.nodes, seen.agents, seen.pods, seen.rollouts, self.api, self.configured)


def test_auto_takes_file_key_ref_on_new_kubelets_and_shell_beside_an_old_one_and_says_why():
    fleet = Skewed(2)
    fleet.step()
    status = fleet.rollout["status"]["delivery"]
    assert status["mode"] == FILEKEYREF and status["configured"] == "auto" and status["apiServer"]["fileKeyRef"] is True
    skewed = Skewed(2, kubelets={"n1": "v1.33.5"})
    skewed.step()
    status = skewed.rollout["status"]["delivery"]
    assert status["mode"] == SHELL and "n1 v1.33.5" in status["reason"]
    condition = next(c for c in skewed.rollout["status"]["conditions"] if c["type"] == "FlagDelivery")
    assert condition["status"] == "True" and condition["reason"] == "Shell"


def test_pods_are_labelled_with_what_their_processes_run_never_what_was_meant():
    fleet = Skewed(2, strategy={"canaryNodes": 1, "maxParallel": 1})
    run_until(fleet, lambda: fleet.states().get("n0") == gating.ANALYZING)
    on = [p for p in fleet.pods.values() if p["spec"]["nodeName"] == "n0"]
    assert on and all(p["metadata"]["labels"][contract.LABEL_POD_FLAG] == "1" for p in on)
    assert fleet.rollout["status"]["delivery"]["pods"]["verified"] == len(on)


def test_an_unsafe_process_on_a_node_that_is_off_makes_it_ineligible_labelled_as_it_runs():
    """A pod whose own command sets the flag (or a kubelet that hands it ''): its node is not enabled, nor
    counted as a control at flag 0, and a Warning, the condition and the status name it."""
    fleet = Skewed(2, strategy={"canaryNodes": 1, "maxParallel": 1, "holdoutNodes": 0}, pods_per_node=0)
    fleet.add_pod("n1", "0", fleet.now - 50)
    hostile = next(iter(fleet.pods))
    fleet.runs[hostile] = "1"
    first = fleet.step()
    assert (
        fleet.states()["n1"] == gating.INELIGIBLE
        and "flag delivery mismatch" in fleet.rollout["status"]["nodes"]["n1"]["reason"]
    )
    assert fleet.pods[hostile]["metadata"]["labels"][contract.LABEL_POD_FLAG] == "1"
    condition = next(c for c in fleet.rollout["status"]["conditions"] if c["type"] == "FlagDeliveryMismatch")
    assert condition["status"] == "True" and hostile in condition["message"]
    assert any(e.reason == "FlagDeliveryMismatch" and hostile in e.message for e in first.events)
    assert not [r for r in first.restarts if r.why == "delivery"]  # its own doing: a restart brings it back the same
    again = fleet.step()
    assert not [e for e in again.events if e.reason == "FlagDeliveryMismatch"]  # said once


def test_a_mismatch_on_an_enabled_node_rolls_it_back_for_its_fingerprint():
    fleet = Skewed(2, strategy={"canaryNodes": 1, "maxParallel": 1})
    run_until(fleet, lambda: fleet.states().get("n0") == gating.ANALYZING)
    victim = next(n for n, p in fleet.pods.items() if p["spec"]["nodeName"] == "n0")
    fleet.runs[victim] = "0"
    fleet.step()
    assert fleet.states()["n0"] == gating.ROLLED_BACK
    record = json.loads(fleet.nodes["n0"]["metadata"]["annotations"][contract.ANNOTATION_ROLLBACK])
    assert (
        record["reason"].startswith(f"flag delivery mismatch: {victim}: container sglang")
        and record["numbers"]["mismatch"]
    )


def test_a_kubelet_that_holds_pods_turns_auto_to_shell_and_they_are_restarted_there():
    fleet = Skewed(2, strategy={"canaryNodes": 1, "maxParallel": 1}, pods_per_node=0)
    fleet.step()
    assert fleet.rollout["status"]["delivery"]["mode"] == FILEKEYREF
    fleet.add_pod("n1", "0", fleet.now - 5)
    held = next(iter(fleet.pods))
    verdict = {"flag": "0", "held": True, "final": True, "agent": {"asked": False}, "reason": "kubelet ignores it"}
    fleet.pods[held]["status"] = {
        "phase": "Pending",
        "initContainerStatuses": [
            {"name": "gluon-preflight", "lastState": {"terminated": {"exitCode": 3, "message": json.dumps(verdict)}}}
        ],
    }
    p = fleet.step()
    status = fleet.rollout["status"]["delivery"]
    assert status["mode"] == SHELL and status["ignoredBy"] == {"n1": "v1.36.3"} and status["pods"]["held"] == 1
    assert [(r.node, r.pods, r.why) for r in p.restarts if r.why == "delivery"] == [("n1", (held,), "delivery")]
    assert any(e.reason == "FlagDelivery" and "turns shell" in e.message for e in p.events)
    fleet.step()
    assert fleet.rollout["status"]["delivery"]["ignoredBy"] == {"n1": "v1.36.3"}  # remembered without the pod
    fleet.nodes["n1"]["status"]["nodeInfo"]["kubeletVersion"] = "v1.36.4"  # upgraded: its chance again
    fleet.step()
    assert fleet.rollout["status"]["delivery"]["mode"] == FILEKEYREF


def test_nodes_whose_agent_cannot_observe_are_not_enabled_but_an_enabled_one_is_kept():
    fleet = Skewed(2, strategy={"canaryNodes": 1, "maxParallel": 1})
    run_until(fleet, lambda: fleet.states().get("n0") == gating.ANALYZING)

    def blind(self) -> World:
        seen = Skewed.world(self)
        unavailable = observed("", [], available=False)
        nodes = {
            name: replace(view, annotations={**view.annotations, contract.ANNOTATION_DELIVERY: unavailable})
            for name, view in seen.nodes.items()
        }
        return World(nodes, seen.agents, seen.pods, seen.rollouts, seen.api, seen.injection_mode)

    fleet.world = blind.__get__(fleet)
    fleet.step()
    assert fleet.states()["n0"] == gating.ANALYZING  # no restart of a fleet because an observer hiccupped
    assert (
        fleet.states()["n1"] == gating.INELIGIBLE
        and "cannot observe" in fleet.rollout["status"]["nodes"]["n1"]["reason"]
    )
