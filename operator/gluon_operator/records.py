"""Type-checked readings of what the operator parses from Nodes and Pods: the agent's report, the
operator's own rollback and node records, the preflight's verdict. Anyone who can write a node annotation
or a pod's termination message can put anything there; a wrong type must make that one node or pod
unreadable (with a reason naming the field), never fail the reconcile of the fleet.

Unknown fields are ignored (agents of other versions add some); known fields have strict types.
"""

from __future__ import annotations

import json
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError

from gluon_agent import contract

Number = float  # JSON numbers; a string of digits is read as its number, anything else is an error naming the field


class Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class Probe(Lenient):
    capable: StrictBool = False
    missing_for_capable: list[StrictStr] = Field(default_factory=list)


class GpuResult(Lenient):
    index: StrictInt | None = None
    result: dict[StrictStr, StrictStr] = Field(default_factory=dict)
    reasons: dict[StrictStr, list[StrictStr]] = Field(default_factory=dict)


class SelfTest(Lenient):
    fingerprint: StrictStr | None = None
    gpus: list[GpuResult] = Field(default_factory=list)


class AgentReport(Lenient):
    """The agent's node report (gluon_agent.daemon.node_report), the fields the operator decides on."""

    fingerprint: StrictStr | None = None
    verdict: StrictStr | None = None
    probe: Probe = Field(default_factory=Probe)
    selftest: SelfTest = Field(default_factory=SelfTest)


class RollbackRecord(Lenient):
    """contract.ANNOTATION_ROLLBACK: why the node was rolled back, for which fingerprint, with the numbers."""

    rollout: StrictStr | None = None
    fingerprint: StrictStr | None = None
    at: Number = 0.0
    reason: StrictStr = "no reason recorded"
    numbers: dict[StrictStr, Any] = Field(default_factory=dict)


class NodeRecord(Lenient):
    """contract.ANNOTATION_NODE_RECORD: the node's durable rollout state (see plan.py)."""

    rollout: StrictStr
    state: Literal[contract.NODE_STATES]  # type: ignore[valid-type]
    reason: StrictStr = ""
    since: Number = 0.0
    fingerprint: StrictStr | None = None
    changedAt: Number | None = None
    holdout: StrictBool = False
    numbers: dict[StrictStr, Any] = Field(default_factory=dict)


class AgentAnswer(Lenient):
    current: StrictBool | None = None
    enabled: StrictBool | None = None


class PreflightVerdict(Lenient):
    """The preflight's termination message (gluon_agent.preflight)."""

    flag: Literal["0", "1"] | None = None
    reason: StrictStr | None = None
    agent: AgentAnswer | None = None
    final: StrictBool | None = None  # a refusal no restart can change (e.g. the image's python is too old)


Record = TypeVar("Record", bound=BaseModel)


def problem(exc: ValidationError) -> str:
    """The first error, naming its field: 'selftest.gpus.0: Input should be a valid dictionary'."""
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "(top level)"
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"{where}: {first['msg']}{more}"


def read_json(model: type[Record], raw: str | None, what: str) -> tuple[Record | None, str | None]:
    """(record, None), (None, None) when absent, or (None, why) naming `what` and the field."""
    if raw is None:
        return None, None
    try:
        value: Any = json.loads(raw)
    except ValueError as exc:
        return None, f"{what} is not JSON ({exc})"
    try:
        return model.model_validate(value), None
    except ValidationError as exc:
        return None, f"{what} field {problem(exc)}"
