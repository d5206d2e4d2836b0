"""The executor: carries out a Plan (plan.py) against the API, in the safe order.

1. Node writes: labels and the node's record (and a rollback record) in one merge patch per node. A
   failed write is logged and left for the next reconcile: the record on the node stays the truth.
   Concurrent; writes that free a strategy slot all land before any that takes one, and after a failed
   write none that takes a slot is made (the slot it counted on may still be held).
2. The status (only the keys that changed).
3. Events.
4. Pod restarts: only those the plan allows, which are of nodes whose record an earlier reconcile wrote.
5. The pods' flag labels (best effort).
A dry run's plan has no writes of 1, 4 or 5 (plan.dry_run_only); the executor refuses to do any.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Mapping

import kopf
from kubernetes import client

from gluon_common import contract
from gluon_common.kube import MERGE_PATCH, REQUEST_TIMEOUT, ApiFailure, classify, make_api_client

from . import proving, records
from .metrics import METRICS
from .plan import NodeWrite, Plan, Restart
from .spec import GROUP, PLURAL, VERSION
from .world import Caches

log = logging.getLogger("gluon_operator")

JSON_PATCH = "application/json-patch+json"
OWN_WRITE_GRACE_SECONDS = (
    2.0  # the watch shows our status write within this, normally; past it one read tells (own_write_overdue)
)
STRAY_RESTART_SECONDS = 15.0  # see restart_strays
NODE_WRITE_CONCURRENCY = 8  # node patches in flight at once (the client's connection pool holds 10)
# The API calls' own threads: asyncio's default executor has min(32, cores + 4) (6 on two cores), shared with
# every other blocking call, so the writes never reached NODE_WRITE_CONCURRENCY in flight on small machines.
API_THREADS = ThreadPoolExecutor(NODE_WRITE_CONCURRENCY + 2, thread_name_prefix="api")


@dataclass
class Runtime:
    """What the executor keeps for one operator run, built once by the startup handler (handlers.configure)
    and passed in: each run, and each test, has its own."""

    api: client.ApiClient
    caches: Caches  # told of each node write, so a reconcile never plans from a node older than its own write
    # rollout uid -> (when, the status keys we last wrote): a reconcile waits until its watch has delivered
    # them, so it never re-plans from a status older than its own last write.
    status_writes: dict[str, tuple[float, dict[str, Any]]] = field(default_factory=dict)
    stray_restarts: dict[str, float] = field(default_factory=dict)  # node -> when its strays last restarted

    def core_api(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    def custom_api(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api)


def api_url_from_env() -> str | None:
    """GLUON_API_URL: an API server to use without credentials (tests and development); None in a cluster."""
    return os.environ.get("GLUON_API_URL")


def api_client_from_env() -> client.ApiClient:
    """The API client of this operator run: GLUON_API_URL's server, else the in-cluster credentials."""
    return make_api_client(api_url_from_env())


def timed_call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    with METRICS.cpu("write"):
        return fn(*args, **kwargs)


async def call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        # Raw responses: nothing reads them, and deserializing costs time at fleet scale.
        call = functools.partial(
            timed_call, fn, *args, _request_timeout=REQUEST_TIMEOUT, _preload_content=False, **kwargs
        )
        return await asyncio.get_running_loop().run_in_executor(API_THREADS, call)
    except Exception as exc:
        failure = classify(exc)
        METRICS.api_errors.labels(failure.kind).inc()
        raise failure from exc


# ---------------------------------------------------------------- nodes and pods


async def patch_node(
    runtime: Runtime, name: str, labels: Mapping[str, Any], annotations: Mapping[str, Any] | None = None
) -> None:
    body: dict[str, Any] = {"metadata": {"labels": dict(labels)}}
    if annotations:
        body["metadata"]["annotations"] = dict(annotations)
    await call(runtime.core_api().patch_node, name, body, _content_type=MERGE_PATCH)


