"""The panel (every node's samples on one time grid) and the reference (the controls' medians)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from .judgement import JudgeConfig
from .queries import COVARIATES, FLAG_OFF, FLAG_UNLABELLED
from .variance import pooled_inflation, pooled_load_effect

POOLED_CONTROLS = 64  # controls whose own autocorrelation is pooled into every node's


LOO_CONTROLS = 16  # controls each compared with the median of the others: the load's effect is pooled over them


@dataclass(frozen=True)
class Panel:
    """Every node's samples on one time grid; NaN where a sample is missing."""

    times: np.ndarray  # (T,)
    speed: Mapping[str, np.ndarray]  # node -> (T,)
    load: Mapping[str, np.ndarray]  # node -> (T, len(COVARIATES)); NaN where a gauge is missing
    flag: Mapping[str, np.ndarray] = field(default_factory=dict)  # node -> (T,) FLAG_* codes; empty: not split by flag

    @property
    def by_flag(self) -> bool:
        """Whether the samples say which flag served them (the speed query split by the flag label)."""
        return bool(self.flag)

    def flags_of(self, node: str) -> np.ndarray:
        return self.flag.get(node, np.full(len(self.times), np.nan))


def build_panel(
    speed: Mapping[str, Any], load: Mapping[str, Mapping[str, Any]], flags: Mapping[str, Any] | None = None
) -> Panel:
    """Series ((t, v) pairs or (n, 2) arrays) on the speed series' common time grid (Prometheus range
    queries share their step); gauge samples off that grid are dropped. `flags`: split_by_flag's codes."""
    arrays = {node: _as_points(series) for node, series in speed.items()}
    stamps = np.unique(np.round(np.concatenate([p[:, 0] for p in arrays.values()]), 3)) if arrays else np.empty(0)

    def column(points: np.ndarray) -> np.ndarray:
        out = np.full(len(stamps), np.nan)
        if len(points) and len(stamps):
            times = np.round(points[:, 0], 3)
            at = np.minimum(np.searchsorted(stamps, times), len(stamps) - 1)
            hit = stamps[at] == times
            out[at[hit]] = points[hit, 1]
        return out

    gauges = {name: {node: _as_points(series) for node, series in by_node.items()} for name, by_node in load.items()}
    empty = np.empty((0, 2))

    def gauge_columns(node: str) -> np.ndarray:
        return np.column_stack([column(gauges.get(name, {}).get(node, empty)) for name in COVARIATES])

    return Panel(
        stamps.astype(float),
        {node: column(points) for node, points in arrays.items()},
        {node: gauge_columns(node) for node in arrays},
        {node: column(_as_points(codes)) for node, codes in (flags or {}).items() if node in arrays},
    )


def _as_points(series: Any) -> np.ndarray:
    points = np.asarray(series, dtype=float)
    return points.reshape(-1, 2) if points.size else np.empty((0, 2))


def log_usable(values: np.ndarray, floor: float = 0.0) -> np.ndarray:
    """log of usable values (finite, > 0, >= floor), NaN elsewhere."""
    values = np.asarray(values, dtype=float)
    good = np.isfinite(values) & (values > 0) & (values >= floor)
    out = np.full(values.shape, np.nan)
    out[good] = np.log(values[good])
    return out


