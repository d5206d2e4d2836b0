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

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError

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


# ---------------------------------------------------------------- proofs in the serving image

PROOF_MESSAGE_LIMIT = 4096  # the kubelet keeps at most this much of a container's termination message


class PodProof(Lenient):
    """A self-test pod's termination message: the probe of the serving image it ran in and the self-test
    there, cut to PROOF_MESSAGE_LIMIT bytes (gluon_agent.selftest_pod writes it with the stdlib alone; the
    full report is the pod's log). `truncated`: details were dropped to fit."""

    schema_version: int = REPORT_SCHEMA_VERSION
    probe: Probe = Field(default_factory=Probe)
    selftest: SelfTest = Field(default_factory=SelfTest)
    truncated: bool = False


class ImageProof(Lenient):
    """What one self-test pod proved on a node, keyed by the serving image's digest and the serving
    configuration's digest (the operator writes it from the pod it created and the pod's message)."""

    digest: StrictStr  # sha256:<hex>, the image content the serving pods resolved to
    serving: StrictStr  # the serving configuration's digest (sglang_routes.ServingConfig.digest)
    image: str | None = None  # the reference the pod ran by (repo@sha256:...), for people
    result: StrictStr  # pass | fail | error (contract.SELFTEST_VALUES)
    reason: str = ""
    at: float | None = None  # when the operator read it (unix seconds)
    fingerprint: str | None = None
    capable: bool | None = None  # the probe in that image
    sglang: dict[StrictStr, Any] | None = None  # its decode routes (sglang_routes.decode_routes)
    seconds: float | None = None  # the pod's own self-test time
    request: str | None = None  # the node's selftest-request value it answered (a new value asks again)


class NodeProofs(Lenient):
    """contract.ANNOTATION_PROOFS: a node's proofs, newest first."""

    proofs: list[ImageProof] = Field(default_factory=list)

    def find(self, digest: str, serving: str) -> ImageProof | None:
        return next((p for p in self.proofs if p.digest == digest and p.serving == serving), None)

    @classmethod
    def parse(cls, raw: str | None, where: str = "the proofs annotation") -> tuple["NodeProofs", str | None]:
        """The annotation's proofs; an unreadable one reads as none, with why (naming the field)."""
        if not raw:
            return cls(), None
        try:
            return cls.model_validate_json(raw), None
        except ValidationError as exc:
            first = exc.errors()[0]
            field = ".".join(str(p) for p in first.get("loc", ())) or "the value"
            return cls(), f"{where} unreadable ({field}: {first.get('msg')})"
