"""Proofs in the serving image (operator/gluon_operator/proving.py): one pod's outcome in every way a pod ends,
the waves of a fleet, and the pod as created and read back."""

from __future__ import annotations

import json

import pytest

from gluon_common import contract
from gluon_common.report import ImageProof, NodeProofs
from gluon_operator import proving
from gluon_operator.proving import Demand, Limits, PodSettings, ProvingPod, Stack

DIGEST = "sha256:" + "a" * 64
NEW = "sha256:" + "b" * 64
STACK = Stack(DIGEST, "registry.example/sglang@" + DIGEST, "cfg1", '{"pageSize": 1}')
NEW_STACK = Stack(NEW, "registry.example/sglang@" + NEW, "cfg1", '{"pageSize": 1}')
NOW = 1_000_000.0
LIMITS = Limits(max_parallel=3, schedule_seconds=60, start_seconds=120, run_seconds=900, retry_seconds=300)


def message(result: str = "pass", capable: bool = True, **selftest: object) -> str:
    gpus = [{"index": i, "result": {"accelerated": result, "fallback": "pass"}} for i in range(2)]
    return json.dumps(
        {
            "probe": {"capable": capable, "missing_for_capable": [] if capable else ["no aiter"]},
            "selftest": {"result": result, "fingerprint": "fp1", "seconds": 41.5, "gpus": gpus, **selftest},
        }
    )


def pod(node: str = "n1", age: float = 10, **kw: object) -> ProvingPod:
    fields: dict = {"name": f"p-{node}", "node": node, "digest": DIGEST, "serving": "cfg1", "created": NOW - age}
    return ProvingPod(**(fields | kw))


# ---------------------------------------------------------------- one pod's outcome


def test_a_running_pod_within_its_limits_has_no_outcome_yet() -> None:
    assert proving.outcome(pod(phase="Running"), NOW, LIMITS) is None


@pytest.mark.parametrize("result", ["pass", "fail", "error"])
def test_a_finished_pod_proves_what_its_message_says(result: str) -> None:
    proof = proving.outcome(pod(terminated=(0, "Completed", message(result)), image="r@" + DIGEST), NOW, LIMITS)
    assert proof is not None
    assert (proof.result, proof.digest, proof.serving, proof.fingerprint) == (result, DIGEST, "cfg1", "fp1")
    assert proof.image == "r@" + DIGEST and proof.at == NOW and proof.seconds == 41.5
    if result == "pass":
        assert proof.reason == "both paths pass on 2 GPU(s)"
    else:
        assert proof.reason.startswith(f"GPU 0 accelerated {result}")


def test_a_passing_kernel_in_an_image_sglang_cannot_take_the_path_in_is_a_failure() -> None:
    proof = proving.outcome(pod(terminated=(0, "Completed", message("pass", capable=False))), NOW, LIMITS)
    assert proof is not None and proof.result == "fail" and proof.reason == "not capable: no aiter"


def test_the_self_tests_own_problems_are_its_reason() -> None:
    text = message("error", problems=["no GPU visible: nothing to test"], gpus=[])
    proof = proving.outcome(pod(terminated=(0, "Completed", text)), NOW, LIMITS)
    assert proof is not None and (proof.result, proof.reason) == ("error", "no GPU visible: nothing to test")


def test_an_unknown_result_word_is_an_error() -> None:
    proof = proving.outcome(pod(terminated=(0, "Completed", message("maybe"))), NOW, LIMITS)
    assert proof is not None and proof.result == "error"


@pytest.mark.parametrize(
    ("terminated", "expected"),
    [
        ((137, "OOMKilled", ""), "was OOM-killed"),
        ((1, "Error", ""), "exit code 1 (Error): it wrote no message"),
        (
            (2, "Error", "the serving image has no python3 on PATH"),
            "(Error): it said: the serving image has no python3",
        ),
        ((0, "Completed", '{"selftest": 1}'), "its message is not a proof: selftest: Input should be"),
        ((0, "Completed", '{"selftest": {"gpus": 3}}'), "not a proof: selftest.gpus"),
    ],
)
def test_a_pod_that_ended_without_a_proof_is_an_error_with_why(terminated: tuple, expected: str) -> None:
    proof = proving.outcome(pod(terminated=terminated), NOW, LIMITS)
    assert proof is not None and proof.result == "error" and expected in proof.reason


