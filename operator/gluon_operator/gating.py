"""The operator's pure decisions per node: eligibility, the node state machine, which pods to restart,
and the rollout's phase (plan.py composes them into one reconcile and chooses which nodes to enable).
Plain data in, plain data out.

States (contract.NODE_STATES): Ineligible, Eligible, Enabling, Analyzing, Promoted, RolledBack, Disabled.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Mapping

from gluon_common import contract
from gluon_common.report import AgentReport, SelfTest
from gluon_common.sglang_routes import ServingConfig

from . import serving as routing
from .records import NOT_FINITE, NodeRecord, RollbackRecord, finite, finite_number, read_json, whole_count

INELIGIBLE, ELIGIBLE, ENABLING, ANALYZING, PROMOTED, ROLLED_BACK, DISABLED = contract.NODE_STATES
FLAG_ON_STATES = (ENABLING, ANALYZING, PROMOTED)
IN_PROGRESS = (ENABLING, ANALYZING)


# ---------------------------------------------------------------- facts


@dataclass(frozen=True)
class NodeFacts:
    name: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    agent_alive: bool


@dataclass(frozen=True)
class Eligibility:
    eligible: bool
    reason: str
    fingerprint: str | None
    no_safe_rollback: bool = False  # flag 0 has no working route here: never enabled (plan keeps an enabled one on)
    proof_pending: bool = False  # passing, but for another serving config: its agent re-tests for this one
    agent_lost: bool = False  # its agent is not running and ready (plan.py grants a flag-on node a grace)


def parse_report(annotations: Mapping[str, str]) -> tuple[AgentReport | None, str | None]:
    report, problem = read_json(AgentReport, annotations.get(contract.ANNOTATION_REPORT), "the agent report annotation")
    if report is None and problem is None:
        return None, "the agent has published no report on this node"
    return report, problem


def parse_rollback(annotations: Mapping[str, str]) -> tuple[RollbackRecord | None, str | None]:
    """The operator's own rollback record on a node: (record, None), (None, None) when absent, or
    (None, why) when a person or a tool wrote something else there. A record whose numbers are not finite
    (NaN, Infinity) still says the node was rolled back: it is read with them as null (its time then
    unknown: no retryAfter runs from it), never taken for no record or for an unreadable one."""
    raw = annotations.get(contract.ANNOTATION_ROLLBACK)
    record, problem = read_json(RollbackRecord, raw, "the rollback record annotation")
    if record is None and raw is not None and problem is not None and NOT_FINITE in problem:
        lenient, still = read_json(RollbackRecord, raw, "the rollback record annotation", non_finite_as_null=True)
        if lenient is not None:
            return lenient, still
    return record, problem


def tested(report: AgentReport) -> SelfTest:
    """The report's self-test; an empty one while the agent has none for its fingerprint yet (pending)."""
    return report.selftest or SelfTest()


def failing_paths(report: AgentReport) -> list[str]:
    out = []
    for gpu in tested(report).gpus:
        for path, result in gpu.result.items():
            if result != "pass":
                reasons = gpu.reasons.get(path, [])
                out.append(f"GPU {gpu.index} {path} {result}" + (f" ({reasons[0]})" if reasons else ""))
    return out


def rolled_back_for(
    rollback: RollbackRecord | None, fingerprint: str | None, now: float, retry_after: int | None
) -> str | None:
    """Why the node is still barred by an earlier rollback, or None."""
    if rollback is None or rollback.fingerprint != fingerprint:
        return None
    if retry_after is not None and rollback.at is not None and now >= rollback.at + retry_after:
        return None
    return f"rolled back for fingerprint {fingerprint}: {rollback_reason(rollback)}"


def rollback_reason(rollback: RollbackRecord) -> str:
    """The record's reason, and that its time is unknown when it was not a finite number."""
    if rollback.at is not None:
        return rollback.reason
    return f"{rollback.reason} (its time unreadable: only a person or a new fingerprint clears it)"


SKIPPED = f"skipped: node label {contract.LABEL_SKIP}=true"
NO_AGENT = "no running, ready agent on this node"


