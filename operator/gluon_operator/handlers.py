"""The kopf handlers: startup, the reconcile timer, cleanup on delete, the rollout index and the
admission webhook. Thin shells: world.py gathers what the caches see, plan.py decides (pure), executor.py
writes, in the safe order (node records first, then status, then pod restarts), so an operator killed at
any point resumes without restarting a node twice.

The analysis runs beside the reconcile, not in it: a due analysis starts as a task with its own deadline
and its verdicts are used by the first reconcile after it ends, so no disable of an ineligible node ever
waits on Prometheus.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import random
import time
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

import kopf
from kubernetes import client

from gluon_common import contract
from gluon_common.backoff import backoff
from gluon_common.kube import ApiFailure

from . import gating, proving, webhook
from .admission import AdmissionServer
from .apiserver import ApiServerFacts
from .evaluation import analyse, analysis_due, deadline_seconds
from .executor import (
    Runtime,
    api_client_from_env,
    api_url_from_env,
    carry_out_proving,
    execute,
    own_write_overdue,
    own_write_pending,
    patch_node,
    read_rollout,
)
from .metrics import METRICS
from .plan import claims_nodes, invalid_before_world, plan, rollout_view
from .records import NodeRecord, read_json
from .spec import GROUP, PLURAL, ROLLOUT_FINALIZER, VERSION, selector_query
from .world import Caches
from .world_types import Claim, unix

log = logging.getLogger("gluon_operator")


def env_float(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


# Read when the decorators run (import time).
RECONCILE_SECONDS = env_float("GLUON_RECONCILE_SECONDS", 10.0)
# A reconcile failed by the API (an outage, the RBAC 403s of an API server's first seconds) is retried after
# this, not a whole interval: recovery after an outage waits at most this for the reconcile.
API_RETRY_SECONDS = min(RECONCILE_SECONDS, 2.0)
# kopf's own requests (its watch of rollouts, its patches) retry errors with these pauses: jittered, at most
# API_BACKOFF_CAP_SECONDS (kopf's default pauses grow to 21 s, which the first request after an outage waited).
API_BACKOFF_CAP_SECONDS = 5.0
# How long kopf's requests retry before giving up. When its watch gives up the whole process exits: with kopf's
# minute, a 90 s API-server or etcd outage killed the operator, and a Deployment's restarts meet the same outage
# (CrashLoopBackOff, then a late start). Ten minutes outlasts a managed control plane's upgrade.
API_RETRY_WINDOW_SECONDS = 600.0
# A backstop around the analysis task: evaluation.analyse keeps its own deadline (contract.ENV_ANALYSIS_DEADLINE).
ANALYSIS_DEADLINE_SECONDS = deadline_seconds() + 5.0


@dataclass
class Analyses:
    """Running analyses, one per rollout uid (each task carries when it started)."""

    tasks: dict[str, asyncio.Task[tuple[dict[str, gating.Verdict], dict[str, Any]]]] = field(default_factory=dict)


@dataclass
class Reconciles:
    """One lock per rollout uid, held by a reconcile while it plans and writes. kopf stops a deleted
    rollout's timer but lets a reconcile in flight finish, concurrently with the deletion handler: the
    cleanup takes the lock, so it runs after that reconcile's node writes, never before them."""

    locks: dict[str, asyncio.Lock] = field(default_factory=dict)
    deleted: set[str] = field(default_factory=set)

    def lock(self, uid: str) -> asyncio.Lock:
        return self.locks.setdefault(uid, asyncio.Lock())


