"""The sequential test: the normal-mixture confidence sequence and always-valid p-values."""

from __future__ import annotations

import math
from typing import Sequence

from scipy import optimize

from .judgement import JudgeConfig

FAIL_NULL_FRACTION = 0.5  # fail needs the whole interval below this fraction of the tolerance


MIXTURE_SCALES, MIXTURE_WEIGHTS = (
    (1.0, 4.0, 16.0, 64.0),
    (0.85, 0.05, 0.05, 0.05),
)  # the sequential test's mixing variances (mixture_for)


Mixture = Sequence[tuple[float, float]]  # (mixing variance rho, weight), weights summing to 1


def mixture_log_ratio(deviation: float, variance: float, mixture: Mixture) -> float:
    """log of the mixture likelihood ratio of an estimate `deviation` away from a null, with this
    variance: sum of w sqrt(v/(v+rho)) exp(rho d^2 / (2 v (v+rho))) over the mixture (Robbins 1970;
    Howard et al. 2021, eq. (14); the mixture SPRT of Johari et al. 2017). A weighted average of test
    martingales is one, so a discrete mixture keeps the guarantee at every look."""
    terms = [
        math.log(w)
        + 0.5 * math.log(variance / (variance + rho))
        + rho * deviation**2 / (2 * variance * (variance + rho))
        for rho, w in mixture
    ]
    top = max(terms)  # log-sum-exp in plain floats: called per node per look, a few terms
    return top + math.log(sum(math.exp(t - top) for t in terms))


def mixture_halfwidth(variance: float, mixture: Mixture, alpha: float) -> float:
    """Half-width of the two-sided normal-mixture confidence sequence: the deviations whose mixture
    likelihood ratio stays below 1/alpha. Closed form for one mixing variance, else the root (brentq)
    between 0 and the narrowest one-component bound at level alpha x weight (that component alone
    already reaches 1/alpha there). Valid at every look at once."""
    if not math.isfinite(variance) or variance <= 0:
        return math.inf

    def single(rho: float, level: float) -> float:
        return math.sqrt(
            variance * (variance + rho) / rho * (2 * math.log(1 / level) + math.log((variance + rho) / variance))
        )

    if len(mixture) == 1:
        return single(mixture[0][0], alpha)
    bound = math.log(1 / alpha)
    high = min(single(rho, alpha * w) for rho, w in mixture)
    return float(
        optimize.brentq(
            lambda d: mixture_log_ratio(d, variance, mixture) - bound, 0.0, high * (1 + 1e-9) + 1e-12, xtol=1e-9
        )
    )


def mixture_p_value(estimate: float, null: float, variance: float, mixture: Mixture, side: str) -> float:
    """One-sided always-valid p-value: 1 / mixture likelihood ratio against `null`, counting only
    evidence on `side` ('below' or 'above') of it."""
    if not math.isfinite(variance) or variance <= 0 or (estimate >= null if side == "below" else estimate <= null):
        return 1.0
    return float(min(1.0, math.exp(-mixture_log_ratio(estimate - null, variance, mixture))))


def mixture_for(threshold: float, cfg: JudgeConfig) -> tuple[tuple[float, float], ...]:
    """Fixed in advance (a data-dependent choice would void the anytime guarantee). Most weight on a
    mixing variance of the tolerance's size, where one normal mixture is sharpest for effects of that
    size; some on 4, 16 and 64 times it, because one mixture's boundary grows as v / sqrt(rho) once
    the estimate's variance v exceeds rho (a noisy or wandering node, sd 5-10%): there the wider
    components keep it near 3-4 sd, so a large regression still fails, for a boundary about 1% wider
    at small v (docs/how-it-decides/analysis.md)."""
    scale = cfg.mixture * (threshold**2 if math.isfinite(threshold) and threshold != 0 else 0.05**2)
    return tuple((scale * k, w) for k, w in zip(MIXTURE_SCALES, MIXTURE_WEIGHTS))
