"""The node's baseline, fitted once per flip on its pre-flip samples: its offset against the controls, how
its own load moves its speed (CUPED's theta: pooled over the controls, else the node's own OLS with a HAC
covariance), and the autocorrelation of what is left."""

from __future__ import annotations

import math

import numpy as np

from .judgement import JudgeConfig
from .panel import Reference
from .placebos import placebo_baselines
from .state import Baseline
from .variance import clip, independent_columns, inflation_of, long_run_variance, robust_scale, statsmodels_api


def fit_baseline(
    log_ratio: np.ndarray, load_ratio: np.ndarray, pre: np.ndarray, cfg: JudgeConfig, ref: Reference
) -> Baseline | None:
    """The fit over the `pre` samples of the node's signed log ratio to the controls and its gauges' log
    ratios. None with fewer than minSamples samples."""
    rows = pre & np.isfinite(log_ratio)
    if rows.sum() < cfg.min_samples:
        return None
    scale = robust_scale(log_ratio[rows])
    gauges, used, pooled = _gauges(load_ratio, rows, cfg, ref)
    clipped = clip(np.where(used, log_ratio, np.nan), scale)
    beta, covariance, gauge_means, residuals = _load_effect(clipped, load_ratio, used, gauges, pooled, cfg, ref)
    inflation, phi = max(inflation_of(residuals, int(used.sum())), (ref.inflation, ref.phi))
    samples = int(used.sum())
    long_run = long_run_variance(residuals, inflation, dof=len(gauges) + 1)
    placebos = ref.cached(
        ("placebo baselines", pre.tobytes(), tuple(gauges), cfg.direction, cfg.min_samples),
        lambda: placebo_baselines(ref, pre, gauges, cfg),
    )
    return Baseline(
        mean=float(np.nanmean(clipped)),
        variance=long_run / samples,
        samples=samples,
        long_run_variance=long_run,
        marginal_variance=long_run / inflation,
        inflation=inflation,
        phi=phi,
        clip_scale=scale,
        gauges=gauges,
        beta=beta,
        beta_covariance=covariance,
        gauge_means=gauge_means,
        pooled_controls=ref.load_effect[3] if pooled else 0,
        placebos=placebos,
    )


def _gauges(load_ratio: np.ndarray, rows: np.ndarray, cfg: JudgeConfig, ref: Reference) -> tuple:
    """(gauge columns, samples the fit uses, whether the load's effect is the controls' pooled one): the
    controls' when the node has minSamples baseline samples with those gauges, else the node's own gauges
    that move and add information, none when too few samples have them."""
    pooled_columns = ref.load_effect[0]
    if pooled_columns is not None:
        used = rows & np.isfinite(load_ratio[:, list(pooled_columns)]).all(axis=1)
        if used.sum() >= cfg.min_samples:
            return list(pooled_columns), used, True
    gauges = [
        k
        for k in range(load_ratio.shape[1])
        if np.isfinite(load_ratio[rows, k]).sum() >= max(cfg.min_samples, 10) and np.nanstd(load_ratio[rows, k]) > 1e-4
    ]
    used = rows & np.isfinite(load_ratio[:, gauges]).all(axis=1) if gauges else rows
    gauges = independent_columns(load_ratio[used], gauges)
    used = rows & np.isfinite(load_ratio[:, gauges]).all(axis=1) if gauges else rows
    if gauges and used.sum() < max(cfg.min_samples, 4 * (len(gauges) + 1)):
        return [], rows, False  # too few samples with gauges to learn the load's effect: no adjustment
    return gauges, used, False


def _load_effect(
    clipped: np.ndarray,
    load_ratio: np.ndarray,
    used: np.ndarray,
    gauges: list[int],
    pooled: bool,
    cfg: JudgeConfig,
    ref: Reference,
) -> tuple[list[float], list[list[float]], list[float], np.ndarray]:
    """(beta, its covariance, the gauges' means, the residuals after the mean and the load's effect)."""
    residuals = np.where(used, clipped - np.nanmean(clipped), np.nan)
    if not gauges:
        return [], [], [], residuals
    design = load_ratio[used][:, gauges]
    gauge_means = design.mean(axis=0).tolist()
    if pooled:
        _, effect, effect_covariance, _ = ref.load_effect
        beta = [cfg.sign * b for b in effect]  # the controls' fit is of log speed; the log ratio is signed
        residuals[used] = clipped[used] - np.mean(clipped[used]) - (design - np.array(gauge_means)) @ np.array(beta)
        return beta, [list(row) for row in effect_covariance], gauge_means, residuals
    api = statsmodels_api()
    lags = max(1, min(int(used.sum()) // 4, int(math.ceil(4 * (used.sum() / 100) ** (2 / 9)))))
    fit = api.OLS(clipped[used], api.add_constant(design, has_constant="add"))
    fit = fit.fit(cov_type="HAC", cov_kwds={"maxlags": lags})
    residuals[used] = fit.resid
    return fit.params[1:].tolist(), fit.cov_params()[1:, 1:].tolist(), gauge_means, residuals