@dataclass
class Proving:
    """Self-tests in the serving images (proving.py), when the chart turns them on: every rollout's last
    demands (the pods of a fleet are planned over all of them at once, one wave bound), and one lock."""

    settings: proving.PodSettings
    limits: proving.Limits
    # (namespace, name) of each rollout -> its demands; stale pods are deleted only once every rollout has said
    demands: dict[tuple[str, str], list[proving.Demand]] = field(default_factory=dict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


@dataclass
class OperatorState:
    """Everything one operator run keeps between handler calls, built once by the startup handler and kept
    in kopf's memo (memo.state): a fresh one per run, so nothing is reset by hand."""

    runtime: Runtime  # the API client, the caches, our own writes (executor.py)
    injection: webhook.Injection  # what the admission webhook injects (read from the chart's env at start)
    apiserver: ApiServerFacts  # whether the API server accepts fileKeyRef (checked now and then)
    analyses: Analyses = field(default_factory=Analyses)
    reconciles: Reconciles = field(default_factory=Reconciles)
    proving: Proving | None = None

    @property
    def caches(self) -> Caches:
        return self.runtime.caches


def state_of(memo: Any) -> OperatorState:
    """This run's state: kopf hands each handler the run's memo (or a shallow copy of it, made after startup)."""
    return memo.state


# ---------------------------------------------------------------- startup, login


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    api_url = api_url_from_env()
    if api_url:
        return kopf.ConnectionInfo(server=api_url, insecure=True)
    return kopf.login_via_client(**kwargs)


def retry_backoffs(rng: random.Random, window: float = API_RETRY_WINDOW_SECONDS) -> list[float]:
    """kopf's pauses between retries of a failed request: jittered, capped, summing to at least `window`."""
    pauses: list[float] = []
    while sum(pauses) < window:
        pauses.append(backoff(len(pauses), 0.5, API_BACKOFF_CAP_SECONDS, rng))
    return pauses


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    injection = webhook.injection_from_env(os.environ)  # a bad setting stops the start, named
    proving_settings = proving.settings_from_env(os.environ)  # likewise
    settings.posting.level = logging.INFO
    settings.watching.server_timeout = int(env_float("GLUON_WATCH_TIMEOUT", 300))
    settings.watching.client_timeout = settings.watching.server_timeout + 30
    settings.scanning.disabled = os.environ.get("GLUON_SCANNING", "on") == "off"
    settings.persistence.finalizer = ROLLOUT_FINALIZER
    # A replica killed without leaving the peering (SIGKILL, a node lost) is taken over once its record is
    # this old: kopf's default is 60 s; the chart sets operator.peeringLifetimeSeconds (kopf renews 5-10 s
    # before it lapses, so a shorter lifetime costs a peering write every few seconds per replica).
    settings.peering.lifetime = int(env_float("GLUON_PEERING_LIFETIME_SECONDS", settings.peering.lifetime))
    settings.networking.error_backoffs = retry_backoffs(random.Random())
    # A deleted rollout's timer that was mid-reconcile is checked again after this many seconds (kopf's
    # default, 60 s, held every deletion that met a running reconcile for a minute).
    settings.background.cancellation_polling = 1.0
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=GROUP)
    cert, key = os.environ.get("GLUON_WEBHOOK_CERT"), os.environ.get("GLUON_WEBHOOK_KEY")
    if cert and key:
        settings.admission.server = AdmissionServer(
            addr=os.environ.get("GLUON_WEBHOOK_ADDR", "0.0.0.0"),
            port=int(env_float("GLUON_WEBHOOK_PORT", 9443)),
            certfile=cert,
            pkeyfile=key,
        )
    else:  # no certificate (tests, local runs): a plain-HTTP server on loopback that nothing calls
        settings.admission.server = AdmissionServer(addr="127.0.0.1", port=None, insecure=True)
    settings.admission.managed = None  # the chart owns the MutatingWebhookConfiguration
    port = int(env_float("GLUON_METRICS_PORT", 8080))
    if port:
        METRICS.serve(os.environ.get("GLUON_METRICS_ADDR", "0.0.0.0"), port)

    def count(failure: Any) -> None:
        METRICS.api_errors.labels(failure.kind).inc()

    api = api_client_from_env()
    rollouts = functools.partial(client.CustomObjectsApi(api).list_cluster_custom_object, GROUP, VERSION, PLURAL)
    caches = Caches(
        client.CoreV1Api(api), int(env_float("GLUON_WATCH_TIMEOUT", 300)), count, (rollouts, rollout_entry)
    ).start()
    state = OperatorState(Runtime(api, caches), injection, ApiServerFacts(api).start())
    if proving_settings is not None:
        state.proving = Proving(*proving_settings)
        caches.watch_selftests(proving_settings[0].namespace)
    memo.state = state


