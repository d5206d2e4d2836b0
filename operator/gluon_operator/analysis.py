"""The analysis judge: pure functions over Prometheus samples.

The treated node (flag 1) is compared with control nodes (flag 0) *in the same window*, and against its
own pre-enable baseline: a difference-in-differences on log ratios, so load drift common to all nodes
cancels and a node's own hardware offset cancels too. The test is Yuen's trimmed-mean Welch t-test
(scipy.stats.ttest_ind with trim=0.2: robust to heavy-tailed outliers); the verdict is tri-state:

  fail          the estimate is worse than the tolerance (e.g. < -5%) and the test says, at the confidence
                level, that the node is worse than half the tolerance (a real regression, not noise)
  pass          the whole confidence interval lies above the tolerance (proved not worse than it)
  inconclusive  anything else, and always when there are too few samples, too little traffic, no
                control, or no data: never pass, never fail

Why fail does not demand proof of "worse than the tolerance" itself: that test needs about 65 samples
after the flip to catch a 10% regression at 5% noise 99 times in 100 (docs/benchmarks/README.md); the
estimate-beyond-tolerance rule with a significance test against half the tolerance catches it in 3
intervals while false rollbacks stay under 0.5% (bench/judge.py). Pass keeps the strict proof: promoting
is the irreversible-looking step, rolling back only costs the speedup.

Every judgement carries its numbers: estimate, interval, sample counts, threshold, p-values.
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import asdict, dataclass
from typing import Any, Mapping, Sequence

from scipy import stats

Series = Sequence[tuple[float, float]]  # (unix seconds, value)

# Decode speed each request sees, tokens/s per sequence: 1 / (mean seconds per output token).
# Load-aware: it does not move with the number of requests the way gen_throughput does, and it is the
# decode step time the attention kernel changes. Weighted by tokens across the node's pods.
# The name is matched as sglang[:_]...: prometheus_client (SGLang's exporter) rewrites ':' to '_' in
# sample names when Prometheus negotiates OpenMetrics (client_python issue #1177; seen with Prometheus
# 2.42 and prometheus-client 0.26), so depending on versions the series is stored under either name.
DEFAULT_QUERY = (
    'sum by (node) (rate({__name__=~"sglang[:_]inter_token_latency_seconds_count",namespace="{{namespace}}"{{selector}}}[{{window}}]))'
    " / "
    'sum by (node) (rate({__name__=~"sglang[:_]inter_token_latency_seconds_sum",namespace="{{namespace}}"{{selector}}}[{{window}}]))'
)
FAIL_NULL_FRACTION = 0.5  # fail tests "worse than this fraction of the tolerance" (see the docstring)
TRIM = 0.2  # Yuen: trim 20% from each tail (at n=8 that is one sample per side; 10% would trim none)
LABEL_NAME = re.compile(r"[^a-zA-Z0-9_]")


def promql_selector(match_labels: Mapping[str, str]) -> str:
    """Extra matchers for the serving pods' labels (the chart's PodMonitor maps pod labels to metric
    labels, '.', '/' and '-' becoming '_'), each prefixed with a comma to follow namespace=..."""
    parts = [f',{LABEL_NAME.sub("_", k)}="{v}"' for k, v in sorted(match_labels.items())]
    return "".join(parts)


def render(template: str, namespace: str, match_labels: Mapping[str, str], step_seconds: int, node: str = ".*") -> str:
    """{{window}} is the rate window of one sample (the step), so samples do not overlap."""
    return (template.replace("{{namespace}}", namespace)
            .replace("{{selector}}", promql_selector(match_labels))
            .replace("{{window}}", f"{step_seconds}s")
            .replace("{{node}}", node))


@dataclass(frozen=True)
class JudgeConfig:
    direction: str = "higher"
    tolerance: float = 0.05
    confidence: float = 0.95
    min_samples: int = 5
    min_traffic: float = 0.0
    min_controls: int = 1


@dataclass(frozen=True)
class Judgement:
    result: str  # pass | fail | inconclusive
    reason: str
    effect: float | None = None  # ratio treated/control after vs before (1.9 = 90% faster)
    ci_low: float | None = None
    ci_high: float | None = None
    threshold: float | None = None  # ratio below which a node fails (1 - tolerance)
    n_post: int = 0
    n_pre: int = 0
    n_controls: int = 0
    p_worse: float | None = None  # H0: not worse than FAIL_NULL_FRACTION x tolerance
    p_not_worse: float | None = None  # H0: worse than the tolerance
    method: str = ""

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if v is not None}
        return {k: round(v, 6) if isinstance(v, float) else v for k, v in out.items()}


def log_ratios(treated: Series, controls: Sequence[Series], cfg: JudgeConfig) -> tuple[list[tuple[float, float]], int]:
    """(timestamp, log(treated / median of controls)) where both have traffic; and how many controls
    contributed at all. The sign is flipped for lower-is-better metrics, so positive is always better."""
    by_time: dict[float, list[float]] = {}
    used = 0
    for series in controls:
        good = [(t, v) for t, v in series if _usable(v, cfg)]
        used += bool(good)
        for t, v in good:
            by_time.setdefault(round(t, 3), []).append(v)
    out = []
    for t, v in treated:
        peers = by_time.get(round(t, 3), [])
        if _usable(v, cfg) and len(peers) >= cfg.min_controls:
            ratio = math.log(v) - math.log(statistics.median(peers))
            out.append((t, ratio if cfg.direction == "higher" else -ratio))
    return out, used


def _usable(value: float, cfg: JudgeConfig) -> bool:
    return value is not None and math.isfinite(value) and value > 0 and value >= cfg.min_traffic


def judge(treated: Series, controls: Sequence[Series], changed_at: float, warmup: float, now: float,
          window: float, baseline: float, cfg: JudgeConfig) -> Judgement:
    """`window`: how much recent post-flip history is judged; `baseline`: how much pre-flip history is the
    node's own reference (longer is better: its error is shared by every later evaluation)."""
    ratios, n_controls = log_ratios(treated, controls, cfg)
    threshold = math.log(1 - cfg.tolerance)
    harm = threshold * FAIL_NULL_FRACTION
    common = dict(threshold=1 - cfg.tolerance, n_controls=n_controls)
    if n_controls == 0:
        return Judgement("inconclusive", "no control node with flag 0 has data in the window", **common)
    post = [r for t, r in ratios if t >= max(changed_at + warmup, now - window)]
    pre = [r for t, r in ratios if changed_at - baseline <= t < changed_at]
    counts = dict(n_post=len(post), n_pre=len(pre))
    if len(post) < cfg.min_samples:
        return Judgement("inconclusive", f"{len(post)} samples with traffic after warm-up, need {cfg.min_samples}", **common, **counts)
    level = 2 * cfg.confidence - 1  # a two-sided interval at this level gives one-sided tests at `confidence`
    if len(pre) >= cfg.min_samples:
        method = f"Yuen-Welch trimmed t-test (trim {TRIM}), difference in differences vs control"
        worse = stats.ttest_ind([r - harm for r in post], pre, equal_var=False, trim=TRIM, alternative="less")
        better = stats.ttest_ind([r - threshold for r in post], pre, equal_var=False, trim=TRIM, alternative="greater")
        ci = stats.ttest_ind(post, pre, equal_var=False, trim=TRIM).confidence_interval(level)
        estimate = stats.trim_mean(post, TRIM) - stats.trim_mean(pre, TRIM)
    else:
        method = "one-sample t-test vs control (no pre-enable baseline)"
        worse = stats.ttest_1samp(post, harm, alternative="less")
        better = stats.ttest_1samp(post, threshold, alternative="greater")
        ci = stats.ttest_1samp(post, 0.0).confidence_interval(level)
        estimate = statistics.fmean(post)
    numbers = dict(effect=math.exp(estimate), ci_low=math.exp(ci.low), ci_high=math.exp(ci.high),
                   p_worse=float(worse.pvalue), p_not_worse=float(better.pvalue), method=method, **common, **counts)
    alpha = 1 - cfg.confidence
    summary = (f"effect x{numbers['effect']:.3f} ({int(cfg.confidence * 100)}% CI x{numbers['ci_low']:.3f}..x{numbers['ci_high']:.3f}), "
               f"threshold x{1 - cfg.tolerance:.3f}, n={len(post)} after / {len(pre)} before, {n_controls} controls")
    if worse.pvalue < alpha and estimate < threshold:
        return Judgement("fail", f"decode speed worse than tolerance: {summary}", **numbers)
    if better.pvalue < alpha and ci.low > threshold:
        return Judgement("pass", f"not worse than tolerance: {summary}", **numbers)
    return Judgement("inconclusive", f"not enough evidence either way: {summary}", **numbers)


# ---------------------------------------------------------------- per-node bookkeeping across intervals


@dataclass(frozen=True)
class Decision:
    verdict: str | None  # "pass" | "fail" | None (keep waiting)
    reason: str
    streak: int
    inconclusive_since: float | None


def decide(judgement: Judgement, streak: int, inconclusive_since: float | None, now: float, consecutive: int,
           on_no_data: str, deadline: float) -> Decision:
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
        return Decision(verdict, f"inconclusive for {now - since:.0f} s, onNoData={on_no_data}: {judgement.reason}", 0, since)
    return Decision(None, f"inconclusive: {judgement.reason}", 0, since)


def series_by_node(result: Sequence[Mapping[str, Any]]) -> dict[str, list[tuple[float, float]]]:
    """Prometheus matrix result -> {node: [(t, v)]}. Series without a node label are ignored."""
    out: dict[str, list[tuple[float, float]]] = {}
    for item in result:
        node = (item.get("metric") or {}).get("node")
        if not node:
            continue
        values = item.get("values") or ([item["value"]] if item.get("value") else [])
        out.setdefault(node, []).extend((float(t), float(v)) for t, v in values)
    return out