async def write_nodes(runtime: Runtime, writes: list[NodeWrite], logger: logging.Logger) -> bool:
    """Concurrently, at most NODE_WRITE_CONCURRENCY in flight (a fleet's first reconcile writes every
    node); True when every one landed. A failed write is logged and left for the next reconcile: e.g. the
    node was deleted, and its record is unchanged."""
    gate = asyncio.Semaphore(NODE_WRITE_CONCURRENCY)

    async def write_one(write: NodeWrite) -> bool:
        async with gate:
            try:
                await patch_node(runtime, write.node, write.labels, write.annotations)
            except ApiFailure as failure:
                logger.warning("node %s not written: %s", write.node, failure)
                return False
            runtime.caches.wrote(write.node, write.labels, write.annotations)
            return True

    return all(await asyncio.gather(*(write_one(w) for w in writes)))


async def restart_pod(runtime: Runtime, namespace: str, name: str, policy: str) -> str:
    """'restarted', 'blocked' (a PodDisruptionBudget said 429: try again later) or 'gone'."""
    try:
        if policy == "Evict":
            eviction = client.V1Eviction(metadata=client.V1ObjectMeta(name=name, namespace=namespace))
            await call(runtime.core_api().create_namespaced_pod_eviction, name, namespace, eviction)
        else:
            await call(runtime.core_api().delete_namespaced_pod, name, namespace)
        return "restarted"
    except Exception as failure:
        status = getattr(failure, "status", None)
        if status == 429:
            return "blocked"
        if status == 404:
            return "gone"
        raise


async def restart_pods(runtime: Runtime, restart: Restart, policy: str, logger: logging.Logger) -> None:
    for pod in restart.pods:
        outcome = await restart_pod(runtime, restart.namespace, pod, policy)
        METRICS.restarts.labels(outcome).inc()
        if outcome == "blocked":
            logger.info(
                "eviction of %s/%s on %s blocked by a disruption budget; retrying next reconcile",
                restart.namespace,
                pod,
                restart.node,
            )
            return  # the budget also protects this node's other pods: one at a time


async def restart_strays(runtime: Runtime, restart: Restart, policy: str, logger: logging.Logger) -> None:
    """New pods on a flag-on node that do not run flag 1 for a passing reason restart again: pods admitted
    while the webhook was unreachable (failurePolicy Ignore: no preflight, the template's flag), and pods
    whose preflight got '0' from an agent that was unreachable or had not yet seen the enable (its watch
    lags under API trouble). At most once per STRAY_RESTART_SECONDS per node: a webhook the API server can
    never reach costs a slow retry, not a restart storm. A '0' from the stack itself is a refusal (RolledBack)."""
    last = runtime.stray_restarts.get(restart.node)
    if last is not None and time.monotonic() - last < STRAY_RESTART_SECONDS:
        return
    logger.warning(
        "node %s: restarting %s (not injected, refused by a stale agent view, or its image proved by now)",
        restart.node,
        ", ".join(restart.pods),
    )
    await restart_pods(runtime, restart, policy, logger)
    runtime.stray_restarts[restart.node] = (
        time.monotonic()
    )  # only after it worked: a failed eviction retries next reconcile


async def label_pod(runtime: Runtime, namespace: str, name: str, flag: str, logger: logging.Logger) -> None:
    """Best effort: a pod evicted meanwhile (404) or a transient error is retried at the next reconcile."""
    try:
        await call(
            runtime.core_api().patch_namespaced_pod,
            name,
            namespace,
            {"metadata": {"labels": {contract.LABEL_POD_FLAG: flag}}},
            _content_type=MERGE_PATCH,
        )
    except ApiFailure as failure:
        logger.info("flag label on %s/%s not written: %s", namespace, name, failure)


# ---------------------------------------------------------------- the status