@kopf.on.cleanup()
def stop_caches(memo: kopf.Memo, **_: Any) -> None:
    state: OperatorState | None = getattr(memo, "state", None)
    if state is None:
        return  # the startup failed before it built the state: nothing was started
    state.caches.close()
    state.apiserver.stop.set()
    for task in state.analyses.tasks.values():
        task.cancel()


def rollout_entry(obj: Mapping[str, Any]) -> dict[str, Any]:
    """A rollout by its namespace: its pod selector (the webhook, the pod caches) and node claim (overlaps).
    A rollout being deleted claims nothing and injects nothing; an Invalid one claims no node."""
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    if meta.get("deletionTimestamp"):
        return {}
    delivery = status.get("delivery") if isinstance(status.get("delivery"), Mapping) else {}
    return {
        meta.get("namespace") or "": {
            "name": meta.get("name") or "",
            "delivery": delivery.get("mode"),  # the mode the operator resolved for its pods (delivery.py)
            "podSelector": dict(spec.get("podSelector") or {}),
            "nodeSelector": dict(spec.get("nodeSelector") or {}),
            "created": unix(meta.get("creationTimestamp")),
            "claims": claims_nodes(rollout_view(obj)),
        }
    }


@kopf.index(GROUP, VERSION, PLURAL)
def rollout_index(body: kopf.Body, **_: Any) -> dict[str, Any]:
    """Live rollouts by namespace (rollout_entry), for the reconcile of the active replica."""
    return rollout_entry(body)


def claims(index: kopf.Index) -> list[Claim]:
    return [
        Claim(namespace, r["name"], r["created"], r["nodeSelector"])
        for namespace in index
        for r in index.get(namespace) or []
        if r.get("claims", True)
    ]


def pod_informers(index: kopf.Index) -> set[tuple[str, str]]:
    """(namespace, label selector) of every rollout with a usable pod selector."""
    return {
        (namespace, selector_query(r["podSelector"]))
        for namespace in index
        for r in index.get(namespace) or []
        if selector_query(r["podSelector"])
    }


# ---------------------------------------------------------------- the reconcile


def finished_analysis(
    analyses: Analyses, uid: str, logger: logging.Logger
) -> tuple[dict[str, gating.Verdict], dict[str, Any] | None]:
    """The verdicts of this rollout's analysis task if it has ended ({} and None otherwise)."""
    task = analyses.tasks.get(uid)
    if task is None or not task.done():
        return {}, None
    del analyses.tasks[uid]
    try:
        return task.result()
    except Exception as exc:  # the deadline, or a bug in the analysis: no verdicts this round, the error in status
        kind = "deadline" if isinstance(exc, TimeoutError) else "error"
        METRICS.analysis_errors.labels(kind).inc()
        message = (
            f"analysis deadline of {ANALYSIS_DEADLINE_SECONDS:g} s passed"
            if kind == "deadline"
            else f"analysis failed: {exc!r}"
        )
        logger.warning("%s", message)
        return {}, {"lastRun": getattr(task, "started", time.time()), "error": message}


def start_analysis(
    analyses: Analyses,
    uid: str,
    namespace: str,
    name: str,
    spec: Any,
    statuses: Mapping[str, gating.NodeStatus],
    now: float,
    logger: logging.Logger,
) -> None:
    task = asyncio.create_task(
        asyncio.wait_for(analyse(namespace, name, spec, dict(statuses), now, logger), ANALYSIS_DEADLINE_SECONDS)
    )
    task.started = now  # type: ignore[attr-defined]
    analyses.tasks[uid] = task


