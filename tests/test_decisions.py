"""The agent's pure decisions, exhaustively where the input space is small, by property elsewhere."""

from __future__ import annotations

import itertools
import json
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gluon_agent import decisions
from gluon_agent.daemon import restore
from gluon_common import contract
from gluon_common.backoff import backoff
from gluon_common.report import ImageProof, NodeProofs, SelfTest
from gluon_common.sglang_routes import ServingConfig

PROBE = {"capable": True, "gpus": [{"arch": "gfx950"}, {"arch": "gfx950"}]}
OTHER = "example.com/keep"


def node(labels=None, annotations=None, rv="7"):
    return {"metadata": {"name": "n1", "resourceVersion": rv, "labels": labels or {}, "annotations": annotations or {}}}


def test_desired_state():
    d = decisions.desired_state(PROBE, "pass", {"a": 1})
    assert d.labels == {
        contract.LABEL_CAPABLE: "true",
        contract.LABEL_SELFTEST: "pass",
        contract.LABEL_GPU_ARCH: "gfx950",
    }
    assert json.loads(d.annotations[contract.ANNOTATION_REPORT]) == {"a": 1}
    assert d.annotations[contract.ANNOTATION_OWNED_KEYS].split(",") == sorted(
        [contract.LABEL_CAPABLE, contract.LABEL_SELFTEST, contract.LABEL_GPU_ARCH, contract.ANNOTATION_REPORT]
    )


@pytest.mark.parametrize(
    "archs,label", [([], "none"), (["gfx950"], "gfx950"), (["gfx950", "gfx942"], "mixed"), ([None], "unknown")]
)
def test_gpu_arch_label(archs, label):
    assert decisions.gpu_arch_label([{"arch": a} for a in archs]) == label


def test_first_publish_without_a_view_removes_nothing():
    plan = decisions.plan_node_patch(None, decisions.desired_state(PROBE, "pending", {}))
    assert all(v is not None for v in plan.patch["metadata"]["labels"].values())
    assert "resourceVersion" not in plan.patch["metadata"]


def test_patch_sets_only_differences_and_names_the_resource_version():
    desired = decisions.desired_state(PROBE, "pass", {})
    current = node(labels=dict(desired.labels, **{OTHER: "x"}), annotations=dict(desired.annotations))
    assert decisions.plan_node_patch(current, desired).patch is None
    current["metadata"]["labels"][contract.LABEL_SELFTEST] = "fail"
    patch = decisions.plan_node_patch(current, desired).patch
    assert patch == {"metadata": {"resourceVersion": "7", "labels": {contract.LABEL_SELFTEST: "pass"}}}


def test_stale_owned_keys_are_removed_but_never_the_operators_or_a_persons():
    old = contract.PREFIX + "old-key"
    owned = ",".join([old, contract.LABEL_ENABLED, contract.ANNOTATION_SELFTEST_REQUEST, contract.LABEL_CAPABLE])
    current = node(
        labels={old: "x", contract.LABEL_ENABLED: "true", OTHER: "y"},
        annotations={contract.ANNOTATION_OWNED_KEYS: owned, contract.ANNOTATION_SELFTEST_REQUEST: "t1"},
    )
    patch = decisions.plan_node_patch(current, decisions.desired_state(PROBE, "pass", {})).patch
    assert patch["metadata"]["labels"][old] is None
    assert contract.LABEL_ENABLED not in patch["metadata"]["labels"]
    assert OTHER not in patch["metadata"]["labels"]
    assert contract.ANNOTATION_SELFTEST_REQUEST not in patch["metadata"]["annotations"]


def test_malformed_owned_keys_remove_nothing_and_are_reported():
    current = node(labels={OTHER: "y"}, annotations={contract.ANNOTATION_OWNED_KEYS: f"{OTHER},{contract.PREFIX}x"})
    plan = decisions.plan_node_patch(current, decisions.desired_state(PROBE, "pass", {}))
    assert plan.problems and "outside" in plan.problems[0]
    assert all(v is not None for v in plan.patch["metadata"]["labels"].values())