NO_SAFE_ROLLBACK = "no safe rollback"


def route_problem(report: AgentReport, serving: ServingConfig | str | None) -> tuple[str, bool] | None:
    """(why the node's SGLang cannot serve the rollout's configuration, whether it is because flag 0 has no
    route), or None. `serving`: the rollout's configuration, why it has none (a str), or None: not checked."""
    if serving is None:
        return None
    if isinstance(serving, str):
        return f"serving configuration unresolved: {serving}", False
    sglang = report.probe.sglang
    flag0 = routing.flag0_no_route(sglang, serving)
    if flag0:
        return (
            f"{NO_SAFE_ROLLBACK}: flag 0 has no working route for the serving configuration "
            f"({routing.describe(serving)}): {flag0[0]}; "
            "a node enabled here could not be rolled back, so it is never enabled"
        ), True
    flag1 = routing.flag1_no_route(sglang, serving)
    if flag1:
        return (
            f"flag 1 has no working route for the serving configuration ({routing.describe(serving)}): {flag1[0]}",
            False,
        )
    return None


def proof_problem(report: AgentReport, serving: ServingConfig | str | None) -> str | None:
    """Why the node's self-test is not the proof of the rollout's configuration (it proved another), or None."""
    if not isinstance(serving, ServingConfig):
        return None
    proof = tested(report).serving
    proved = proof.digest if proof else None
    if proved == serving.digest:
        return None
    return (
        f"self-test proved serving config {proved or '(none: an agent without serving configs)'}; this rollout serves "
        f"{serving.digest} ({routing.describe(serving)}); re-test requested"
    )


def eligibility(
    facts: NodeFacts, now: float, retry_after: int | None, serving: ServingConfig | str | None = None
) -> Eligibility:
    """Eligible only when not skipped by a person, with a live agent, capable, able to serve the rollout's
    serving configuration on both flags with a self-test that proved that configuration, both paths passing
    for the current fingerprint, and not rolled back for that fingerprint. A report or record of the wrong
    shape makes this node alone ineligible, naming the field."""
    report, problem = parse_report(facts.annotations)
    fingerprint = report.fingerprint if report else None
    if facts.labels.get(contract.LABEL_SKIP) == "true":
        return Eligibility(False, SKIPPED, fingerprint)
    if not facts.agent_alive:
        return Eligibility(False, NO_AGENT, fingerprint, agent_lost=True)
    if report is None:
        return Eligibility(False, problem or "no report", None)
    if facts.labels.get(contract.LABEL_CAPABLE) != "true" or not report.probe.capable:
        missing = report.probe.missing_for_capable or ["capable label is not 'true'"]
        return Eligibility(False, "not capable: " + "; ".join(missing), fingerprint)
    routes = route_problem(report, serving)
    if routes:
        return Eligibility(False, routes[0], fingerprint, routes[1])
    # A failed self-test is named first, also one of another serving config (its failure is the news; the
    # re-test for this one is noted), so a crashing kernel never reads as a config still to prove.
    proof = proof_problem(report, serving)
    verdict = facts.labels.get(contract.LABEL_SELFTEST)
    if verdict != "pass" or report.verdict != "pass":
        failing = failing_paths(report)
        detail = "; ".join(failing) if failing else f"label {verdict}, report {report.verdict}"
        return Eligibility(False, f"self-test not passed: {detail}" + (f" ({proof})" if proof else ""), fingerprint)
    selftest = tested(report)
    if selftest.fingerprint != fingerprint:
        return Eligibility(
            False, f"self-test is for fingerprint {selftest.fingerprint}, node is at {fingerprint}", fingerprint
        )
    if proof:  # a passing node whose agent re-tests for this config: eligible once it has (proof_pending)
        return Eligibility(False, proof, fingerprint, proof_pending=selftest.serving is not None)
    record, unreadable = parse_rollback(facts.annotations)
    if unreadable:
        return Eligibility(False, unreadable, fingerprint)
    barred = rolled_back_for(record, fingerprint, now, retry_after)
    if barred:
        return Eligibility(False, barred, fingerprint)
    return Eligibility(True, f"capable, both paths pass for fingerprint {fingerprint}", fingerprint)