# backoff: a failed reconcile (API errors) is retried after one interval, not kopf's default minute.
@kopf.timer(GROUP, VERSION, PLURAL, interval=RECONCILE_SECONDS, backoff=RECONCILE_SECONDS, id="reconcile")
async def reconcile(
    name: str,
    namespace: str,
    spec: Mapping[str, Any],
    status: Mapping[str, Any],
    meta: Mapping[str, Any],
    body: kopf.Body,
    rollout_index: kopf.Index,
    memo: kopf.Memo,
    logger: logging.Logger,
    **_: Any,
) -> None:
    uid = meta["uid"]
    if meta.get("deletionTimestamp"):
        return  # the cleanup handler's work now
    state = state_of(memo)
    async with state.reconciles.lock(uid):
        if uid not in state.reconciles.deleted:
            try:
                await reconcile_once(state, uid, namespace, name, spec, status, body, rollout_index, logger)
            except ApiFailure as failure:  # the API's trouble, not a bug: retried soon, logged without a traceback
                raise kopf.TemporaryError(f"API call failed: {failure}", delay=API_RETRY_SECONDS) from failure


async def reconcile_once(
    state: OperatorState,
    uid: str,
    namespace: str,
    name: str,
    spec: Mapping[str, Any],
    status: Mapping[str, Any],
    body: Mapping[str, Any],
    rollout_index: kopf.Index,
    logger: logging.Logger,
) -> None:
    runtime, caches = state.runtime, state.caches
    if own_write_pending(runtime, uid, status):
        if not own_write_overdue(runtime, uid):
            METRICS.reconciles.labels("waiting").inc()
            logger.debug("waiting for the watch to deliver our last status write")
            return
        body = await read_rollout(runtime, namespace, name)  # the watch is behind: plan from the API server's own view
        if (body.get("metadata") or {}).get("deletionTimestamp"):
            return  # the cleanup handler's work, once the watch shows the deletion
        spec, status = body.get("spec") or {}, body.get("status") or {}
    caches.want_pods(pod_informers(rollout_index))
    pods = (namespace, selector_query(spec.get("podSelector") or {}))
    now = time.time()
    view = rollout_view(body)
    planned = invalid_before_world(view, caches.refused(pods), now)
    if planned is None:
        # The first reconciles meet caches still listing: wait for them, up to one interval, rather than a whole
        # interval for the next reconcile (at start, that was the operator's time to converge beyond the API's floor).
        if not await asyncio.to_thread(caches.wait_synced, pods if pods[1] else None, RECONCILE_SECONDS):
            METRICS.reconciles.labels("waiting").inc()
            # kopf's timer sleeps a whole interval after a return: at 5000 nodes that interval came after the
            # caches had filled (bench/scale.py). Retried in API_RETRY_SECONDS instead.
            raise kopf.TemporaryError("waiting for the node and pod caches to fill", delay=API_RETRY_SECONDS)
        verdicts, summary = finished_analysis(state.analyses, uid, logger)
        world = replace(
            caches.world(claims(rollout_index), pods),
            api=state.apiserver.facts,
            injection_mode=state.injection.mode,
            proving=state.proving is not None,
        )
        with METRICS.cpu("plan"):
            planned = plan(view, world, verdicts, summary, now)
        METRICS.reconciles.labels("planned").inc()
    after = await execute(runtime, planned, namespace, name, uid, status, body, logger)
    if state.proving is not None and planned.spec is not None and not planned.dry_run:
        rollouts = {(c.namespace, c.name) for c in claims(rollout_index)}
        await prove(state.proving, runtime, (namespace, name), planned.proving, rollouts, logger)
    if planned.spec is not None and uid not in state.analyses.tasks and analysis_due(planned.spec, after, now):
        start_analysis(state.analyses, uid, namespace, name, planned.spec, planned.statuses, now, logger)


async def prove(
    proving_state: Proving,
    runtime: Runtime,
    rollout: tuple[str, str],
    demands: list[proving.Demand],
    rollouts: set[tuple[str, str]],
    logger: logging.Logger,
) -> None:
    """One step of the self-tests in the serving images, over every rollout's demands: what finished is
    recorded, the next wave starts. Not before the self-test pods' cache has listed (never a blind twin); a pod
    no demand names is deleted only once every rollout of `rollouts` has said what it wants."""
    proving_state.demands[rollout] = demands
    async with proving_state.lock:
        pods = runtime.caches.selftest_pods()
        if pods is None:
            return
        wanted = [d for each in proving_state.demands.values() for d in each]
        prune = rollouts <= set(proving_state.demands)
        proofs = runtime.caches.node_proofs()
        planned = proving.plan(wanted, pods, proofs, time.time(), proving_state.limits, prune)
        METRICS.selftest_pods.labels("running").set(len(pods) - len(planned.delete) + len(planned.create))
        METRICS.selftest_pods.labels("waiting").set(planned.waiting)
        await carry_out_proving(runtime, planned, proofs, proving_state.settings, logger)