@given(
    labels=st.dictionaries(
        st.sampled_from(
            [OTHER, contract.LABEL_ENABLED, contract.LABEL_STATE, contract.PREFIX + "z", contract.LABEL_CAPABLE]
        ),
        st.sampled_from(["a", "true"]),
    ),
    owned=st.lists(
        st.sampled_from(
            [OTHER, contract.LABEL_ENABLED, contract.LABEL_STATE, contract.PREFIX + "z", contract.LABEL_GPU_ARCH]
        )
    ),
    verdict=st.sampled_from(contract.SELFTEST_VALUES),
)
def test_patches_only_ever_touch_agent_keys(labels, owned, verdict):
    current = node(labels=labels, annotations={contract.ANNOTATION_OWNED_KEYS: ",".join(owned)})
    plan = decisions.plan_node_patch(current, decisions.desired_state(PROBE, verdict, {}))
    meta = (plan.patch or {}).get("metadata", {})
    touched = set(meta.get("labels", {})) | set(meta.get("annotations", {}))
    assert all(contract.is_ours(k) and k not in contract.OPERATOR_NODE_KEYS for k in touched)


@pytest.mark.parametrize(
    "previous,same_fp,new,expected",
    [
        (p, same, n, (p if n == "deferred" and p in ("pass", "fail", "error") and same else n))
        for p, same, n in itertools.product(
            [None, "pending", "pass", "fail", "error", "deferred"], [True, False], contract.SELFTEST_VALUES
        )
    ],
)
def test_merge_verdict(previous, same_fp, new, expected):
    assert decisions.merge_verdict(previous, "fp" if same_fp else "old", new, "fp") == expected


@pytest.mark.parametrize(
    "value,token",
    [
        (None, None),
        ("2026-11-29T10:00:00Z", "2026-11-29T10:00:00Z"),
        ("a" * 63, "a" * 63),
        ("a" * 64, None),
        ("run now!", None),
        ("", None),
        ("-x", None),
    ],
)
def test_request_tokens(value, token):
    got, problem = decisions.valid_request_token(value)
    assert got == token
    assert (problem is not None) == (value is not None and token is None)


def test_retest_reasons_in_priority_order():
    s = decisions.Schedule()
    assert decisions.retest_reason(s, 0, "fp", None) == "start"
    s = decisions.Schedule(tested_fingerprint="fp", handled_request="t1", last_run_at=0, next_periodic_at=100)
    assert decisions.retest_reason(s, 50, "fp", "t1") is None
    assert decisions.retest_reason(s, 50, "fp2", "t1") == "fingerprint changed"
    assert decisions.retest_reason(s, 50, "fp", "t2") == "requested"
    assert decisions.retest_reason(s, 50, "fp", None) is None  # a removed request asks for nothing
    assert decisions.retest_reason(s, 100, "fp", "t1") == "periodic"
    s.next_retry_at = 60
    assert decisions.retest_reason(s, 60, "fp", "t1") == "deferred retry"


@given(attempt=st.integers(0, 30), seed=st.integers(0, 2**32))
def test_backoff_bounds(attempt, seed):
    delay = backoff(attempt, 1.0, 60.0, random.Random(seed))
    step = min(60.0, 2.0**attempt)
    assert step / 2 <= delay <= step


def test_backoff_after_hours_of_failures_stays_at_the_cap():
    """An informer or node watch failing every 30 s for 9 hours is past attempt 1024: 2**1024 overflows a float."""
    assert 30.0 <= backoff(5000, 0.5, 60.0, random.Random(1)) <= 60.0


def test_after_run_schedules_period_with_jitter_and_deferral_backoff():
    rng = random.Random(1)
    periods = [
        decisions.after_run(decisions.Schedule(), 0, "fp", None, "pass", 1000, 0.1, 60, 3600, rng).next_periodic_at
        for _ in range(200)
    ]
    assert 900 <= min(periods) < 950 and 1050 < max(periods) <= 1100  # spread over the fleet
    s = decisions.Schedule()
    retries = []
    for _ in range(8):
        s = decisions.after_run(s, 0, "fp", None, "deferred", 1000, 0.0, 60, 3600, rng)
        retries.append(s.next_retry_at)
    assert s.deferrals == 8 and 30 <= retries[0] <= 60 and 1800 <= retries[-1] <= 3600
    assert decisions.after_run(s, 0, "fp", None, "pass", 1000, 0.0, 60, 3600, rng).next_retry_at is None


ENABLED = {contract.LABEL_ENABLED: "true", contract.LABEL_STATE: "Promoted"}


