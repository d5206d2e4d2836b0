"""The reconcile as one pure function: `plan(rollout, world, verdicts, analysis, now) -> Plan`.

Input: the rollout (spec, annotations, prior status), the world as the caches see it (nodes with their
labels, annotations, `spec.unschedulable` and Ready condition; which agents run; the serving pods), the
analysis verdicts and the time. Output: the node writes (labels and annotations, one patch per node), the
pod restarts in order, the pod flag labels, the Events and the new status. Nothing here calls the API:
handlers.py gathers the world (world.py; its types are in world_types.py), calls this, and executor.py
carries the plan out in the safe order.

Durable state. Each node's record (state, reason, since, changedAt, fingerprint, holdout, numbers with
failStreak) lives on the Node in contract.ANNOTATION_NODE_RECORD, written in the same patch as its
`enabled` and `state` labels, so the status does not have to hold every node (etcd's request limit at
fleet scale, see `status_nodes`). A node's pods restart only when the record that says why is already on
the node as the caches see it (an earlier reconcile wrote it): an operator killed at any point resumes
without restarting a node twice. Records are rewritten only when a field that decides something changes
(state, since, changedAt, fingerprint, holdout, failStreak, inconclusiveSince): a reason that changes
wording costs no node write, so a state change costs one node write.

Per node, on top of the state machine of gating.py:
- skipped (label contract.LABEL_SKIP=true), or outside strategy.batches: ineligible; disabled if it was on.
- held: cordoned (spec.unschedulable) or NotReady. Not enabled, its pods never evicted or deleted, and it
  does not count against maxParallel (a held node never blocks the fleet). A flag-on held node keeps its
  state unless it turns ineligible (then Disabled, its pods left alone while held).
- owned by an older rollout whose node selector also matches it: left out of this rollout entirely (the
  Conflict condition names it), so two rollouts never fight over a label. An Invalid rollout owns no node
  (`claims_nodes`).

Rollout controls: spec.paused (enable nothing more), spec.dryRun (plan and report, write nothing to
nodes or pods), strategy.approval gates granted by the rollout annotation contract.ANNOTATION_ROLLOUT_APPROVE,
contract.ANNOTATION_ROLLOUT_ABORT (aborted while present), abort.maxFailedNodes per batch.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Mapping

from gluon_common import contract
from gluon_common.delivery import DeliveryReport

from . import delivery, disruption, gating, proving
from .gating import (
    DISABLED,
    ELIGIBLE,
    ENABLING,
    FLAG_ON_STATES,
    IN_PROGRESS,
    INELIGIBLE,
    PROMOTED,
    ROLLED_BACK,
    NodeStatus,
)
from .records import NodeRecord, dumps, finite, read_json
from .serving import PodServing, Resolution, describe, resolve_serving
from .spec import GluonRolloutSpec, parse_spec, resolve, selector_matches
from .world_types import ApiFacts, Claim, NodeView, PodView, World, iso, unix

FULL_STATUS_NODES = 500  # up to this many nodes, status.nodes lists every node (kubectl get -o yaml reads as before)
ATTENTION_CAP = 200  # beyond it, at most this many nodes needing attention; the rest are counted, and on their Nodes
DRY_RUN_CAP = 200  # entries of status.dryRun.plan
CONFLICT_NAMES = 20  # nodes named in the Conflict condition's message
FIRST_SIGHT_EVENTS = 10  # nodes new to the rollout, one Event each up to this many; beyond, one summary Event
FLEET = "fleet"  # the one batch without strategy.batches
CANARY_GATE = "canary"
DECIDING_NUMBERS = (
    "failStreak",
    "inconclusiveSince",
    gating.RESTARTED_PODS,
)  # record fields beside the state that the next reconcile reads


@dataclass(frozen=True)
class RolloutView:
    namespace: str
    name: str
    spec: Mapping[str, Any]
    status: Mapping[str, Any] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    generation: int | None = None
    created: float = 0.0

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def rollout_view(obj: Mapping[str, Any]) -> RolloutView:
    meta = obj.get("metadata") or {}
    return RolloutView(
        meta.get("namespace") or "",
        meta.get("name") or "",
        dict(obj.get("spec") or {}),
        dict(obj.get("status") or {}),
        dict(meta.get("annotations") or {}),
        meta.get("generation"),
        unix(meta.get("creationTimestamp")),
    )


def claim_of(view: RolloutView) -> Claim:
    return Claim(view.namespace, view.name, view.created, dict(view.spec.get("nodeSelector") or {}))


def claims_nodes(view: RolloutView) -> bool:
    """Whether the rollout claims the nodes its selector matches. An Invalid one plans no node, so it claims
    none (else a younger valid rollout would get Conflict on every node of the overlap): its spec does not
    parse, or its status says Invalid for this generation (what only the API server could tell, e.g. a pod
    selector it refuses)."""
    _, problems = parse_spec(dict(view.spec))
    return not problems and not (
        view.status.get("phase") == "Invalid" and view.status.get("observedGeneration") == view.generation
    )


def selects_node(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """An empty node selector means every node (unlike a pod selector)."""
    if not selector.get("matchLabels") and not selector.get("matchExpressions"):
        return True
    return selector_matches(selector, labels)


# ---------------------------------------------------------------- the plan, as plain data


@dataclass(frozen=True)
class NodeWrite:
    """One merge patch of a node's metadata (None removes a key). `starts`: it puts the node in progress
    (Enabling or Analyzing) from a state that is not, so it takes one of the strategy's slots."""

    node: str
    labels: Mapping[str, str | None]
    annotations: Mapping[str, str | None]
    starts: bool = False


@dataclass(frozen=True)
class Restart:
    """Restart these pods of one node, in order, stopping at the first a disruption budget blocks.
    why: "old" (they predate the node's persisted change) or "stray" (new, but not on the flag the node
    has: admitted without the webhook, refused by a stale agent view, or at 0 until its image was proved, which it
    is by now; the executor rate-limits these)."""

    namespace: str
    node: str
    pods: tuple[str, ...]
    why: str


@dataclass(frozen=True)
class PodLabel:
    namespace: str
    name: str
    flag: str


@dataclass(frozen=True)
class Event:
    type: str  # "Normal" | "Warning"
    reason: str
    message: str


@dataclass(frozen=True)
class Transition:
    node: str
    old: str | None
    new: str
    rollback: str | None = None  # "preflight" | "analysis" when this transition rolled the node back


