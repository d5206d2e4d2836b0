"""Placebo flips: controls given the judged node's flip time, whose estimates bound its variance from below."""

from __future__ import annotations

import warnings
from typing import Mapping

import numpy as np

from .judgement import JudgeConfig
from .panel import Reference
from .state import Baseline, PlaceboSums
from .variance import CLIP, clip, robust_scale

PLACEBOS, MIN_PLACEBOS = 8, 2  # controls given a placebo flip at the node's flip time; needed for their variance


def placebo_baselines(ref: Reference, pre: np.ndarray, gauges: list[int], cfg: JudgeConfig) -> dict[str, list[float]]:
    """Placebo flips: the first PLACEBOS controls get the judged node's flip time and baseline, and each
    look the same difference in differences as the node (post mean, load-adjusted with the same beta,
    minus the pre mean). Their flag never changed, so their estimates show how far the node's estimate
    strays with no effect at all, whatever the memory of the noise. {control: [pre mean, clip scale,
    pre mean of each gauge]}."""
    out: dict[str, list[float]] = {}
    names, log_ratios, load_ratios = ref.loo
    for index, name in enumerate(names[:PLACEBOS]):
        log_ratio, load_ratio = cfg.sign * log_ratios[index], load_ratios[index]
        rows = pre & np.isfinite(log_ratio) & (np.isfinite(load_ratio[:, gauges]).all(axis=1) if gauges else True)
        if rows.sum() < cfg.min_samples:
            continue
        scale = robust_scale(log_ratio[rows])
        clipped = clip(log_ratio[rows], scale)
        out[name] = [float(clipped.mean()), scale] + (
            load_ratio[rows][:, gauges].mean(axis=0).tolist() if gauges else []
        )
    return out


def placebo_looks(
    ref: Reference,
    baseline: Baseline,
    sums: Mapping[str, PlaceboSums],
    window: np.ndarray,
    times: np.ndarray,
    start: float,
    sign: float,
) -> dict[str, PlaceboSums]:
    """The placebos' running post sums, updated with this look's new samples (in `window`, after `start`)
    of the controls still in the reference (one that left the control set keeps its last sums: an
    estimate over fewer samples, no less variable)."""
    out = {name: PlaceboSums(*value) for name, value in sums.items() if name in baseline.placebos}
    for name in baseline.placebos:
        out.setdefault(name, PlaceboSums(0, 0.0, start))
    names = ref.loo[0]
    live = [name for name in baseline.placebos if name in names]
    if not live:
        return out
    adjusted, rows = _adjusted(ref, baseline, live, window, sign)
    new = rows & (times[None, :] > np.array([out[name].until for name in live])[:, None])
    counts, totals = new.sum(axis=1), np.where(new, adjusted, 0.0).sum(axis=1)
    last = np.where(new, times[None, :], -np.inf).max(axis=1)
    for row, name in enumerate(live):
        if counts[row]:
            count, total, _ = out[name]
            out[name] = PlaceboSums(count + int(counts[row]), total + float(totals[row]), float(last[row]))
    return out


def _adjusted(
    ref: Reference, baseline: Baseline, live: list[str], window: np.ndarray, sign: float
) -> tuple[np.ndarray, np.ndarray]:
    """The `live` placebos' log ratios in `window`, load-adjusted with the node's beta and clipped at
    their own scale, and where they have samples ((P, T) each)."""
    names, log_ratios, load_ratios = ref.loo
    at = np.array([names.index(name) for name in live])
    scale = np.array([baseline.placebos[name][1] for name in live])
    adjusted = sign * log_ratios[at]
    rows = window[None, :] & np.isfinite(adjusted)
    if baseline.gauges:
        gauge_means = np.array([baseline.placebos[name][2:] for name in live])[:, None, :]
        shift = load_ratios[at][:, :, baseline.gauges] - gauge_means
        rows &= np.isfinite(shift).all(axis=2)
        adjusted = adjusted - shift @ np.array(baseline.beta)
    adjusted = np.where(rows, adjusted, np.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        center = np.nan_to_num(np.nanmedian(adjusted, axis=1))
    return np.clip(adjusted, (center - CLIP * scale)[:, None], (center + CLIP * scale)[:, None]), rows


def placebo_variance(
    placebos: Mapping[str, list[float]], sums: Mapping[str, PlaceboSums], min_samples: int
) -> tuple[float, int]:
    """Mean square of the placebo estimates (their true effect is 0): the variance of a difference in
    differences of exchangeable nodes, long memory, baseline error and tails included. (0, count) when
    fewer than MIN_PLACEBOS have min_samples post samples."""
    estimates = [
        sums[name].total / sums[name].count - placebos[name][0]
        for name in placebos
        if name in sums and sums[name].count >= min_samples
    ]
    if len(estimates) < MIN_PLACEBOS:
        return 0.0, len(estimates)
    return float(np.mean(np.square(estimates))), len(estimates)