async def write_status(
    runtime: Runtime, namespace: str, name: str, uid: str, status: Mapping[str, Any], fresh: Mapping[str, Any]
) -> dict[str, Any]:
    """Only what changed (an idle rollout costs no writes), each changed key replaced whole (a JSON patch:
    a merge patch would keep stale keys inside nested objects). Our own request, not kopf's patch: kopf 1.x
    applies a timer's patch outside the handler and a 409 there ends the timer for good (found by
    bench/faults.py); here a failure fails this reconcile, which kopf retries. Nulls are left out, as the
    API server prunes them from a structural schema, so what we wrote compares equal to what we read.
    Returns the status as it now is."""
    changed = {
        key: value for key, value in ((k, without_none(v)) for k, v in fresh.items()) if status.get(key) != value
    }
    after = {k: v for k, v in {**status, **changed}.items() if v is not None}
    if not changed:
        return after
    if status:
        body: Any = [
            {"op": "remove", "path": f"/status/{key}"}
            if value is None
            else {"op": "add", "path": f"/status/{key}", "value": value}
            for key, value in changed.items()
            if value is not None or key in status
        ]
        content_type = JSON_PATCH
    else:
        body, content_type = {"status": {k: v for k, v in changed.items() if v is not None}}, MERGE_PATCH
    if body:
        await call(
            runtime.custom_api().patch_namespaced_custom_object_status,
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            name,
            body,
            _content_type=content_type,
        )
        runtime.status_writes[uid] = (time.monotonic(), changed)
    return after


