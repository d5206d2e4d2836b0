"""The analysis judge: pure functions over Prometheus samples (docs/analysis.md says why each step).

Per node under analysis T, against the control nodes C (nodes whose flag held steady over T's windows, at
flag 0 or 1: evaluation.control_group) in the same window, at each step t, counting only samples of the
flag each node's pods really ran (split_by_flag: T's baseline at flag 0, its post window at flag 1 from
when every serving pod runs it):

    l_t = log T_t - log median(C_t)          (sign flipped when lower is better)
    x_t = log load_T,t - log median(load_C,t) (the node's own load gauges against the controls')

1. Baseline (once per flip, then kept in the node's status): the `baselineSeconds` before the flip,
   the node's mean of l and of x. How much a node's own load moves its speed (beta, with its
   covariance) is fitted on the controls, each against the median of the others: one within-node OLS
   (statsmodels, cluster-robust covariance by node); with fewer than 3 such controls, on the node's own
   baseline (HAC / Newey-West covariance). The long-run variance comes from an ARMA(1,1) fit of the
   residuals' autocorrelations (statsmodels acf, gaps allowed), the node's and the controls' pooled.
2. Every look: post-flip samples (after `warmupSeconds`) are load-adjusted, CUPED-style,
   l_t - beta . (x_t - mean pre x), and added to running sums kept in the status, so the estimate is
   the mean over everything since the flip, not a sliding window: a random-walk-like sequence of looks.
3. Placebo flips: the first 8 controls get the node's flip time and the same estimate, every look.
   Their flag never changed; the mean square of their estimates is a floor under the variance.
4. The estimate (difference in differences), its variance (max(long-run variance / n plus the
   baseline's, narrowed to the fitted ARMA(1,1)'s exact variance over the two finite windows, under the
   fit whose inflation it uses; the placebos' mean square), plus beta's through the load shift) and an anytime-valid
   confidence sequence: the normal-mixture boundary (Robbins; the mixture SPRT of Johari et al. 2017;
   Netflix's sequential canary tests, Lindon et al., KDD 2022) over four mixing variances, so looking
   every interval, for hours of guard mode, keeps the error rate, and a noisy node's large regression
   still fails.

Verdicts: fail when the whole sequence interval lies below half the tolerance and the estimate is beyond
the tolerance; pass when the whole interval lies above the tolerance; inconclusive otherwise, and always
with too few samples, too little traffic, no control or no data: never pass, never fail.
"""

from __future__ import annotations

import math
import re
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
from scipy import optimize, stats

from gluon_agent import contract

Series = Sequence[tuple[float, float]]  # (unix seconds, value)

# Decode speed each request sees, tokens/s per sequence: 1 / (mean seconds per output token).
# Load-aware: it does not move with the number of requests the way gen_throughput does, and it is the
# decode step time the attention kernel changes. Weighted by tokens across the node's pods.
# The name is matched as sglang[:_]...: prometheus_client (SGLang's exporter) rewrites ':' to '_' in
# sample names when Prometheus negotiates OpenMetrics (client_python issue #1177; seen with Prometheus
# 2.42 and prometheus-client 0.26), so depending on versions the series is stored under either name.
# Split by the flag the pods really ran (the PodMonitor's `flag` label): a node's samples from pods still
# at flag 0 after its label flipped are never counted as flag 1 (split_by_flag, judge).
DEFAULT_QUERY = (
    f'sum by (node, {contract.METRIC_LABEL_FLAG}) (rate({{__name__=~"sglang[:_]inter_token_latency_seconds_count",namespace="{{{{namespace}}}}"{{{{selector}}}}}}[{{{{window}}}}]))'
    " / "
    f'sum by (node, {contract.METRIC_LABEL_FLAG}) (rate({{__name__=~"sglang[:_]inter_token_latency_seconds_sum",namespace="{{{{namespace}}}}"{{{{selector}}}}}}[{{{{window}}}}]))'
)
# The node's own load, from SGLang's gauges, templated and name-matched like DEFAULT_QUERY: running
# requests summed over the node's pods, KV-cache usage (0..1) averaged over them. One query each per
# rollout per interval, whatever the fleet size.
COVARIATE_QUERIES: Mapping[str, str] = {
    "running": 'sum by (node) (avg_over_time({__name__=~"sglang[:_]num_running_reqs",namespace="{{namespace}}"{{selector}}}[{{window}}]))',
    "usage": 'avg by (node) (avg_over_time({__name__=~"sglang[:_]token_usage",namespace="{{namespace}}"{{selector}}}[{{window}}]))',
}
COVARIATES = tuple(COVARIATE_QUERIES)
FAIL_NULL_FRACTION = 0.5  # fail needs the whole interval below this fraction of the tolerance
CLIP = 4.0  # heavy tails: log ratios clipped at median +- 4 robust sd (MAD), before any mean
MAX_PHI = 0.99  # autocorrelation decay cap (a unit root would make the variance infinite)
BATCH_SECONDS, MIN_BATCHES = 600.0, 5  # batch means: 10 min batches, used from the fifth on
DEMEAN_ROUNDS = 10  # fixed-point rounds of the demeaning correction (it settles in a few)
ACF_LAGS = 8  # autocorrelations the long-run variance is fitted to (2 min at a 15 s step)
POOLED_CONTROLS = 64  # controls whose own autocorrelation is pooled into every node's
LOO_CONTROLS = 16  # controls each compared with the median of the others: the load's effect is pooled over them
POOLED_BETA_MIN = 3  # controls with gauges needed to pool the load's effect (else the node's own pre-flip fit)
CONTROL_NAMES = 20  # controls named in a node's status (all are counted)
FEW_CONTROLS = 3  # with this many controls or fewer, the placebos' floor is widened by its own degrees of freedom
PLACEBOS, MIN_PLACEBOS = 8, 2  # controls given a placebo flip at the node's flip time; needed for their variance
MIXTURE_SCALES, MIXTURE_WEIGHTS = (
    (1.0, 4.0, 16.0, 64.0),
    (0.85, 0.05, 0.05, 0.05),
)  # the sequential test's mixing variances (_mixture)
LABEL_NAME = re.compile(r"[^a-zA-Z0-9_]")


def _statsmodels() -> Any:
    """statsmodels.api, imported at the first fit: with pandas it is most of a second or more of the operator's
    start (and of `kubectl gluon`'s), and nothing before the first judgement needs it."""
    import statsmodels.api

    return statsmodels.api


def _acf(series: np.ndarray, **kwargs: Any) -> np.ndarray:
    from statsmodels.tsa.stattools import acf

    return acf(series, **kwargs)


class MalformedAnswer(ValueError):
    """A Prometheus answer that is not the documented matrix/vector shape."""


class MissingLabel(ValueError):
    """Series that all lack a label the judge groups by: the scrape's relabeling that sets it is missing."""


