"""The GluonRollout spec: one pydantic model, from which the CRD's OpenAPI schema is generated (crd.py).
Checks the schema cannot express (relations between fields) are in `semantic_problems`."""

from __future__ import annotations

import math
import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, PlainValidator, StrictBool, ValidationError, WithJsonSchema

from gluon_agent import contract

GROUP = "gluonrollout.io"
VERSION = "v1alpha1"
PLURAL = "gluonrollouts"
KIND = "GluonRollout"


DAY = 86_400  # windows and intervals are bounded by a day: longer ones are typos, and PromQL ranges grow with them

# Counts or percentages, as Kubernetes' IntOrString (maxSurge, maxUnavailable): see resolve().
PERCENT = r"^(100|[1-9]?[0-9])%$"
PERCENT_POSITIVE = r"^(100|[1-9][0-9]?)%$"


def count_or_percent(minimum: int) -> object:
    """An int-or-string field: a count >= minimum or a percentage "N%". One clear error either way,
    and the CRD's x-kubernetes-int-or-string schema (crd.py keeps it as is)."""
    pattern = PERCENT if minimum == 0 else PERCENT_POSITIVE

    def check(value: object) -> int | str:
        if isinstance(value, int) and not isinstance(value, bool) and value >= minimum:
            return value
        if isinstance(value, str) and re.fullmatch(pattern, value):
            return value
        raise ValueError(f"must be a count >= {minimum} or a percentage such as '10%' ({minimum or 0}..100%), not {value!r}")

    schema = {"x-kubernetes-int-or-string": True, "anyOf": [{"type": "integer"}, {"type": "string"}],
              "minimum": minimum, "pattern": pattern}
    return Annotated[int | str, PlainValidator(check), WithJsonSchema(schema)]


CountOrPercent = count_or_percent(0)
PositiveCountOrPercent = count_or_percent(1)


def resolve(value: int | str, total: int, round_up: bool) -> int:
    """A count as is; a percentage of `total`, rounded up (as Kubernetes rounds maxSurge) or down (as it
    rounds maxUnavailable): canaryNodes and maxParallel round up, so "10%" of 5 nodes is 1, never 0;
    abort.maxFailedNodes rounds down, so a percentage never tolerates more failures than it says."""
    if isinstance(value, int):
        return value
    fraction = int(value[:-1]) * total / 100
    return math.ceil(fraction) if round_up else math.floor(fraction)


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Requirement(Model):
    key: str = Field(min_length=1)
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[str] = Field(default_factory=list)


class LabelSelector(Model):
    """A Kubernetes label selector (matchLabels AND matchExpressions)."""

    matchLabels: dict[str, str] = Field(default_factory=dict)
    matchExpressions: list[Requirement] = Field(default_factory=list)


class Batches(Model):
    """Groups of nodes by one label (GPU model, zone, rack), rolled out one group after another in the
    given order; each group has its own canaries. Nodes whose value is not listed are left alone."""

    nodeLabel: str = Field(min_length=1, max_length=317, description="The node label whose value names a node's group.")
    order: list[Annotated[str, Field(max_length=63)]] = Field(
        min_length=1, max_length=100, description="The groups' label values, first rolled out first.")


class Strategy(Model):
    canaryNodes: CountOrPercent = Field(1, description="Nodes enabled first (per batch); the rest wait until these are promoted. A count or a percentage of the batch's nodes, rounded up.")
    maxParallel: PositiveCountOrPercent = Field(
        1, description="Most nodes enabling or analyzing at once after the canaries. A count or a percentage of the batch's nodes, rounded up (at least 1).")
    approval: Literal["Automatic", "AfterCanary", "EachBatch"] = Field(
        "Automatic", description="Automatic: no person in the loop. AfterCanary: wait for the gate 'canary' after the first canaries are promoted. EachBatch: also wait for 'batch/<value>' before each later batch. Granted by annotating the rollout " + contract.ANNOTATION_ROLLOUT_APPROVE + "=<gate> (kubectl gluon promote).")
    batches: Batches | None = Field(None, description="Roll out group by group; a group whose failures pass abort.maxFailedNodes aborts the rest.")
    restart: Literal["Evict", "Delete", "None"] = Field(
        "Evict", description="How a node's serving pods restart: Eviction API (honours PDBs), delete, or not at all.")
    holdoutNodes: int = Field(0, ge=0, description="Eligible nodes kept at flag 0 as a permanent control group.")
    restartDelaySeconds: int = Field(
        5, ge=0, le=3600, description="Wait after labelling a node before restarting its pods, so its agent sees the label.")


