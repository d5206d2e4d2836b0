"""The agent's pure decisions over plain data: what to publish on its node, when to test again, how a
new verdict merges with the last one, and what the flag should be for a serving pod. No I/O here."""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from gluon_common import contract, image_ref
from gluon_common.backoff import backoff
from gluon_common.report import NodeProofs
from gluon_common.sglang_routes import ServingConfig

CONCLUSIVE = ("pass", "fail", "error")
REQUEST_TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,62}")  # e.g. a timestamp or a UUID
BOOL_LABEL_VALUES = ("true", "false")


# ---------------------------------------------------------------- publishing


@dataclass(frozen=True)
class Desired:
    labels: dict[str, str]
    annotations: dict[str, str]

    def keys(self) -> list[str]:
        return sorted(set(self.labels) | set(self.annotations))


def gpu_arch_label(gpus: list[Mapping[str, Any]]) -> str:
    archs = {g.get("arch") or "unknown" for g in gpus}
    if not archs:
        return "none"
    return archs.pop() if len(archs) == 1 else "mixed"


def capable_label(probe_report: Mapping[str, Any]) -> str:
    """ "true" / "false", or "import-crash" when the aiter import would stop SGLang with the flag on."""
    if probe_report.get("import_crash"):
        return contract.CAPABLE_IMPORT_CRASH
    return "true" if probe_report.get("capable") else "false"


def desired_state(
    probe_report: Mapping[str, Any], verdict: str, report: Mapping[str, Any], delivery: str | None = None
) -> Desired:
    """Our labels and annotations on the node; `delivery`: the delivery observation's JSON, once there is one."""
    labels = {
        contract.LABEL_CAPABLE: capable_label(probe_report),
        contract.LABEL_SELFTEST: verdict,
        contract.LABEL_GPU_ARCH: gpu_arch_label(probe_report.get("gpus", [])),
    }
    annotations = {contract.ANNOTATION_REPORT: json.dumps(report, sort_keys=True, separators=(",", ":"))}
    if delivery is not None:
        annotations[contract.ANNOTATION_DELIVERY] = delivery
    owned = sorted(set(labels) | set(annotations))
    annotations[contract.ANNOTATION_OWNED_KEYS] = ",".join(owned)
    return Desired(labels, annotations)


def parse_owned_keys(value: str | None) -> tuple[list[str], str | None]:
    """The keys the agent recorded as its own last time, or a problem when the value is not ours."""
    if not value:
        return [], None
    keys = [k.strip() for k in value.split(",") if k.strip()]
    foreign = [k for k in keys if not contract.is_ours(k)]
    if foreign:
        return [], f"owned-keys annotation lists keys outside {contract.PREFIX}: {foreign}"
    return keys, None


def removable(key: str) -> bool:
    """Owned keys the agent may delete: ours, and never the operator's or a person's request."""
    return (
        contract.is_ours(key) and key not in contract.OPERATOR_NODE_KEYS and key != contract.ANNOTATION_SELFTEST_REQUEST
    )


@dataclass
class NodePatch:
    """What the agent writes to its node: a merge patch (or nothing) and the malformed input it met."""

    patch: dict[str, Any] | None  # a JSON merge patch, or None when the node already matches
    problems: list[str] = field(default_factory=list)  # malformed input seen while planning


def plan_node_patch(node: Mapping[str, Any] | None, desired: Desired) -> NodePatch:
    """A merge patch that makes the node carry `desired` and drops keys the agent owned before and no
    longer sets. Without a complete view of the node (None) nothing is removed. The patch names the
    resourceVersion it was planned on, so a concurrent change answers 409 and we plan again."""
    if node is None:
        return NodePatch({"metadata": {"labels": dict(desired.labels), "annotations": dict(desired.annotations)}})
    meta = node.get("metadata", {})
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    owned, problem = parse_owned_keys(annotations.get(contract.ANNOTATION_OWNED_KEYS))
    patch_labels = {k: v for k, v in desired.labels.items() if labels.get(k) != v}
    patch_annotations = {k: v for k, v in desired.annotations.items() if annotations.get(k) != v}
    for key in owned:
        if key in desired.labels or key in desired.annotations or not removable(key):
            continue
        if key in labels:
            patch_labels[key] = None
        if key in annotations:
            patch_annotations[key] = None
    if not patch_labels and not patch_annotations:
        return NodePatch(None, [problem] if problem else [])
    patch_meta: dict[str, Any] = {"resourceVersion": meta.get("resourceVersion")}
    if patch_labels:
        patch_meta["labels"] = patch_labels
    if patch_annotations:
        patch_meta["annotations"] = patch_annotations
    return NodePatch({"metadata": patch_meta}, [problem] if problem else [])