def require_label(result: Any, label: str, what: str) -> None:
    """Series came back but none carries `label` (e.g. a PodMonitor without the chart's relabeling to
    `node`): an error naming the label, where series_by_node would silently find no node at all."""
    if not isinstance(result, list) or not result:
        return
    if not any(isinstance(item, dict) and (item.get("metric") or {}).get(label) for item in result):
        raise MissingLabel(
            f"the {what} query's {len(result)} series carry no '{label}' label: the scrape config does not set it "
            f"(the chart's PodMonitor relabels __meta_kubernetes_pod_node_name to '{label}')"
        )


def promql_selector(match_labels: Mapping[str, str]) -> str:
    """Extra matchers for the serving pods' labels (the chart's PodMonitor maps pod labels to metric
    labels, '.', '/' and '-' becoming '_'), each prefixed with a comma to follow namespace=..."""
    parts = [f',{LABEL_NAME.sub("_", k)}="{v}"' for k, v in sorted(match_labels.items())]
    return "".join(parts)


def render(template: str, namespace: str, match_labels: Mapping[str, str], step_seconds: int, node: str = ".*") -> str:
    """{{window}} is the rate window of one sample (the step), so samples do not overlap."""
    return (
        template.replace("{{namespace}}", namespace)
        .replace("{{selector}}", promql_selector(match_labels))
        .replace("{{window}}", f"{step_seconds}s")
        .replace("{{node}}", node)
    )


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
        out = {k: _round(v) for k, v in out.items()}
        return out | ({"sequential": self.state} if self.state else {})


def _round(value: Any) -> Any:
    """6 significant digits, except for large values (unix times: changedAt, switchedAt, the last sample
    kept), which keep their milliseconds: rounded to 6 digits, a time no longer matched its flip, and
    every look started afresh."""
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        return round(value, 3) if abs(value) >= 1e5 else float(f"{value:.6g}")
    if isinstance(value, (list, tuple)):
        return [_round(v) for v in value]
    if isinstance(value, dict):
        return {k: _round(v) for k, v in value.items()}
    return value


# ---------------------------------------------------------------- Prometheus answers -> aligned arrays


def series_by_node(result: Any) -> dict[str, np.ndarray]:
    """Prometheus matrix (or vector) result -> {node: (n, 2) array of [t, v]}. Series without a node
    label are ignored; anything not of the documented shape raises MalformedAnswer naming the item."""
    if not isinstance(result, list):
        raise MalformedAnswer(f"result is {type(result).__name__}, not a list of series")
    out: dict[str, np.ndarray] = {}
    for index, item in enumerate(result):
        if not isinstance(item, dict) or not isinstance(item.get("metric", {}), dict):
            raise MalformedAnswer(f"result[{index}] is not an object with a metric object")
        node = (item.get("metric") or {}).get("node")
        if not node:
            continue
        values = item.get("values") if "values" in item else ([item["value"]] if item.get("value") is not None else [])
        if not isinstance(values, list):
            raise MalformedAnswer(f"result[{index}].values is {type(values).__name__}, not a list")
        points = _points(values, f"result[{index}] (node {node})")
        out[str(node)] = np.vstack([out[str(node)], points]) if str(node) in out else points
    return out


def _points(values: list, where: str) -> np.ndarray:
    """[[t, "v"], ...] -> (n, 2) floats; numpy parses the whole list at once (Prometheus sends values
    as strings, NaN and +Inf included), and only a failure is looked at pair by pair, to name it."""
    try:
        points = np.array(values, dtype=float)
        parsed = points.ndim == 2 and points.shape[1] == 2
        # numpy reads None as NaN: a NaN is only a value when Prometheus sent the string "NaN"
        if parsed and not (
            np.isnan(points).any() and any(None in pair for pair in values if isinstance(pair, (list, tuple)))
        ):
            if np.isnan(points[:, 0]).any():
                raise MalformedAnswer(f"{where} has a sample time that is not a number")
            return points
        if not values:
            return np.empty((0, 2))
    except (TypeError, ValueError):
        pass
    for pair in values:
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise MalformedAnswer(f"{where} has a sample {pair!r}, not [time, value]")
        try:
            float(pair[0]), float(pair[1])
        except (TypeError, ValueError):
            raise MalformedAnswer(f"{where} has a non-numeric sample {pair!r}") from None
    raise MalformedAnswer(f"{where} has samples that are not [time, value] pairs")


# What a node's sample at one step came from (split_by_flag): pods at flag 0, at flag 1, both at once
# (no single flag: never a treatment or control sample), or pods without the flag label (admitted without
# the webhook: their flag is unknown, so not 1). NaN: no sample, or a query not split by the flag at all.
FLAG_OFF, FLAG_ON, FLAG_MIXED, FLAG_UNLABELLED = 0.0, 1.0, 0.5, -1.0


def split_by_flag(result: Any) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """A speed answer split `by (node, flag)` -> ({node: (n, 2) [t, value]}, {node: (n, 2) [t, flag code]}).
    At a step where one flag's pods served (a usable value: finite, > 0) that value and its flag; where
    pods of two flags (or unlabelled ones) both served, NaN and FLAG_MIXED: the sum over both cannot be
    recovered from two ratios, and such a node has not switched. An answer with no flag label anywhere
    (a custom query not split by it) gives no flag codes: every sample's flag is unknown."""
    labelled = isinstance(result, list) and any(
        isinstance(item, dict) and isinstance(item.get("metric"), dict) and contract.METRIC_LABEL_FLAG in item["metric"]
        for item in result
    )
    if not labelled:
        return series_by_node(result), {}
    parts: dict[str, dict[float, np.ndarray]] = {}
    for index, item in enumerate(result):
        flag = str(item.get("metric", {}).get(contract.METRIC_LABEL_FLAG, "")) if isinstance(item, dict) else ""
        code = {"0": FLAG_OFF, "1": FLAG_ON}.get(flag, FLAG_UNLABELLED)
        for node, points in series_by_node([item]).items():
            known = parts.setdefault(node, {})
            known[code] = np.vstack([known[code], points]) if code in known else points
    speed, flags = {}, {}
    for node, by_code in parts.items():
        stamps = np.unique(np.round(np.concatenate([p[:, 0] for p in by_code.values()]), 3))
        value, code, served = np.full(len(stamps), np.nan), np.full(len(stamps), np.nan), np.zeros(len(stamps), int)
        for flag_code, points in by_code.items():
            at = np.searchsorted(stamps, np.round(points[:, 0], 3))
            usable = np.isfinite(points[:, 1]) & (points[:, 1] > 0)
            first = (
                ~np.isfinite(value[at]) & ~usable & ~np.isfinite(code[at])
            )  # a sample without traffic still says the step
            value[at[first]], code[at[first]] = points[first, 1], flag_code
            value[at[usable]], code[at[usable]] = points[usable, 1], flag_code
            np.add.at(served, at[usable], 1)
        both = served > 1
        value[both], code[both] = np.nan, FLAG_MIXED
        speed[node], flags[node] = np.column_stack([stamps, value]), np.column_stack([stamps, code])
    return speed, flags


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
    arrays = {n: _as_points(s) for n, s in speed.items()}
    stamps = np.unique(np.round(np.concatenate([a[:, 0] for a in arrays.values()]), 3)) if arrays else np.empty(0)

    def column(points: np.ndarray) -> np.ndarray:
        out = np.full(len(stamps), np.nan)
        if len(points) and len(stamps):
            times = np.round(points[:, 0], 3)
            at = np.minimum(np.searchsorted(stamps, times), len(stamps) - 1)
            hit = stamps[at] == times
            out[at[hit]] = points[hit, 1]
        return out

    gauges = {name: {n: _as_points(s) for n, s in series.items()} for name, series in load.items()}
    empty = np.empty((0, 2))
    return Panel(
        stamps.astype(float),
        {n: column(a) for n, a in arrays.items()},
        {n: np.column_stack([column(gauges.get(name, {}).get(n, empty)) for name in COVARIATES]) for n in arrays},
        {n: column(_as_points(f)) for n, f in (flags or {}).items() if n in arrays},
    )


