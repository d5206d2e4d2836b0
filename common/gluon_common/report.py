"""The agent's node report (contract.ANNOTATION_REPORT), written once: the agent builds it through these
models and the operator reads it with them.

Reading is lenient where versions differ and strict where it decides: unknown fields are ignored (agents
of other versions add some), known fields have types, and a wrong type makes that one node unreadable with
a reason naming the field (the operator's records.read_json), never the fleet's reconcile. The fields the
operator decides on are strict (a "true" string is not a bool); the ones written for people are typed as
the agent writes them.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

REPORT_SCHEMA_VERSION = 1


class Lenient(BaseModel):
    """A record read from what others write: unknown fields ignored, frozen once read."""

    model_config = ConfigDict(extra="ignore", frozen=True)


class Probe(Lenient):
    """The probe's facts the report carries (gluon_agent.probe.probe, cut to these)."""

    capable: StrictBool = False
    ready: bool | None = None
    missing_for_capable: list[StrictStr] = Field(default_factory=list)
    summary: str | None = None
    import_crash: str | None = None  # why the aiter Gluon import would stop SGLang with the flag on
    sglang: dict[StrictStr, Any] | None = None  # sglang_routes.decode_routes of the serving image's SGLang
    simulated: bool = False  # a SIMULATION: no probe ran (the demo's and the tests' agents)


class ServingProof(Lenient):
    """The serving configuration a self-test proved (sglang_routes.ServingConfig.as_dict() and its digest):
    the digest decides; the rest is for people."""

    digest: StrictStr | None = None
    verifyQLens: list[int] | None = None
    dcpSize: int | None = None
    dcpDecodeBackend: str | None = None
    persist: bool | None = None
    pageSize: int | None = None
    dpAttention: bool | None = None


class GpuResult(Lenient):
    """One GPU's outcome: its verdict and reasons per path (accelerated, fallback), its speedups."""

    index: StrictInt | None = None
    result: dict[StrictStr, StrictStr] = Field(default_factory=dict)
    speedup: dict[str, float | None] = Field(default_factory=dict)  # fallback ms / accelerated ms, per case
    max_rel_l2: dict[str, float | None] = Field(default_factory=dict)  # per path, over its correctness cases
    reasons: dict[StrictStr, list[StrictStr]] = Field(default_factory=dict)


class SelfTest(Lenient):
    """The self-test behind the published verdict, cut to what the operator and a person need on the Node
    (annotations are small); the full report stays in the agent's log and metrics."""

    result: str | None = None
    fingerprint: StrictStr | None = None
    tested_at: float | None = None
    seconds: float | None = None
    trigger: str | None = None  # why it ran: start, fingerprint changed, requested, periodic, ...
    mode: str | None = None  # gpu, cpu-interpret, simulation
    backend_set: str | None = None
    thresholds: dict[str, Any] | None = None
    problems: list[str] = Field(default_factory=list)
    simulated: bool = False
    serving: ServingProof | None = None
    no_route: dict[str, list[str]] = Field(default_factory=dict)  # per path: the q_lens it has no route for
    gpus: list[GpuResult] = Field(default_factory=list)


class LastAttempt(Lenient):
    """A self-test whose outcome did not replace the published verdict (GPUs busy: deferred)."""

    result: str | None = None
    at: float | None = None
    problems: list[str] = Field(default_factory=list)
    gpus: list[GpuResult] = Field(default_factory=list)


class AgentReport(Lenient):
    """The report an agent publishes on its Node (gluon_agent.daemon.node_report)."""

    schema_version: int = REPORT_SCHEMA_VERSION
    agent_version: str | None = None
    node: str | None = None
    fingerprint: StrictStr | None = None
    fingerprint_parts: dict[str, Any] = Field(default_factory=dict)
    verdict: StrictStr | None = None
    probe: Probe = Field(default_factory=Probe)
    selftest: SelfTest | None = None  # None until this fingerprint's first self-test ends
    last_attempt: LastAttempt | None = None

    def annotation_value(self) -> dict[str, Any]:
        """The report as plain JSON data, every field written (decisions.desired_state serialises it)."""
        return self.model_dump(mode="json")