def _nanmedian(stack: np.ndarray, need: int) -> np.ndarray:
    """Median over axis 0 ignoring NaN, NaN where fewer than `need` values: NaN sorts last, so the
    median sits at the middle of each column's finite prefix (np.nanmedian's masked-array path is
    ten times slower on small stacks)."""
    counts = np.isfinite(stack).sum(axis=0)
    ordered = np.sort(stack, axis=0)
    low = np.take_along_axis(ordered, np.maximum((counts - 1) // 2, 0)[None], axis=0)[0]
    high = np.take_along_axis(ordered, np.maximum(counts // 2, 0)[None], axis=0)[0]
    return np.where(counts >= max(need, 1), (low + high) / 2, np.nan)


@dataclass
class Reference:
    """The controls, computed once per evaluation for every node judged against them. What only a
    baseline fit needs (the controls' pooled autocorrelation and load effect) is computed on first use."""

    speed: np.ndarray  # (T,) log median speed of the controls
    load: np.ndarray  # (T, K) log median of each gauge
    n_controls: int  # controls with any usable sample
    names: tuple[str, ...] = ()
    stack: np.ndarray | None = None  # (C, T) the controls' log speeds
    load_stack: np.ndarray | None = None  # (C, T, K) their gauges' logs
    min_controls: int = 1  # controls a step's median needs
    flag: float = FLAG_OFF  # the flag every control held over the judged nodes' windows
    unlabelled: int = 0  # controls whose only usable samples came from pods of unknown flag
    _cache: dict = field(default_factory=dict, repr=False)

    def cached(self, key: Any, compute: Any) -> Any:
        if key not in self._cache:
            self._cache[key] = compute()
        return self._cache[key]

    @property
    def pooled(self) -> tuple[float, float]:
        """(long-run variance inflation, phi) of the controls' own log ratios, pooled (1, 0 when unknown)."""
        if self.stack is None:
            return 1.0, 0.0
        return self.cached(
            "pooled",
            lambda: pooled_inflation(
                self.stack[:POOLED_CONTROLS] - self.speed, self.load_stack[:POOLED_CONTROLS] - self.load
            ),
        )

    @property
    def inflation(self) -> float:
        return self.pooled[0]

    @property
    def phi(self) -> float:
        return self.pooled[1]

    @property
    def loo(self) -> tuple[tuple[str, ...], np.ndarray, np.ndarray]:
        """The first LOO_CONTROLS controls, each against the median of the others, as a judged node is
        against all of them (a control inside its own median would hide half of its own load's effect):
        (names, (P, T) log ratios, (P, T, K) gauges' log ratios)."""

        def compute() -> tuple[tuple[str, ...], np.ndarray, np.ndarray]:
            count = min(len(self.names), LOO_CONTROLS) if self.stack is not None and len(self.names) > 1 else 0
            steps, gauges = self.speed.shape[0], self.load.shape[1]
            if not count:
                return (), np.empty((0, steps)), np.empty((0, steps, gauges))
            ratios = np.stack(
                [self.stack[i] - _nanmedian(np.delete(self.stack, i, axis=0), self.min_controls) for i in range(count)]
            )
            loads = np.stack(
                [
                    self.load_stack[i] - _nanmedian(np.delete(self.load_stack, i, axis=0), self.min_controls)
                    for i in range(count)
                ]
            )
            return tuple(self.names[:count]), ratios, loads

        return self.cached("loo", compute)

    @property
    def load_effect(self) -> tuple[tuple[int, ...] | None, tuple[float, ...], tuple[tuple[float, ...], ...], int]:
        """(gauge columns, beta, its covariance, controls used) of the load's effect pooled over the
        controls; columns None when there are too few of them."""
        return self.cached("beta", lambda: pooled_load_effect(*self.loo[1:]))


def reference(
    panel: Panel, controls: Sequence[str], cfg: JudgeConfig, held: Mapping[str, float] | None = None
) -> Reference:
    """The controls' medians. `held`: the flag each control held (FLAG_OFF unless named); with samples
    split by flag, a control contributes only samples of that flag (none from a restart in between)."""
    gauges, steps = len(COVARIATES), len(panel.times)
    names = [name for name in controls if name in panel.speed]
    if not names or not steps:
        return Reference(np.full(steps, np.nan), np.full((steps, gauges), np.nan), 0)
    held = held or {}

    def own(control: str) -> np.ndarray:
        speed = log_usable(panel.speed[control], cfg.min_traffic)
        if not panel.by_flag:
            return speed
        return np.where(panel.flags_of(control) == held.get(control, FLAG_OFF), speed, np.nan)

    speed = np.vstack([own(name) for name in names])
    flag = held.get(names[0], FLAG_OFF)
    load = np.stack([log_usable(panel.load[name]) for name in names])  # (C, T, K)
    used = np.isfinite(speed).any(axis=1)
    unknown = [
        panel.by_flag and not used[i] and bool(np.any(panel.flags_of(name) == FLAG_UNLABELLED))
        for i, name in enumerate(names)
    ]
    return Reference(
        _nanmedian(speed, 1),
        _nanmedian(load, 1),
        int(used.sum()),
        tuple(names),
        speed,
        load,
        1,
        flag,
        unlabelled=int(sum(unknown)),
    )
