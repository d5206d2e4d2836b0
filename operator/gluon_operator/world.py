"""Gathering the world (its types in world_types.py): what the plan (plan.py) reads, from the node and pod
caches (informer.py).

The readings of a Node or Pod are pure functions (`node_view`, `agent_entry`, `pod_view`), shared by the
caches and by `kubectl gluon plan` (kubectl_plugin.views.preview, from raw objects), so both decide alike.
The caches hold only what the operator needs: every Node; agent pods by their label; and, per rollout, the
pods its podSelector selects in its namespace (both selected by the API server, so no other pod is listed
or watched).
"""

from __future__ import annotations

import functools
import logging
import os
import time
from dataclasses import replace
from typing import Any, Callable, Iterable, Mapping

from gluon_common import contract, image_ref
from gluon_common.kube import ApiFailure
from gluon_common.report import NodeProofs

from . import proving, webhook
from .informer import Informer
from .records import PreflightVerdict, read_json
from .serving import PodServing, container_serving
from .world_types import Claim, NodeView, PodView, World, unix

log = logging.getLogger("gluon_operator.world")

AGENT_LABEL = os.environ.get("GLUON_AGENT_LABEL", "app.kubernetes.io/name=gluon-rollout-agent")
AGENT_LABEL_KEY, AGENT_LABEL_VALUE = AGENT_LABEL.split("=", 1)
STALE_WRITE_SECONDS = 30.0  # an own node write the watch has not shown by then is taken as lost or overwritten


# ---------------------------------------------------------------- readings of one object (pure)


def condition_true(status: Mapping[str, Any], kind: str) -> bool | None:
    for c in status.get("conditions") or []:
        if isinstance(c, Mapping) and c.get("type") == kind:
            return c.get("status") == "True"
    return None


def node_view(obj: Mapping[str, Any]) -> NodeView:
    """Every label (a rollout's nodeSelector may name any), but only our own annotations: other tools'
    annotations on a Node can be large, and the cache holds every Node of the fleet."""
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k.startswith(contract.PREFIX)}
    return NodeView(
        meta["name"],
        dict(meta.get("labels") or {}),
        annotations,
        bool(spec.get("unschedulable")),
        condition_true(status, "Ready"),
        kubelet_version(status),
    )


def kubelet_version(status: Mapping[str, Any]) -> str | None:
    version = (
        (status.get("nodeInfo") or {}).get("kubeletVersion") if isinstance(status.get("nodeInfo"), Mapping) else None
    )
    return version if isinstance(version, str) else None


def is_agent(obj: Mapping[str, Any]) -> bool:
    return ((obj.get("metadata") or {}).get("labels") or {}).get(AGENT_LABEL_KEY) == AGENT_LABEL_VALUE


def agent_entry(obj: Mapping[str, Any]) -> dict[str, bool] | None:
    """node -> whether its agent pod is running and ready."""
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    node = spec.get("nodeName")
    if not node or not is_agent(obj):
        return None
    return {
        node: status.get("phase") == "Running"
        and bool(condition_true(status, "Ready"))
        and not meta.get("deletionTimestamp")
    }


def selftest_entry(obj: Mapping[str, Any]) -> dict[str, proving.ProvingPod] | None:
    view = proving.proving_pod_view(obj, unix((obj.get("metadata") or {}).get("creationTimestamp")))
    return {view.name: view} if view is not None else None


def preflight_verdict(status: Mapping[str, Any]) -> tuple[PreflightVerdict | None, str | None]:
    """The preflight init container's verdict (its termination message), type-checked: (verdict, None),
    (None, None) while there is none, or (None, why) for a message of the wrong shape."""
    for container in status.get("initContainerStatuses") or []:
        if isinstance(container, Mapping) and container.get("name") == webhook.PREFLIGHT_CONTAINER:
            # A preflight that holds its pod exits non-zero and is restarted by the kubelet: its verdict is
            # then the last run's (lastState), while it waits to run again.
            message = terminated_message(container.get("state")) or terminated_message(container.get("lastState"))
            if not message:
                return None, None
            verdict, problem = read_json(PreflightVerdict, message, "the preflight message")
            return verdict, (f"{problem}: {message[:200]!r}" if problem else None)
    return None, None


def terminated_message(state: Any) -> str | None:
    terminated = state.get("terminated") if isinstance(state, Mapping) else None
    message = terminated.get("message") if isinstance(terminated, Mapping) else None
    return message if isinstance(message, str) and message else None


