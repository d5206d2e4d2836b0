"""The world as the plan (plan.py) reads it, as plain data: the nodes, which agents run, the serving pods
and the other rollouts' claims. world.py reads these from the caches or from raw API objects; the plan
decides over them. Its own module, so the readings and the plan both import it and neither imports the other.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from . import gating
from .serving import PodServing


def unix(timestamp: str | None) -> float:
    """A Kubernetes timestamp (RFC 3339, as metadata.creationTimestamp) in seconds since the epoch; 0 for none."""
    if not timestamp:
        return 0.0
    return datetime.datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


def iso(now: float) -> str:
    """Seconds since the epoch as a Kubernetes timestamp (RFC 3339, whole seconds, UTC)."""
    return datetime.datetime.fromtimestamp(now, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class NodeView:
    name: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    unschedulable: bool = False
    ready: bool | None = None  # the Ready condition; None when the node reports none (counted as ready)
    kubelet_version: str | None = None  # status.nodeInfo.kubeletVersion (fileKeyRef needs 1.35 or later)


@dataclass(frozen=True)
class PodView:
    """A serving pod, as gating needs it (world.pod_view reads it from a Pod)."""

    namespace: str
    name: str
    node: str
    labels: Mapping[str, str]
    created: float
    ready: bool = True
    deleting: bool = False
    flag: str | None = None
    preflight_reason: str | None = None
    injected: bool = True
    transient: bool = False
    controlled: bool = True  # a controller (ReplicaSet, StatefulSet, ...) recreates it when it is restarted
    serving: PodServing | None = None  # what its serving container states of its SGLang setup (serving.py)
    uid: str = ""
    wired: tuple[str, ...] = ()  # the containers the webhook gave the flag (contract.ENV_FLAG_CONTAINER)
    delivery_mode: str | None = None  # how they get it: fileKeyRef | shell (None: no flag file wired)
    held: str | None = None  # why its preflight holds it (its kubelet ignores fileKeyRef), None when it does not
    has_command: bool = True  # its serving container has a command (shell delivery can wrap it)
    image_digest: str | None = None  # the serving container's image as its runtime resolved it (image_ref)
    image_pinned: str | None = None  # a reference that runs exactly that image, None: none (or not started)
    awaiting_proof: bool = False  # its preflight got '0' only because its image was not proved on the node yet

    @property
    def running_flag(self) -> str | None:
        """The flag its serving process runs, where that is known: the preflight's verdict, or, for a pod the
        webhook never saw (created before the rollout, or while the webhook was down), its template's literal
        SGLANG_AITER_MLA_GLUON=0. Labelled on the pod, it lets such pods on untouched nodes be controls."""
        if self.flag in ("0", "1"):
            return self.flag
        if not self.injected and self.serving is not None and self.serving.flag_env is False:
            return "0"
        return None

    def facts(
        self, delivered: str | None = None, mismatch: str | None = None, proved_now: bool = False
    ) -> gating.PodFacts:
        """Its facts for the gating, with the flag its processes were seen to run (delivery.py). `proved_now`: its
        node holds a passing proof of its image by now (a pod that waited for it restarts to get 1)."""
        return gating.PodFacts(
            self.name,
            self.created,
            self.flag,
            self.preflight_reason,
            self.ready,
            self.deleting,
            self.injected,
            self.transient or (self.awaiting_proof and proved_now),
            self.controlled,
            delivered,
            mismatch,
            self.awaiting_proof and not proved_now,
        )


@dataclass(frozen=True)
class Claim:
    """Another rollout's claim on nodes: its node selector and age (the older one owns an overlap)."""

    namespace: str
    name: str
    created: float
    node_selector: Mapping[str, Any]


@dataclass(frozen=True)
class ApiFacts:
    """What the operator found out about its API server (apiserver.py): its version, and whether a pod with
    fileKeyRef passes its admission and validation (None: not known yet, or it could not be checked)."""

    version: str | None = None
    file_key_ref: bool | None = None
    reason: str = "not checked yet"

    def to_dict(self) -> dict[str, object]:
        return {"version": self.version, "fileKeyRef": self.file_key_ref, "reason": self.reason}


@dataclass(frozen=True)
class World:
    nodes: Mapping[str, NodeView]
    agents: Mapping[str, bool]  # node -> its agent pod runs and is ready
    pods: Mapping[tuple[str, str], Sequence[PodView]]  # (namespace, node) -> serving pods there
    rollouts: Sequence[Claim] = ()  # every rollout, this one included
    api: ApiFacts = ApiFacts()
    # node -> since when (unix seconds) its agent has not been running and ready, as the caches saw it
    agents_lost_since: Mapping[str, float] = field(default_factory=dict)
    injection_mode: str = "auto"  # the chart's operator.injectionMode (contract.INJECTION_MODES)
    proving: bool = False  # self-tests run in the serving images (the chart's selfTest.inServingImage)