@dataclass
class Plan:
    dry_run: bool = False
    node_writes: list[NodeWrite] = field(default_factory=list)
    restarts: list[Restart] = field(default_factory=list)
    pod_labels: list[PodLabel] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    status: dict[str, Any] = field(default_factory=dict)  # the status keys to write (None removes one)
    statuses: dict[str, NodeStatus] = field(default_factory=dict)  # every node's new record (analysis, metrics)
    transitions: list[Transition] = field(default_factory=list)
    spec: GluonRolloutSpec | None = None
    no_safe_rollback: list[str] = field(default_factory=list)  # nodes where flag 0 has no working route
    delivery_mode: delivery.Mode | None = None  # how the flag reaches this rollout's pods now
    agent_loss: disruption.AgentLoss | None = None  # its flag-on nodes whose agents are gone
    restart_turns: set[str] | None = None  # nodes whose old pods may be restarted now (None: every node)
    delivery_counts: dict[str, int] = field(default_factory=dict)  # its serving pods by delivery state
    proving: list[proving.Demand] = field(default_factory=list)  # (node, image, configuration) to be proved
    # rollout annotations to remove once the status is written, each only while it still has this value:
    # an approve annotation an abort revoked (else it would grant its gate again after the abort is lifted)
    spent_annotations: dict[str, str] = field(default_factory=dict)

    def writes(self) -> int:
        """Writes to nodes and pods this plan asks for (a dry run's is 0)."""
        return len(self.node_writes) + sum(len(r.pods) for r in self.restarts) + len(self.pod_labels)

    def to_dict(self) -> dict[str, Any]:
        return {
            "dryRun": self.dry_run,
            "nodeWrites": [asdict(w) for w in self.node_writes],
            "restarts": [asdict(r) for r in self.restarts],
            "podLabels": [asdict(p) for p in self.pod_labels],
            "events": [asdict(e) for e in self.events],
            "transitions": [asdict(t) for t in self.transitions],
            "status": self.status,
            "spentAnnotations": self.spent_annotations,
        }


# ---------------------------------------------------------------- the reconcile


@dataclass
class NodeWork:
    """One node's working set during a plan."""

    view: NodeView
    batch: str | None  # None: outside strategy.batches
    prior: NodeStatus
    recorded: NodeStatus | None  # what the node's own record says (None: no record of this rollout)
    pods: list[PodView]
    summary: gating.PodSummary
    held: str | None  # why the node is held (cordoned, NotReady), or None
    status: NodeStatus
    action: str | None = None
    known: bool = True  # False: the node is new to this rollout (no record, no status entry)
    no_safe_rollback: bool = False  # flag 0 has no working route for the rollout's serving configuration here
    proof_pending: bool = False  # passing, but its agent still re-tests for the rollout's serving configuration
    delivery: delivery.NodeDelivery = field(default_factory=lambda: delivery.NodeDelivery({}))
    agent_kept: bool = False  # flag-on, its agent gone, kept (disruption.AgentLoss): a restart would get 0


def plan(
    rollout: RolloutView,
    world: World,
    verdicts: Mapping[str, gating.Verdict],
    analysis: Mapping[str, Any] | None,
    now: float,
) -> Plan:
    spec, problems = parse_spec(dict(rollout.spec))
    if problems or spec is None:
        return invalid_plan(rollout, "; ".join(problems), now)
    out = Plan(dry_run=spec.dryRun, spec=spec)
    owned, conflicts = claimed_nodes(rollout, spec, world)
    serving = rollout_serving(rollout, spec, world)
    pods = {name: rollout_pods(rollout, spec, world, name) for name in owned}
    deliveries = {name: delivery.node_delivery(pods[name], delivery_report(world.nodes[name])) for name in owned}
    mode = delivery_mode(rollout, world, owned, pods, deliveries)
    out.delivery_mode = mode
    states = {name: prior_status(rollout, world.nodes[name], now)[0].state for name in owned}
    out.agent_loss = disruption.agent_loss(
        [n for n, s in states.items() if s in FLAG_ON_STATES],
        world.agents,
        world.agents_lost_since,
        spec.strategy,
        now,
        rollout.status.get("agentLoss"),
    )
    work = {
        name: node_work(
            rollout,
            spec,
            world,
            world.nodes[name],
            verdicts.get(name),
            now,
            serving,
            pods[name],
            deliveries[name],
            mode,
            out.agent_loss,
        )
        for name in owned
    }
    out.no_safe_rollback = sorted(n for n, w in work.items() if w.no_safe_rollback)
    if world.proving:
        out.proving = proving_demands(rollout, spec, world, owned, serving)

    aborted = abort_record(rollout, spec, work)
    if aborted:
        for w in work.values():
            if w.status.state in FLAG_ON_STATES:
                w.status = gating.move(w.status, DISABLED, f"rollout aborted: {aborted['reason']}", now, changed_at=now)
                w.action = "restart"
    statuses = {n: w.status for n, w in work.items()}
    pending = [n for n, w in work.items() if w.proof_pending and not w.held]
    for name in gating.choose_holdouts(
        {n: s for n, s in statuses.items() if not work[n].held}, spec.strategy.holdoutNodes, pending
    ):
        work[name].status = replace(work[name].status, holdout=True, reason="holdout: control group kept at flag 0")
    approval = approvals(rollout, spec, now)
    if aborted:
        out.spent_annotations, revoked = revoke_approvals(rollout, approval)
        if revoked:
            out.events.append(
                Event("Normal", "ApprovalsRevoked", f"the abort revokes the gates granted before: {', '.join(revoked)}")
            )
    chosen, waiting = choose_enables(spec, work, approval, bool(aborted))
    for name in chosen:
        step = gating.enable(work[name].status, now)
        work[name].status, work[name].action = step.status, step.action
    approval["waitingFor"] = waiting
    out.statuses = {n: w.status for n, w in sorted(work.items())}

    out.restart_turns = restart_turns(work, spec, now)
    for name, w in sorted(work.items()):
        node_plan(rollout, spec, w, now, out, serving)
    out.events[:0] = first_sight_events(out)
    out.events += serving_events(rollout, serving, out.no_safe_rollback)
    out.events += delivery_events(rollout, mode, work)
    out.events += agent_loss_events(rollout, out.agent_loss)
    # Writes that free a slot before those that take one: an operator stopped between two writes, or a
    # write that fails, never leaves more nodes in progress than the strategy allows.
    out.node_writes.sort(key=lambda write: write.starts)
    for gate in granted_gates(approval)[len(approval["_before"]) :]:
        out.events.append(
            Event(
                "Normal",
                "Approved",
                f"approval gate {gate!r} granted by annotation {contract.ANNOTATION_ROLLOUT_APPROVE}",
            )
        )
    if aborted and not rollout.status.get("aborted"):
        out.events.append(Event("Warning", "Aborted", aborted["reason"][:1000]))
    out.status = finite(
        rollout_status(rollout, spec, out, work, aborted, approval, conflicts, analysis, now, serving, world.api)
    )  # JSON has no NaN
    if spec.dryRun:
        dry_run_only(rollout, out)
    return out