def without_none(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: without_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [without_none(v) for v in value]
    return value


def shows(status: Mapping[str, Any], changed: Mapping[str, Any]) -> bool:
    return all(status.get(k) == v for k, v in changed.items())


def own_write_pending(runtime: Runtime, uid: str, status: Mapping[str, Any]) -> bool:
    """True while kopf's view of the rollout (its watch) does not show our last status write yet."""
    memo = runtime.status_writes.get(uid)
    if memo is None:
        return False
    if shows(status, memo[1]):
        del runtime.status_writes[uid]
        return False
    return True


def own_write_overdue(runtime: Runtime, uid: str) -> bool:
    """Our last status write has been pending past OWN_WRITE_GRACE_SECONDS: the watch is behind (after an
    API-server outage kopf's own retries of its watch wait up to 21 s), so the reconcile reads the rollout
    instead of waiting for the watch (it waited 30 s)."""
    memo = runtime.status_writes.get(uid)
    return memo is not None and time.monotonic() - memo[0] > OWN_WRITE_GRACE_SECONDS


async def read_rollout(runtime: Runtime, namespace: str, name: str) -> dict[str, Any]:
    """The rollout as the API server has it now (a quorum read), and what that says of our last write:
    one the API server does not show was lost or overwritten, so kopf's view will never show it either."""
    response = await call(runtime.custom_api().get_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, name)
    body = records.loads(response.data, max_bytes=records.PAGE_BYTES_LIMIT)
    uid = (body.get("metadata") or {}).get("uid")
    memo = runtime.status_writes.get(uid)
    if memo is not None and not shows(body.get("status") or {}, memo[1]):
        del runtime.status_writes[uid]
    return body


async def remove_spent_annotations(
    runtime: Runtime, namespace: str, name: str, spent: Mapping[str, str], logger: logging.Logger
) -> None:
    """Remove each rollout annotation only while it still has the value the plan saw spent (a JSON patch's
    `test`): a person who meanwhile wrote a new value keeps it. After the status write, so an operator
    stopped in between removes it on its next reconcile."""
    for key, value in spent.items():
        path = "/metadata/annotations/" + key.replace("~", "~0").replace("/", "~1")
        body = [{"op": "test", "path": path, "value": value}, {"op": "remove", "path": path}]
        try:
            await call(
                runtime.custom_api().patch_namespaced_custom_object,
                GROUP,
                VERSION,
                namespace,
                PLURAL,
                name,
                body,
                _content_type=JSON_PATCH,
            )
        except ApiFailure as failure:
            if getattr(failure, "status", None) != 422:  # 422: the test failed, the value changed meanwhile
                raise
            logger.info("annotation %s changed meanwhile: left as it is", key)


# ---------------------------------------------------------------- the plan


async def execute(
    runtime: Runtime,
    plan: Plan,
    namespace: str,
    name: str,
    uid: str,
    status: Mapping[str, Any],
    body: kopf.Body,
    logger: logging.Logger,
) -> dict[str, Any]:
    """Carry out `plan` in the safe order (see the module docstring); returns the status as written."""
    if plan.dry_run and plan.writes():
        raise AssertionError(
            f"a dry run's plan asks for {plan.writes()} writes"
        )  # plan.dry_run_only clears them: a bug, not input
    starts = [w for w in plan.node_writes if w.starts]
    if not await write_nodes(runtime, [w for w in plan.node_writes if not w.starts], logger) and starts:
        logger.warning(
            "%d nodes not started (%s): an earlier node write of this reconcile failed",
            len(starts),
            ", ".join(w.node for w in starts[:5]),
        )
    elif starts:
        await write_nodes(runtime, starts, logger)
    for t in plan.transitions:
        METRICS.transitions.labels(t.old or "None", t.new).inc()
        if t.rollback:
            METRICS.rollbacks.labels(t.rollback).inc()
    after = await write_status(runtime, namespace, name, uid, status, plan.status)
    if plan.spent_annotations:
        await remove_spent_annotations(runtime, namespace, name, plan.spent_annotations, logger)
    for event in plan.events:
        (kopf.warn if event.type == "Warning" else kopf.info)(body, reason=event.reason, message=event.message)
        logger.info("%s: %s", event.reason, event.message)
    policy = plan.spec.strategy.restart if plan.spec else "None"
    for restart in plan.restarts:
        await (restart_strays if restart.why == "stray" else restart_pods)(runtime, restart, policy, logger)
    for pod in plan.pod_labels:
        await label_pod(runtime, pod.namespace, pod.name, pod.flag, logger)
    if plan.statuses:
        mode = plan.delivery_mode
        METRICS.observe_rollout(
            namespace,
            name,
            plan.statuses,
            len(plan.no_safe_rollback),
            plan.delivery_counts,
            (mode.mode, mode.configured) if mode else None,
            (len(plan.agent_loss.lost), plan.agent_loss.paused) if plan.agent_loss else (0, False),
        )
    return after


# ---------------------------------------------------------------- proofs in the serving image


async def carry_out_proving(
    runtime: Runtime,
    planned: proving.ProvingPlan,
    proofs: Mapping[str, proving.NodeProofs],
    settings: proving.PodSettings,
    logger: logging.Logger,
) -> None:
    """Record what finished on its node (merged into `proofs`, the nodes' proofs the plan was made from; before
    deleting the pod that said it: a crash between the two reads the pod again, never loses it), delete what was
    read or is stale, then start the next wave. Each step fails alone and is retried by the next reconcile."""
    for node, new in planned.record.items():
        merged_proofs = proving.merged(proofs.get(node, proving.NodeProofs()), new)
        value = merged_proofs.model_dump_json(exclude_none=True)
        try:
            await patch_node(runtime, node, {}, {contract.ANNOTATION_PROOFS: value})
        except ApiFailure as failure:
            logger.warning("proofs of node %s not written: %s", node, failure)
            planned = proving.keep_pods_of(planned, node)  # read again next time
            continue
        runtime.caches.wrote(node, {}, {contract.ANNOTATION_PROOFS: value})
        for proof in new:
            METRICS.proofs.labels(proof.result).inc()
            logger.info(
                "node %s: image %s serving %s: %s (%s)", node, proof.digest, proof.serving, proof.result, proof.reason
            )
    core = runtime.core_api()
    for name in planned.delete:
        try:
            await call(core.delete_namespaced_pod, name, settings.namespace, grace_period_seconds=0)
        except ApiFailure as failure:
            if failure.status != 404:
                logger.warning("self-test pod %s not deleted: %s", name, failure)
    for demand in planned.create:
        try:
            await call(core.create_namespaced_pod, settings.namespace, proving.selftest_pod(demand, settings))
        except ApiFailure as failure:
            if failure.status != 409:  # 409: a twin by name already runs (an earlier reconcile's): fine
                logger.warning("self-test pod for node %s not created: %s", demand.node, failure)