def wiring(spec: Mapping[str, Any]) -> tuple[tuple[str, ...], str | None]:
    """(the containers the webhook gave the flag, how: fileKeyRef | shell), read from the pod's spec."""
    names, modes = [], set()
    for container in spec.get("containers") or []:
        if not isinstance(container, Mapping) or not isinstance(container.get("name"), str):
            continue
        env = [e for e in container.get("env") or [] if isinstance(e, Mapping)]
        if not any(e.get("name") == contract.ENV_FLAG_CONTAINER for e in env):
            continue
        names.append(container["name"])
        flag = next((e for e in env if e.get("name") == contract.FLAG_ENV), {})
        if isinstance(flag.get("valueFrom"), Mapping) and "fileKeyRef" in flag["valueFrom"]:
            modes.add(webhook.FILEKEYREF)
        elif webhook.wrapped(container.get("command")):
            modes.add(webhook.SHELL)
    return tuple(names), (modes.pop() if len(modes) == 1 else None)


def pod_view(obj: Mapping[str, Any]) -> PodView | None:
    """A pod on a node as the gating needs it; a verdict of the wrong shape reads as no flag, with why."""
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    node = spec.get("nodeName")
    if not node:
        return None
    verdict, problem = preflight_verdict(status)
    agent = verdict.agent if verdict else None
    serving = pod_serving(obj)
    transient = not (verdict and verdict.final) and (agent is None or agent.current is False or agent.enabled is False)
    injected = (
        contract.ANNOTATION_POD_INJECTED in (meta.get("annotations") or {})
        or verdict is not None
        or problem is not None
        or any(
            isinstance(c, Mapping) and c.get("name") == webhook.PREFLIGHT_CONTAINER
            for c in spec.get("initContainers") or []
        )
    )
    return PodView(
        meta.get("namespace") or "",
        meta.get("name") or "",
        node,
        dict(meta.get("labels") or {}),
        unix(meta.get("creationTimestamp")),
        bool(condition_true(status, "Ready")),
        bool(meta.get("deletionTimestamp")),
        verdict.flag if verdict else None,
        verdict.reason if verdict else problem,
        injected,
        verdict is not None and verdict.flag == "0" and transient,
        any(isinstance(o, Mapping) and o.get("controller") is True for o in meta.get("ownerReferences") or []),
        serving,
        str(meta.get("uid") or ""),
        *wiring(spec),
        verdict.reason if verdict is not None and verdict.held else None,
        serving_has_command(obj),
        *serving_image(obj),
        verdict is not None and verdict.flag == "0" and agent is not None and agent.proved is False,
    )