def invalid_before_world(rollout: RolloutView, refused_selector: str | None, now: float) -> Plan | None:
    """The plan of a rollout that needs no world because it is Invalid: its spec does not parse, or the API
    server refused to list pods by its pod selector (`refused_selector`: what it said). Planned before any
    cache is waited for, as the pod cache of such a selector never fills: the rollout would stall silently.
    None for a rollout to plan with `plan`."""
    _, problems = parse_spec(dict(rollout.spec))
    if refused_selector:
        problems = [*problems, f"spec.podSelector: the API server refuses it as a label selector: {refused_selector}"]
    return invalid_plan(rollout, "; ".join(problems), now) if problems else None


def invalid_plan(rollout: RolloutView, message: str, now: float) -> Plan:
    out = Plan()
    status = rollout.status
    if status.get("phase") != "Invalid" or status.get("invalid") != message:
        out.events.append(Event("Warning", "InvalidSpec", message[:1000]))
    out.status = {
        "phase": "Invalid",
        "invalid": message,
        "message": gating.rollout_message({"invalid": message}),
        "observedGeneration": rollout.generation,
        "conditions": gating.merge_conditions(
            status.get("conditions") or [], gating.conditions("Invalid", {}, message, iso(now))
        ),
    }
    return out


def claimed_nodes(rollout: RolloutView, spec: GluonRolloutSpec, world: World) -> tuple[list[str], list[str]]:
    """(the nodes this rollout owns, the nodes in its selector that an older rollout owns). Older: created
    first, then by namespace/name, so every rollout computes the same owner and no label ever flaps."""
    selector = spec.nodeSelector.model_dump()
    me = (rollout.created, rollout.namespace, rollout.name)
    elders = [c for c in world.rollouts if (c.created, c.namespace, c.name) < me]
    owned, conflicts = [], []
    for name in sorted(world.nodes):
        labels = world.nodes[name].labels
        if not selects_node(selector, labels):
            continue
        (conflicts if any(selects_node(c.node_selector, labels) for c in elders) else owned).append(name)
    return owned, conflicts


def recorded_status(rollout: RolloutView, view: NodeView) -> tuple[NodeStatus | None, str | None]:
    """This rollout's record on the node (None when absent, another rollout's, or unreadable: why)."""
    record, problem = read_json(
        NodeRecord, view.annotations.get(contract.ANNOTATION_NODE_RECORD), "the node record annotation"
    )
    if record is None or record.rollout != rollout.key:
        return None, problem
    return NodeStatus.from_record(record), None


def held_reason(view: NodeView) -> str | None:
    if view.unschedulable:
        return "cordoned (spec.unschedulable): not enabled, its pods left alone"
    if view.ready is False:
        return "NotReady: not enabled, its pods left alone"
    return None


def batch_of(spec: GluonRolloutSpec, view: NodeView) -> str | None:
    batches = spec.strategy.batches
    if batches is None:
        return FLEET
    value = view.labels.get(batches.nodeLabel)
    return value if value in batches.order else None


def rollout_serving(rollout: RolloutView, spec: GluonRolloutSpec, world: World) -> Resolution:
    """The serving configuration of every pod the rollout selects (on any node), with spec.serving."""
    selector = spec.podSelector.model_dump()
    pods = [
        (p.name, p.serving or PodServing())
        for (namespace, _), views in world.pods.items()
        if namespace == rollout.namespace
        for p in views
        if not p.deleting and selector_matches(selector, p.labels)
    ]
    return resolve_serving(pods, spec.serving.model_dump())


def prior_status(rollout: RolloutView, view: NodeView, now: float) -> tuple[NodeStatus, NodeStatus | None, bool]:
    """(the node's state before this reconcile, its own record of this rollout, whether the rollout knew it):
    the record on the node, else a status written before records were on nodes, else new (Ineligible)."""
    recorded, _ = recorded_status(rollout, view)
    fallback = (rollout.status.get("nodes") or {}).get(view.name)
    if recorded is not None:
        return recorded, recorded, True
    if isinstance(fallback, Mapping) and not fallback.get("dryRun"):
        return NodeStatus.from_dict(fallback), None, True
    return NodeStatus(since=now), None, False


def rollout_pods(rollout: RolloutView, spec: GluonRolloutSpec, world: World, node: str) -> list[PodView]:
    """The rollout's serving pods on this node."""
    selector = spec.podSelector.model_dump()
    return [p for p in world.pods.get((rollout.namespace, node), ()) if selector_matches(selector, p.labels)]


def proving_demands(
    rollout: RolloutView, spec: GluonRolloutSpec, world: World, owned: list[str], serving: Resolution
) -> list[proving.Demand]:
    """The images this rollout's serving pods run, to be proved with its serving configuration on each of its
    nodes that can run a self-test now: a live agent, ready, schedulable, not skipped by a person."""
    if serving.config is None:
        return []  # nothing to prove until the configuration is resolved
    selector = spec.podSelector.model_dump()
    served = [
        proving.ServedImage(pod.node, pod.image_digest, pod.image_pinned, pod.created)
        for (namespace, _), pods in world.pods.items()
        if namespace == rollout.namespace
        for pod in pods
        if pod.image_digest and selector_matches(selector, pod.labels)
    ]
    nodes = [
        name
        for name in owned
        if world.agents.get(name)
        and world.nodes[name].ready is not False
        and not world.nodes[name].unschedulable
        and world.nodes[name].labels.get(contract.LABEL_SKIP) != "true"
    ]
    requests = {name: world.nodes[name].annotations.get(contract.ANNOTATION_SELFTEST_REQUEST) for name in nodes}
    return proving.demands(nodes, served, serving.config.digest, dumps(serving.config.as_dict()), requests)


def proved_images(view: NodeView, serving: Resolution | None) -> set[str]:
    """The image digests this node holds a passing proof of, for the rollout's serving configuration."""
    if serving is None or serving.config is None:
        return set()
    proofs, _ = proving.read_proofs(view.annotations.get(contract.ANNOTATION_PROOFS))
    return {p.digest for p in proofs.proofs if p.serving == serving.config.digest and p.result == "pass"}


def delivery_report(view: NodeView) -> DeliveryReport | None:
    """The node's delivery observation (its agent's annotation); None when absent or unreadable."""
    report, _ = read_json(DeliveryReport, view.annotations.get(contract.ANNOTATION_DELIVERY), "the delivery annotation")
    return report