# ---------------------------------------------------------------- verdicts and triggers


def merge_verdict(previous: str | None, previous_fingerprint: str | None, new: str, fingerprint: str) -> str:
    """A deferral (GPUs busy) never replaces a conclusive verdict for the same fingerprint."""
    if new == "deferred" and previous in CONCLUSIVE and previous_fingerprint == fingerprint:
        return previous
    return new


def valid_request_token(value: str | None) -> tuple[str | None, str | None]:
    """(token, problem): a self-test request annotation is an opaque token of up to 63 safe characters."""
    if value is None:
        return None, None
    if REQUEST_TOKEN.fullmatch(value):
        return value, None
    return (
        None,
        f"{contract.ANNOTATION_SELFTEST_REQUEST}={value[:100]!r} is not a token of 1-63 characters [A-Za-z0-9._:-]",
    )


@dataclass
class Schedule:
    """When the agent tested last and when it should test next (wall-clock seconds)."""

    tested_fingerprint: str | None = None
    handled_request: str | None = None
    last_run_at: float | None = None
    next_periodic_at: float = 0.0
    deferrals: int = 0
    next_retry_at: float | None = None
    tested_serving: str | None = None  # the digest of the serving config last tested


def retest_reason(
    s: Schedule, now: float, fingerprint: str, request: str | None, serving: str | None = None
) -> str | None:
    """Why to test now, or None. `serving`: the digest of the serving config the operator asks for."""
    if s.last_run_at is None:
        return "start"
    if fingerprint != s.tested_fingerprint:
        return "fingerprint changed"
    if request is not None and request != s.handled_request:
        return "requested"
    if serving is not None and serving != s.tested_serving:
        return "serving config changed"
    if s.next_retry_at is not None and now >= s.next_retry_at:
        return "deferred retry"
    if now >= s.next_periodic_at:
        return "periodic"
    return None


def jittered(period: float, fraction: float, rng: random.Random) -> float:
    return period * (1 + rng.uniform(-fraction, fraction))


def after_run(
    s: Schedule,
    now: float,
    fingerprint: str,
    request: str | None,
    result: str,
    period: float,
    jitter: float,
    retry_base: float,
    retry_cap: float,
    rng: random.Random,
    serving: str | None = None,
) -> Schedule:
    deferrals = s.deferrals + 1 if result == "deferred" else 0
    return Schedule(
        tested_fingerprint=fingerprint,
        handled_request=request,
        last_run_at=now,
        next_periodic_at=now + jittered(period, jitter, rng),
        deferrals=deferrals,
        next_retry_at=now + backoff(deferrals - 1, retry_base, retry_cap, rng) if deferrals else None,
        tested_serving=serving,
    )


# ---------------------------------------------------------------- the flag for serving pods


