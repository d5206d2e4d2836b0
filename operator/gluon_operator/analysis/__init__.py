"""The analysis judge: pure functions over Prometheus samples (docs/how-it-decides/analysis.md says why each step).

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

The package, by concept: `queries` (PromQL templates, their rendering, Prometheus answers read), `panel`
(the samples on one grid, the controls' reference), `variance` (the model of the noise), `placebos`,
`sequential` (the confidence sequence), `baseline` (the node's pre-flip fit), `state` (what a look keeps for
the next, typed and versioned) and `judging` (the judge's steps). The streak policy over judgements
(`decide`) is evaluation.py's.
"""

from __future__ import annotations

from .judgement import JudgeConfig, Judgement
from .judging import CONTROL_NAMES, judge, judge_nodes
from .panel import Panel, Reference, build_panel, reference
from .placebos import MIN_PLACEBOS, PLACEBOS
from .queries import (
    COVARIATE_QUERIES,
    COVARIATES,
    DEFAULT_QUERY,
    FLAG_MIXED,
    FLAG_OFF,
    FLAG_ON,
    FLAG_UNLABELLED,
    MalformedAnswer,
    MissingLabel,
    Series,
    promql_selector,
    render,
    require_label,
    series_by_node,
    split_by_flag,
)
from .sequential import (
    FAIL_NULL_FRACTION,
    Mixture,
    mixture_for,
    mixture_halfwidth,
    mixture_log_ratio,
    mixture_p_value,
)
from .state import JudgeState, restore
from .variance import contrast_factor, small_sample_factor

_mixture = mixture_for  # the name tests/test_analysis.py and bench/judge_oracle.py call it by

__all__ = [
    "COVARIATES",
    "COVARIATE_QUERIES",
    "CONTROL_NAMES",
    "DEFAULT_QUERY",
    "FAIL_NULL_FRACTION",
    "FLAG_MIXED",
    "FLAG_OFF",
    "FLAG_ON",
    "FLAG_UNLABELLED",
    "MIN_PLACEBOS",
    "PLACEBOS",
    "JudgeConfig",
    "JudgeState",
    "Judgement",
    "MalformedAnswer",
    "MissingLabel",
    "Mixture",
    "Panel",
    "Reference",
    "Series",
    "build_panel",
    "contrast_factor",
    "judge",
    "judge_nodes",
    "mixture_for",
    "mixture_halfwidth",
    "mixture_log_ratio",
    "mixture_p_value",
    "promql_selector",
    "reference",
    "render",
    "require_label",
    "restore",
    "series_by_node",
    "small_sample_factor",
    "split_by_flag",
]
