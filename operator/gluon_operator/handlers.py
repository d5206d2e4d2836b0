"""kopf handlers: thin shells around gating.py and webhook.py.

Durable state lives only in the GluonRollout status and node labels. A node's pods are restarted only
after the status that records why (its state and changedAt) has been persisted by an earlier reconcile,
so an operator killed at any point resumes without restarting a node twice or skipping one.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
import os
import time
from dataclasses import replace
from typing import Any, Mapping

import kopf
from kubernetes import client

from gluon_agent import contract
from gluon_agent.kube import MERGE_PATCH, REQUEST_TIMEOUT, ApiFailure, classify, make_api_client

from . import gating, webhook
from .admission import AdmissionServer
from .evaluation import analyse, analysis_due
from .informer import Index, Informer
from .metrics import METRICS
from .spec import GROUP, PLURAL, VERSION, GluonRolloutSpec, parse_spec

log = logging.getLogger("gluon_operator")


def env_float(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


# Read when the decorators run (import time): the reconcile interval and the agent pods' label.
RECONCILE_SECONDS = env_float("GLUON_RECONCILE_SECONDS", 10.0)
STALE_WRITE_SECONDS = 30.0  # see own_write_pending
JSON_PATCH = "application/json-patch+json"
STRAY_RESTART_SECONDS = 15.0  # see restart_strays
AGENT_LABEL = os.environ.get("GLUON_AGENT_LABEL", "app.kubernetes.io/name=gluon-rollout-agent")
AGENT_LABEL_KEY, AGENT_LABEL_VALUE = AGENT_LABEL.split("=", 1)


class Runtime:
    """Read from the environment at operator startup (so each test run can point elsewhere)."""

    api_url: str | None = None  # tests and development; in-cluster credentials otherwise
    injection = webhook.Injection(agent_image="ghcr.io/gluon-rollout/agent:0.1.0")
    api: client.ApiClient | None = None
    # rollout uid -> (when, the status keys we last wrote): a reconcile waits until its watch has delivered
    # them, so it never re-plans from a status older than its own last write.
    written: dict[str, tuple[float, dict[str, Any]]] = {}
    stray_restarts: dict[str, float] = {}  # node -> when its stray pods were last restarted (restart_strays)

    @classmethod
    def load(cls) -> None:
        cls.api_url = os.environ.get("GLUON_API_URL")
        cls.injection = webhook.Injection(
            agent_image=os.environ.get("GLUON_AGENT_IMAGE", "ghcr.io/gluon-rollout/agent:0.1.0"),
            mode="shell" if os.environ.get("GLUON_INJECTION_MODE") == "shell" else "fileKeyRef",
        )
        cls.api = make_api_client(cls.api_url)
        cls.written, cls.stray_restarts = {}, {}  # per operator run (tests start several in one process)


def api_client() -> client.ApiClient:
    if Runtime.api is None:
        Runtime.load()
    assert Runtime.api is not None
    return Runtime.api


def core() -> client.CoreV1Api:
    return client.CoreV1Api(api_client())


def custom() -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api_client())


# ---------------------------------------------------------------- startup, login


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    Runtime.load()
    if Runtime.api_url:
        return kopf.ConnectionInfo(server=Runtime.api_url, insecure=True)
    return kopf.login_via_client(**kwargs)


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    Runtime.load()
    settings.posting.level = logging.INFO
    settings.watching.server_timeout = int(env_float("GLUON_WATCH_TIMEOUT", 300))
    settings.watching.client_timeout = settings.watching.server_timeout + 30
    settings.scanning.disabled = os.environ.get("GLUON_SCANNING", "on") == "off"
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=GROUP)
    cert, key = os.environ.get("GLUON_WEBHOOK_CERT"), os.environ.get("GLUON_WEBHOOK_KEY")
    if cert and key:
        settings.admission.server = AdmissionServer(
            addr=os.environ.get("GLUON_WEBHOOK_ADDR", "0.0.0.0"), port=int(env_float("GLUON_WEBHOOK_PORT", 9443)),
            certfile=cert, pkeyfile=key,
        )
    else:  # no certificate (tests, local runs): a plain-HTTP server on loopback that nothing calls
        settings.admission.server = AdmissionServer(addr="127.0.0.1", port=None, insecure=True)
    settings.admission.managed = None  # the chart owns the MutatingWebhookConfiguration
    port = int(env_float("GLUON_METRICS_PORT", 8080))
    if port:
        METRICS.serve(os.environ.get("GLUON_METRICS_ADDR", "0.0.0.0"), port)
    Caches.start()


@kopf.on.cleanup()
def stop_caches(**_: Any) -> None:
    Caches.close()


# ---------------------------------------------------------------- caches: nodes and pods (informers), rollouts (kopf index)


def node_entry(obj: Mapping[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata") or {}
    return {meta["name"]: {"labels": dict(meta.get("labels") or {}), "annotations": dict(meta.get("annotations") or {})}}


def pod_ready(status: Mapping[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])


def agent_entry(obj: Mapping[str, Any]) -> dict[str, Any] | None:
    """node -> whether its agent pod is running and ready."""
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    node = spec.get("nodeName")
    if not node or (meta.get("labels") or {}).get(AGENT_LABEL_KEY) != AGENT_LABEL_VALUE:
        return None
    return {node: status.get("phase") == "Running" and pod_ready(status) and not meta.get("deletionTimestamp")}


def preflight_verdict(status: Mapping[str, Any]) -> dict[str, Any] | None:
    for container in status.get("initContainerStatuses") or []:
        if container.get("name") == webhook.PREFLIGHT_CONTAINER:
            message = ((container.get("state") or {}).get("terminated") or {}).get("message")
            try:
                verdict = json.loads(message) if message else None
            except ValueError:
                return {"flag": None, "reason": f"unreadable preflight message: {message[:200]!r}"}
            return verdict if isinstance(verdict, dict) else None
    return None


def pod_entry(obj: Mapping[str, Any]) -> dict[Any, Any] | None:
    """(namespace, node) -> what the gating needs of each pod there."""
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    node = spec.get("nodeName")
    if not node:
        return None
    verdict = preflight_verdict(status)
    agent = (verdict or {}).get("agent")
    transient = agent is None or agent.get("current") is False or agent.get("enabled") is False
    injected = (contract.ANNOTATION_POD_INJECTED in (meta.get("annotations") or {}) or verdict is not None
                or any(c.get("name") == webhook.PREFLIGHT_CONTAINER for c in spec.get("initContainers") or []))
    return {(meta.get("namespace"), node): {
        "name": meta.get("name"), "labels": dict(meta.get("labels") or {}), "created": meta.get("creationTimestamp"),
        "ready": pod_ready(status), "deleting": bool(meta.get("deletionTimestamp")),
        "flag": (verdict or {}).get("flag"), "preflight_reason": (verdict or {}).get("reason"), "injected": injected,
        "transient": verdict is not None and verdict.get("flag") == "0" and transient,
    }}


class Caches:
    """The node and pod informers (see informer.py for why not kopf indexes)."""

    nodes: Informer | None = None
    pods: Informer | None = None

    @classmethod
    def start(cls) -> None:
        timeout = int(env_float("GLUON_WATCH_TIMEOUT", 300))
        cls.close()
        def count(failure: ApiFailure) -> None:
            METRICS.api_errors.labels(failure.kind).inc()
        cls.nodes = Informer("nodes", core().list_node, {"nodes": node_entry}, watch_timeout=timeout, on_error=count).start()
        cls.pods = Informer("pods", core().list_pod_for_all_namespaces, {"agents": agent_entry, "serving": pod_entry},
                            watch_timeout=timeout, on_error=count).start()

    @classmethod
    def close(cls) -> None:
        for informer in (cls.nodes, cls.pods):
            if informer is not None:
                informer.close()

    @classmethod
    def synced(cls) -> bool:
        return all(i is not None and i.synced.is_set() for i in (cls.nodes, cls.pods))


@kopf.index(GROUP, VERSION, PLURAL)
def rollout_index(namespace: str, name: str, spec: Mapping[str, Any], **_: Any) -> dict[str, Any]:
    return {namespace: {"name": name, "podSelector": dict(spec.get("podSelector") or {})}}


# ---------------------------------------------------------------- facts from the indexes


def first(index: Index | kopf.Index, key: Any) -> Any:
    store = index.get(key)
    return next(iter(store), None) if store is not None else None


def unix(timestamp: str | None) -> float:
    if not timestamp:
        return 0.0
    return datetime.datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


def serving_pods(pod_index: Index, namespace: str, node: str, selector: Mapping[str, Any]) -> list[dict[str, Any]]:
    store = pod_index.get((namespace, node))
    return [p for p in (store or []) if webhook.selector_matches(selector, p["labels"])]


def pod_facts(pods: list[dict[str, Any]]) -> list[gating.PodFacts]:
    return [gating.PodFacts(p["name"], unix(p["created"]), p["flag"], p["preflight_reason"], p["ready"], p["deleting"], p["injected"],
                            p["transient"]) for p in pods]


def nodes_in_scope(node_index: Index, selector: Mapping[str, Any]) -> list[str]:
    names = []
    for name in node_index:
        node = first(node_index, name)
        if node is None:
            continue
        everything = not selector.get("matchLabels") and not selector.get("matchExpressions")
        if everything or webhook.selector_matches(selector, node["labels"]):
            names.append(name)
    return sorted(names)


# ---------------------------------------------------------------- writes (thread pool: sync client)


async def call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        # Raw responses: nothing reads them, and deserializing costs time at fleet scale.
        return await asyncio.to_thread(fn, *args, _request_timeout=REQUEST_TIMEOUT, _preload_content=False, **kwargs)
    except Exception as exc:
        failure = classify(exc)
        METRICS.api_errors.labels(failure.kind).inc()
        raise failure from exc


async def label_node(name: str, labels: dict[str, str], annotations: dict[str, Any] | None = None) -> None:
    body: dict[str, Any] = {"metadata": {"labels": labels}}
    if annotations:
        body["metadata"]["annotations"] = annotations
    await call(core().patch_node, name, body, _content_type=MERGE_PATCH)


async def restart_pod(namespace: str, name: str, policy: str) -> str:
    """'restarted', 'blocked' (a PodDisruptionBudget said 429: try again later) or 'gone'."""
    try:
        if policy == "Evict":
            eviction = client.V1Eviction(metadata=client.V1ObjectMeta(name=name, namespace=namespace))
            await call(core().create_namespaced_pod_eviction, name, namespace, eviction)
        else:
            await call(core().delete_namespaced_pod, name, namespace)
        return "restarted"
    except Exception as failure:
        status = getattr(failure, "status", None)
        if status == 429:
            return "blocked"
        if status == 404:
            return "gone"
        raise


async def label_pod(namespace: str, name: str, flag: str, logger: logging.Logger) -> None:
    """Best effort: a pod evicted meanwhile (404) or a transient error is retried at the next reconcile."""
    try:
        await call(core().patch_namespaced_pod, name, namespace, {"metadata": {"labels": {contract.LABEL_POD_FLAG: flag}}},
                   _content_type=MERGE_PATCH)
    except ApiFailure as failure:
        logger.info("flag label on %s/%s not written: %s", namespace, name, failure)


# ---------------------------------------------------------------- the reconcile


def abort_now(spec: GluonRolloutSpec, status: Mapping[str, Any], statuses: Mapping[str, gating.NodeStatus],
              generation: int | None) -> dict[str, Any] | None:
    """The abort record: kept until a person edits the spec (a new generation re-arms the rollout)."""
    previous = status.get("aborted")
    if previous and previous.get("generation") == generation:
        return previous
    failed = sum(1 for s in statuses.values() if s.state == gating.ROLLED_BACK)
    if failed > spec.abort.maxFailedNodes:
        return {"generation": generation, "reason": f"{failed} nodes rolled back > maxFailedNodes {spec.abort.maxFailedNodes}"}
    return None


async def restart_old_pods(namespace: str, node: str, old: list[str], policy: str, logger: logging.Logger) -> None:
    for pod in old:
        outcome = await restart_pod(namespace, pod, policy)
        METRICS.restarts.labels(outcome).inc()
        if outcome == "blocked":
            logger.info("eviction of %s/%s on %s blocked by a disruption budget; retrying next reconcile", namespace, pod, node)
            return  # the budget also protects this node's other pods: one at a time


async def restart_strays(namespace: str, node: str, stray: list[str], policy: str, logger: logging.Logger) -> None:
    """New pods on a flag-on node that do not run flag 1 for a passing reason restart again: pods admitted
    while the webhook was unreachable (failurePolicy Ignore: no preflight, the template's flag), and pods
    whose preflight got '0' from an agent that was unreachable or had not yet seen the enable (its watch
    lags under API trouble). At most once per STRAY_RESTART_SECONDS per node: a webhook the API server can
    never reach costs a slow retry, not a restart storm. A '0' from the stack itself is a refusal (RolledBack)."""
    last = Runtime.stray_restarts.get(node)
    if not stray or (last is not None and time.monotonic() - last < STRAY_RESTART_SECONDS):
        return
    logger.warning("node %s: restarting %s (not injected, or refused by a stale agent view)", node, ", ".join(stray))
    await restart_old_pods(namespace, node, stray, policy, logger)
    Runtime.stray_restarts[node] = time.monotonic()  # only after it worked: a failed eviction retries next reconcile


# backoff: a failed reconcile (API errors) is retried after one interval, not kopf's default minute.
@kopf.timer(GROUP, VERSION, PLURAL, interval=RECONCILE_SECONDS, backoff=RECONCILE_SECONDS, id="reconcile")
async def reconcile(name: str, namespace: str, spec: Mapping[str, Any], status: Mapping[str, Any], meta: Mapping[str, Any],
                    body: kopf.Body, logger: logging.Logger, **_: Any) -> None:
    uid = meta["uid"]
    if own_write_pending(uid, status):
        logger.debug("waiting for the watch to deliver our last status write")
        return
    if not Caches.synced():
        logger.info("waiting for the node and pod caches to fill")
        return
    assert Caches.nodes is not None and Caches.pods is not None
    node_index, agent_index, pod_index = Caches.nodes.snapshot("nodes"), Caches.pods.snapshot("agents"), Caches.pods.snapshot("serving")
    now = time.time()
    generation = meta.get("generation")
    parsed, problems = parse_spec(dict(spec))
    previous_conditions = status.get("conditions") or []
    if problems or parsed is None:
        message = "; ".join(problems)
        if status.get("phase") != "Invalid" or status.get("invalid") != message:
            kopf.warn(body, reason="InvalidSpec", message=message)
        await write_status(namespace, name, uid, status, dict(
            phase="Invalid", invalid=message, observedGeneration=generation,
            conditions=gating.merge_conditions(previous_conditions, gating.conditions("Invalid", {}, message, iso(now)))))
        return

    prev = {n: gating.NodeStatus.from_dict(d) for n, d in (status.get("nodes") or {}).items()}
    verdicts, analysis_summary = {}, status.get("analysis")
    if analysis_due(parsed, status, now):
        verdicts, analysis_summary = await analyse(namespace, name, parsed, prev, now, logger)
    selector = parsed.podSelector.model_dump()
    steps: dict[str, gating.Step] = {}
    pods_by_node: dict[str, list[dict[str, Any]]] = {}
    pod_summaries: dict[str, gating.PodSummary] = {}  # against the persisted changed_at: what restarts use
    for node in nodes_in_scope(node_index, parsed.nodeSelector.model_dump()):
        info = first(node_index, node)
        facts = gating.NodeFacts(node, info["labels"], info["annotations"], bool(first(agent_index, node)))
        retry = parsed.analysis.retryAfterSeconds
        el = gating.eligibility(facts, now, retry)
        record = gating.parse_rollback(info["annotations"])
        cleared = gating.rolled_back_for(record, el.fingerprint, now, retry) is None
        previous = prev.get(node, gating.NodeStatus(since=now))
        pods_by_node[node] = serving_pods(pod_index, namespace, node, selector)
        summary = pod_summaries[node] = gating.summarize_pods(pod_facts(pods_by_node[node]), previous.changed_at)
        steps[node] = gating.advance(previous, el, summary, verdicts.get(node), now, cleared, None if cleared else record)

    statuses = {n: s.status for n, s in steps.items()}
    aborted = abort_now(parsed, status, statuses, generation)
    if aborted:
        for node, current in statuses.items():
            if current.state in gating.FLAG_ON_STATES:
                steps[node] = gating.Step(gating.move(current, gating.DISABLED, f"rollout aborted: {aborted['reason']}", now, changed_at=now), "restart")
                statuses[node] = steps[node].status
    for node in gating.choose_holdouts(statuses, parsed.strategy.holdoutNodes):
        statuses[node] = replace(statuses[node], holdout=True, reason="holdout: control group kept at flag 0")
    for node in gating.plan_enables(statuses, parsed.strategy.canaryNodes, parsed.strategy.maxParallel, parsed.paused, bool(aborted)):
        steps[node] = gating.enable(statuses[node], now)
        statuses[node] = steps[node].status

    for node, new in statuses.items():
        old = prev.get(node)
        await apply_node(name, node, old, new, steps[node].action, first(node_index, node), body, logger)
        # persisted: same state and changed_at as the status read, so pod_summaries[node] is against new.changed_at
        persisted = old is not None and old.state == new.state and old.changed_at == new.changed_at
        if persisted and new.state in (gating.ENABLING, gating.DISABLED, gating.ROLLED_BACK) and \
                gating.restart_due(new, now, parsed.strategy.restartDelaySeconds) and parsed.strategy.restart != "None":
            await restart_old_pods(namespace, node, pod_summaries[node].old, parsed.strategy.restart, logger)
        if persisted and new.state in gating.FLAG_ON_STATES and parsed.strategy.restart != "None":
            await restart_strays(namespace, node, pod_summaries[node].retry, parsed.strategy.restart, logger)
        for pod in pods_by_node[node]:
            if pod["flag"] in ("0", "1") and pod["labels"].get(contract.LABEL_POD_FLAG) != pod["flag"]:
                await label_pod(namespace, pod["name"], pod["flag"], logger)

    phase = gating.phase(statuses, parsed.paused, bool(aborted), False)
    METRICS.observe_rollout(namespace, name, statuses)
    await write_status(namespace, name, uid, status, {
        "phase": phase,
        "counts": gating.counts(statuses),
        "nodes": {n: s.to_dict() for n, s in sorted(statuses.items())},
        "observedGeneration": generation,
        "invalid": None,
        "aborted": aborted,
        "analysis": analysis_summary,
        "conditions": gating.merge_conditions(previous_conditions, gating.conditions(phase, statuses, "", iso(now))),
    })


async def write_status(namespace: str, name: str, uid: str, status: Mapping[str, Any], fresh: dict[str, Any]) -> None:
    """Only what changed (an idle rollout costs no writes), each changed key replaced whole (a JSON patch:
    a merge patch would keep stale keys inside nested objects). Our own request, not kopf's patch: kopf 1.x
    applies a timer's patch outside the handler and a 409 there ends the timer for good (found by
    bench/faults.py); here a failure fails this reconcile, which kopf retries. Nulls are left out, as the
    API server prunes them from a structural schema, so what we wrote compares equal to what we read."""
    changed = {key: value for key, value in ((k, without_none(v)) for k, v in fresh.items()) if status.get(key) != value}
    if not changed:
        return
    if status:
        body: Any = [{"op": "remove", "path": f"/status/{key}"} if value is None else {"op": "add", "path": f"/status/{key}", "value": value}
                     for key, value in changed.items() if value is not None or key in status]
        content_type = JSON_PATCH
    else:
        body, content_type = {"status": {k: v for k, v in changed.items() if v is not None}}, MERGE_PATCH
    await call(custom().patch_namespaced_custom_object_status, GROUP, VERSION, namespace, PLURAL, name, body, _content_type=content_type)
    Runtime.written[uid] = (time.monotonic(), changed)


def without_none(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: without_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [without_none(v) for v in value]
    return value


def own_write_pending(uid: str, status: Mapping[str, Any]) -> bool:
    """True while the watch has not yet delivered our last status write (bounded: after STALE_WRITE_SECONDS
    the write is assumed lost or overwritten and the reconcile goes on from what the API shows)."""
    memo = Runtime.written.get(uid)
    if memo is None:
        return False
    at, changed = memo
    if time.monotonic() - at > STALE_WRITE_SECONDS or all(status.get(k) == v for k, v in changed.items()):
        del Runtime.written[uid]
        return False
    return True


def iso(now: float) -> str:
    return datetime.datetime.fromtimestamp(now, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def apply_node(rollout: str, node: str, old: gating.NodeStatus | None, new: gating.NodeStatus, action: str | None,
                     info: Mapping[str, Any] | None, body: kopf.Body, logger: logging.Logger) -> None:
    """Labels (and a rollback record) on the node, one patch; an Event for the transition."""
    wanted = gating.node_labels(new)
    current = (info or {}).get("labels", {})
    annotations = None
    if action == "rollback":
        annotations = {contract.ANNOTATION_ROLLBACK: json.dumps({"rollout": rollout, "fingerprint": new.fingerprint, "at": new.since,
                                                                 "reason": new.reason, "numbers": dict(new.numbers)}, sort_keys=True)}
    if any(current.get(k) != v for k, v in wanted.items()) or annotations:
        await label_node(node, wanted, annotations)
    if old is None or old.state != new.state:
        METRICS.transitions.labels(old.state if old else "None", new.state).inc()
        if action == "rollback":
            METRICS.rollbacks.labels("preflight" if "refused" in new.numbers else "analysis").inc()
        event = kopf.warn if new.state in (gating.ROLLED_BACK, gating.DISABLED) else kopf.info
        event(body, reason=new.state, message=f"node {node}: {old.state if old else 'new'} -> {new.state}: {new.reason}"[:1000])
        logger.info("node %s: %s -> %s: %s", node, old.state if old else "new", new.state, new.reason)


@kopf.on.delete(GROUP, VERSION, PLURAL)
async def cleanup(status: Mapping[str, Any], meta: Mapping[str, Any], logger: logging.Logger, **_: Any) -> None:
    """Deleting a rollout takes its labels off the nodes it managed: new pods start at flag 0. Running
    pods keep the flag they started with until they restart (a deletion does not restart a fleet)."""
    Runtime.written.pop(meta.get("uid"), None)
    for node in (status.get("nodes") or {}):
        try:
            await label_node(node, {contract.LABEL_ENABLED: None, contract.LABEL_STATE: None})
        except Exception as failure:  # a node deleted meanwhile
            logger.warning("cleanup of node %s: %s", node, failure)


# ---------------------------------------------------------------- the admission webhook


@kopf.on.mutate("pods", id="inject", operations=["CREATE"], ignore_failures=True)
def inject(body: kopf.Body, patch: kopf.Patch, namespace: str | None, rollout_index: kopf.Index,
           warnings: list[str], logger: logging.Logger, **_: Any) -> None:
    """Never raises (kopf answers a handler's exception with allowed=false): webhook.admit decides."""
    admission = webhook.admit(dict(body), namespace, rollout_index, Runtime.injection)
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
