"""The flag each injected serving container really runs, as the agent observes it on its node
(contract.ANNOTATION_DELIVERY): the agent builds it through these models, the operator reads it with them.

An observation is read off the container's processes, never off the pod spec: `delivered` is the value of
SGLANG_AITER_MLA_GLUON in the environment the kernel holds for the container's main process (what
the kubelet, the shell wrapper or the container's own command gave it at exec), `runs` what SGLang makes of
each process's value (gluon_common.sglang_env: unset or empty is on), and `intended` the value the pod's
preflight wrote into its flag file, read through the process's own root. Nothing else of a process's
environment is ever kept (gluon_agent.observe reads these two variables and drops the rest in the function
that read them).

Bounded: at most MAX_CONTAINERS containers (a GPU node runs a few serving pods; the kubelet's default is 110
pods), values cut to VALUE_CHARS printable characters, at most MAX_VALUES distinct values each.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, StrictBool, StrictInt, StrictStr

from .report import Lenient

DELIVERY_SCHEMA_VERSION = 1
MAX_CONTAINERS = 64
MAX_VALUES = 4
VALUE_CHARS = 16
UNSET = "<unset>"  # a process without the variable (SGLang: its default, on)

Flag = Literal["0", "1"]


def shown(raw: str | None) -> str:
    """A process's raw value as a report carries it: printable, at most VALUE_CHARS, UNSET for none."""
    if raw is None:
        return UNSET
    text = "".join(c if c.isprintable() else "?" for c in raw[:VALUE_CHARS])
    return text + ("..." if len(raw) > VALUE_CHARS else "")


class ObservedContainer(Lenient):
    """One injected serving container (its processes grouped by their cgroup) on the node."""

    pod_uid: StrictStr
    container: StrictStr  # its name, from contract.ENV_FLAG_CONTAINER in its processes' environment
    container_id: StrictStr  # the runtime's id, first 12 characters (a restarted container has a new one)
    intended: Flag | None = None  # the pod's flag file, as the preflight wrote it; None: unreadable
    delivered: StrictStr = UNSET  # the main process's raw value (shown())
    runs: list[Flag] = Field(default_factory=list)  # what SGLang makes of each process's value, distinct, sorted
    values: list[StrictStr] = Field(default_factory=list)  # distinct raw values over its processes (shown())
    processes: StrictInt = 0
    since: float | None = None  # when it was first observed as it is now (unix seconds)

    @property
    def key(self) -> tuple[str, str]:
        return self.pod_uid, self.container

    def mismatch(self) -> bool:
        """A process runs another flag than the one the preflight chose (or that flag is unreadable)."""
        return self.intended is None or any(flag != self.intended for flag in self.runs)


class DeliveryReport(Lenient):
    """What the agent publishes on its Node (gluon_agent.delivery builds it)."""

    schema_version: int = DELIVERY_SCHEMA_VERSION
    available: StrictBool = False  # False: the agent cannot see its node's processes (problem says why)
    problem: StrictStr | None = None
    cgroup_root: StrictStr | None = None  # the kubelet's cgroup root the observer read (None: the whole host)
    containers: list[ObservedContainer] = Field(default_factory=list)
    omitted: StrictInt = 0  # containers past MAX_CONTAINERS, not listed

    def by_pod(self) -> dict[str, list[ObservedContainer]]:
        out: dict[str, list[ObservedContainer]] = {}
        for container in self.containers:
            out.setdefault(container.pod_uid, []).append(container)
        return out