class Analysis(Model):
    prometheusUrl: str | None = Field(None, max_length=2048, pattern=r"^https?://[^\s]+$",
                                      description="Prometheus base URL (http or https); without it nodes wait in Analyzing.")
    query: str | None = Field(None, min_length=1, max_length=4096, description="PromQL template with {{node}} {{namespace}} {{selector}} {{window}}; one series per node (default: decode tokens/s per sequence).")
    direction: Literal["higher", "lower"] = "higher"
    intervalSeconds: int = Field(60, ge=1, le=DAY)
    stepSeconds: int = Field(30, ge=1, le=DAY, description="Sample spacing and rate window ({{window}}); at least two scrape intervals.")
    windowSeconds: int = Field(300, ge=10, le=DAY, description="How much recent history each evaluation judges.")
    baselineSeconds: int = Field(1200, ge=10, le=DAY, description="How much history before a node's flag flipped is its own baseline (its error is shared by every later evaluation, so longer is better).")
    warmupSeconds: int = Field(120, ge=0, le=DAY)
    minSamples: int = Field(5, ge=1)
    minTraffic: float = Field(0.0, ge=0, description="Below this mean value a sample says too little traffic.")
    tolerance: float = Field(0.05, ge=0, lt=1, description="How much worse than control still passes (0.05 = 5%).")
    confidence: float = Field(0.95, ge=0.5, le=0.9999)
    consecutiveFailures: int = Field(2, ge=1, description="Failing evaluations in a row before a rollback.")
    onNoData: Literal["hold", "promote", "rollback"] = "hold"
    noDataDeadlineSeconds: int = Field(1800, ge=0)
    retryAfterSeconds: int | None = Field(None, ge=0, description="Re-admit a rolled-back node after this long.")


class Abort(Model):
    maxFailedNodes: CountOrPercent = Field(
        2, description="Past this many rolled-back nodes (in one batch) the rollout aborts. A count or a percentage of the batch's nodes, rounded down.")


class GluonRolloutSpec(Model):
    podSelector: LabelSelector = Field(description="The serving pods, in this rollout's namespace.")
    nodeSelector: LabelSelector = Field(default_factory=LabelSelector, description="The nodes this rollout may enable.")
    strategy: Strategy = Field(default_factory=Strategy)
    analysis: Analysis = Field(default_factory=Analysis)
    abort: Abort = Field(default_factory=Abort)
    paused: StrictBool = Field(False, description="Enable no further nodes; nodes already on stay on.")
    dryRun: StrictBool = Field(False, description="Decide and report (status.dryRun, Events), change nothing on nodes or pods. The analysis still runs.")


def semantic_problems(spec: GluonRolloutSpec) -> list[str]:
    problems = []
    a = spec.analysis
    if a.windowSeconds < a.minSamples * a.stepSeconds:
        problems.append(f"spec.analysis.windowSeconds ({a.windowSeconds}) holds fewer than minSamples ({a.minSamples}) steps of {a.stepSeconds} s")
    if a.baselineSeconds < a.minSamples * a.stepSeconds:
        problems.append(f"spec.analysis.baselineSeconds ({a.baselineSeconds}) holds fewer than minSamples ({a.minSamples}) steps of {a.stepSeconds} s")
    if a.windowSeconds < a.intervalSeconds:
        problems.append(f"spec.analysis.windowSeconds ({a.windowSeconds}) must be >= spec.analysis.intervalSeconds ({a.intervalSeconds})")
    if (a.prometheusUrl is None) != (a.query is None) and a.query is not None:
        problems.append("spec.analysis.query needs spec.analysis.prometheusUrl")
    if a.query is not None and "{{node}}" not in a.query and " by (node)" not in a.query.replace("by(", "by ("):
        problems.append("spec.analysis.query must return one series per node: use {{node}} or `by (node)`")
    if not spec.podSelector.matchLabels and not spec.podSelector.matchExpressions:
        problems.append("spec.podSelector must select something: an empty selector would match every pod in the namespace")
    return problems


def parse_spec(raw: dict | None) -> tuple[GluonRolloutSpec | None, list[str]]:
    """(spec, problems): problems name the field, e.g. 'spec.strategy.maxParallel: Input should be >= 1'."""
    try:
        spec = GluonRolloutSpec.model_validate(raw or {})
    except ValidationError as exc:
        return None, [f"spec.{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()]
    return spec, semantic_problems(spec)