@dataclass(frozen=True)
class PodFacts:
    name: str
    created: float  # unix seconds
    flag: str | None  # the value the preflight chose, None while unknown
    preflight_reason: str | None
    ready: bool
    deleting: bool
    injected: bool = True  # the webhook added the preflight (False: admitted while it was unreachable)
    transient: bool = False  # a '0' from the agent's view, not the stack: unreachable, stale, not enabled yet
    controlled: bool = True  # a controller recreates it when it is restarted (a bare pod is just gone)
    delivered: str | None = None  # the flag its serving processes were seen to run (delivery.py), None: not yet
    mismatch: str | None = None  # how what they run differs from what its preflight chose, None: it does not
    unproved: bool = False  # at '0' until its own image is proved on the node (self-tests in serving images)


JUDGE_STATE = ("sequential", "failStreak", "inconclusiveSince")  # the judge's working numbers, look to look
GUARD_KEYS = ("effect", "ci_low", "ci_high", "threshold", "p_worse", "looks", "at")  # a guard look, as recorded
JUDGED_AT = "judgedAt"  # a Promoted node's numbers: when the look that promoted it ran
UNJUDGED_STATES = (ELIGIBLE, INELIGIBLE, DISABLED)  # states whose record carries no judge's numbers
RESTARTED_PODS = "restartedPods"  # an Enabling node's record: serving pods it will have again once restarted
MISMATCH = "mismatch"  # a record's numbers: the pods whose processes ran another flag than chosen (a rollback)
MISMATCH_CAP = 10


@dataclass(frozen=True)
class PodSummary:
    old: list[str]  # created before the node's change: still to restart
    new_flags: dict[str, str | None]  # pods started after the change: the flag each was seen to run (None: not yet)
    new_ready: bool
    refused: list[str]  # new pods whose preflight chose '0', with its reason
    retry: list[str] = field(default_factory=list)  # new, running pods to restart: not injected, or a transient '0'
    starting: list[str] = field(default_factory=list)  # such pods not ready yet: restarted once they run
    replaced: int = 0  # old pods a controller recreates once they are restarted
    mismatched: list[str] = field(default_factory=list)  # pods whose processes run another flag than chosen
    unproved: list[str] = field(default_factory=list)  # new pods at '0' until their image is proved here


def summarize_pods(pods: Iterable[PodFacts], changed_at: float | None) -> PodSummary:
    """Old pods predate the node's change and restart; new ones carry the flag their preflight chose.
    creationTimestamp has one-second resolution: a pod stamped with the second of the change may predate
    it, so it counts as old. Restarts wait until that second is over (restart_due), so a replacement is
    always stamped later and counts as new: never evicted twice."""
    pods = [p for p in pods if not p.deleting]
    mismatched = [f"{p.name}: {p.mismatch}" for p in pods if p.mismatch]
    changed_at = finite_number(changed_at)  # NodeStatus holds finite times; a guard, never a crash
    if changed_at is None:
        return PodSummary(
            [], {p.name: p.delivered for p in pods}, all(p.ready for p in pods), [], mismatched=mismatched
        )
    cutoff = math.ceil(changed_at)
    old = sorted(p.name for p in pods if p.created < cutoff)
    new = [p for p in pods if p.created >= cutoff]
    stray = [p for p in new if not p.injected or (p.flag == "0" and p.transient)]
    unproved = sorted(p.name for p in new if p.flag == "0" and p.unproved and p not in stray)
    settled = [p for p in new if p not in stray and p.name not in unproved]
    refused = [f"{p.name}: {p.preflight_reason or 'no reason given'}" for p in settled if p.flag == "0"]
    retry = sorted(p.name for p in stray if p.ready)
    starting = sorted(p.name for p in stray if not p.ready)
    replaced = sum(1 for p in pods if p.created < cutoff and p.controlled)
    return PodSummary(
        old,
        {p.name: p.delivered for p in settled},
        all(p.ready for p in settled),
        refused,
        retry,
        starting,
        replaced,
        mismatched,
        unproved,
    )


