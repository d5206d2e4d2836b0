"""Where the daemon gets its node's delivery observation (observe.py reads /proc), and `gluon-agent observe`.

Reading another user's process environment needs CAP_SYS_PTRACE, which the daemon (UID 65532, no
capabilities, GPU access) should not hold. So the chart runs the observation in a container of its own in the
agent's pod (root with only CAP_SYS_PTRACE, the host's /proc read-only, no API token, no network listener),
which writes its report to a shared in-memory volume every few seconds (`run_observer`); the daemon reads
that file (FileObservation) and publishes it. Where the daemon itself may read /proc (the local-cluster
harness runs it as root on the host), InlineObservation reads it directly.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

from pydantic import ValidationError

from gluon_common.delivery import DeliveryReport, ObservedContainer

from .observe import kubelet_root, observe

log = logging.getLogger("gluon_agent.delivery")
DEFAULT_INTERVAL = 5.0
STALE_INTERVALS = 3  # a file older than this many intervals (plus a grace) means the observer stopped
STALE_GRACE = 5.0
FILE_LIMIT = 1024 * 1024


class Observation(Protocol):
    def read(self, now: float) -> tuple[DeliveryReport, int]:
        """(the node's observation now, pod processes whose environment could not be read)."""
        ...


@dataclass
class NoObservation:
    why: str = "this agent observes no serving processes (gluon-agent run --delivery-file or --observe-proc)"

    def read(self, now: float) -> tuple[DeliveryReport, int]:
        return DeliveryReport(available=False, problem=self.why), 0


class InlineObservation:
    """observe() in this process, at most once per `interval` seconds."""

    def __init__(self, proc: Path, root: str | None, interval: float = DEFAULT_INTERVAL) -> None:
        self.proc, self.root, self.interval = proc, root, interval
        self.last: tuple[float, tuple[DeliveryReport, int]] | None = None

    def read(self, now: float) -> tuple[DeliveryReport, int]:
        if self.last is None or now - self.last[0] >= self.interval or now < self.last[0]:
            self.last = (now, observe(self.proc, self.root))
        return self.last[1]


@dataclass
class FileObservation:
    """The report the observer container writes (run_observer); unavailable, saying why, when it is missing,
    unreadable or older than STALE_INTERVALS of its interval."""

    path: Path
    interval: float = DEFAULT_INTERVAL

    def read(self, now: float) -> tuple[DeliveryReport, int]:
        try:
            raw = self.path.read_bytes()[:FILE_LIMIT]
            written = json.loads(raw)
            at, unreadable = float(written["at"]), int(written.get("unreadable", 0))
            report = DeliveryReport.model_validate(written["report"])
        except FileNotFoundError:
            return self._unavailable(f"the observer has written no report at {self.path} yet")
        except (OSError, ValueError, KeyError, TypeError, ValidationError) as exc:
            return self._unavailable(f"the observer's report at {self.path} is unreadable: {type(exc).__name__}")
        age = now - at
        if age > STALE_INTERVALS * self.interval + STALE_GRACE:
            return self._unavailable(
                f"the observer has not written for {age:.0f} s (it writes every {self.interval:g} s)"
            )
        return report, unreadable

    @staticmethod
    def _unavailable(problem: str) -> tuple[DeliveryReport, int]:
        return DeliveryReport(available=False, problem=problem), 0


def with_since(previous: DeliveryReport | None, fresh: DeliveryReport, now: float) -> DeliveryReport:
    """`fresh`, each container keeping the `since` it had while it is observed exactly as before (so an
    unchanged node is never written again), else stamped `now`."""
    before = {(c.key, c.container_id): c for c in (previous.containers if previous else [])}
    stamped = []
    for container in fresh.containers:
        old = before.get((container.key, container.container_id))
        same = old is not None and old.model_copy(update={"since": None}) == container.model_copy(
            update={"since": None}
        )
        stamped.append(container.model_copy(update={"since": old.since if same and old else round(now, 3)}))
    return fresh.model_copy(update={"containers": stamped})


def annotation(report: DeliveryReport) -> str:
    return json.dumps(report.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))


def counts(report: DeliveryReport) -> dict[str, int]:
    """Containers by state, for gluon_agent_flag_delivery_containers."""
    out = {"match": 0, "mismatch": 0, "unknown": 0}
    for container in report.containers:
        out["unknown" if container.intended is None else "mismatch" if container.mismatch() else "match"] += 1
    return out


def mismatched(report: DeliveryReport) -> list[ObservedContainer]:
    return [c for c in report.containers if c.intended is not None and c.mismatch()]


# ---------------------------------------------------------------- `gluon-agent observe`


def resolve_root(value: str, own_cgroup: Callable[[], str]) -> str | None:
    """--cgroup-root: 'auto' reads the kubelet's root off this process's own cgroup, 'any' takes every pod
    process of the host, anything else is the root itself."""
    if value == "any":
        return None
    if value == "auto":
        try:
            return kubelet_root(own_cgroup())
        except OSError:
            return None
    return value


def write_report(path: Path, report: DeliveryReport, unreadable: int, now: float) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"at": now, "unreadable": unreadable, "report": report.model_dump(mode="json")}))
    os.replace(tmp, path)


def run_observer(
    proc: Path,
    out: Path,
    interval: float,
    root: str | None,
    stop: threading.Event,
    clock: Callable[[], float] = time.time,
) -> None:
    """Observe every `interval` seconds and write the report for the daemon, until `stop`."""
    log.info("observing serving processes under %s (kubelet cgroup root %s) every %g s", proc, root or "any", interval)
    while not stop.is_set():
        report, unreadable = observe(proc, root)
        if not report.available:
            log.warning("observation unavailable: %s", report.problem)
        write_report(out, report, unreadable, clock())
        stop.wait(interval)