def test_an_unschedulable_pod_is_an_error_only_past_its_limit() -> None:
    stuck = "0/3 nodes are available: 1 Insufficient memory."
    assert proving.outcome(pod(age=59, unschedulable=stuck), NOW, LIMITS) is None
    proof = proving.outcome(pod(age=60, unschedulable=stuck), NOW, LIMITS)
    assert proof is not None and proof.result == "error"
    assert proof.reason == f"the self-test pod could not be scheduled within 60 s: {stuck}"


def test_an_image_that_cannot_be_pulled_is_an_error_past_its_limit() -> None:
    waiting = ("ImagePullBackOff", 'Back-off pulling image "r@sha256:..."')
    assert proving.outcome(pod(age=119, waiting=waiting), NOW, LIMITS) is None
    proof = proving.outcome(pod(age=120, waiting=waiting), NOW, LIMITS)
    assert proof is not None and "could not start within 120 s: ImagePullBackOff: Back-off" in proof.reason


def test_a_pod_waiting_for_an_ordinary_reason_is_left_until_it_hangs() -> None:
    assert proving.outcome(pod(age=500, waiting=("PodInitializing", "")), NOW, LIMITS) is None
    proof = proving.outcome(pod(age=900, waiting=("PodInitializing", "")), NOW, LIMITS)
    assert proof is not None and "the self-test hung" in proof.reason


def test_a_failed_install_and_a_pod_the_kubelet_ended_are_errors() -> None:
    install = proving.outcome(pod(install_failed="exit code 1 (Error)"), NOW, LIMITS)
    assert install is not None and "install step in the agent image failed: exit code 1" in install.reason
    ended = proving.outcome(pod(failed="DeadlineExceeded: Pod was active on the node longer than"), NOW, LIMITS)
    assert ended is not None and "failed before a verdict: DeadlineExceeded" in ended.reason


def test_a_long_reason_is_cut_to_one_line() -> None:
    proof = proving.outcome(pod(install_failed="x\n" * 400), NOW, LIMITS)
    assert proof is not None and len(proof.reason) <= 300 and "\n" not in proof.reason


# ---------------------------------------------------------------- what each node needs


def proof(result: str = "pass", at: float = NOW - 10, digest: str = DIGEST, **kw: object) -> ImageProof:
    return ImageProof(digest=digest, serving="cfg1", result=result, at=at, **kw)


@pytest.mark.parametrize(
    ("held", "asked", "due"),
    [
        (None, None, True),  # never proved
        (proof(), None, False),
        (proof("fail"), None, False),  # a failure stands until asked again or renewed
        (proof("error", at=NOW - 299), None, False),
        (proof("error", at=NOW - 300), None, True),  # retried
        (proof(at=NOW - 7 * 86_400), None, True),  # renewed
        (proof(request="1"), "1", False),
        (proof(request="1"), "2", True),  # asked again
        (proof(digest=NEW), None, True),  # another image's proof never covers this one
    ],
)
def test_needs_test(held: ImageProof | None, asked: str | None, due: bool) -> None:
    proofs = NodeProofs(proofs=[held] if held else [])
    assert proving.needs_test(Demand("n1", STACK, request=asked), proofs, NOW, LIMITS) is due


def test_merged_puts_new_first_replaces_its_own_and_keeps_a_bounded_few() -> None:
    old = [proof(digest=f"sha256:{i:064x}") for i in range(10)]
    new = proof(result="fail", digest="sha256:" + "3" * 64)
    again = proof(result="error", digest=f"sha256:{4:064x}")
    out = proving.merged(NodeProofs(proofs=old), [new, again])
    assert out.proofs[:2] == [new, again] and len(out.proofs) == proving.PROOFS_KEPT
    assert [p.digest for p in out.proofs].count(f"sha256:{4:064x}") == 1


def test_read_proofs_names_what_is_wrong_and_tests_again() -> None:
    assert proving.read_proofs(None) == (NodeProofs(), None)
    proofs, problem = proving.read_proofs('{"proofs": [{"digest": 1}]}')
    assert proofs == NodeProofs() and problem is not None and "proofs.0.digest" in problem


# ---------------------------------------------------------------- the plan


def demands(nodes: int, stack: Stack = STACK, waiting: frozenset[int] = frozenset()) -> list[Demand]:
    return [Demand(f"n{i}", stack, waiting=i in waiting) for i in range(nodes)]