def _as_points(series: Any) -> np.ndarray:
    points = np.asarray(series, dtype=float)
    return points.reshape(-1, 2) if points.size else np.empty((0, 2))


def _log(values: np.ndarray, floor: float = 0.0) -> np.ndarray:
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
    _cache: dict = field(default_factory=dict, repr=False)

    def _cached(self, key: Any, compute: Any) -> Any:
        if key not in self._cache:
            self._cache[key] = compute()
        return self._cache[key]

    @property
    def pooled(self) -> tuple[float, float]:
        """(long-run variance inflation, phi) of the controls' own log ratios, pooled (1, 0 when unknown)."""
        if self.stack is None:
            return 1.0, 0.0
        return self._cached(
            "pooled",
            lambda: _pooled_inflation(
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
            t, k = self.speed.shape[0], self.load.shape[1]
            if not count:
                return (), np.empty((0, t)), np.empty((0, t, k))
            l = np.stack(
                [self.stack[i] - _nanmedian(np.delete(self.stack, i, axis=0), self.min_controls) for i in range(count)]
            )
            x = np.stack(
                [
                    self.load_stack[i] - _nanmedian(np.delete(self.load_stack, i, axis=0), self.min_controls)
                    for i in range(count)
                ]
            )
            return tuple(self.names[:count]), l, x

        return self._cached("loo", compute)

    @property
    def load_effect(self) -> tuple[tuple[int, ...] | None, tuple[float, ...], tuple[tuple[float, ...], ...], int]:
        """(gauge columns, beta, its covariance, controls used) of the load's effect pooled over the
        controls; columns None when there are too few of them."""
        return self._cached("beta", lambda: _pooled_beta(*self.loo[1:]))


def reference(
    panel: Panel, controls: Sequence[str], cfg: JudgeConfig, held: Mapping[str, float] | None = None
) -> Reference:
    """The controls' medians. `held`: the flag each control held (FLAG_OFF unless named); with samples
    split by flag, a control contributes only samples of that flag (none from a restart in between)."""
    k, t = len(COVARIATES), len(panel.times)
    names = [c for c in controls if c in panel.speed]
    if not names or not t:
        return Reference(np.full(t, np.nan), np.full((t, k), np.nan), 0)

    def own(c: str) -> np.ndarray:
        speed = _log(panel.speed[c], cfg.min_traffic)
        return np.where(panel.flags_of(c) == (held or {}).get(c, FLAG_OFF), speed, np.nan) if panel.by_flag else speed

    speed = np.vstack([own(c) for c in names])
    flag = (held or {}).get(names[0], FLAG_OFF)
    load = np.stack([_log(panel.load[c]) for c in names])  # (C, T, K)
    return Reference(
        _nanmedian(speed, 1),
        _nanmedian(load, 1),
        int(np.isfinite(speed).any(axis=1).sum()),
        tuple(names),
        speed,
        load,
        1,
        flag,
    )


def _robust_rows(rows: np.ndarray) -> np.ndarray:
    """Each row clipped at its median +- CLIP robust sd (scipy's MAD along the rows, NaN omitted)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        scale = np.maximum(
            np.nan_to_num(stats.median_abs_deviation(rows, axis=1, scale="normal", nan_policy="omit"), nan=1e-6), 1e-6
        )
        center = np.nan_to_num(np.nanmedian(rows, axis=1))
    return np.clip(rows, (center - CLIP * scale)[:, None], (center + CLIP * scale)[:, None])


def _pooled_beta(l: np.ndarray, x: np.ndarray) -> tuple:
    """How the node's own load moves its speed, from the controls: one within-node OLS of their log
    ratios on their gauges (each node demeaned, its offset is its own), with a cluster-robust covariance
    by node (statsmodels cov_type="cluster"), valid whatever the autocorrelation within a node. Many
    nodes' wander averages out, where one node's 20 min can confuse its own wander with its load.
    Assumes the speed-load relation is the same on every node of the rollout (same hardware, model and
    serving settings). Empty (None) with fewer than POOLED_BETA_MIN controls with gauges."""
    none = (None, (), (), 0)
    if len(l) < POOLED_BETA_MIN:
        return none
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        l = _robust_rows(l)
        flat = x[np.isfinite(x).all(axis=2) & np.isfinite(l)]
        cols = _independent(flat, [k for k in range(x.shape[2]) if len(flat) > 20 and np.std(flat[:, k]) > 1e-4])
        if not cols:
            return none
        rows = np.isfinite(l) & np.isfinite(x[:, :, cols]).all(axis=2)
        used = rows.sum(axis=1) >= 10
        if used.sum() < POOLED_BETA_MIN:
            return none
        l, x, rows = l[used], x[used][:, :, cols], rows[used]
        y = np.where(rows, l, np.nan)
        y = y - np.nanmean(y, axis=1, keepdims=True)
        design = np.where(rows[:, :, None], x, np.nan)
        design = design - np.nanmean(design, axis=1, keepdims=True)
    groups = np.broadcast_to(np.arange(len(y))[:, None], y.shape)[rows]
    fit = _statsmodels().OLS(y[rows], design[rows]).fit(cov_type="cluster", cov_kwds={"groups": groups})
    cov = np.atleast_2d(fit.cov_params())
    return (
        tuple(cols),
        tuple(float(b) for b in fit.params),
        tuple(tuple(float(c) for c in row) for row in cov),
        int(used.sum()),
    )


def _pooled_inflation(l: np.ndarray, x: np.ndarray) -> tuple[float, float]:
    """One autocorrelation estimate over several controls' own log ratios, after what their own load
    explains (one within-node OLS on the gauges, as each judged node is adjusted): each series
    demeaned (their offsets differ), joined with NaNs between them so no lag spans two nodes."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        l = _robust_rows(l)  # outliers hide memory
        l = l - np.nanmean(l, axis=1, keepdims=True)
        x = x - np.nanmean(x, axis=1, keepdims=True)
    rows = np.isfinite(l) & np.isfinite(x).all(axis=2)
    flat_x = x[rows]
    cols = _independent(flat_x, [k for k in range(x.shape[2]) if len(flat_x) > 20 and np.std(flat_x[:, k]) > 1e-4])
    if cols:
        fit = _statsmodels().OLS(l[rows], flat_x[:, cols]).fit()
        l = np.where(rows, np.nan, l)
        l[rows] = fit.resid
    gap = np.full((len(l), 2), np.nan)
    return _inflation(np.hstack([l, gap]).ravel(), l.shape[1])


# ---------------------------------------------------------------- the statistics


def _inflation(series: np.ndarray, length: int) -> tuple[float, float]:
    """(long-run variance / variance, phi) of a gappy series (NaN = missing) made of stretches of
    about `length` samples each demeaned, from its autocorrelations (statsmodels acf, lags
    1..ACF_LAGS), as for AR(1) wander plus white noise, an ARMA(1,1): rho_k = c phi^k, phi fitted as
    sum(rho_2..rho_L) / sum(rho_1..rho_L-1), long-run variance = var (1 + 2 rho_1 / (1 - phi)).
    A lag-1 autocorrelation alone would read wander under noise as a small phi and miss most of it.
    Demeaning a stretch lowers every sample autocovariance by about the variance of its mean,
    long-run variance / length, so the autocorrelations are corrected for that (a fixed point, a few
    rounds): without it, 10 min of memory seen through 20 min stretches reads as a quarter of itself.
    A rho_1 within noise of 0 (2 / sqrt(n)), or negative, counts as none: a noisy ratio would
    otherwise invent a long memory."""
    finite = int(np.isfinite(series).sum())
    if finite < 2 * ACF_LAGS:
        return 1.0, 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        raw = _acf(series, nlags=ACF_LAGS, missing="conservative", fft=False)
    if not np.isfinite(raw).all() or raw[1] <= 2 / math.sqrt(finite):
        return 1.0, 0.0
    inflation, phi = 1.0, 0.0
    for _ in range(DEMEAN_ROUNDS):
        bias = inflation / max(length, 1)
        rho = (raw + bias) / (1 + bias)
        phi = float(min(max(rho[2:].sum() / rho[1:-1].sum(), 0.0), MAX_PHI))
        inflation = float(1 + 2 * min(rho[1], 1.0) / (1 - phi))
    return inflation, phi


def _geometric(phi: float, k: int) -> float:
    """1 + phi + ... + phi^(k-1)."""
    return float(k) if phi >= 1 else (1 - phi**k) / (1 - phi)


def _window_mean_variance(n: int, inflation: float, phi: float) -> float:
    """Variance of a mean of n consecutive samples over the samples' variance, under the fitted
    ARMA(1,1) (rho_h = c phi^(h-1), c = (inflation - 1)(1 - phi) / 2): (1 + 2 sum (1 - h/n) rho_h) / n."""
    c = (inflation - 1) * (1 - phi) / 2
    weighted = float(n - 1) if phi == 0 else ((n - 1) - n * phi + phi**n) / (1 - phi) ** 2  # sum (n - h) phi^(h-1)
    return (1 + 2 * c * weighted / n) / n


def contrast_factor(n_pre: int, n_post: int, gap: int, inflation: float, phi: float) -> float:
    """How much of the asymptotic variance of the difference in differences, inflation x variance x
    (1 / n_post + 1 / n_pre), the fitted ARMA(1,1) gives it over windows this long: a mean over a window
    shorter than the memory varies less than long-run variance / n (the far lags never enter it), the
    two windows' wander is shared (their covariance is subtracted), and the variance it multiplies was
    taken about the baseline's own mean, which hides that mean's variance (so it is divided by
    1 - that). `gap`: samples between the last baseline sample and the first post-flip one (the
    warm-up). At most 1: with no memory it changes nothing; with 10 min of it, 20 min of baseline and
    10 min after, about 0.4-0.6 (docs/analysis.md, step 4)."""
    if inflation <= 1 or n_pre < 2 or n_post < 1:
        return 1.0
    c = (inflation - 1) * (1 - phi) / 2
    w_pre, w_post = _window_mean_variance(n_pre, inflation, phi), _window_mean_variance(n_post, inflation, phi)
    cross = c * phi**gap * _geometric(phi, n_pre) * _geometric(phi, n_post) / (n_pre * n_post)
    exact = max(w_pre + w_post - 2 * cross, 0.0)
    return min(1.0, exact / (inflation * (1 / n_pre + 1 / n_post)) / max(1 - w_pre, 0.05))


def _long_run_variance(residuals: np.ndarray, inflation: float, dof: int = 1) -> float:
    """The variance of a mean of n of these samples is this / n."""
    values = residuals[np.isfinite(residuals)]
    if len(values) <= dof:
        return math.inf
    return float(np.var(values, ddof=dof)) * inflation


def _robust_scale(values: np.ndarray) -> float:
    scale = float(stats.median_abs_deviation(values[np.isfinite(values)], scale="normal"))
    return scale if scale > 1e-6 else 1e-6


def _clip(values: np.ndarray, scale: float) -> np.ndarray:
    center = float(np.nanmedian(values)) if np.isfinite(values).any() else 0.0
    return np.clip(values, center - CLIP * scale, center + CLIP * scale)


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


def _mixture(threshold: float, cfg: JudgeConfig) -> tuple[tuple[float, float], ...]:
    """Fixed in advance (a data-dependent choice would void the anytime guarantee). Most weight on a
    mixing variance of the tolerance's size, where one normal mixture is sharpest for effects of that
    size; some on 4, 16 and 64 times it, because one mixture's boundary grows as v / sqrt(rho) once
    the estimate's variance v exceeds rho (a noisy or wandering node, sd 5-10%): there the wider
    components keep it near 3-4 sd, so a large regression still fails, for a boundary about 1% wider
    at small v (docs/analysis.md)."""
    scale = cfg.mixture * (threshold**2 if math.isfinite(threshold) and threshold != 0 else 0.05**2)
    return tuple((scale * k, w) for k, w in zip(MIXTURE_SCALES, MIXTURE_WEIGHTS))


def _baseline(l: np.ndarray, x: np.ndarray, pre: np.ndarray, cfg: JudgeConfig, ref: Reference) -> dict[str, Any] | None:
    """The node's pre-flip offset against the controls and how its load moves its speed (CUPED's theta,
    by OLS with a HAC covariance). None with fewer than minSamples samples."""
    rows = pre & np.isfinite(l)
    if rows.sum() < cfg.min_samples:
        return None
    scale = _robust_scale(l[rows])
    effect_cols, effect, effect_cov, effect_nodes = ref.load_effect
    pooled = (
        effect_cols is not None and (rows & np.isfinite(x[:, list(effect_cols)]).all(axis=1)).sum() >= cfg.min_samples
    )
    if pooled:
        cols = list(effect_cols)
        full = rows & np.isfinite(x[:, cols]).all(axis=1)
    else:
        cols = [
            k
            for k in range(x.shape[1])
            if np.isfinite(x[rows, k]).sum() >= max(cfg.min_samples, 10) and np.nanstd(x[rows, k]) > 1e-4
        ]
        full = rows & np.isfinite(x[:, cols]).all(axis=1) if cols else rows
        cols = _independent(x[full], cols)
        full = rows & np.isfinite(x[:, cols]).all(axis=1) if cols else rows
        if cols and full.sum() < max(cfg.min_samples, 4 * (len(cols) + 1)):
            cols, full = [], rows  # too few samples with gauges to learn the load's effect: no adjustment
    y = _clip(np.where(full, l, np.nan), scale)
    residuals = np.where(full, y - np.nanmean(y), np.nan)
    beta, cov, mean_x = [], [], []
    if pooled:
        # the controls' fit is of log speed; l is signed
        beta, cov = [cfg.sign * b for b in effect], [list(row) for row in effect_cov]
        mean_x = x[full][:, cols].mean(axis=0).tolist()
        residuals[full] = y[full] - np.mean(y[full]) - (x[full][:, cols] - np.array(mean_x)) @ np.array(beta)
    elif cols:
        design = _statsmodels().add_constant(x[full][:, cols], has_constant="add")
        lags = max(1, min(int(full.sum()) // 4, int(math.ceil(4 * (full.sum() / 100) ** (2 / 9)))))
        fit = _statsmodels().OLS(y[full], design).fit(cov_type="HAC", cov_kwds={"maxlags": lags})
        beta, cov = fit.params[1:].tolist(), fit.cov_params()[1:, 1:].tolist()
        mean_x = x[full][:, cols].mean(axis=0).tolist()
        residuals[full] = fit.resid
    inflation, phi = max(_inflation(residuals, int(full.sum())), (ref.inflation, ref.phi))
    n = int(full.sum())
    lrv = _long_run_variance(residuals, inflation, dof=len(cols) + 1)
    return {
        "m": float(np.nanmean(y)),
        "v": lrv / n,
        "n": n,
        "lrv": lrv,
        "g": lrv / inflation,
        "f": inflation,
        "phi": phi,
        "s": scale,
        "cols": cols,
        "beta": beta,
        "cov": cov,
        "x": mean_x,
        "pooled": effect_nodes if pooled else 0,
        "pl": ref._cached(
            ("placebo baselines", pre.tobytes(), tuple(cols), cfg.direction, cfg.min_samples),
            lambda: _placebo_baselines(ref, pre, cols, cfg),
        ),
    }


def _placebo_baselines(ref: Reference, pre: np.ndarray, cols: list[int], cfg: JudgeConfig) -> dict[str, list[float]]:
    """Placebo flips: the first PLACEBOS controls get the judged node's flip time and baseline, and each
    look the same difference in differences as the node (post mean, load-adjusted with the same beta,
    minus the pre mean). Their flag never changed, so their estimates show how far the node's estimate
    strays with no effect at all, whatever the memory of the noise. {control: [pre mean, clip scale,
    pre mean of each gauge]}."""
    out: dict[str, list[float]] = {}
    names, loo_l, loo_x = ref.loo
    for i, name in enumerate(names[:PLACEBOS]):
        l, x = cfg.sign * loo_l[i], loo_x[i]
        rows = pre & np.isfinite(l) & (np.isfinite(x[:, cols]).all(axis=1) if cols else True)
        if rows.sum() < cfg.min_samples:
            continue
        scale = _robust_scale(l[rows])
        y = _clip(l[rows], scale)
        out[name] = [float(y.mean()), scale] + (x[rows][:, cols].mean(axis=0).tolist() if cols else [])
    return out


def _placebo_looks(
    ref: Reference,
    placebos: Mapping[str, list[float]],
    sums: Mapping[str, list[float]] | None,
    window: np.ndarray,
    t: np.ndarray,
    cols: list[int],
    beta: Sequence[float],
    start: float,
    sign: float,
) -> dict[str, list[float]]:
    """The placebos' running post sums {control: [n, sum, last sample time]}, updated with this look's
    new samples of the controls still in the reference (one that left the control set keeps its last
    sums: an estimate over fewer samples, no less variable)."""
    out = {name: list(v) for name, v in (sums or {}).items() if name in placebos}
    names, loo_l, loo_x = ref.loo
    index = {name: i for i, name in enumerate(names)}
    live = [name for name in placebos if name in index]
    for name in placebos:
        out.setdefault(name, [0, 0.0, start])
    if not live:
        return out
    rows_of = np.array([index[name] for name in live])
    m, scale = (np.array([placebos[name][j] for name in live]) for j in (0, 1))
    l = sign * loo_l[rows_of]
    rows = window[None, :] & np.isfinite(l)
    if cols:
        x = loo_x[rows_of][:, :, cols] - np.array([placebos[name][2:] for name in live])[:, None, :]
        rows &= np.isfinite(x).all(axis=2)
        l = l - x @ np.array(beta)
    l = np.where(rows, l, np.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        center = np.nan_to_num(np.nanmedian(l, axis=1))
    l = np.clip(l, (center - CLIP * scale)[:, None], (center + CLIP * scale)[:, None])
    until = np.array([out[name][2] for name in live])
    new = rows & (t[None, :] > until[:, None])
    counts, totals = new.sum(axis=1), np.where(new, l, 0.0).sum(axis=1)
    last = np.where(new, t[None, :], -np.inf).max(axis=1)
    for j, name in enumerate(live):
        if counts[j]:
            n, total, _ = out[name]
            out[name] = [n + int(counts[j]), total + float(totals[j]), float(last[j])]
    return out


def n_pre_of(base: Mapping[str, Any] | None) -> int:
    return int(base["n"]) if base else 0


def small_sample_factor(dof: float, alpha: float) -> float:
    """How much wider a variance estimated with `dof` degrees of freedom must be taken for an interval
    at level alpha: (t_dof / z)^2 at 1 - alpha/2, the ratio of Student's to the normal quantile (the
    small-sample interval of a mean whose variance is estimated). 1.03 at 77 dof, 1.46 at 7, 2.6 at 3,
    42 at 1; below 1 dof, infinite (nothing to estimate a variance from)."""
    if not dof >= 1:
        return math.inf
    q = 1 - alpha / 2
    return float((stats.t.ppf(q, dof) / stats.norm.ppf(q)) ** 2)


def _placebo_variance(
    placebos: Mapping[str, list[float]], sums: Mapping[str, list[float]], min_samples: int
) -> tuple[float, int]:
    """Mean square of the placebo estimates (their true effect is 0): the variance of a difference in
    differences of exchangeable nodes, long memory, baseline error and tails included. (0, count) when
    fewer than MIN_PLACEBOS have min_samples post samples."""
    estimates = [
        sums[name][1] / sums[name][0] - placebos[name][0]
        for name in placebos
        if name in sums and sums[name][0] >= min_samples
    ]
    if len(estimates) < MIN_PLACEBOS:
        return 0.0, len(estimates)
    return float(np.mean(np.square(estimates))), len(estimates)


def _independent(x: np.ndarray, cols: list[int]) -> list[int]:
    """The gauges that add information: one nearly collinear with a kept one (|r| > 0.98, e.g. KV usage
    tracking running requests exactly) is dropped, so beta stays identified."""
    kept: list[int] = []
    for k in cols:
        if all(abs(np.corrcoef(x[:, k], x[:, j])[0, 1]) <= 0.98 for j in kept):
            kept.append(k)
    return kept


def _step(times: np.ndarray) -> float:
    return float(np.median(np.diff(times))) if len(times) > 1 else 15.0


def _gap_samples(times: np.ndarray, seconds: float) -> int:
    """Samples skipped between the baseline and the post-flip window (the pods' switch and the warm-up)."""
    step = _step(times)
    return max(int(round(seconds / step)), 0) if step > 0 else 0


def _switch_time(
    t: np.ndarray, speed: np.ndarray, codes: np.ndarray, changed_at: float, now: float
) -> tuple[float | None, str]:
    """When every serving pod of the node ran flag 1: the first flag-1 sample after the last one served
    (in part) by pods at another flag since the flip. (None, why) while the latest served sample is not
    all flag 1: a restart held back (a PodDisruptionBudget, restartDelaySeconds, a slow pull, a pod
    admitted without the webhook) leaves the node's own flag-0 samples after its label flipped."""
    served = (t >= changed_at) & (t <= now) & ((np.isfinite(speed) & (speed > 0)) | (codes == FLAG_MIXED))
    other = served & (codes != FLAG_ON)
    last_other = float(t[other].max()) if other.any() else -math.inf
    after = served & (codes == FLAG_ON) & (t > last_other)
    if after.any():
        return float(t[after].min()), ""
    if not other.any():
        return None, "no sample from the node's serving pods since its flag flipped"
    what = {
        FLAG_OFF: "pods at flag 0",
        FLAG_MIXED: "pods at flag 0 and 1 at once",
        FLAG_UNLABELLED: "pods without the flag label",
    }
    latest = int(np.flatnonzero(other)[-1])
    return None, (
        f"{int(other.sum())} samples since the flip came from pods not all at flag 1 (latest at {t[latest]:.0f}: "
        f"{what.get(float(codes[latest]), 'pods of another flag')}); waiting for every serving pod to run flag 1"
    )


def _batch_size(times: np.ndarray) -> int:
    step = _step(times)
    return max(8, int(round(BATCH_SECONDS / step))) if step > 0 else 8


def _add_to_batches(batches: Mapping[str, Any] | None, values: np.ndarray, size: int) -> dict[str, Any]:
    """Non-overlapping batch means of the post-flip samples, in time order, as running sums (count,
    sum, sum of squares of full batches; the open batch's sum and count)."""
    out = dict(batches or {"k": 0, "s": 0.0, "q": 0.0, "ps": 0.0, "pn": 0})
    for value in values[np.isfinite(values)]:
        out["ps"] += float(value)
        out["pn"] += 1
        if out["pn"] >= size:
            mean = out["ps"] / out["pn"]
            out.update(k=out["k"] + 1, s=out["s"] + mean, q=out["q"] + mean * mean, ps=0.0, pn=0)
    return out


def _batch_lrv(batches: Mapping[str, Any], size: int) -> float:
    """The batch-means estimate of the long-run variance, size x var(batch means): consistent
    whatever the autocorrelation once batches are longer than its memory; 0 until MIN_BATCHES."""
    k = batches["k"]
    if k < MIN_BATCHES:
        return 0.0
    return size * max(batches["q"] - batches["s"] ** 2 / k, 0.0) / (k - 1)


def _restore(state: Any, changed_at: float) -> dict[str, Any]:
    """The previous look's state when it belongs to this flip and is well formed, else a fresh start."""
    try:
        if not isinstance(state, Mapping) or float(state.get("changedAt")) != float(changed_at):
            return {}
        base, post = state.get("baseline"), state["post"]
        if base is not None:
            cols = [int(c) for c in base["cols"]]
            base = {
                "m": float(base["m"]),
                "v": float(base["v"]),
                "n": int(base["n"]),
                "lrv": float(base["lrv"]),
                "g": float(base["g"]),
                "f": float(base["f"]),
                "phi": float(base["phi"]),
                "s": float(base["s"]),
                "cols": cols,
                "beta": [float(b) for b in base["beta"]],
                "cov": [[float(c) for c in row] for row in base["cov"]],
                "x": [float(v) for v in base["x"]],
                "pooled": int(base.get("pooled", 0)),
                "pl": {
                    str(k): [float(v) for v in row]
                    for k, row in (base.get("pl") or {}).items()
                    if len(row) == 2 + len(cols)
                },
            }
            if not (len(base["beta"]) == len(base["x"]) == len(base["cov"]) == len(cols)) or any(
                c >= len(COVARIATES) for c in cols
            ):
                return {}
        bm = post.get("bm")
        bm = (
            None
            if bm is None
            else {
                "k": int(bm["k"]),
                "s": float(bm["s"]),
                "q": float(bm["q"]),
                "ps": float(bm["ps"]),
                "pn": int(bm["pn"]),
            }
        )
        pl = {str(k): [int(row[0]), float(row[1]), float(row[2])] for k, row in (post.get("pl") or {}).items()}
        post = {
            "n": int(post["n"]),
            "s": float(post["s"]),
            "x": [float(v) for v in post["x"]],
            "until": float(post["until"]),
            "bm": bm,
            "pl": pl,
        }
        switched = state.get(
            "switchedAt", changed_at if post["n"] else None
        )  # a state from before the flag split: its flip time
        return {
            "changedAt": float(changed_at),
            "controlFlag": int(state.get("controlFlag", 0)),
            "baselineSeconds": float(state.get("baselineSeconds", 0.0)) or None,
            "baseline": base,
            "switchedAt": None if switched is None else float(switched),
            "post": post,
            "looks": int(state.get("looks", 0)),
            "pw": float(state.get("pw", 1.0)),
            "pn": float(state.get("pn", 1.0)),
        }
    except (AttributeError, KeyError, TypeError, ValueError):
        return {}


def judge(
    panel: Panel,
    ref: Reference,
    node: str,
    changed_at: float,
    warmup: float,
    now: float,
    baseline: float,
    cfg: JudgeConfig,
    state: Mapping[str, Any] | None = None,
) -> Judgement:
    """One look at one node. `baseline`: how much pre-flip history is the node's own reference;
    `state`: what the previous look returned in Judgement.state (the running sums and the baseline)."""
    threshold = math.log(1 - cfg.tolerance) if cfg.tolerance < 1 else -math.inf
    harm = threshold * FAIL_NULL_FRACTION
    common = dict(
        threshold=1 - cfg.tolerance,
        n_controls=ref.n_controls,
        controls=ref.names[:CONTROL_NAMES],
        control_flag=int(ref.flag),
    )
    if ref.n_controls == 0:
        return Judgement("inconclusive", "no control node has data in the window", **common, state=dict(state or {}))
    if ref.n_controls < cfg.min_controls:
        return Judgement(
            "inconclusive",
            f"{ref.n_controls} control nodes with data (nodes whose flag held steady over this node's "
            f"baseline and since), need minControls {cfg.min_controls}",
            **common,
            state=dict(state or {}),
        )
    t = panel.times
    sign = cfg.sign
    empty = np.full(len(t), np.nan)
    l = sign * (_log(panel.speed.get(node, empty), cfg.min_traffic) - ref.speed)
    x = _log(panel.load.get(node, np.full((len(t), len(COVARIATES)), np.nan))) - ref.load
    previous = _restore(state, changed_at)
    codes = panel.flags_of(node)
    pre = (t >= changed_at - baseline) & (t < changed_at)
    if panel.by_flag:
        pre &= codes == FLAG_OFF  # the baseline is the node at flag 0 only
    base = previous.get("baseline") if previous else _baseline(l, x, pre, cfg, ref)
    switched = previous.get("switchedAt") if previous else None
    if switched is None:
        switched, waiting = (
            _switch_time(t, panel.speed.get(node, empty), codes, changed_at, now) if panel.by_flag else (changed_at, "")
        )
        if switched is None:
            fresh = {
                "changedAt": float(changed_at),
                "controlFlag": int(ref.flag),
                "baselineSeconds": float(baseline),
                "baseline": base,
                "switchedAt": None,
                "post": {
                    "n": 0,
                    "s": 0.0,
                    "x": [0.0] * len(base["cols"] if base else []),
                    "until": changed_at,
                    "bm": None,
                    "pl": {},
                },
                "looks": previous.get("looks", 0) + 1,
                "pw": previous.get("pw", 1.0),
                "pn": previous.get("pn", 1.0),
            }
            return Judgement(
                "inconclusive",
                f"not judged yet: {waiting}",
                **common,
                n_pre=base["n"] if base else 0,
                looks=fresh["looks"],
                state=_round(fresh),
            )
    start = switched + warmup  # the warm-up counts from the moment every serving pod runs flag 1
    post_state = previous.get("post") or {
        "n": 0,
        "s": 0.0,
        "x": [0.0] * len(base["cols"] if base else []),
        "until": start - 1e-3,
    }
    post_state = dict(post_state, until=max(post_state["until"], start - 1e-3))
    cols = base["cols"] if base else []
    window = (t >= start) & (t <= now) & np.isfinite(l)
    if panel.by_flag:
        window &= codes == FLAG_ON  # the treatment is flag-1 samples only, whatever the label says
    if cols:
        window &= np.isfinite(x[:, cols]).all(axis=1)
    adjusted = np.where(window, l, np.nan)
    if cols:
        shift = np.where(window[:, None], x[:, cols] - np.array(base["x"]), 0.0)
        adjusted = adjusted - shift @ np.array(base["beta"])
    scale = base["s"] if base else (_robust_scale(adjusted) if window.any() else 1.0)
    adjusted = _clip(adjusted, scale)
    new = window & (t > post_state["until"])
    n = post_state["n"] + int(new.sum())
    total = post_state["s"] + float(adjusted[new].sum())
    sum_x = (np.array(post_state["x"]) + (x[new][:, cols].sum(axis=0) if cols else 0.0)).tolist() if cols else []
    until = float(t[new].max()) if new.any() else post_state["until"]
    looks = previous.get("looks", 0) + 1
    batch = _batch_size(t)
    batches = _add_to_batches(post_state.get("bm"), adjusted[new], batch)
    placebos = base.get("pl", {}) if base else {}
    # nodes flipped together share their placebos' sums: computed once per evaluation for all of them
    key = (
        "placebo looks",
        start,
        now,
        tuple(cols),
        tuple(base["beta"]) if base else (),
        sign,
        tuple((k, tuple(v), tuple((post_state.get("pl") or {}).get(k, ()))) for k, v in placebos.items()),
    )
    placebo_sums = (
        ref._cached(
            key,
            lambda: _placebo_looks(
                ref,
                placebos,
                post_state.get("pl"),
                (t >= start) & (t <= now),
                t,
                cols,
                base["beta"] if base else [],
                start - 1e-3,
                sign,
            ),
        )
        if placebos
        else {}
    )
    kept = {
        "changedAt": float(changed_at),
        "controlFlag": int(ref.flag),
        "baselineSeconds": float(previous.get("baselineSeconds") or baseline),
        "baseline": base,
        "switchedAt": float(switched),
        "post": {"n": n, "s": total, "x": sum_x, "until": until, "bm": batches, "pl": placebo_sums},
        "looks": looks,
        "pw": previous.get("pw", 1.0),
        "pn": previous.get("pn", 1.0),
    }
    n_pre = base["n"] if base else 0
    counts = dict(n_post=n, n_pre=n_pre, looks=looks)
    if n < cfg.min_samples:
        return Judgement(
            "inconclusive",
            f"{n} samples with traffic after warm-up, need {cfg.min_samples}",
            **common,
            **counts,
            state=_round(kept),
        )
    recent = np.where(window, adjusted - (np.nanmean(adjusted) if window.any() else 0.0), np.nan)
    # With a baseline, its own and the controls' autocorrelation (fitted on 20 min, not on the last
    # few minutes, whose autocorrelations are noise) scale the recent samples' variance.
    inflation, phi = (
        (base["f"], base["phi"]) if base else max(_inflation(recent, int(window.sum())), (ref.inflation, ref.phi))
    )
    recent_lrv = _long_run_variance(recent, inflation)
    lrv = (
        max(recent_lrv if math.isfinite(recent_lrv) else 0.0, base["lrv"] if base else 0.0, _batch_lrv(batches, batch))
        or math.inf
    )
    shift = (np.array(sum_x) / n - np.array(base["x"])) if cols else np.zeros(0)
    beta_var = float(shift @ np.array(base["cov"]) @ shift) if cols else 0.0
    # The baseline shares the post period's noise process: its variance grows with what the batch
    # means learn about the long-run variance (a 20 min baseline alone cannot see 10 min memory).
    # Over finite windows the shared wander cancels: the factor is that of the fit whose inflation
    # the variance uses, so the model is one ARMA(1,1), not the widest inflation of one fit with the
    # mildest narrowing of another (that mix read a calm node among wandering controls several times too wide).
    factor = contrast_factor(base["n"], n, _gap_samples(t, start - changed_at), base["f"], base["phi"]) if base else 1.0
    model_var = (lrv / n + (max(base["v"], lrv / base["n"]) if base else 0.0)) * factor
    # The placebos' spread bounds it from below: what the model of the noise misses, they show.
    placebo_var, n_placebos = _placebo_variance(placebos, placebo_sums, cfg.min_samples)
    # Both are estimates: 20 min of memory holds few independent samples, few controls give few placebos.
    # The model is widened by its degrees of freedom, t-style (small_sample_factor), and so is the placebos'
    # floor with FEW_CONTROLS or fewer (from 4 controls on, its max with the model already errs wide:
    # widening it too cost a tenth of the power on a 10% regression at 5% noise in bench/judge.py).
    placebo_dof = min(n_placebos, ref.n_controls - 1)  # two controls' placebos mirror each other: one
    placebo_widening = small_sample_factor(placebo_dof, 1 - cfg.confidence) if ref.n_controls <= FEW_CONTROLS else 1.0
    model_dof = (n_pre_of(base) + n) / inflation - len(cols) - 1  # samples worth of independent ones, less the fit's
    alpha = 1 - cfg.confidence
    widened = [model_var * small_sample_factor(model_dof, alpha)] if model_dof >= 1 else []
    widened += [placebo_var * placebo_widening] if placebo_dof >= 1 and n_placebos >= MIN_PLACEBOS else []
    variance = (max(widened) if widened else math.inf) + beta_var
    marginal = base["g"] if base else float(np.nanvar(recent)) if window.sum() > 1 else lrv
    inflation = max(inflation, lrv / marginal if marginal > 0 else 1.0)
    estimate = total / n - (base["m"] if base else 0.0)
    mixture = _mixture(threshold, cfg)
    half = mixture_halfwidth(variance, mixture, alpha)
    p_worse = min(kept["pw"], mixture_p_value(estimate, harm, variance, mixture, "below"))
    p_not_worse = min(kept["pn"], mixture_p_value(estimate, threshold, variance, mixture, "above"))
    kept.update(pw=p_worse, pn=p_not_worse)
    method = (
        (
            "difference in differences vs control"
            + (
                f", load-adjusted ({', '.join(COVARIATES[c] for c in cols)})"
                + (
                    f" with the effect pooled over {base['pooled']} controls"
                    if base.get("pooled")
                    else " with the node's own fit"
                )
                if cols
                else ""
            )
            if base
            else "vs control only (no pre-enable baseline)"
        )
        + ", ARMA(1,1) long-run variance"
        + (f" x{factor:.2f} over the finite windows" if factor < 1 else "")
        + (f" bounded by {n_placebos} placebo controls" if n_placebos >= MIN_PLACEBOS else "")
        + ", normal-mixture confidence sequence"
        + (
            ", samples by the flag their pods ran"
            if panel.by_flag
            else ", every sample after the flip counted as flag 1 (the speed query is not split by flag)"
        )
    )
    numbers = dict(
        effect=math.exp(estimate),
        ci_low=math.exp(estimate - half),
        ci_high=math.exp(min(estimate + half, 700.0)),
        n_eff=n / inflation,
        inflation=inflation,
        phi=phi,
        adjustment=math.exp(-float(shift @ np.array(base["beta"]))) if cols else 1.0,
        p_worse=p_worse,
        p_not_worse=p_not_worse,
        placebos=n_placebos,
        placebo_sd=math.sqrt(placebo_var),
        model_sd=math.sqrt(model_var),
        beta_sd=math.sqrt(max(beta_var, 0.0)),
        method=method,
        **common,
        **counts,
    )
    summary = (
        f"effect x{numbers['effect']:.3f} ({int(cfg.confidence * 100)}% sequence x{numbers['ci_low']:.3f}..x{numbers['ci_high']:.3f}), "
        f"threshold x{1 - cfg.tolerance:.3f}, load adjustment x{numbers['adjustment']:.3f}, "
        f"n={n} after (effective {numbers['n_eff']:.1f}) / {n_pre} before, {ref.n_controls} controls, look {looks}"
    )
    if estimate + half < harm and estimate < threshold:
        return Judgement("fail", f"decode speed worse than tolerance: {summary}", **numbers, state=_round(kept))
    if estimate - half > threshold:
        return Judgement("pass", f"not worse than tolerance: {summary}", **numbers, state=_round(kept))
    return Judgement("inconclusive", f"not enough evidence either way: {summary}", **numbers, state=_round(kept))


def judge_nodes(
    panel: Panel,
    ref: Reference,
    nodes: Mapping[str, tuple[float, Mapping[str, Any] | None]],
    warmup: float,
    now: float,
    baseline: float,
    cfg: JudgeConfig,
) -> dict[str, Judgement]:
    """Every judged node against the same reference: {node: (changed_at, previous state)}."""
    return {
        node: judge(panel, ref, node, changed_at, warmup, now, baseline, cfg, state)
        for node, (changed_at, state) in nodes.items()
    }


# ---------------------------------------------------------------- per-node bookkeeping across intervals


@dataclass(frozen=True)
class Decision:
    verdict: str | None  # "pass" | "fail" | None (keep waiting)
    reason: str
    streak: int
    inconclusive_since: float | None


def decide(
    judgement: Judgement,
    streak: int,
    inconclusive_since: float | None,
    now: float,
    consecutive: int,
    on_no_data: str,
    deadline: float,
) -> Decision:
    """K consecutive failing evaluations before a rollback; inconclusive past the deadline does what
    `onNoData` says (hold by default)."""
    if judgement.result == "fail":
        streak += 1
        if streak >= consecutive:
            return Decision("fail", f"{streak} consecutive failing evaluations: {judgement.reason}", streak, None)
        return Decision(None, f"failing evaluation {streak}/{consecutive}: {judgement.reason}", streak, None)
    if judgement.result == "pass":
        return Decision("pass", judgement.reason, 0, None)
    since = inconclusive_since if inconclusive_since is not None else now
    if now - since >= deadline and on_no_data != "hold":
        verdict = "pass" if on_no_data == "promote" else "fail"
        return Decision(
            verdict, f"inconclusive for {now - since:.0f} s, onNoData={on_no_data}: {judgement.reason}", 0, since
        )
    return Decision(None, f"inconclusive: {judgement.reason}", 0, since)