@kopf.on.delete(GROUP, VERSION, PLURAL)
async def cleanup(
    namespace: str,
    name: str,
    status: Mapping[str, Any],
    meta: Mapping[str, Any],
    memo: kopf.Memo,
    logger: logging.Logger,
    **_: Any,
) -> None:
    """Deleting a rollout takes its labels, records and serving config off the nodes it managed: new pods start
    at flag 0. Running pods keep the flag they started with until they restart (a deletion does not restart a
    fleet)."""
    uid, state = meta.get("uid", ""), state_of(memo)
    state.reconciles.deleted.add(uid)
    async with state.reconciles.lock(uid):  # a reconcile in flight writes first
        await clean_nodes(state, uid, namespace, name, status, logger)
    state.reconciles.locks.pop(uid, None)


async def clean_nodes(
    state: OperatorState, uid: str, namespace: str, name: str, status: Mapping[str, Any], logger: logging.Logger
) -> None:
    state.runtime.status_writes.pop(uid, None)
    if state.proving is not None:
        state.proving.demands.pop((namespace, name), None)  # no longer tested for it (its pods: next step)
    task = state.analyses.tasks.pop(uid, None)
    if task is not None:
        task.cancel()
    nodes = set(status.get("nodes") or {})  # without caches (never synced), what the status names
    if state.caches.nodes_listed():
        nodes = set()
        for node, view in state.caches.world([]).nodes.items():
            record, _ = read_json(NodeRecord, view.annotations.get(contract.ANNOTATION_NODE_RECORD), "record")
            if (
                record is not None
                and record.rollout == f"{namespace}/{name}"
                or record is None
                and node in (status.get("nodes") or {})
            ):
                nodes.add(node)
    failed = []
    for node in sorted(nodes):
        try:
            await patch_node(
                state.runtime,
                node,
                {contract.LABEL_ENABLED: None, contract.LABEL_STATE: None},
                {contract.ANNOTATION_NODE_RECORD: None, contract.ANNOTATION_SERVING_CONFIG: None},
            )
        except ApiFailure as failure:
            if failure.status != 404:  # a node deleted meanwhile has nothing left to clean
                logger.warning("cleanup of node %s: %s", node, failure)
                failed.append(node)
    if failed:  # the finalizer stays until every node is clean
        raise kopf.TemporaryError(
            f"{len(failed)} nodes not cleaned yet ({', '.join(failed[:5])}); retrying", delay=RECONCILE_SECONDS
        )


# ---------------------------------------------------------------- the admission webhook


@kopf.on.mutate("pods", id="inject", operations=["CREATE"], ignore_failures=True)
def inject(
    body: kopf.Body,
    patch: kopf.Patch,
    namespace: str | None,
    rollout_index: kopf.Index,
    warnings: list[str],
    memo: kopf.Memo,
    logger: logging.Logger,
    **_: Any,
) -> None:
    """Never raises (kopf answers a handler's exception with allowed=false): webhook.admit decides. The
    rollouts come from the operator's own informer, which every replica keeps: kopf's index stops with its
    watches on a replica that waits in the peering, and a Service sends admissions to both replicas."""
    state = state_of(memo)
    rollouts = state.caches.live_rollouts()
    admission = webhook.admit(
        dict(body),
        namespace,
        rollout_index if rollouts is None else rollouts,
        state.injection,
        state.apiserver.facts.file_key_ref,
    )
    METRICS.webhook_reviews.labels(admission.outcome).inc()
    for warning in admission.warnings:
        logger.warning(warning)
        warnings.append(warning)
    for key, value in (admission.changes or {}).items():
        if key == "spec":
            for field, content in value.items():
                patch.spec[field] = content
        else:
            for annotation, content in value["annotations"].items():
                patch.metadata.annotations[annotation] = content