def delivery_mode(
    rollout: RolloutView,
    world: World,
    owned: list[str],
    pods: Mapping[str, list[PodView]],
    deliveries: Mapping[str, delivery.NodeDelivery],
) -> delivery.Mode:
    """How the flag reaches the rollout's pods now: the chart's mode, the API server's acceptance of fileKeyRef,
    its nodes' kubelets, and the nodes seen ignoring fileKeyRef (remembered in status.delivery.ignoredBy while
    their kubelet's version stays the same)."""
    kubelets = {name: world.nodes[name].kubelet_version for name in owned}
    before = (rollout.status.get("delivery") or {}).get("ignoredBy") or {}
    ignored = (
        {n: v for n, v in before.items() if isinstance(n, str) and isinstance(v, str)}
        if isinstance(before, Mapping)
        else {}
    )
    for name, found in deliveries.items():
        if found.ignores_file_key_ref and kubelets.get(name):
            ignored[name] = kubelets[name]  # type: ignore[assignment]
    commandless = [p.name for name in owned for p in pods[name] if p.injected and not p.has_command and not p.deleting]
    return delivery.resolve_mode(world.injection_mode, world.api, kubelets, ignored, commandless)


def delivery_eligibility(
    el: gating.Eligibility, view: NodeView, prior: NodeStatus, found: delivery.NodeDelivery, mode: delivery.Mode
) -> gating.Eligibility:
    """An eligible node is not, where its serving pods cannot get the flag or were seen running another one;
    a flag-on node keeps its state while its agent merely cannot observe (a mismatch seen rolls it back)."""
    if not el.eligible:
        return el
    flag_on = prior.state in FLAG_ON_STATES
    refused = mode.undeliverable or mode.refuses(view.name, view.kubelet_version)
    if refused:
        return gating.Eligibility(False, f"flag delivery: {refused}", el.fingerprint)
    if found.unavailable and not flag_on:
        return gating.Eligibility(False, found.unavailable, el.fingerprint)
    unsafe = found.unsafe()
    if unsafe and not flag_on:
        return gating.Eligibility(False, "flag delivery mismatch: " + "; ".join(unsafe), el.fingerprint)
    return el


def serving_expectation(serving: Resolution) -> Any:
    """What gating.eligibility checks a node against: the config, or why there is none."""
    return serving.config if serving.config is not None else serving.problem


def node_work(
    rollout: RolloutView,
    spec: GluonRolloutSpec,
    world: World,
    view: NodeView,
    verdict: gating.Verdict | None,
    now: float,
    serving: Resolution | None = None,
    pods: list[PodView] | None = None,
    found: delivery.NodeDelivery | None = None,
    mode: delivery.Mode | None = None,
    loss: disruption.AgentLoss | None = None,
) -> NodeWork:
    prior, recorded, known = prior_status(rollout, view, now)
    retry = spec.analysis.retryAfterSeconds
    expected = serving_expectation(serving) if serving is not None else None
    facts = gating.NodeFacts(view.name, view.labels, view.annotations, bool(world.agents.get(view.name)))
    el = gating.eligibility(facts, now, retry, expected)
    kept = loss.keeps(view.name) if loss is not None and el.agent_lost and prior.state in FLAG_ON_STATES else None
    if kept:  # judged on the rest of what it published; only the lost agent is forgiven
        rest = gating.eligibility(replace(facts, agent_alive=True), now, retry, expected)
        el = gating.Eligibility(True, f"kept as it is: {kept}", rest.fingerprint) if rest.eligible else rest
    no_safe_rollback, proof_pending = el.no_safe_rollback, el.proof_pending
    if (
        not el.eligible
        and prior.state in FLAG_ON_STATES
        and (el.no_safe_rollback or serving is not None and serving.config is None)
    ):
        # Turning it off would restart its pods at a flag that cannot serve (or at a config nobody resolved):
        # it keeps its state, and the condition and Events say so.
        el = gating.Eligibility(True, f"kept as it is: {el.reason}", el.fingerprint, el.no_safe_rollback)
    rollback, _ = gating.parse_rollback(view.annotations)
    cleared = gating.rolled_back_for(rollback, el.fingerprint, now, retry) is None
    batch, held = batch_of(spec, view), held_reason(view)
    if el.eligible and batch is None:
        el = gating.Eligibility(
            False,
            f"outside strategy.batches: node label {spec.strategy.batches.nodeLabel!r} is "  # type: ignore[union-attr]
            f"{view.labels.get(spec.strategy.batches.nodeLabel)!r}, not in its order",
            el.fingerprint,
        )  # type: ignore[union-attr]
    if el.eligible and held and prior.state not in FLAG_ON_STATES:
        el = gating.Eligibility(False, held, el.fingerprint)
    pods = rollout_pods(rollout, spec, world, view.name) if pods is None else pods
    found = found if found is not None else delivery.node_delivery(pods, delivery_report(view))
    mode = mode or delivery.resolve_mode(world.injection_mode, world.api, {view.name: view.kubelet_version}, {})
    el = delivery_eligibility(el, view, prior, found, mode)
    proved = proved_images(view, serving)
    facts = [p.facts(found.delivered(p.name), found.mismatch(p.name), p.image_digest in proved) for p in pods]
    summary = gating.summarize_pods(facts, prior.changed_at)
    step = gating.advance(prior, el, summary, verdict, now, cleared, None if cleared else rollback)
    status = step.status
    if status.state in FLAG_ON_STATES:  # what is happening now, beside the reason its state was reached for
        blind = verdict.now if verdict else None  # an Analyzing node's inconclusive reason says it already
        blind = None if blind and blind in status.reason.split(gating.NOW)[0] else blind
        notes = [f"{held.split(':')[0]}: its pods left alone" if held else None, kept, blind]
        status = replace(status, reason=gating.with_now(status.reason, "; ".join(n for n in notes if n) or None))
    return NodeWork(
        view,
        batch,
        prior,
        recorded,
        pods,
        summary,
        held,
        status,
        step.action,
        known,
        no_safe_rollback,
        proof_pending,
        found,
        agent_kept=bool(kept),
    )