@pytest.mark.parametrize(
    "labels,age,verdict,capable,flag,reason",
    [
        (ENABLED, 1.0, "pass", True, "1", "enabled by the operator"),
        (None, None, "pass", True, "0", "no current view"),
        (ENABLED, 100.0, "pass", True, "0", "no current view"),
        ({contract.LABEL_ENABLED: "false"}, 1.0, "pass", True, "0", "has not enabled"),
        ({}, 1.0, "pass", True, "0", "has not enabled"),
        ({contract.LABEL_ENABLED: "yes"}, 1.0, "pass", True, "0", "malformed label"),
        (ENABLED, 1.0, "fail", True, "0", "self-test is fail"),
        (ENABLED, 1.0, "pass", False, "0", "not capable"),
    ],
)
def test_flag_decision(labels, age, verdict, capable, flag, reason):
    answer = decisions.flag_decision(labels, age, 90.0, verdict, capable)
    assert answer["flag"] == flag and reason in answer["reason"]
    assert answer["current"] == (labels is not None and age is not None and age <= 90)


def test_restore_previous_verdict():
    report = json.dumps({"fingerprint": "fp", "verdict": "pass", "selftest": {"result": "pass"}})
    annotated = node(annotations={contract.ANNOTATION_REPORT: report})
    assert restore(annotated, "fp") == ("pass", SelfTest(result="pass"), None)
    assert restore(annotated, "other") == (None, None, None)
    assert restore(node(), "fp") == (None, None, None)
    verdict, _, problem = restore(node(annotations={contract.ANNOTATION_REPORT: "{not json"}), "fp")
    assert verdict is None and "not our JSON report" in problem


@pytest.mark.parametrize(
    "probe, label",
    [
        ({"capable": True}, "true"),
        ({"capable": False}, "false"),
        (
            {"capable": False, "import_crash": "aiter... import fails with RuntimeError: x, not ImportError"},
            contract.CAPABLE_IMPORT_CRASH,
        ),
    ],
)
def test_capable_label_says_import_crash_louder_than_false(probe, label):
    d = decisions.desired_state(probe | {"gpus": []}, "pending", {})
    assert d.labels[contract.LABEL_CAPABLE] == label and label in contract.CAPABLE_VALUES


def test_import_crash_metric():
    from gluon_agent.metrics import AgentMetrics

    m = AgentMetrics()
    m.observe_probe({"capable": False, "import_crash": "boom", "sglang": {"version": "0.5.19"}}, "fp")
    assert m.registry.get_sample_value(contract.M_AGENT_IMPORT_CRASH) == 1
    assert (
        m.registry.get_sample_value(
            contract.M_AGENT_INFO + "_info",
            {
                "fingerprint": "fp",
                "arch": "none",
                "gpus": "0",
                "aiter": "None",
                "triton": "None",
                "torch": "None",
                "hip": "None",
                "driver": "None",
                "sglang": "0.5.19",
            },
        )
        == 1
    )
    m.observe_probe({"capable": True}, "fp")
    assert m.registry.get_sample_value(contract.M_AGENT_IMPORT_CRASH) == 0


# ---------------------------------------------------------------- the pod's own image (self-tests in serving images)

IMAGE = "sha256:" + "a" * 64
OTHER_IMAGE = "sha256:" + "b" * 64
SERVING = ServingConfig()
YES = {"flag": "1", "current": True, "enabled": True, "state": "Promoted", "reason": "enabled by the operator"}


def node_annotations(*proofs: ImageProof, serving: ServingConfig | None = SERVING) -> dict[str, str]:
    out = {contract.ANNOTATION_PROOFS: NodeProofs(proofs=list(proofs)).model_dump_json()}
    if serving is not None:
        out[contract.ANNOTATION_SERVING_CONFIG] = json.dumps(serving.as_dict())
    return out


def proved(digest: str = IMAGE, result: str = "pass", serving: str = SERVING.digest) -> ImageProof:
    return ImageProof(digest=digest, serving=serving, result=result, reason="both paths pass on 8 GPU(s)", at=1.0)