# ---------------------------------------------------------------- the state machine


@dataclass(frozen=True)
class NodeStatus:
    """One node's durable record in the rollout's status (all the operator needs to resume)."""

    state: str = INELIGIBLE
    reason: str = ""
    since: float = 0.0
    fingerprint: str | None = None
    changed_at: float | None = None  # when the flag last changed: pods created before it restart
    holdout: bool = False
    numbers: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "reason": self.reason,
            "since": self.since,
            "fingerprint": self.fingerprint,
            "changedAt": self.changed_at,
            "holdout": self.holdout,
            "numbers": dict(self.numbers),
        }

    def record(self, rollout: str) -> dict[str, Any]:
        """The node's durable record (contract.ANNOTATION_NODE_RECORD), naming its rollout."""
        return {"rollout": rollout, **self.to_dict()}

    @classmethod
    def from_record(cls, record: NodeRecord) -> "NodeStatus":
        return cls(
            record.state,
            record.reason,
            finite_number(record.since) or 0.0,
            record.fingerprint,
            finite_number(record.changedAt),
            record.holdout,
            dict(record.numbers),
        )

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any] | None) -> "NodeStatus":
        """A node of the rollout's status (written before records were on nodes); loosely typed, so every
        field is checked: a wrong type reads as its default, never fails the reconcile."""
        raw = raw if isinstance(raw, Mapping) else {}
        state = raw.get("state") if raw.get("state") in contract.NODE_STATES else INELIGIBLE
        reason, fingerprint, numbers = raw.get("reason"), raw.get("fingerprint"), raw.get("numbers")
        return cls(
            state,
            reason if isinstance(reason, str) else "",
            finite_number(raw.get("since")) or 0.0,
            fingerprint if isinstance(fingerprint, str) else None,
            finite_number(raw.get("changedAt")),
            raw.get("holdout") is True,
            numbers if isinstance(numbers, Mapping) else {},
        )


@dataclass(frozen=True)
class Verdict:
    """The analysis verdict for a node (filled by the analysis; None means none yet)."""

    result: str  # "pass" | "fail" | "inconclusive"
    reason: str
    numbers: Mapping[str, Any] = field(default_factory=dict)
    now: str | None = None  # what keeps the judge from seeing now (Prometheus unreachable), while it lasts


@dataclass(frozen=True)
class Step:
    status: NodeStatus
    action: str | None = None  # "restart": restart the node's old pods; "rollback": record and restart


def move(prev: NodeStatus, state: str, reason: str, now: float, **changes: Any) -> NodeStatus:
    if state != prev.state and state in UNJUDGED_STATES and "numbers" not in changes:
        changes["numbers"] = {}  # an effect measured while the flag was on does not describe a node now off
    if "numbers" in changes:  # a verdict's numbers may hold NaN (0/0 in a judge): a record holds only finite ones
        changes["numbers"] = finite(changes["numbers"])
    if state == prev.state:
        return replace(prev, reason=reason, **changes)
    return replace(prev, state=state, reason=reason, since=now, **changes)