def serving_image(obj: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """(digest, pinned reference) of the image the serving container runs, as its node's runtime resolved it;
    (None, None) before it has started, or for a shape the webhook could not read."""
    container, status = picked_container(obj), obj.get("status") or {}
    if not container or container is UNREADABLE:
        return None, None
    seen = next(
        (
            c
            for c in status.get("containerStatuses") or []
            if isinstance(c, Mapping) and c.get("name") == container["name"]
        ),
        None,
    )
    if seen is None:
        return None, None
    identity = image_ref.identify(str(container.get("image") or ""), seen.get("image"), seen.get("imageID"))
    return identity.digest, identity.pinned


UNREADABLE: Any = object()  # a pod shape nobody can inject


def picked_container(obj: Mapping[str, Any]) -> Any:
    """The serving container as the webhook picks it, None without containers, UNREADABLE for a shape the
    webhook could not read either."""
    containers = (obj.get("spec") or {}).get("containers")
    try:
        return webhook.serving_container(containers, webhook.annotations_of(obj)) if containers else None
    except (webhook.NotInjectable, TypeError, KeyError, AttributeError):
        return UNREADABLE


def serving_has_command(obj: Mapping[str, Any]) -> bool:
    """Whether the serving container (as the webhook picks it) has a command shell delivery can wrap."""
    container = picked_container(obj)
    if container is UNREADABLE:
        return True  # a shape nobody can inject: not a delivery matter
    return bool(container and container.get("command"))


def pod_serving(obj: Mapping[str, Any]) -> PodServing | None:
    """What the pod's serving container (as the webhook picks it) states of its SGLang setup; None for a pod
    whose shape the webhook could not read either."""
    containers = (obj.get("spec") or {}).get("containers")
    if (
        not isinstance(containers, list)
        or not containers
        or not all(isinstance(c, dict) and isinstance(c.get("name"), str) for c in containers)
    ):
        return None
    try:  # no deep copy of the spec (webhook.checked_spec's): this runs on every pod event of the cache
        return container_serving(webhook.serving_container(containers, webhook.annotations_of(obj)))
    except webhook.NotInjectable:
        return None


def world_from_objects(nodes: list[dict], pods: list[dict], claims: list[Claim]) -> World:
    """The world from raw objects (kubectl_plugin.views.preview): the same readings the caches make."""
    views = {v.name: v for v in map(node_view, nodes)}
    agents: dict[str, bool] = {}
    serving: dict[tuple[str, str], list[PodView]] = {}
    for pod in pods:
        entry = agent_entry(pod)
        if entry is not None:
            for node, alive in entry.items():
                agents[node] = agents.get(node, False) or alive
            continue
        view = pod_view(pod)
        if view is not None:
            serving.setdefault((view.namespace, view.node), []).append(view)
    return World(views, agents, serving, claims)


# ---------------------------------------------------------------- the caches


PodsKey = tuple[str, str]  # (namespace, label selector)


class Caches:
    """The informers: every Node; agent pods (label-selected by the API server); and per rollout pod
    selector, that namespace's pods it selects (selected by the API server), so nothing else is held.
    `written` overlays our own node writes the node watch has not shown yet, so a reconcile never plans
    from a node older than its own last write (it would re-enable past maxParallel). One per operator run,
    built by the startup handler (handlers.configure)."""

    def __init__(
        self,
        core: Any,
        timeout: int,
        on_error: Callable[[ApiFailure], None] | None,
        rollouts: tuple[Any, Callable[[Mapping[str, Any]], Mapping[str, Any]]] | None = None,
    ) -> None:
        """`rollouts`: (the GluonRollouts' list call, their index entry), for the webhook."""
        self.core, self.timeout, self.on_error = core, timeout, on_error
        self.rollouts_source = rollouts
        self.nodes: Informer | None = None
        self.agents: Informer | None = None
        self.rollouts: Informer | None = None
        self.pods: dict[PodsKey, Informer] = {}
        self.written: dict[str, tuple[float, dict[str, Any], dict[str, Any]]] = {}
        self.agent_lost_since: dict[str, float] = {}  # node -> when (unix) its agent was first seen gone
        self.selftests: Informer | None = None  # the self-test pods in the operator's namespace (proving.py)

    def start(self) -> Caches:
        self.nodes = Informer(
            "nodes",
            self.core.list_node,
            {"nodes": lambda o: {o["metadata"]["name"]: node_view(o)}},
            watch_timeout=self.timeout,
            on_error=self.on_error,
        ).start()
        self.agents = Informer(
            "agents",
            self.core.list_pod_for_all_namespaces,
            {"agents": agent_entry},
            label_selector=AGENT_LABEL,
            watch_timeout=self.timeout,
            on_error=self.on_error,
        ).start()
        if self.rollouts_source is not None:
            list_call, entry = self.rollouts_source
            self.rollouts = Informer(
                "rollouts", list_call, {"rollouts": entry}, watch_timeout=self.timeout, on_error=self.on_error
            ).start()
        return self

    def watch_selftests(self, namespace: str) -> None:
        """Start the cache of self-test pods: the operator's own namespace, by their label."""
        if self.selftests is not None:
            return
        self.selftests = Informer(
            f"self-test pods {namespace}",
            functools.partial(self.core.list_namespaced_pod, namespace),
            {"selftests": selftest_entry},
            label_selector=f"{contract.LABEL_SELFTEST_POD}=true",
            watch_timeout=self.timeout,
            on_error=self.on_error,
        ).start()

    def selftest_pods(self) -> list[proving.ProvingPod] | None:
        """Every self-test pod, once their cache has listed; None before (nothing is planned blind)."""
        if self.selftests is None or not self.selftests.synced.is_set():
            return None
        index = self.selftests.snapshot("selftests")
        return [pod for name in index for pod in index.get(name) or []]

    def node_proofs(self) -> dict[str, NodeProofs]:
        """Every node's proofs annotation, our own writes not yet shown included, read (an unreadable one as
        none: it is rewritten whole)."""
        nodes = self.current_nodes()
        return {
            name: proving.read_proofs(view.annotations.get(contract.ANNOTATION_PROOFS))[0]
            for name, view in nodes.items()
            if contract.ANNOTATION_PROOFS in view.annotations
        }

    def live_rollouts(self) -> Any | None:
        """Every rollout by namespace (an Index) once the rollout informer has listed; None before."""
        if self.rollouts is None or not self.rollouts.synced.is_set():
            return None
        return self.rollouts.snapshot("rollouts")

    def close(self) -> None:
        for informer in (self.nodes, self.agents, self.rollouts, self.selftests, *self.pods.values()):
            if informer is not None:
                informer.close()

    def want_pods(self, wanted: Iterable[PodsKey]) -> None:
        """Start a pod informer for each (namespace, selector) some rollout has; stop those none has."""
        wanted = set(wanted)
        for key in set(self.pods) - wanted:
            self.pods.pop(key).close()
        for namespace, selector in wanted - set(self.pods):

            def serving(obj: Mapping[str, Any]) -> dict[Any, Any] | None:
                view = pod_view(obj)
                return {view.node: view} if view is not None else None

            self.pods[(namespace, selector)] = Informer(
                f"pods {namespace} {selector}",
                functools.partial(self.core.list_namespaced_pod, namespace),
                {"serving": serving},
                label_selector=selector,
                watch_timeout=self.timeout,
                on_error=self.on_error,
            ).start()

    def wait_synced(self, pods: PodsKey | None, timeout: float) -> bool:
        """True once the node and agent caches (and the pod cache of `pods`) have listed once; waits at most
        `timeout` s."""
        deadline = time.monotonic() + timeout
        informers = [self.nodes, self.agents] + ([self.pods.get(pods)] if pods else [])
        return all(i is not None and i.synced.wait(max(0.0, deadline - time.monotonic())) for i in informers)

    def nodes_listed(self) -> bool:
        """Whether the node cache has listed once (until then it knows no node)."""
        return self.nodes is not None and self.nodes.synced.is_set()

    def refused(self, pods: PodsKey) -> str | None:
        """Why the API server refuses to list the pods of this (namespace, selector), if it does."""
        informer = self.pods.get(pods) if pods[1] else None
        return informer.refused if informer is not None else None

    def wrote(self, node: str, labels: Mapping[str, Any], annotations: Mapping[str, Any]) -> None:
        self.written[node] = (time.monotonic(), dict(labels), dict(annotations))

    def current_nodes(self) -> dict[str, NodeView]:
        """Every node as the cache sees it, with our own writes the watch has not shown yet laid over it."""
        assert self.nodes is not None
        nodes_index = self.nodes.snapshot("nodes")
        nodes = {name: (nodes_index.get(name) or [None])[0] for name in nodes_index}
        for name, (at, labels, own_annotations) in list(self.written.items()):
            view = nodes.get(name)
            shown = (
                view is not None
                and all(view.labels.get(k) == v for k, v in labels.items())
                and all(view.annotations.get(k) == v for k, v in own_annotations.items())
            )
            if view is None or shown or time.monotonic() - at > STALE_WRITE_SECONDS:
                del self.written[name]
                continue
            nodes[name] = replace(
                view, labels=merged(view.labels, labels), annotations=merged(view.annotations, own_annotations)
            )
        return {n: v for n, v in nodes.items() if v is not None}

    def world(self, claims: list[Claim], pods: PodsKey | None = None) -> World:
        """What the caches see, with our own node writes not yet shown; the serving pods of `pods` only."""
        assert self.agents is not None
        nodes, agents_index = self.current_nodes(), self.agents.snapshot("agents")
        agents = {node: any(agents_index.get(node) or []) for node in agents_index}
        lost = self.lost_since(nodes, agents)
        serving: dict[tuple[str, str], list[PodView]] = {}
        informer = self.pods.get(pods) if pods else None
        if informer is not None and pods is not None:
            index = informer.snapshot("serving")
            serving = {(pods[0], node): list(index.get(node) or []) for node in index}
        return World(nodes, agents, serving, claims, agents_lost_since=lost)

    def lost_since(self, nodes: Iterable[str], agents: Mapping[str, bool]) -> dict[str, float]:
        """Since when each node's agent has been gone, continuously, as these caches saw it (a restarted
        operator starts counting afresh: a grace that starts late only delays a disable)."""
        now, nodes = time.time(), set(nodes)
        for node in set(self.agent_lost_since) - nodes:  # deleted
            del self.agent_lost_since[node]
        for node in nodes:
            if agents.get(node):
                self.agent_lost_since.pop(node, None)
            else:
                self.agent_lost_since.setdefault(node, now)
        return dict(self.agent_lost_since)


def merged(current: Mapping[str, str], patch: Mapping[str, Any]) -> dict[str, str]:
    out = dict(current)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = value
    return out