@pytest.mark.parametrize(
    ("answer", "annotations", "digest", "flag", "reason"),
    [
        (YES, node_annotations(proved()), IMAGE, "1", "this pod's image sha256:aaaaaaaaaaaa is proved"),
        ({**YES, "flag": "0", "reason": "not enabled"}, node_annotations(proved()), IMAGE, "0", "not enabled"),
        (YES, node_annotations(proved()), None, "0", "this pod's image is not known: no imageID yet"),
        (YES, node_annotations(proved(), serving=None), IMAGE, "0", "no serving configuration from the operator"),
        (YES, node_annotations(proved(OTHER_IMAGE)), IMAGE, "0", f"this pod runs {IMAGE}, not proved on this node"),
        (YES, node_annotations(proved(serving="x")), IMAGE, "0", "(proved: none); a test is on its way"),
        (YES, node_annotations(proved(result="fail")), IMAGE, "0", f"the self-test of {IMAGE} on this node: fail"),
        (YES, {contract.ANNOTATION_PROOFS: "{", **node_annotations()}, IMAGE, "0", "not proved"),
        (YES, {**node_annotations(), contract.ANNOTATION_PROOFS: "[1]"}, IMAGE, "0", "unreadable"),
    ],
)
def test_image_decision(answer, annotations, digest, flag, reason):
    out = decisions.image_decision(answer, annotations, digest, "no imageID yet")
    assert out["flag"] == flag and reason in out["reason"] and out["image"] == digest


def asking_pod(uid: str = "u1", node: str = "n1", image_id: str | None = "registry.example/sglang@" + IMAGE) -> dict:
    status = {"name": contract.PREFLIGHT_CONTAINER, "image": "registry.example/sglang:v1", "imageID": image_id or ""}
    return {"metadata": {"uid": uid}, "spec": {"nodeName": node}, "status": {"initContainerStatuses": [status]}}


@pytest.mark.parametrize(
    ("pod", "uid", "digest", "problem"),
    [
        (asking_pod(), "u1", IMAGE, ""),
        (asking_pod(), None, IMAGE, ""),
        (asking_pod(uid="u2"), "u1", None, "has uid u2, not u1"),
        (asking_pod(node="n2"), "u1", None, "runs on 'n2', not on this agent's node 'n1'"),
        (asking_pod(image_id=None), "u1", None, "no imageID"),
        ({"metadata": {"uid": "u1"}, "spec": {"nodeName": "n1"}, "status": {}}, "u1", None, "no gluon-preflight"),
    ],
)
def test_asking_pod_image(pod, uid, digest, problem):
    found, why = decisions.asking_pod_image(pod, uid, "n1", contract.PREFLIGHT_CONTAINER)
    assert found == digest and problem in why


class PodReader:
    """The agent's API as far as the decision reads it: one pod, whose preflight's image shows up late."""

    def __init__(self, pods: list[dict]) -> None:
        self.pods = pods
        self.reads = 0

    def read_pod(self, namespace: str, name: str) -> dict:
        self.reads += 1
        return self.pods[min(self.reads, len(self.pods)) - 1]


def agent_with(pods: list[dict], proofs: list[ImageProof]):
    from gluon_agent.daemon import Agent, AgentConfig

    agent = Agent(AgentConfig("n1", image_proofs=True, image_wait=2.0), PodReader(pods), source=None)
    agent.probe_report, agent.verdict = {"capable": True}, "pass"
    node = {
        "metadata": {
            "labels": {contract.LABEL_ENABLED: "true", contract.LABEL_STATE: "Analyzing"},
            "annotations": node_annotations(*proofs),
        }
    }
    agent.view.set(node)
    return agent


def test_the_agent_answers_per_image_and_waits_for_the_kubelet_to_report_it():
    late = [asking_pod(image_id=None), asking_pod(image_id=None), asking_pod()]
    agent = agent_with(late, [proved()])
    answer = agent.decision({"namespace": "ns", "name": "p", "uid": "u1"})
    assert (answer["flag"], answer["proved"], answer["image"]) == ("1", True, IMAGE) and agent.api.reads == 3
    other = agent_with([asking_pod()], [proved(OTHER_IMAGE)])
    answer = other.decision({"namespace": "ns", "name": "p", "uid": "u1"})
    assert (answer["flag"], answer["proved"]) == ("0", False) and "not proved on this node" in answer["reason"]
    unnamed = agent_with([asking_pod()], [proved()]).decision({})
    assert unnamed["flag"] == "0" and "did not say which pod it is" in unnamed["reason"]