def advance(
    prev: NodeStatus,
    el: Eligibility,
    pods: PodSummary,
    verdict: Verdict | None,
    now: float,
    rollback_cleared: bool,
    recorded_rollback: RollbackRecord | None = None,
) -> Step:
    """Automatic transitions. Eligible -> Enabling is the planner's choice (plan.choose_enables).
    `recorded_rollback`: the node's rollback annotation when it still bars the node. A flag-on node that
    carries one was rolled back by a reconcile whose status write was lost (labels and record are written
    first, in one patch): the record, not the stale status, is the truth."""
    s = prev.state
    if s in FLAG_ON_STATES and recorded_rollback is not None and not rollback_cleared:
        return Step(
            move(
                prev,
                ROLLED_BACK,
                rollback_reason(recorded_rollback),
                now,
                changed_at=finite_number(recorded_rollback.at) or now,
                numbers=recorded_rollback.numbers,
            )
        )
    if s == ROLLED_BACK:
        if not rollback_cleared:
            return Step(move(prev, ROLLED_BACK, prev.reason, now, fingerprint=el.fingerprint))
        s = INELIGIBLE  # cleared by a new fingerprint, retryAfter or a person: judge afresh below
        prev = move(prev, INELIGIBLE, "rollback cleared", now)
    if s in FLAG_ON_STATES and pods.mismatched:
        return Step(
            move(
                prev,
                ROLLED_BACK,
                "flag delivery mismatch: " + "; ".join(pods.mismatched),
                now,
                changed_at=now,
                numbers={MISMATCH: pods.mismatched[:MISMATCH_CAP]},
            ),
            "rollback",
        )
    if not el.eligible:
        if s in FLAG_ON_STATES:
            return Step(
                move(
                    prev, DISABLED, f"turned ineligible: {el.reason}", now, changed_at=now, fingerprint=el.fingerprint
                ),
                "restart",
            )
        if s == DISABLED:
            return Step(move(prev, DISABLED, f"ineligible: {el.reason}", now, fingerprint=el.fingerprint))
        return Step(move(prev, INELIGIBLE, el.reason, now, fingerprint=el.fingerprint, holdout=False))
    if s in (INELIGIBLE, DISABLED):
        if s == DISABLED and pods.old:
            return Step(
                move(prev, DISABLED, f"eligible again; waiting for {len(pods.old)} pods to restart at flag 0", now)
            )
        return Step(move(prev, ELIGIBLE, el.reason, now, fingerprint=el.fingerprint))
    if s == ENABLING:
        if pods.refused:
            return Step(
                move(
                    prev,
                    ROLLED_BACK,
                    "the serving image's preflight chose 0: " + "; ".join(pods.refused),
                    now,
                    changed_at=now,
                    numbers={"refused": pods.refused},
                ),
                "rollback",
            )
        if (
            pods.old
        ):  # how many it will have, so that a moment with none (evicted, not yet replaced) is not taken for done
            had = max(
                pods.replaced + len(pods.new_flags) + len(pods.retry) + len(pods.starting),
                whole_count(prev.numbers.get(RESTARTED_PODS)),
            )
            return Step(
                move(
                    prev,
                    ENABLING,
                    f"restarting {len(pods.old)} serving pods",
                    now,
                    numbers={**prev.numbers, RESTARTED_PODS: had} if had else prev.numbers,
                )
            )
        if pods.retry:
            return Step(
                move(
                    prev,
                    ENABLING,
                    f"restarting {len(pods.retry)} serving pods not injected, refused by a stale agent view, "
                    "or whose image is proved by now",
                    now,
                )
            )
        if pods.unproved:  # their images' self-tests are on their way; they restart once proved
            return Step(
                move(
                    prev,
                    ENABLING,
                    f"waiting for the self-tests of the images of {len(pods.unproved)} serving pods "
                    f"(flag 0 until proved on this node): {', '.join(pods.unproved[:5])}",
                    now,
                )
            )
        if pods.starting:  # they run the template's flag, not 1: never Analyzing with them
            return Step(
                move(
                    prev,
                    ENABLING,
                    f"waiting for {len(pods.starting)} serving pods not injected or refused by a stale "
                    "agent view to start, to restart them",
                    now,
                )
            )
        if not pods.new_ready or any(flag not in ("1", None) for flag in pods.new_flags.values()):
            return Step(move(prev, ENABLING, "waiting for restarted pods to be ready with flag 1", now))
        unseen = sorted(name for name, flag in pods.new_flags.items() if flag is None)
        if unseen:  # its preflight chose 1; the agent has not yet read it in the serving processes
            return Step(
                move(
                    prev, ENABLING, f"waiting for the agent to see flag 1 in the processes of {', '.join(unseen)}", now
                )
            )
        restarted = whole_count(prev.numbers.get(RESTARTED_PODS))
        if restarted and not pods.new_flags:
            return Step(
                move(prev, ENABLING, f"waiting for the replacements of {restarted} restarted serving pods", now)
            )
        return Step(
            move(
                prev,
                ANALYZING,
                f"{len(pods.new_flags)} serving pods run with flag 1",
                now,
                numbers=without_restarted(prev.numbers),
            )
        )
    if s in (ANALYZING, PROMOTED) and verdict is not None:
        if verdict.result == "fail":
            return Step(
                move(prev, ROLLED_BACK, verdict.reason, now, changed_at=now, numbers=verdict.numbers), "rollback"
            )
        if verdict.result == "pass" and s == ANALYZING:
            judged = {**verdict.numbers, JUDGED_AT: verdict.numbers.get("at", now)}
            return Step(move(prev, PROMOTED, verdict.reason, now, numbers=judged))
        if s == PROMOTED:  # its reason stays the look that promoted it, and says what keeps the guard blind
            reason = with_now(prev.reason, verdict.now)
            return Step(move(prev, s, reason, now, numbers=guard_numbers(prev.numbers, verdict)))
        return Step(move(prev, s, verdict.reason, now, numbers=verdict.numbers))
    return Step(prev)