def abort_record(rollout: RolloutView, spec: GluonRolloutSpec, work: Mapping[str, NodeWork]) -> dict[str, Any] | None:
    """A person's abort (the annotation, while present), or too many rollbacks in one batch (kept until a
    person edits the spec: a new generation re-arms the rollout)."""
    by_person = rollout.annotations.get(contract.ANNOTATION_ROLLOUT_ABORT)
    if by_person is not None:
        return {
            "reason": f"{contract.ANNOTATION_ROLLOUT_ABORT}: {by_person or 'no reason given'}",
            "byAnnotation": True,
        }
    previous = rollout.status.get("aborted")
    if previous and not previous.get("byAnnotation") and previous.get("generation") == rollout.generation:
        return dict(previous)
    for batch, members in batches(work).items():
        failed = sum(1 for w in members if w.status.state == ROLLED_BACK)
        limit = resolve(spec.abort.maxFailedNodes, len(members), round_up=False)
        if failed > limit:
            where = "" if batch == FLEET else f"batch {batch}: "
            return {
                "generation": rollout.generation,
                "reason": f"{where}{failed} nodes rolled back > maxFailedNodes {limit}",
            }
    return None


def batches(work: Mapping[str, NodeWork]) -> dict[str, list[NodeWork]]:
    out: dict[str, list[NodeWork]] = {}
    for w in work.values():
        if w.batch is not None:
            out.setdefault(w.batch, []).append(w)
    return out


def approvals(rollout: RolloutView, spec: GluonRolloutSpec, now: float) -> dict[str, Any]:
    """status.approval: the mode, the gate waited for, the gates granted (gate, at). Keys with a leading
    underscore are working state, not written."""
    previous = rollout.status.get("approval") or {}
    granted = [
        dict(g) for g in previous.get("granted") or [] if isinstance(g, Mapping) and isinstance(g.get("gate"), str)
    ]
    return {
        "mode": spec.strategy.approval,
        "waitingFor": None,
        "granted": granted,
        "_before": list(granted),
        "_asked": rollout.annotations.get(contract.ANNOTATION_ROLLOUT_APPROVE),
        "_now": now,
    }


def revoke_approvals(rollout: RolloutView, approval: dict[str, Any]) -> tuple[dict[str, str], list[str]]:
    """An abort revokes every grant: a resumed rollout starts over from its canaries and waits at each gate
    for a new grant. The approve annotation present now is spent (the executor removes it), so it cannot
    grant a gate again once the abort is lifted. Returns (the annotations spent, the gates revoked)."""
    revoked = granted_gates(approval)
    approval["granted"], approval["_before"], asked = [], [], approval["_asked"]
    approval["_asked"] = None
    return ({contract.ANNOTATION_ROLLOUT_APPROVE: asked} if asked is not None else {}), revoked


def granted_gates(approval: Mapping[str, Any]) -> list[str]:
    return [g["gate"] for g in approval["granted"]]


def gate_open(approval: dict[str, Any], gate: str) -> bool:
    """Granted before, or granted now by the approve annotation naming exactly this gate."""
    if any(g["gate"] == gate for g in approval["granted"]):
        return True
    if approval["_asked"] == gate:
        approval["granted"] = [*approval["granted"], {"gate": gate, "at": iso(approval["_now"])}]
        return True
    return False


def choose_enables(
    spec: GluonRolloutSpec, work: Mapping[str, NodeWork], approval: dict[str, Any], aborted: bool
) -> tuple[list[str], str | None]:
    """Batch by batch in order, each with its own canaries: at most canaryNodes until they are promoted,
    then at most maxParallel in progress; a batch starts when the one before has nothing left to do.
    Held nodes neither count nor get chosen. Returns (nodes to enable, the approval gate waited for).
    Paused: nothing is enabled, but the gate waited for is still named (and a promote then recorded), so a
    person may approve while paused and the grant takes effect on resume."""
    if aborted:
        return [], None
    chosen, gate = enables_by_strategy(spec, work, approval)
    return ([] if spec.paused else chosen), gate


def enables_by_strategy(
    spec: GluonRolloutSpec, work: Mapping[str, NodeWork], approval: dict[str, Any]
) -> tuple[list[str], str | None]:
    by_batch = batches(work)
    order = spec.strategy.batches.order if spec.strategy.batches else [FLEET]
    mode = spec.strategy.approval
    for i, batch in enumerate(order):
        members = by_batch.get(batch, [])
        active = [w for w in members if not w.held]
        in_progress = sum(1 for w in active if w.status.state in IN_PROGRESS)
        candidates = sorted(w.view.name for w in active if w.status.state == ELIGIBLE and not w.status.holdout)
        if not candidates and not in_progress:
            continue  # done (or nothing to do): the next batch may start
        if i > 0 and mode == "EachBatch" and not gate_open(approval, f"batch/{batch}"):
            return [], f"batch/{batch}"
        promoted = sum(1 for w in members if w.status.state == PROMOTED)
        canaries = resolve(spec.strategy.canaryNodes, len(members), round_up=True)
        if promoted < canaries:
            limit = canaries - promoted - in_progress
        # The gate is asked whenever the batch is past its canaries, candidates or not: nodes past them in
        # progress record a grant whose status write was lost.
        elif i == 0 and mode != "Automatic" and not gate_open(approval, CANARY_GATE) and candidates:
            return [], CANARY_GATE
        else:
            limit = max(1, resolve(spec.strategy.maxParallel, len(members), round_up=True)) - in_progress
        return candidates[: max(0, limit)], None
    return [], None


def deciding_fields(status: NodeStatus | None) -> tuple[Any, ...] | None:
    """The record's fields that decide something (a change is worth a node write)."""
    if status is None:
        return None
    return (
        status.state,
        status.since,
        status.changed_at,
        status.fingerprint,
        status.holdout,
        *(status.numbers.get(k) for k in DECIDING_NUMBERS),
    )


def serving_annotation(serving: Resolution | None) -> str | None:
    """contract.ANNOTATION_SERVING_CONFIG's value, or None while the configuration is unresolved (then the
    nodes keep the one they have)."""
    return dumps(serving.config.as_dict()) if serving is not None and serving.config is not None else None