def flag_decision(
    labels: Mapping[str, str] | None,
    view_age: float | None,
    max_view_age: float,
    verdict: str | None,
    capable: bool | None,
) -> dict[str, Any]:
    """What a serving pod's preflight should set: '1' only when the operator enabled this node and the
    agent's own current facts agree. No current view of the node means '0'."""
    if labels is None or view_age is None or view_age > max_view_age:
        age = "never" if view_age is None else f"{view_age:.0f} s ago"
        return {
            "flag": "0",
            "current": False,
            "enabled": None,
            "state": None,
            "reason": f"the agent has no current view of its node (last seen {age}, limit {max_view_age:.0f} s)",
        }
    enabled, state = labels.get(contract.LABEL_ENABLED), labels.get(contract.LABEL_STATE)
    base = {"current": True, "enabled": enabled == "true", "state": state}
    if enabled is not None and enabled not in BOOL_LABEL_VALUES:
        return base | {"flag": "0", "reason": f"malformed label {contract.LABEL_ENABLED}={enabled!r}"}
    if enabled != "true":
        return base | {
            "flag": "0",
            "reason": f"the operator has not enabled this node ({contract.LABEL_ENABLED}={enabled}, state={state})",
        }
    if not capable:
        return base | {"flag": "0", "reason": "this node's probe says it is not capable"}
    if verdict != "pass":
        return base | {"flag": "0", "reason": f"this node's self-test is {verdict}"}
    return base | {"flag": "1", "reason": f"enabled by the operator (state={state}), capable, self-test pass"}


def image_decision(
    answer: Mapping[str, Any],
    annotations: Mapping[str, str],
    digest: str | None,
    digest_problem: str | None,
) -> dict[str, Any]:
    """With self-tests in the serving images: `answer` (flag_decision's) stands at '1' only when this node holds
    a passing proof of the asking pod's own image digest (as its runtime resolved it) with the node's serving
    configuration; else '0', saying what was proved and what this pod runs. The agent's own verdict is not
    enough: it is about the agent's image."""
    out = dict(answer) | {"image": digest, "proved": None}
    if answer.get("flag") != "1":
        return out
    if digest is None:
        return out | {"flag": "0", "reason": f"this pod's image is not known: {digest_problem}"}
    serving = node_serving_digest(annotations.get(contract.ANNOTATION_SERVING_CONFIG))
    if serving is None:
        return out | {"flag": "0", "reason": "the node has no serving configuration from the operator yet"}
    proofs, problem = NodeProofs.parse(annotations.get(contract.ANNOTATION_PROOFS), contract.ANNOTATION_PROOFS)
    proof = proofs.find(digest, serving)
    if proof is None:
        proved = ", ".join(f"{p.digest[:19]} ({p.result})" for p in proofs.proofs if p.serving == serving) or "none"
        return out | {
            "flag": "0",
            "proved": False,
            "reason": f"this pod runs {digest}, not proved on this node for serving config {serving} (proved: "
            f"{proved}{'; ' + problem if problem else ''}); a test is on its way",
        }
    if proof.result != "pass":  # an error is tried again (the pod waits for it); a failure is a refusal
        return out | {
            "flag": "0",
            "proved": False if proof.result == "error" else None,
            "reason": f"the self-test of {digest} on this node: {proof.result} ({proof.reason})",
        }
    return out | {
        "proved": True,
        "reason": f"{answer.get('reason')}; this pod's image {digest[:19]} is proved on this node",
    }


def asking_pod_image(pod: Mapping[str, Any], uid: str | None, node: str, container: str) -> tuple[str | None, str]:
    """(digest, why none) of the image `container` of the asking pod runs, as its node's runtime resolved it: only a
    pod on this node, of the uid it gave (a pod name reused by a later pod is another pod)."""
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    if uid and meta.get("uid") != uid:
        return None, f"the pod of that name has uid {meta.get('uid')}, not {uid}"
    if spec.get("nodeName") != node:
        return None, f"the pod runs on {spec.get('nodeName')!r}, not on this agent's node {node!r}"
    for seen in status.get("initContainerStatuses") or []:
        if isinstance(seen, Mapping) and seen.get("name") == container:
            identity = image_ref.identify("", seen.get("image"), seen.get("imageID"))
            return identity.digest, identity.problem or ""
    return None, f"the pod's status has no {container} container yet"


def node_serving_digest(raw: str | None) -> str | None:
    """The digest of the serving configuration the operator wrote on the node; None when absent or unreadable."""
    if not raw:
        return None
    try:
        return ServingConfig.from_dict(json.loads(raw), contract.ANNOTATION_SERVING_CONFIG).digest
    except ValueError:
        return None