NOW = " | now: "  # a reason's part saying what is happening now, which the next reconcile says afresh


def with_now(reason: str, now: str | None) -> str:
    """`reason` with what is happening now put after it (or taken off, once nothing is)."""
    base = reason.split(NOW, 1)[0]
    return f"{base}{NOW}{now}" if now else base


def guard_numbers(judged: Mapping[str, Any], verdict: Verdict) -> dict[str, Any]:
    """A Promoted node's numbers after a guard-mode look: those of the look that promoted it stay as they were
    (its effect, with JUDGED_AT), so its number does not move while its reason stays fixed; the judge's working
    state moves on; what this look saw is kept apart, under "guard"."""
    kept = {k: v for k, v in judged.items() if k not in JUDGE_STATE and k != "guard"}
    working = {k: verdict.numbers[k] for k in JUDGE_STATE if k in verdict.numbers}
    seen = {k: verdict.numbers[k] for k in GUARD_KEYS if k in verdict.numbers}
    return {**kept, **working, "guard": {**seen, "result": verdict.result}}


def recorded_effect(numbers: Mapping[str, Any] | None) -> float | None:
    """The one effect a reader shows for a node: the judge's recorded effect in the node's record (for a
    Promoted node, that of the look that promoted it)."""
    effect = (numbers or {}).get("effect")
    return float(effect) if isinstance(effect, (int, float)) and math.isfinite(effect) else None


def effect_text(numbers: Mapping[str, Any] | None, missing: str = "-") -> str:
    """recorded_effect as every view prints it: x and three decimals."""
    effect = recorded_effect(numbers)
    return missing if effect is None else f"x{effect:.3f}"


def holdout_rank(name: str) -> str:
    """A stable pseudo-random order, so the control group does not follow node naming."""
    return hashlib.sha256(name.encode()).hexdigest()


def choose_holdouts(statuses: Mapping[str, NodeStatus], wanted: int, pending: Iterable[str] = ()) -> list[str]:
    """Eligible nodes to add to the control group until it has `wanted` members. `pending`: nodes that pass
    but still prove another serving config (their agents re-test for this one): they keep their place in
    the order, so the group does not go to whichever nodes proved first (it would follow the agents' timing)."""
    have = sum(1 for s in statuses.values() if s.holdout and s.state == ELIGIBLE)
    waiting = set(pending)
    pool = sorted(
        (n for n, s in statuses.items() if s.state == ELIGIBLE and not s.holdout or n in waiting), key=holdout_rank
    )
    return [n for n in pool[: max(0, wanted - have)] if n not in waiting]


def enable(prev: NodeStatus, now: float) -> Step:
    return Step(
        move(
            prev,
            ENABLING,
            "chosen by the rollout strategy",
            now,
            changed_at=now,
            numbers=without_restarted(prev.numbers),
        ),
        "restart",
    )


def without_restarted(numbers: Mapping[str, Any]) -> dict[str, Any]:
    """A record's numbers without RESTARTED_PODS: it counts one Enabling's restarts only."""
    return {k: v for k, v in numbers.items() if k != RESTARTED_PODS}


