"""How the flag reaches a rollout's serving pods, and whether it did (pure; the plan calls these).

Two ways to hand the preflight's verdict to the serving process (webhook.py injects them):
- `fileKeyRef`: the kubelet reads the flag file into the environment (Kubernetes EnvFiles, KEP-3721: alpha
  and off in 1.34, beta and on from 1.35). An API server without it drops the field at admission, and the
  pod then fails validation; a kubelet without it (older than 1.35, or the gate off) ignores the field and
  hands the process an EMPTY value, which SGLang reads as its default, on (gluon_common.sglang_env).
- `shell`: the container's command is wrapped to source the file and export it; every kubelet runs it, but
  it needs the container's command (the image's entrypoint is not known to the webhook).

`auto` (the chart's default) takes fileKeyRef only where the API server accepts it (a dry-run create the
operator makes, apiserver.py) and every node the rollout selects runs a kubelet of 1.35 or later that has not
been seen to ignore it; else shell. Whatever the mode, the agent reads the flag each serving process really
got (gluon_agent.observe) and the operator trusts that, not what it meant to deliver.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from gluon_common import contract
from gluon_common.delivery import UNSET, DeliveryReport, ObservedContainer

from .world_types import ApiFacts, PodView

FILEKEYREF_SINCE = (1, 35)  # EnvFiles on by default (beta) from this minor
AUTO, FILEKEYREF, SHELL = contract.INJECTION_MODES
IGNORED_BY_CAP = 100  # nodes remembered in status.delivery.ignoredBy
NAMES = 5  # nodes named in a reason


def minor(version: str | None) -> tuple[int, int] | None:
    """(major, minor) of a Kubernetes version as nodes and /version report it ('v1.33.5-eks-1a2b' included);
    None for what is not one (kwok's 'kwok-v0.8.0')."""
    match = re.match(r"^v?(\d+)\.(\d+)(?:\.\d+)?(?:[-+].*)?$", version or "")
    return (int(match.group(1)), int(match.group(2))) if match else None


def kubelet_honours(version: str | None) -> bool:
    """Whether a kubelet of this version reads fileKeyRef with its default gates (1.35 or later)."""
    found = minor(version)
    return found is not None and found >= FILEKEYREF_SINCE


@dataclass(frozen=True)
class Mode:
    """The delivery a rollout's pods get now (status.delivery), and why."""

    mode: str  # fileKeyRef | shell
    configured: str  # the chart's operator.injectionMode
    reason: str
    ignored_by: Mapping[str, str] = field(default_factory=dict)  # node -> its kubelet version when it ignored
    undeliverable: str | None = None  # why no pod of this rollout can get flag 1 (then no node is enabled)

    def refuses(self, node: str, kubelet: str | None) -> str | None:
        """Why this node's kubelet cannot take the flag in this mode, or None."""
        if self.mode != FILEKEYREF:
            return None
        if node in self.ignored_by:
            return (
                f"its kubelet {self.ignored_by[node]} ignored fileKeyRef (EnvFiles off): a serving process would get "
                f"an empty {contract.FLAG_ENV}, which SGLang reads as on; its pods are held at their preflight"
            )
        if not kubelet_honours(kubelet):
            return (
                f"its kubelet {kubelet or '(unknown version)'} is older than "
                f"{'.'.join(map(str, FILEKEYREF_SINCE))} and ignores fileKeyRef; injectionMode is fileKeyRef"
            )
        return None

    def to_dict(self, api: ApiFacts) -> dict[str, object]:
        return {
            "mode": self.mode,
            "configured": self.configured,
            "reason": self.reason,
            "ignoredBy": dict(self.ignored_by) or None,
            "undeliverable": self.undeliverable,
            "apiServer": api.to_dict(),
        }


def named(nodes: list[str]) -> str:
    return ", ".join(nodes[:NAMES]) + (f" and {len(nodes) - NAMES} more" if len(nodes) > NAMES else "")


def resolve_mode(
    configured: str,
    api: ApiFacts,
    kubelets: Mapping[str, str | None],
    ignored_by: Mapping[str, str],
    commandless: Iterable[str] = (),
) -> Mode:
    """The mode of a rollout whose nodes run these kubelets (node -> version). `ignored_by`: nodes seen to
    ignore fileKeyRef (held pods, empty values observed), kept while their kubelet's version is unchanged.
    `commandless`: serving containers of its pods that have no command (shell cannot wrap them)."""
    ignored = {n: v for n, v in ignored_by.items() if n in kubelets and kubelets[n] == v}
    ignored = dict(sorted(ignored.items())[:IGNORED_BY_CAP])
    no_command = sorted(set(commandless))
    if configured == SHELL:
        return Mode(
            SHELL,
            configured,
            "injectionMode shell: the webhook wraps the serving command",
            ignored,
            _shell_gap(no_command),
        )
    if configured == FILEKEYREF:
        if api.file_key_ref is not True:
            why = (
                f"the API server does not accept fileKeyRef ({api.reason}): pods are admitted uninjected, at their "
                "template's flag"
            )
            return Mode(FILEKEYREF, configured, "injectionMode fileKeyRef", ignored, why)
        return Mode(FILEKEYREF, configured, "injectionMode fileKeyRef: the kubelet reads the flag file", ignored)
    if api.file_key_ref is not True:
        reason = f"auto: shell, as the API server does not accept fileKeyRef ({api.reason})"
        return Mode(SHELL, configured, reason, ignored, _shell_gap(no_command))
    old = sorted(n for n, v in kubelets.items() if not kubelet_honours(v))
    if old:
        reason = (
            f"auto: shell, as {len(old)} of the rollout's nodes run a kubelet older than 1.35 that ignores "
            f"fileKeyRef ({named([f'{n} {kubelets[n]}' for n in old])})"
        )
        return Mode(SHELL, configured, reason, ignored, _shell_gap(no_command))
    if ignored:
        reason = (
            f"auto: shell, as {len(ignored)} node(s) ignored fileKeyRef though their kubelet is 1.35 or later "
            f"(EnvFiles off: {named([f'{n} {v}' for n, v in ignored.items()])})"
        )
        return Mode(SHELL, configured, reason, ignored, _shell_gap(no_command))
    reason = (
        f"auto: fileKeyRef, as the API server {api.version or ''} accepts it and all {len(kubelets)} of the "
        "rollout's nodes run a kubelet of 1.35 or later"
    ).replace("  ", " ")
    return Mode(FILEKEYREF, configured, reason, ignored)


def _shell_gap(no_command: list[str]) -> str | None:
    if not no_command:
        return None
    return (
        f"shell delivery wraps the serving container's command, and {named(no_command)} has none (its image's "
        "entrypoint is unknown to the webhook): those pods run at flag 0 (set the container's command, or use a "
        "cluster where fileKeyRef works)"
    )


# ---------------------------------------------------------------- one pod: what it runs


VERIFIED, MISMATCH, UNOBSERVED, HELD, TEMPLATE = "verified", "mismatch", "unobserved", "held", "template"


@dataclass(frozen=True)
class PodDelivery:
    state: str  # VERIFIED | MISMATCH | UNOBSERVED | HELD | TEMPLATE (not injected: its template's literal)
    flag: str | None  # the flag its serving processes run ('0'|'1'; '1' when any runs it), None: not known
    detail: str = ""  # for status, explain and Events
    ignores_file_key_ref: bool = False  # evidence that its node's kubelet ignores fileKeyRef

    @property
    def unsafe(self) -> bool:
        """A process runs the accelerated path where the flag it was given says 0."""
        return self.state == MISMATCH and self.flag == "1"


def observed(report: DeliveryReport | None, pod: PodView) -> dict[str, list[ObservedContainer]]:
    """The agent's observations of this pod's wired containers, by container name."""
    if report is None or not pod.uid:
        return {}
    out: dict[str, list[ObservedContainer]] = {}
    for container in report.by_pod().get(pod.uid, []):
        out.setdefault(container.container, []).append(container)
    return out


def pod_delivery(pod: PodView, report: DeliveryReport | None) -> PodDelivery:
    """What this serving pod's processes run, against the flag its preflight chose (pod.flag)."""
    if not pod.injected:
        flag = pod.running_flag
        return PodDelivery(TEMPLATE, flag, "not injected: its template's literal value" if flag else "not injected")
    if pod.held:
        return PodDelivery(HELD, None, pod.held, ignores_file_key_ref=True)
    if report is None or not report.available:
        why = report.problem if report is not None else "its node's agent has published no observation"
        return PodDelivery(UNOBSERVED, None, f"not observed: {why}")
    seen = observed(report, pod)
    missing = [name for name in pod.wired if name not in seen]
    if not pod.wired or missing:
        return PodDelivery(UNOBSERVED, None, f"not observed yet: container {', '.join(missing) or '(none wired)'}")
    intended = pod.flag or _file_flag(seen)
    runs = sorted({flag for containers in seen.values() for c in containers for flag in c.runs})
    empty = any(c.delivered in ("", UNSET) for containers in seen.values() for c in containers)
    ignores = pod.delivery_mode == FILEKEYREF and empty
    if intended is not None and runs == [intended]:
        return PodDelivery(VERIFIED, intended, f"runs {intended}, as its preflight chose")
    flag = "1" if "1" in runs else (runs[0] if runs else None)
    return PodDelivery(MISMATCH, flag, mismatch_detail(pod, seen, intended), ignores)


def _file_flag(seen: Mapping[str, list[ObservedContainer]]) -> str | None:
    flags = {c.intended for containers in seen.values() for c in containers}
    return flags.pop() if len(flags) == 1 else None


def mismatch_detail(pod: PodView, seen: Mapping[str, list[ObservedContainer]], intended: str | None) -> str:
    parts = []
    for name, containers in sorted(seen.items()):
        for c in containers:
            value = "unset" if c.delivered == UNSET else repr(c.delivered)
            parts.append(f"container {name} ({c.container_id}) runs {'/'.join(c.runs)} ({contract.FLAG_ENV}={value})")
    how = f", delivered by {pod.delivery_mode}" if pod.delivery_mode else ""
    return f"{'; '.join(parts)} where its preflight chose {intended or '(unknown)'}{how}"


# ---------------------------------------------------------------- one node: what to do about it


@dataclass(frozen=True)
class NodeDelivery:
    """A node's serving pods as delivered (the plan reads it per node)."""

    pods: Mapping[str, PodDelivery]  # pod name -> its delivery
    unavailable: str | None = None  # why the node's processes cannot be observed (None: they can)
    ignores_file_key_ref: bool = False

    def mismatched(self) -> list[str]:
        return [f"{name}: {d.detail}" for name, d in sorted(self.pods.items()) if d.state == MISMATCH]

    def unsafe(self) -> list[str]:
        return [f"{name}: {d.detail}" for name, d in sorted(self.pods.items()) if d.unsafe]

    def mismatch(self, name: str) -> str | None:
        found = self.pods.get(name)
        return found.detail if found is not None and found.state == MISMATCH else None

    def delivered(self, name: str) -> str | None:
        """The flag the pod's processes were seen to run (or its template's, uninjected), None if unknown."""
        found = self.pods.get(name)
        return found.flag if found is not None and found.state in (VERIFIED, MISMATCH, TEMPLATE) else None

    def counts(self) -> dict[str, int]:
        out = {VERIFIED: 0, MISMATCH: 0, UNOBSERVED: 0, HELD: 0}
        for d in self.pods.values():
            if d.state in out:
                out[d.state] += 1
        return out


def node_delivery(pods: Iterable[PodView], report: DeliveryReport | None) -> NodeDelivery:
    deliveries = {p.name: pod_delivery(p, report) for p in pods if not p.deleting}
    unavailable = None
    if report is None:
        unavailable = "its agent has published no delivery observation"
    elif not report.available:
        unavailable = f"its agent cannot observe the flag its serving processes run: {report.problem}"
    return NodeDelivery(deliveries, unavailable, any(d.ignores_file_key_ref for d in deliveries.values()))


def to_restart(pods: Iterable[PodView], node: NodeDelivery, mode: Mode) -> list[str]:
    """Pods a restart makes safe: injected under another mode than the rollout's now (held at their preflight by
    a kubelet that ignores fileKeyRef, or run on its empty value) and running, or held, unsafely. A pod whose own
    command or environment overrides the flag comes back the same: it is not restarted (its node is barred)."""
    out = []
    for pod in pods:
        d = node.pods.get(pod.name)
        if d is None or pod.deleting or pod.delivery_mode in (None, mode.mode):
            continue
        if d.state == HELD or d.unsafe:
            out.append(pod.name)
    return sorted(out)