def node_plan(
    rollout: RolloutView, spec: GluonRolloutSpec, w: NodeWork, now: float, out: Plan, serving: Resolution | None = None
) -> None:
    """This node's write, restarts, pod labels and Event."""
    name, new, view = w.view.name, w.status, w.view
    labels = gating.node_labels(new)
    annotations: dict[str, str | None] = {}
    wanted = serving_annotation(serving)
    if wanted is not None and view.annotations.get(contract.ANNOTATION_SERVING_CONFIG) != wanted:
        annotations[contract.ANNOTATION_SERVING_CONFIG] = wanted
    if w.action == "rollback":
        annotations[contract.ANNOTATION_ROLLBACK] = dumps(
            {
                "rollout": rollout.name,
                "fingerprint": new.fingerprint,
                "at": new.since,
                "reason": new.reason,
                "numbers": dict(new.numbers),
            }
        )
    if deciding_fields(w.recorded) != deciding_fields(new) or contract.ANNOTATION_ROLLBACK in annotations:
        annotations[contract.ANNOTATION_NODE_RECORD] = dumps(new.record(rollout.key))
    if annotations or any(view.labels.get(k) != v for k, v in labels.items()):
        starts = new.state in IN_PROGRESS and (w.recorded is None or w.recorded.state not in IN_PROGRESS)
        out.node_writes.append(NodeWrite(name, labels, annotations, starts))

    restarting = may_restart(w, spec)
    if old_restart_due(w, spec, now) and (out.restart_turns is None or name in out.restart_turns):
        out.restarts.append(Restart(rollout.namespace, name, tuple(w.summary.old), "old"))
    if restarting and new.state in FLAG_ON_STATES and w.summary.retry:
        out.restarts.append(Restart(rollout.namespace, name, tuple(w.summary.retry), "stray"))
    fixable = delivery.to_restart(w.pods, w.delivery, out.delivery_mode) if out.delivery_mode else []
    if fixable and not w.held and spec.strategy.restart != "None":
        out.restarts.append(Restart(rollout.namespace, name, tuple(fixable), "delivery"))
    for pod in w.pods:
        flag = w.delivery.delivered(pod.name)  # what its processes were seen to run: what the judge splits by
        if flag is not None and pod.labels.get(contract.LABEL_POD_FLAG) != flag:
            out.pod_labels.append(PodLabel(pod.namespace, pod.name, flag))

    old = w.prior if w.known else None
    if old is None or old.state != new.state:
        kind = rollback_kind(new.numbers) if w.action == "rollback" else None
        out.transitions.append(Transition(name, old.state if old else None, new.state, kind))
        if old is None and new.state in (ELIGIBLE, INELIGIBLE):
            return  # first sight: first_sight_events tells of these
        out.events.append(node_event(name, old.state if old else "new", new))


RESTART_STATES = (ENABLING, DISABLED, ROLLED_BACK)


def may_restart(w: NodeWork, spec: GluonRolloutSpec) -> bool:
    """Restarts only against a change the node's own record already carries (written by an earlier
    reconcile), never on a held node, never with restart None, never on a flag-on node kept while its agent
    is gone (each replacement's preflight would find no agent and get 0: churn for nothing)."""
    new = w.status
    persisted = w.recorded is not None and w.recorded.state == new.state and w.recorded.changed_at == new.changed_at
    return persisted and not w.held and not w.agent_kept and spec.strategy.restart != "None"


def old_restart_due(w: NodeWork, spec: GluonRolloutSpec, now: float) -> bool:
    """Its pods from before its flag changed are due a restart now."""
    return (
        may_restart(w, spec)
        and w.status.state in RESTART_STATES
        and gating.restart_due(w.status, now, spec.strategy.restartDelaySeconds)
        and bool(w.summary.old)
    )


def restart_turns(work: Mapping[str, NodeWork], spec: GluonRolloutSpec, now: float) -> set[str]:
    """The nodes whose old pods may be restarted this reconcile (disruption.restart_turns): a node has begun
    once any of its pods is a replacement; a node whose replacements are not ready yet is still restarting."""
    candidates, busy = [], []
    for name, w in work.items():
        if w.status.state not in RESTART_STATES or w.status.changed_at is None:
            continue
        begun = bool(w.summary.new_flags or w.summary.retry or w.summary.starting)
        if old_restart_due(w, spec, now):
            candidates.append(disruption.RestartCandidate(name, w.status.state, begun))
        elif begun and not w.summary.new_ready:
            busy.append(name)
    return disruption.restart_turns(candidates, busy, disruption.restart_limit(spec.strategy, len(work)))


def rollback_kind(numbers: Mapping[str, Any]) -> str:
    """What rolled a node back, for gluon_rollout_rollbacks_total: its preflight, its delivery, or the judge."""
    if "refused" in numbers:
        return "preflight"
    return "delivery" if gating.MISMATCH in numbers else "analysis"


def node_event(name: str, old: str, new: NodeStatus) -> Event:
    warn = new.state in (ROLLED_BACK, DISABLED)
    return Event("Warning" if warn else "Normal", new.state, f"node {name}: {old} -> {new.state}: {new.reason}"[:1000])


def first_sight_events(out: Plan) -> list[Event]:
    """Nodes the rollout meets for the first time and finds Eligible or Ineligible: an Event each for a
    few; for a fleet, one Event with the counts and the commonest reasons (one object's Events at fleet
    scale would be thousands of writes, and client-go's own recorder would drop all but a burst of them)."""
    seen = [t.node for t in out.transitions if t.old is None and t.new in (ELIGIBLE, INELIGIBLE)]
    if len(seen) <= FIRST_SIGHT_EVENTS:
        return [node_event(node, "new", out.statuses[node]) for node in seen]
    states = Counter(out.statuses[node].state for node in seen)
    reasons = Counter(out.statuses[node].reason for node in seen if out.statuses[node].state == INELIGIBLE)
    message = (
        f"{len(seen)} nodes new to this rollout: "
        + ", ".join(f"{count} {state}" for state, count in sorted(states.items()))
        + (
            "; commonest reasons for Ineligible: "
            + "; ".join(f"{count} x {reason}" for reason, count in reasons.most_common(3))
            if reasons
            else ""
        )
    )
    return [Event("Normal", "NodesSeen", message[:1000])]


def needs_attention(status: NodeStatus) -> bool:
    return status.state not in (PROMOTED, INELIGIBLE)


def status_nodes(statuses: Mapping[str, NodeStatus], dry_run: bool) -> tuple[dict[str, Any], int]:
    """(status.nodes, how many left out). Every node up to FULL_STATUS_NODES; beyond, only those needing
    attention (not Promoted, not steadily Ineligible), at most ATTENTION_CAP: each node's full record is
    on the Node (contract.ANNOTATION_NODE_RECORD) either way."""

    def entry(s: NodeStatus) -> dict[str, Any]:
        return {**s.to_dict(), "dryRun": True} if dry_run else s.to_dict()

    if len(statuses) <= FULL_STATUS_NODES:
        return {n: entry(s) for n, s in sorted(statuses.items())}, 0
    chosen = sorted(n for n, s in statuses.items() if needs_attention(s))[:ATTENTION_CAP]
    return {n: entry(statuses[n]) for n in chosen}, len(statuses) - len(chosen)


