"""The GluonRollout spec: one pydantic model, from which the CRD's OpenAPI schema is generated (crd.py).
Checks the schema cannot express (relations between fields) are in `semantic_problems`."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

GROUP = "gluonrollout.io"
VERSION = "v1alpha1"
PLURAL = "gluonrollouts"
KIND = "GluonRollout"


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


class Strategy(Model):
    canaryNodes: int = Field(1, ge=0, description="Nodes enabled first; the rest wait until these are promoted.")
    maxParallel: int = Field(1, ge=1, description="Most nodes enabling or analyzing at once after the canaries.")
    restart: Literal["Evict", "Delete", "None"] = Field(
        "Evict", description="How a node's serving pods restart: Eviction API (honours PDBs), delete, or not at all.")
    holdoutNodes: int = Field(0, ge=0, description="Eligible nodes kept at flag 0 as a permanent control group.")
    restartDelaySeconds: int = Field(
        5, ge=0, description="Wait after labelling a node before restarting its pods, so its agent sees the label.")


class Analysis(Model):
    prometheusUrl: str | None = Field(None, description="Prometheus base URL; without it nodes wait in Analyzing.")
    query: str | None = Field(None, description="PromQL template with {{node}} {{namespace}} {{selector}} {{window}}; one series per node (default: decode tokens/s per sequence).")
    direction: Literal["higher", "lower"] = "higher"
    intervalSeconds: int = Field(60, ge=1)
    stepSeconds: int = Field(30, ge=1, description="Sample spacing and rate window ({{window}}); at least two scrape intervals.")
    windowSeconds: int = Field(300, ge=10, description="How much recent history each evaluation judges.")
    baselineSeconds: int = Field(1200, ge=10, description="How much history before a node's flag flipped is its own baseline (its error is shared by every later evaluation, so longer is better).")
    warmupSeconds: int = Field(120, ge=0)
    minSamples: int = Field(5, ge=1)
    minTraffic: float = Field(0.0, ge=0, description="Below this mean value a sample says too little traffic.")
    tolerance: float = Field(0.05, ge=0, le=1, description="How much worse than control still passes (0.05 = 5%).")
    confidence: float = Field(0.95, ge=0.5, le=0.9999)
    consecutiveFailures: int = Field(2, ge=1, description="Failing evaluations in a row before a rollback.")
    onNoData: Literal["hold", "promote", "rollback"] = "hold"
    noDataDeadlineSeconds: int = Field(1800, ge=0)
    retryAfterSeconds: int | None = Field(None, ge=0, description="Re-admit a rolled-back node after this long.")


class Abort(Model):
    maxFailedNodes: int = Field(2, ge=0, description="Past this many rolled-back nodes the rollout aborts.")


class GluonRolloutSpec(Model):
    podSelector: LabelSelector = Field(description="The serving pods, in this rollout's namespace.")
    nodeSelector: LabelSelector = Field(default_factory=LabelSelector, description="The nodes this rollout may enable.")
    strategy: Strategy = Field(default_factory=Strategy)
    analysis: Analysis = Field(default_factory=Analysis)
    abort: Abort = Field(default_factory=Abort)
    paused: bool = False


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