def test_a_wave_is_bounded_and_nodes_with_waiting_pods_go_first() -> None:
    plan = proving.plan(demands(10, waiting=frozenset({7, 8})), [], {}, NOW, LIMITS)
    assert [d.node for d in plan.create] == ["n7", "n8", "n0"] and plan.waiting == 7


def test_one_pod_per_node_at_a_time_and_running_pods_count() -> None:
    wanted = [*demands(3), *demands(3, NEW_STACK)]
    running = [pod("n0", phase="Running")]
    plan = proving.plan(wanted, running, {}, NOW, LIMITS)
    assert sorted((d.node, d.stack.digest) for d in plan.create) == [("n1", DIGEST), ("n2", DIGEST)]
    assert plan.delete == [] and plan.waiting == 3


def test_a_deleting_pod_holds_its_node_and_its_share() -> None:
    plan = proving.plan(demands(4), [pod("n0", deleting=True)], {}, NOW, LIMITS)
    assert [d.node for d in plan.create] == ["n1", "n2"]


def test_finished_pods_are_recorded_and_deleted_and_the_next_wave_starts() -> None:
    done = pod("n0", terminated=(0, "Completed", message()))
    plan = proving.plan(demands(5), [done], {}, NOW, LIMITS)
    assert plan.delete == ["p-n0"] and [p.result for p in plan.record["n0"]] == ["pass"]
    assert [d.node for d in plan.create] == ["n1", "n2", "n3"]  # n0 is proved now: not again


def test_a_pod_for_an_image_no_longer_served_is_deleted_unread() -> None:
    plan = proving.plan(demands(1, NEW_STACK), [pod("n0", phase="Running")], {}, NOW, LIMITS)
    assert plan.delete == ["p-n0"] and plan.record == {}
    assert [(d.node, d.stack.digest) for d in plan.create] == [("n0", NEW)]


def test_proved_nodes_are_left_alone_and_a_new_image_is_tested_everywhere() -> None:
    held = {f"n{i}": NodeProofs(proofs=[proof()]) for i in range(3)}
    assert proving.plan(demands(3), [], held, NOW, LIMITS).create == []
    plan = proving.plan([*demands(3), *demands(3, NEW_STACK)], [], held, NOW, LIMITS)
    assert [(d.node, d.stack.digest) for d in plan.create] == [("n0", NEW), ("n1", NEW), ("n2", NEW)]


def test_a_fleet_is_proved_in_waves_until_done() -> None:
    """1000 nodes, 3 at a time, each pod done by the next look: every node proved once, no node twice at once."""
    wanted = demands(1000)
    proofs: dict[str, NodeProofs] = {}
    pods: list[ProvingPod] = []
    created = 0
    for look in range(400):
        plan = proving.plan(wanted, pods, proofs, NOW + look, LIMITS)
        for node, new in plan.record.items():
            proofs[node] = proving.merged(proofs.get(node, NodeProofs()), new)
        pods = [p for p in pods if p.name not in plan.delete]
        assert len(pods) + len(plan.create) <= LIMITS.max_parallel
        created += len(plan.create)
        pods += [
            pod(d.node, age=0, name=proving.pod_name(d.node, d.stack), terminated=(0, "Completed", message()))
            for d in plan.create
        ]
        if not pods and not plan.create:
            break
    assert len(proofs) == 1000 and created == 1000 and look == 334


# ---------------------------------------------------------------- the pod as created and read back

SETTINGS = PodSettings(
    namespace="gluon-system",
    agent_image="registry.example/gluon-rollout-agent:0.2.0",
    pod={"priorityClassName": "gluon-rollout-selftest", "tolerations": [{"operator": "Exists"}]},
    container={"securityContext": {"privileged": True}, "resources": {"limits": {"memory": "8Gi"}}},
    deadline_seconds=600,
)


