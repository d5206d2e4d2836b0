"""What the judge is given (JudgeConfig) and what it gives (Judgement), rounded as the status keeps it."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping


@dataclass(frozen=True)
class JudgeConfig:
    direction: str = "higher"
    tolerance: float = 0.05
    confidence: float = 0.95
    min_samples: int = 5
    min_traffic: float = 0.0
    min_controls: int = 1  # controls a node is judged against at least (spec.analysis.minControls); fewer: inconclusive
    mixture: float = 1.0  # scales the sequential test's mixing variances, in units of log(1 - tolerance)^2

    @property
    def sign(self) -> float:
        """Multiplies log speed so that higher is better (direction "lower": latency-like metrics)."""
        return 1.0 if self.direction == "higher" else -1.0


@dataclass(frozen=True)
class Judgement:
    result: str  # pass | fail | inconclusive
    reason: str
    effect: float | None = None  # ratio treated/control after vs before, at equal load (1.9 = 90% faster)
    ci_low: float | None = None  # the anytime-valid confidence sequence at this look
    ci_high: float | None = None
    threshold: float | None = None  # ratio below which a node fails (1 - tolerance)
    n_post: int = 0
    n_pre: int = 0
    n_controls: int = 0
    controls: tuple[str, ...] = ()  # the controls it was judged against (the first CONTROL_NAMES of them)
    control_flag: int | None = None  # the flag those controls held: 0 (not enabled, holdouts) or 1 (promoted, steady)
    n_eff: float | None = None  # post samples worth of independent ones: n / inflation
    inflation: float | None = None  # long-run variance / variance (1 for independent samples)
    phi: float | None = None  # decay per step of the autocorrelation behind that inflation
    adjustment: float | None = None  # ratio the load adjustment applied to the estimate (1 = none)
    placebos: int = 0  # controls with a placebo flip whose estimates bound the variance from below
    placebo_sd: float | None = None  # root mean square of their estimates (log ratio; 0 = too few yet)
    model_sd: float | None = None  # the estimate's sd from the model of the noise, before that bound and beta's part
    beta_sd: float | None = None  # the estimate's sd from the uncertainty of the load's effect
    p_worse: float | None = None  # always-valid p, H0: not worse than FAIL_NULL_FRACTION x tolerance
    p_not_worse: float | None = None  # always-valid p, H0: worse than the tolerance
    looks: int = 0
    method: str = ""
    state: Mapping[str, Any] = field(default_factory=dict)  # kept in the node's status between looks

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if v is not None and k != "state"}
        out = {k: rounded(v) for k, v in out.items()}
        return out | ({"sequential": self.state} if self.state else {})


def rounded(value: Any) -> Any:
    """6 significant digits, except for large values (unix times: changedAt, switchedAt, the last sample
    kept), which keep their milliseconds: rounded to 6 digits, a time no longer matched its flip, and
    every look started afresh."""
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        return round(value, 3) if abs(value) >= 1e5 else float(f"{value:.6g}")
    if isinstance(value, (list, tuple)):
        return [rounded(v) for v in value]
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    return value