def rollout_status(
    rollout: RolloutView,
    spec: GluonRolloutSpec,
    out: Plan,
    work: Mapping[str, NodeWork],
    aborted: dict[str, Any] | None,
    approval: dict[str, Any],
    conflicts: list[str],
    analysis: Mapping[str, Any] | None,
    now: float,
    serving: Resolution | None = None,
    api: ApiFacts | None = None,
) -> dict[str, Any]:
    statuses = out.statuses
    phase = gating.phase(statuses, spec.paused, bool(aborted), False)
    if approval["waitingFor"] and phase in ("Progressing", "Idle"):
        phase = "AwaitingApproval"
    if spec.dryRun:
        phase = "DryRun"
    fresh = gating.conditions(phase, statuses, "", iso(now))
    if conflicts or any(c.get("type") == "Conflict" for c in rollout.status.get("conditions") or []):
        fresh.append(conflict_condition(conflicts, iso(now)))  # present once a conflict was seen
    if serving is not None:
        fresh += serving_conditions(serving, out.no_safe_rollback, iso(now))
    delivered = delivery_status(out, work, api or ApiFacts())
    if out.delivery_mode is not None:
        fresh += delivery_conditions(out.delivery_mode, delivered, iso(now))
    if out.agent_loss is not None:
        fresh.append(agent_loss_condition(out.agent_loss, iso(now)))
    nodes, omitted = status_nodes(statuses, spec.dryRun)
    status = {
        "phase": phase,
        "counts": gating.counts(statuses),
        "nodes": nodes,
        "nodesOmitted": omitted or None,
        "observedGeneration": rollout.generation,
        "invalid": None,
        "aborted": aborted,
        "analysis": analysis if analysis is not None else rollout.status.get("analysis"),
        "approval": {k: v for k, v in approval.items() if not k.startswith("_")}
        if spec.strategy.approval != "Automatic" or approval["granted"]
        else None,
        "conflicts": {"nodes": conflicts[:CONFLICT_NAMES], "count": len(conflicts)} if conflicts else None,
        "dryRun": None,
        "serving": serving.status() if serving is not None else None,
        "noSafeRollback": no_safe_rollback_status(serving, out.no_safe_rollback),
        "delivery": delivered,
        "agentLoss": out.agent_loss.status() if out.agent_loss is not None else None,
        "conditions": gating.merge_conditions(rollout.status.get("conditions") or [], fresh),
    }
    return {**status, "message": gating.rollout_message(status)}


NO_SAFE_ROLLBACK_NAMES = 20
MISMATCH_NAMES = 20  # pods listed in status.delivery.mismatched


def delivery_status(out: Plan, work: Mapping[str, NodeWork], api: ApiFacts) -> dict[str, Any] | None:
    """status.delivery: the mode and why, the API server's facts, the pods by delivery state, and the pods whose
    processes run another flag than their preflight chose (node/pod: what was seen)."""
    if out.delivery_mode is None:
        return None
    counts: Counter[str] = Counter()
    for w in work.values():
        counts.update(w.delivery.counts())
    out.delivery_counts = dict(counts)
    mismatched = [f"{n}/{line}" for n, w in sorted(work.items()) for line in w.delivery.mismatched()]
    return {
        **out.delivery_mode.to_dict(api),
        "pods": dict(sorted(counts.items())),
        "mismatched": mismatched[:MISMATCH_NAMES] or None,
        "mismatchedCount": len(mismatched) or None,
    }


def delivery_conditions(mode: delivery.Mode, status: Mapping[str, Any], now_iso: str) -> list[dict[str, Any]]:
    """FlagDelivery (the mode, and whether the pods can get the flag at all) and FlagDeliveryMismatch (a serving
    process runs another flag than its preflight chose)."""
    mismatched = status.get("mismatched") or []
    return [
        {
            "type": "FlagDelivery",
            "status": "False" if mode.undeliverable else "True",
            "reason": "Undeliverable"
            if mode.undeliverable
            else ("FileKeyRef" if mode.mode == "fileKeyRef" else "Shell"),
            "message": (mode.undeliverable or mode.reason)[:1000],
            "lastTransitionTime": now_iso,
        },
        {
            "type": "FlagDeliveryMismatch",
            "status": "True" if mismatched else "False",
            "reason": "ProcessesRunAnotherFlag" if mismatched else "Verified",
            "message": (
                f"{status.get('mismatchedCount')} serving pod(s) run another flag than their preflight chose: "
                + "; ".join(mismatched[:5])
                if mismatched
                else "every observed serving process runs the flag its preflight chose"
            )[:1000],
            "lastTransitionTime": now_iso,
        },
    ]


def agent_loss_condition(loss: disruption.AgentLoss, now_iso: str) -> dict[str, Any]:
    """AgentsLost: flag-on nodes whose agents are gone, and whether disabling for it pauses."""
    if not loss.lost:
        reason, message = "AgentsPresent", "every flag-on node's agent runs and is ready"
    elif loss.paused:
        reason = "DisablingPaused"
        message = (
            f"{len(loss.lost)} of {loss.flag_on} flag-on nodes lost their agents at once (pause at {loss.threshold}): "
            "a control plane's or network's trouble, not the nodes'; none is disabled for it, their pods keep "
            "their flag, new pods there get 0"
        )
    else:
        reason = "WithinGrace"
        message = (
            f"{len(loss.lost)} flag-on node(s) lost their agents ({', '.join(sorted(loss.lost)[:5])}); each is "
            f"disabled {loss.grace:g} s after its agent went"
            + (f" or after disabling resumed at {iso(loss.resumed)}, whichever is later" if loss.resumed else "")
        )
    return {
        "type": "AgentsLost",
        "status": "True" if loss.lost else "False",
        "reason": reason,
        "message": message[:1000],
        "lastTransitionTime": now_iso,
    }


def agent_loss_events(rollout: RolloutView, loss: disruption.AgentLoss | None) -> list[Event]:
    """A Warning when disabling for lost agents pauses, a Normal when it resumes."""
    before = bool((rollout.status.get("agentLoss") or {}).get("paused"))
    now = bool(loss is not None and loss.paused)
    if now and not before:
        assert loss is not None
        return [Event("Warning", "DisablingPaused", agent_loss_condition(loss, "")["message"])]
    if before and not now:
        return [Event("Normal", "DisablingResumed", "fewer flag-on nodes have lost their agents: disabling resumes")]
    return []