def test_the_pod_runs_the_pinned_image_on_its_node_only() -> None:
    obj = proving.selftest_pod(Demand("gpu-node-7", STACK, request="r1"), SETTINGS)
    spec = obj["spec"]
    assert obj["metadata"]["name"] == proving.pod_name("gpu-node-7", STACK)
    assert obj["metadata"]["labels"] == {
        contract.LABEL_SELFTEST_POD: "true",
        contract.LABEL_SELFTEST_POD_NODE: "gpu-node-7",
    }
    term = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term == [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-node-7"]}]}]
    assert "nodeName" not in spec  # the scheduler weighs its requests and priority against serving
    (install,) = spec["initContainers"]
    (main,) = spec["containers"]
    assert install["image"] == SETTINGS.agent_image and install["command"][-2:] == ["--install", "/gluon"]
    assert main["image"] == STACK.pinned and main["securityContext"] == {"privileged": True}
    assert {"name": "GLUON_SERVING_CONFIG", "value": STACK.serving_json} in main["env"]
    assert "--deadline 600" in main["command"][2] and contract.SELFTEST_POD_MODULE in main["command"][2]
    assert main["command"][3:] == ["selftest"]  # $0; the chart's selfTest.extraArgs follow
    assert spec["restartPolicy"] == "Never" and spec["activeDeadlineSeconds"] == 720
    assert spec["priorityClassName"] == "gluon-rollout-selftest" and spec["volumes"][-1]["emptyDir"] == {}


def test_a_long_node_name_becomes_a_hash_in_the_label_and_stays_whole_in_the_annotation() -> None:
    node = "n" * 200
    obj = proving.selftest_pod(Demand(node, STACK), SETTINGS)
    assert len(obj["metadata"]["labels"][contract.LABEL_SELFTEST_POD_NODE]) <= 63
    view = proving.proving_pod_view(obj, NOW)
    assert view is not None and view.node == node


def status(**kw: object) -> dict:
    return {"phase": "Pending", **kw}


def read(status_: dict) -> ProvingPod:
    obj = proving.selftest_pod(Demand("n1", STACK, request="r1"), SETTINGS) | {"status": status_}
    view = proving.proving_pod_view(obj, NOW)
    assert view is not None
    return view


def test_reading_back_a_pod_in_each_of_its_states() -> None:
    fresh = read(status())
    assert (fresh.node, fresh.digest, fresh.serving, fresh.request, fresh.image) == (
        "n1",
        DIGEST,
        "cfg1",
        "r1",
        STACK.pinned,
    )
    unscheduled = read(
        status(conditions=[{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/1"}])
    )
    assert unscheduled.unschedulable == "0/1"
    pulling = read(
        status(
            containerStatuses=[
                {"name": proving.SELFTEST_CONTAINER, "state": {"waiting": {"reason": "ErrImagePull", "message": "404"}}}
            ]
        )
    )
    assert pulling.waiting == ("ErrImagePull", "404")
    install = read(
        status(
            phase="Failed",
            initContainerStatuses=[
                {"name": proving.INSTALL_CONTAINER, "state": {"terminated": {"exitCode": 127, "reason": "Error"}}}
            ],
        )
    )
    assert install.install_failed == "exit code 127 (Error)"
    assert install.failed is None
    done = read(
        status(
            phase="Succeeded",
            containerStatuses=[
                {
                    "name": proving.SELFTEST_CONTAINER,
                    "state": {"terminated": {"exitCode": 0, "reason": "Completed", "message": message()}},
                }
            ],
        )
    )
    assert done.terminated == (0, "Completed", message())
    ended = read(status(phase="Failed", reason="DeadlineExceeded", message="Pod was active too long"))
    assert ended.failed == "DeadlineExceeded: Pod was active too long"


def test_a_pod_without_the_operators_annotation_is_not_read() -> None:
    assert proving.proving_pod_view({"metadata": {"name": "x", "annotations": {}}}, NOW) is None


# ---------------------------------------------------------------- what a rollout asks to be proved


def served(node: str, digest: str, pinned: str | None, created: float) -> proving.ServedImage:
    return proving.ServedImage(node, digest, pinned, created)


def test_every_node_is_asked_for_the_newest_images_its_rollout_serves_anywhere() -> None:
    images = [
        served("n0", DIGEST, "r@" + DIGEST, 10),
        served("n1", NEW, "r@" + NEW, 20),  # a rolling upgrade reached n1 first
        served("n1", "sha256:" + "c" * 64, None, 30),  # unpinnable: never asked for
    ]
    out = proving.demands(["n2", "n1", "n0"], images, "cfg1", "{}", {"n0": "r7"})
    assert [(d.node, d.stack.digest, d.waiting) for d in out] == [
        ("n0", NEW, False),
        ("n0", DIGEST, True),
        ("n1", NEW, True),
        ("n1", DIGEST, False),
        ("n2", NEW, False),
        ("n2", DIGEST, False),
    ]
    assert {d.request for d in out if d.node == "n0"} == {"r7"} and {d.stack.serving for d in out} == {"cfg1"}


def test_only_the_newest_images_are_asked_for() -> None:
    images = [served("n0", f"sha256:{i:064x}", f"r@sha256:{i:064x}", i) for i in range(6)]
    out = proving.demands(["n0"], images, "cfg1", "{}", max_images=3)
    assert [d.stack.digest for d in out] == [f"sha256:{i:064x}" for i in (5, 4, 3)]


def test_a_node_local_image_is_asked_for_only_where_it_is_and_a_node_uses_its_own_reference() -> None:
    local = "sha256:" + "d" * 64
    images = [
        served("n0", local, local, 5),
        served("n0", DIGEST, "mirror.local/sglang@" + DIGEST, 1),
        served("n1", DIGEST, "registry.example/sglang@" + DIGEST, 2),
    ]
    out = {(d.node, d.stack.digest): d.stack.pinned for d in proving.demands(["n0", "n1"], images, "c", "{}")}
    assert out == {
        ("n0", local): local,
        ("n0", DIGEST): "mirror.local/sglang@" + DIGEST,
        ("n1", DIGEST): "registry.example/sglang@" + DIGEST,
    }


# ---------------------------------------------------------------- the chart's settings


def test_settings_from_env_reads_the_charts_json_and_is_off_without_it() -> None:
    assert proving.settings_from_env({}) is None and proving.settings_from_env({proving.SETTINGS_ENV: " "}) is None
    raw = {
        "namespace": "gluon-system",
        "agentImage": "r/agent:1",
        "pod": {"priorityClassName": "p"},
        "container": {},
        "maxParallel": 4,
        "runSeconds": 1500,
        "deadlineSeconds": 1200,
    }
    settings, limits = proving.settings_from_env({proving.SETTINGS_ENV: json.dumps(raw)})
    assert (settings.namespace, settings.agent_image, settings.deadline_seconds) == ("gluon-system", "r/agent:1", 1200)
    assert (limits.max_parallel, limits.run_seconds, limits.retry_seconds) == (4, 1500.0, Limits().retry_seconds)


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ("{", "is not JSON"),
        ("[]", "must be a JSON object"),
        ('{"agentImage": "a"}', "GLUON_SELFTEST_POD.namespace must be a non-empty string"),
        ('{"namespace": "n", "agentImage": "a", "maxParallel": 0}', "maxParallel must be a positive number or a perc"),
        ('{"namespace": "n", "agentImage": "a", "maxParallel": "0%"}', "a percentage such as '10%', not '0%'"),
        ('{"namespace": "n", "agentImage": "a", "maxParallel": true}', "maxParallel must be a positive number"),
        ('{"namespace": "n", "agentImage": "a", "pod": []}', "GLUON_SELFTEST_POD.pod must be an object"),
        ('{"namespace": "n", "agentImage": "a", "deadlineSeconds": 1.5}', "deadlineSeconds must be a positive whole"),
    ],
)
def test_settings_from_env_names_what_is_wrong(raw: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        proving.settings_from_env({proving.SETTINGS_ENV: raw})


@pytest.mark.parametrize(("value", "nodes", "cap"), [(3, 1000, 3), ("10%", 5, 1), ("10%", 1000, 100), ("1%", 0, 1)])
def test_a_wave_is_a_count_or_a_share_of_the_nodes_asked_for(value, nodes, cap):
    assert proving.parallel_cap(value, nodes) == cap


def test_a_share_keeps_the_number_of_waves_whatever_the_fleet():
    limits = Limits(max_parallel="10%")
    assert len(proving.plan(demands(1000), [], {}, NOW, limits).create) == 100
    assert len(proving.plan(demands(40), [], {}, NOW, limits).create) == 4


def test_a_node_local_image_is_never_pulled():
    local = "sha256:" + "d" * 64
    obj = proving.selftest_pod(Demand("n1", Stack(local, local, "cfg1")), SETTINGS)
    assert obj["spec"]["containers"][0]["imagePullPolicy"] == "Never"
    assert proving.selftest_pod(Demand("n1", STACK), SETTINGS)["spec"]["containers"][0]["imagePullPolicy"] == (
        "IfNotPresent"
    )


def test_a_restarted_operator_deletes_no_pod_before_every_rollout_has_said_what_it_wants():
    running = [pod("n0", phase="Running")]
    partial = proving.plan(demands(1, NEW_STACK), running, {}, NOW, LIMITS, prune=False)
    assert partial.delete == [] and partial.create == []  # n0 is busy with the pod another rollout may want
    assert proving.plan(demands(1, NEW_STACK), running, {}, NOW, LIMITS).delete == ["p-n0"]