def restart_due(status: NodeStatus, now: float, delay: float) -> bool:
    """Pods restart after the node's label has had time to reach its agent, and never within the second of
    the change (see summarize_pods)."""
    changed_at = finite_number(status.changed_at)
    return changed_at is not None and now >= max(changed_at + delay, math.ceil(changed_at))


def node_labels(status: NodeStatus) -> dict[str, str]:
    return {
        contract.LABEL_ENABLED: "true" if status.state in FLAG_ON_STATES else "false",
        contract.LABEL_STATE: status.state,
    }


# ---------------------------------------------------------------- the rollout


def counts(statuses: Mapping[str, NodeStatus]) -> dict[str, int]:
    out = {state: 0 for state in contract.NODE_STATES}
    for s in statuses.values():
        out[s.state] += 1
    return out


def phase(statuses: Mapping[str, NodeStatus], paused: bool, aborted: bool, invalid: bool) -> str:
    if invalid:
        return "Invalid"
    if aborted:
        return "Aborted"
    if paused:
        return "Paused"
    c = counts(statuses)
    waiting = sum(1 for s in statuses.values() if s.state == ELIGIBLE and not s.holdout)
    if c[ENABLING] or c[ANALYZING] or waiting:
        return "Progressing"
    return "Complete" if c[PROMOTED] else "Idle"


def conditions(
    phase_name: str, statuses: Mapping[str, NodeStatus], invalid_message: str, now_iso: str
) -> list[dict[str, Any]]:
    c = counts(statuses)

    def cond(kind: str, true: bool, reason: str, message: str) -> dict[str, Any]:
        return {
            "type": kind,
            "status": "True" if true else "False",
            "reason": reason,
            "message": message,
            "lastTransitionTime": now_iso,
        }

    return [
        cond(
            "Ready",
            phase_name == "Complete",
            phase_name,
            f"{c[PROMOTED]} promoted, {c[ELIGIBLE]} eligible waiting or held out",
        ),
        cond(
            "Progressing", phase_name == "Progressing", phase_name, f"{c[ENABLING]} enabling, {c[ANALYZING]} analyzing"
        ),
        cond(
            "Degraded",
            phase_name == "Aborted" or c[ROLLED_BACK] > 0,
            "RolledBack" if c[ROLLED_BACK] else phase_name,
            f"{c[ROLLED_BACK]} rolled back, {c[DISABLED]} disabled",
        ),
        cond(
            "Invalid",
            bool(invalid_message),
            "InvalidSpec" if invalid_message else "Valid",
            invalid_message or "spec is valid",
        ),
    ]


MESSAGE_MAX = 300  # status.message, the CRD's MESSAGE column: one line


def rollout_message(status: Mapping[str, Any]) -> str:
    """status.message, shown in `kubectl get gluonrollouts`' MESSAGE column: why the rollout is where it is,
    the most pressing first (an invalid spec, an abort, a gate waiting for a person), else its counts."""
    approval = status.get("approval") or {}
    aborted = status.get("aborted") or {}
    c = status.get("counts") or {}
    if status.get("invalid"):
        text = str(status["invalid"])
    elif aborted:
        text = f"aborted: {aborted.get('reason') if isinstance(aborted, Mapping) else aborted}"
    elif approval.get("waitingFor"):
        text = f"waiting for approval of {approval['waitingFor']!r} (kubectl gluon promote)"
    else:
        text = ", ".join(f"{c[state]} {state}" for state in contract.NODE_STATES if c.get(state)) or "no nodes"
        if status.get("phase") == "DryRun":
            text = f"dry run, nothing changed: {text}"
    return text if len(text) <= MESSAGE_MAX else text[: MESSAGE_MAX - 3] + "..."


def merge_conditions(previous: Iterable[Mapping[str, Any]], fresh: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Keep a condition's lastTransitionTime unless its status changed (so an idle rollout writes nothing)."""
    before = {c.get("type"): c for c in previous or []}
    out = []
    for cond in fresh:
        old = before.get(cond["type"])
        if old and old.get("status") == cond["status"]:
            cond = dict(cond, lastTransitionTime=old.get("lastTransitionTime", cond["lastTransitionTime"]))
        out.append(cond)
    return out