def delivery_events(rollout: RolloutView, mode: delivery.Mode, work: Mapping[str, NodeWork]) -> list[Event]:
    """One Event when the delivery mode changes, and one Warning per node whose mismatched pods change."""
    events = []
    before = rollout.status.get("delivery") or {}
    if before.get("mode") not in (None, mode.mode):
        events.append(Event("Normal", "FlagDelivery", f"flag delivery turns {mode.mode}: {mode.reason}"[:1000]))
    seen = {line.split(":", 1)[0] for line in before.get("mismatched") or [] if isinstance(line, str)}
    for name, w in sorted(work.items()):
        lines = w.delivery.mismatched()
        fresh = [line for line in lines if f"{name}/{line.split(':', 1)[0]}" not in seen]
        if fresh:
            events.append(Event("Warning", "FlagDeliveryMismatch", f"node {name}: {'; '.join(fresh)}"[:1000]))
    return events


def no_safe_rollback_status(serving: Resolution | None, nodes: list[str]) -> dict[str, Any] | None:
    """status.noSafeRollback: the nodes where flag 0 has no working route, and why (None when there are none)."""
    if not nodes:
        return None
    return {
        "count": len(nodes),
        "nodes": nodes[:NO_SAFE_ROLLBACK_NAMES],
        "reason": (
            f"flag 0 ({contract.FLAG_ENV}=0) has no working route for the serving configuration"
            f"{f' ({describe(serving.config)})' if serving is not None and serving.config else ''} on "
            f"{len(nodes)} node(s): no safe rollback, so the operator does not enable them; a pod template with "
            f"{contract.FLAG_ENV}=0 would crash serving there (README: when flag 0 has no route)"
        ),
    }


def serving_conditions(serving: Resolution, no_safe_rollback: list[str], now_iso: str) -> list[dict[str, Any]]:
    """ServingConfigResolved (the pods' configuration is known and agreed) and RollbackUnsafe (flag 0 has no route)."""
    resolved = serving.config is not None
    reason = (
        "Resolved"
        if resolved
        else ("PodsDisagree" if "different serving configurations" in (serving.problem or "") else "Unresolved")
    )
    message = (
        f"serving config {serving.config.digest}: {describe(serving.config)}"
        if serving.config is not None
        else serving.problem or ""
    )
    unsafe = no_safe_rollback_status(serving, no_safe_rollback)
    return [
        {
            "type": "ServingConfigResolved",
            "status": "True" if resolved else "False",
            "reason": reason,
            "message": message[:1000],
            "lastTransitionTime": now_iso,
        },
        {
            "type": "RollbackUnsafe",
            "status": "True" if unsafe else "False",
            "reason": "Flag0HasNoRoute" if unsafe else "Flag0Routed",
            "message": unsafe["reason"]
            if unsafe
            else "flag 0 has a working route on every node that can serve the configuration",
            "lastTransitionTime": now_iso,
        },
    ]


def serving_events(rollout: RolloutView, serving: Resolution, no_safe_rollback: list[str]) -> list[Event]:
    """One Event when the configuration changes (not when first seen: status.serving says it) or turns
    unresolved, and one when the number of nodes where flag 0 has no route changes to a non-zero one."""
    events = []
    before = rollout.status.get("serving") or {}
    if serving.config is not None and before.get("digest") not in (None, serving.config.digest):
        events.append(
            Event(
                "Normal",
                "ServingConfig",
                f"serving config {serving.config.digest} ({describe(serving.config)}) "
                f"written to the nodes; their agents re-test it",
            )
        )
    if serving.config is None and before.get("problem") != serving.problem:
        events.append(Event("Warning", "ServingConfigUnresolved", (serving.problem or "")[:1000]))
    unsafe = no_safe_rollback_status(serving, no_safe_rollback)
    if unsafe and (rollout.status.get("noSafeRollback") or {}).get("count") != unsafe["count"]:
        events.append(Event("Warning", "NoSafeRollback", unsafe["reason"][:1000]))
    return events


def conflict_condition(conflicts: list[str], now_iso: str) -> dict[str, Any]:
    named = ", ".join(conflicts[:CONFLICT_NAMES]) + (
        f" and {len(conflicts) - CONFLICT_NAMES} more" if len(conflicts) > CONFLICT_NAMES else ""
    )
    return {
        "type": "Conflict",
        "status": "True" if conflicts else "False",
        "reason": "NodesOwnedByAnOlderRollout" if conflicts else "NoOverlap",
        "message": f"left to an older rollout whose nodeSelector also matches: {named}"
        if conflicts
        else "no node is claimed by an older rollout",
        "lastTransitionTime": now_iso,
    }


def dry_run_only(rollout: RolloutView, out: Plan) -> None:
    """Turn the writes into a report: status.dryRun lists what would be enabled, disabled, rolled back or
    restarted, and why; one Event when that list changes. Nothing is written to nodes or pods."""
    enabled = {t.node: t for t in out.transitions}
    restarts = {r.node: r for r in out.restarts}
    entries = []
    for name, status in out.statuses.items():
        t, r = enabled.get(name), restarts.get(name)
        flag_change = t is not None and (t.new in FLAG_ON_STATES) != (t.old in FLAG_ON_STATES)
        if not flag_change and r is None and (t is None or t.new != ROLLED_BACK):
            continue
        action = (
            {ENABLING: "enable", DISABLED: "disable", ROLLED_BACK: "roll back"}.get(status.state, "restart")
            if t
            else "restart"
        )
        entry: dict[str, Any] = {
            "node": name,
            "action": action,
            "from": t.old if t else status.state,
            "to": status.state,
            "reason": status.reason,
        }
        if r is not None:
            entry["restart"] = list(r.pods)
        entries.append(entry)
    plan_entries = entries[:DRY_RUN_CAP]
    report = {
        "plan": plan_entries,
        "more": len(entries) - len(plan_entries),
        "wouldWriteNodes": len(out.node_writes),
        "wouldRestartPods": sum(len(r.pods) for r in out.restarts),
        "wouldLabelPods": len(out.pod_labels),
    }
    out.status["dryRun"] = report
    previous = (rollout.status.get("dryRun") or {}).get("plan")
    out.events = [e for e in out.events if e.reason in ("Approved", "Aborted")]
    if previous != plan_entries:
        summary = (
            "; ".join(f"{e['node']}: {e['action']} ({e['reason']})" for e in plan_entries[:10]) or "nothing to change"
        )
        out.events.append(Event("Normal", "DryRun", f"dry run, would: {summary}"[:1000]))
    out.node_writes, out.restarts, out.pod_labels, out.transitions = [], [], [], []
    # Keep `since` stable across dry-run reconciles (nothing is persisted), so an idle dry run writes no status.
    before = rollout.status.get("nodes") or {}
    for name, entry in out.status["nodes"].items():
        old = before.get(name)
        if isinstance(old, Mapping) and old.get("state") == entry["state"]:
            entry["since"] = old.get("since", entry["since"])
