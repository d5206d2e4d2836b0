"""The oracle bound beside ours (SIMULATION: bench/judge.py's series, seeds and windows, not a cluster).

    python bench/judge_oracle.py --json [--runs 100] [--workers 2] [--looks 10]

On bench/judge.py's independent-noise scenarios (iid: log-normal noise of 2, 5 or 10% per sample, a common
drift, a 3% offset per node, 2% outliers, 5% missing samples; 7 controls), tests that *know the noise
model* judge the same series, with the same seeds (`bench.scenarios(runs)`: at --runs 100 the very runs
of docs/benchmarks/judge.json), the same baseline (20 min before the flip), the same warm-up and the same
looks (one per 60 s interval):

  model     log speed = node offset + time effect (the common drift) + effect x (treated, after the
            flip) + N(0, noise^2), the noise sd known. Both oracles are handed which samples are
            outliers (a genie: they are dropped like missing ones), so the residual is exactly
            Gaussian; that only favours the oracles. The estimate is the two-way fixed-effects least
            squares of the effect (node and time effects free): with known variance, the best unbiased
            estimate, delta_hat ~ N(delta, noise^2 c) exactly, c from the design of the samples present.
  null      the one ours' fail rule tests: delta >= theta / 2, theta = log(1 - tolerance) (ours fails
            only when its interval lies below half the tolerance); also delta >= 0 (`null_at_zero`, no
            regression at all, a looser bar than ours sets itself), at alpha = 1 - confidence = 0.05.
  fixed     a one-sided z-test at the last look (10 intervals), once. Its power per run given the
            samples present is closed form, Phi((null - delta) / sd - z_alpha), exact; the mean of that
            over the runs is `fixed_horizon_closed_form`, the rejections on the simulated noise are
            `fixed_horizon`.
  anytime   tests valid at every look, for as long as one looks (Ville's inequality on a likelihood
            ratio martingale: the fixed-effects estimate's likelihood ratio given the samples so far is
            one, the invariant data growing with the looks), looking every interval: Wald's one-sided
            SPRT at the true effect (the point alternative, `sprt_at_true_effect`), and the one-sided
            normal mixture (Robbins; Howard et al. 2021) with mixing variance (effect - null)^2
            (`one_sided_mixture_tuned`). `anytime_best` is the higher of the two, per scenario. No
            test that keeps its level over unlimited looks can be the best at every horizon; these are
            the standard ones with the oracle's knowledge, tuned to the effect.
  ours_boundary_true_variance   ours' own rule (the two-sided discrete mixture of analysis/sequential.py, fail
            when the interval lies below theta / 2 and the estimate below theta, consecutiveFailures 2)
            on the oracle's estimate and its true variance: what ours' boundary costs, apart from
            estimating the variance (and its robustness to tails, wander and load).

ar1_wander (bench/judge.py's AR(1) family: each node's own wander of correlation time U(1, 10) min and
sd U(2, 10)%, Student-t noise of 5% sd, its own load moving its speed, outliers, missing samples, a
scrape gap): the oracle also knows each node's wander (its drawn correlation time and sd) and how load
moves speed (bench.ELASTICITY, taken out through the gauges), and estimates by generalised least
squares (`gls_estimate`, each node's rows whitened). Its variance is exact for Gaussian errors; the
noise is Student-t here, so the closed form and the tests' levels are the Gaussian approximation (the
GLS is the best linear unbiased estimate, not the exact optimum under t tails), and the simulated
rejections are what counts.

Ours (`gluon_operator.analysis.judge`, as bench/judge.py runs it) is run on the same series; the
fractions are ours' power within the looks over each oracle's.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import judge as bench
import numpy as np
from scipy import linalg, stats

from gluon_operator import analysis

ALPHA = 1 - bench.OURS.confidence
THETA = math.log(1 - bench.TOLERANCE)
NULLS = {"null_at_half_tolerance": THETA * analysis.FAIL_NULL_FRACTION, "null_at_zero": 0.0}
LOOKS = 10
TESTS = (
    "fixed_horizon",
    "fixed_horizon_closed_form",
    "sprt_at_true_effect",
    "one_sided_mixture_tuned",
    "ours_boundary_true_variance",
)


def fixed_effects_estimate(
    y: np.ndarray, node: np.ndarray, step: np.ndarray, treated: np.ndarray
) -> tuple[float, float]:
    """The least-squares effect of `treated` (0/1) with a free effect per node and per time step, and c,
    its variance over the noise variance (1 / the treated indicator's residual sum of squares after the
    node and time effects: Frisch-Waugh-Lovell). The time effects are profiled out exactly by demeaning
    within each step, leaving a least squares over the node effects alone."""
    counts = np.bincount(step)

    def within(v: np.ndarray) -> np.ndarray:
        return v - (np.bincount(step, weights=v) / counts)[step]

    nodes = np.column_stack([within((node == i).astype(float)) for i in range(node.max() + 1)])
    d = within(treated.astype(float))
    residual = d - nodes @ np.linalg.lstsq(nodes, d, rcond=None)[0]
    information = float(residual @ residual)
    if information <= 1e-9:
        raise ValueError(
            "the treated indicator is collinear with the node and time effects: no post-flip treated sample"
        )
    return float(residual @ y) / information, 1.0 / information


def gls_estimate(
    y: np.ndarray,
    node: np.ndarray,
    step: np.ndarray,
    treated: np.ndarray,
    seconds: np.ndarray,
    noise: float,
    wander: list[tuple[float, float]],
) -> tuple[float, float]:
    """The generalised least-squares effect of `treated` with a free effect per node and per time step,
    each node's errors white noise of sd `noise` plus its own stationary AR(1) wander (correlation time,
    sd), independent across nodes; and its variance (exact for Gaussian errors). Each node's rows are
    whitened by the Cholesky factor of their covariance, then ordinary least squares."""
    nodes, steps = node.max() + 1, step.max() + 1
    design = np.zeros((len(y), nodes + steps))  # the last column of the time effects stands in for the effect:
    design[np.arange(len(y)), node] = 1.0  # one time dummy is dropped, every row having one node and one time
    design[np.arange(len(y)), nodes + step] = 1.0
    design = np.column_stack([design[:, :-1], treated.astype(float)])
    white_x, white_y = np.empty_like(design), np.empty_like(y)
    for i in range(nodes):
        rows = node == i
        tau, sd = wander[i]
        lags = np.abs(np.subtract.outer(seconds[rows], seconds[rows]))
        factor = np.linalg.cholesky(sd**2 * np.exp(-lags / tau) + noise**2 * np.eye(rows.sum()))
        white_x[rows] = linalg.solve_triangular(factor, design[rows], lower=True)
        white_y[rows] = linalg.solve_triangular(factor, y[rows], lower=True)
    information = white_x.T @ white_x
    coefficients = np.linalg.solve(information, white_x.T @ white_y)
    return float(coefficients[-1]), float(np.linalg.inv(information)[-1, -1])


def load_term(sim: dict) -> np.ndarray:
    """How each node's own load moved its log speed (bench.ELASTICITY on its gauges), which the oracle knows."""
    return sum(
        e * (np.log(sim[k]) - math.log(base)) for e, k, base in zip(bench.ELASTICITY, ("running", "usage"), (12.0, 0.5))
    )


def looks_of(sim: dict, noise: float, looks: int = LOOKS) -> tuple[np.ndarray, np.ndarray]:
    """The fixed-effects estimate and its exact variance at each look, from the baseline and the
    post-warm-up samples the genie leaves (no outliers, none missing); where the nodes wander (AR(1)),
    the generalised least squares with each node's wander known, its own load's part taken out."""
    t, enable, wander = sim["t"], sim["enable"], sim.get("wander") or []
    y = np.log(sim["speed"]) - (load_term(sim) if wander else 0.0)
    kept = np.isfinite(y) & ~sim["outliers"]
    pre = (t >= enable - bench.BASELINE * bench.STEP) & (t < enable)
    start = enable + bench.WARMUP_INTERVALS * bench.PER_INTERVAL * bench.STEP
    estimates, variances = [], []
    for now in bench.interval_ends(enable, looks):
        window = pre | ((t >= start) & (t <= now))
        rows, cols = np.nonzero(kept & window[None, :])
        _, step = np.unique(cols, return_inverse=True)
        treated = (rows == 0) & (t[cols] >= enable)
        if not treated.any():  # a scrape gap of the treated node: nothing to judge at this look
            estimates.append(math.nan)
            variances.append(math.inf)
            continue
        if wander:
            estimate, variance = gls_estimate(y[rows, cols], rows, step, treated, t[cols], noise, wander)
        else:
            estimate, c = fixed_effects_estimate(y[rows, cols], rows, step, treated)
            variance = noise**2 * c
        estimates.append(estimate)
        variances.append(variance)
    return np.array(estimates), np.array(variances)


def one_sided_mixture_log(estimate: np.ndarray, variance: np.ndarray, null: float, rho: float) -> np.ndarray:
    """log of the one-sided normal-mixture likelihood ratio against `null`, mixing over effects below it
    (a half-normal of variance rho): 2 / sqrt(rho A) exp(S^2 / (2A)) Phi(-S / sqrt(A)), S = (estimate -
    null) / v, A = 1 / v + 1 / rho."""
    score, a = (estimate - null) / variance, 1 / variance + 1 / rho
    return math.log(2) - 0.5 * np.log(rho * a) + score**2 / (2 * a) + stats.norm.logcdf(-score / np.sqrt(a))


def sprt_log(estimate: np.ndarray, variance: np.ndarray, null: float, effect: float) -> np.ndarray:
    """log of Wald's likelihood ratio of the true effect against `null`, given the estimate."""
    gap = effect - null
    return (gap * (estimate - null) - gap**2 / 2) / variance


def ours_rule(estimate: np.ndarray, variance: np.ndarray) -> bool:
    """Ours' fail rule on these estimates and variances: the discrete mixture interval (analysis/sequential.py)
    below theta / 2 and the estimate below theta, at `consecutiveFailures` looks in a row."""
    mixture = analysis._mixture(THETA, bench.OURS)
    bound = math.log(1 / ALPHA)
    streak = 0
    for d, v in zip(estimate, variance):
        below = d < THETA and analysis.mixture_log_ratio(NULLS["null_at_half_tolerance"] - d, v, mixture) >= bound
        streak = streak + 1 if below else 0
        if streak >= bench.OURS_CONSECUTIVE:
            return True
    return False


def oracle_one(s: bench.Scenario, looks: int = LOOKS) -> dict:
    """Every oracle's verdict on one run, and ours' (its rollback within the looks)."""
    sim = bench.simulate(s, guard=s.harmless)  # bench/judge.py's very series: harmless ones are drawn with guard mode
    with np.errstate(invalid="ignore"):  # a look without treated samples: nan, which no test rejects on
        return _verdicts(s, sim, *looks_of(sim, s.noise, looks), looks)


def _verdicts(s: bench.Scenario, sim: dict, estimate: np.ndarray, variance: np.ndarray, looks: int) -> dict:
    """The oracles' verdicts on one run's estimates and variances by look, and ours' on its series."""
    effect, bound, z = math.log(s.effect), math.log(1 / ALPHA), stats.norm.ppf(1 - ALPHA)
    out: dict = {}
    for name, null in NULLS.items():
        sd = math.sqrt(variance[-1])
        target = effect if effect < null else null + THETA  # harmless runs: tune to a tolerance-sized regression
        out[name] = {
            "fixed_horizon": bool((estimate[-1] - null) / sd < -z),
            "fixed_horizon_closed_form": float(stats.norm.cdf((null - effect) / sd - z)) if math.isfinite(sd) else 0.0,
            "sprt_at_true_effect": bool((sprt_log(estimate, variance, null, target) >= bound).any()),
            "one_sided_mixture_tuned": bool(
                (one_sided_mixture_log(estimate, variance, null, (target - null) ** 2) >= bound).any()
            ),
        }
    out["null_at_half_tolerance"]["ours_boundary_true_variance"] = ours_rule(estimate, variance)
    rollback = bench.ours(sim, looks)
    out["ours"] = rollback is not None and rollback <= looks
    out["sd_at_last_look"] = math.sqrt(variance[-1])
    return out


def summarize(todo: list[bench.Scenario], results: list[dict]) -> dict:
    cells: dict[str, list[dict]] = {}
    for s, r in zip(todo, results):
        cells.setdefault(s.key, []).append(r)
    out = {}
    for key, rs in cells.items():
        ours = float(np.mean([r["ours"] for r in rs]))
        row: dict = {
            "runs": len(rs),
            "ours_within_looks": ours,
            "oracle_sd_at_last_look_median": round(float(np.median([r["sd_at_last_look"] for r in rs])), 5),
        }
        for null in NULLS:
            power = {
                test: round(float(np.mean([r[null][test] for r in rs])), 4) for test in TESTS if test in rs[0][null]
            }
            power["anytime_best"] = max(power["sprt_at_true_effect"], power["one_sided_mixture_tuned"])
            fractions = {
                f"ours_over_{test}": (round(ours / p, 3) if p > 0 else None)
                for test, p in power.items()
                if test in ("fixed_horizon_closed_form", "anytime_best")
            }
            row[null] = {**power, **fractions}
        out[key] = row
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print JSON (the only output format)")
    parser.add_argument(
        "--runs", type=int, default=100, help="runs per scenario (bench/judge.py's seeds at the same --runs)"
    )
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--looks", type=int, default=LOOKS, help="looks (intervals after the warm-up) the power counts")
    parser.add_argument(
        "--families",
        nargs="+",
        choices=("iid", "ar1_wander"),
        default=["iid", "ar1_wander"],
        help="bench/judge.py's scenario families to judge (the ones whose noise model the oracle can know)",
    )
    parser.add_argument("--quick", action="store_true", help="a few runs, for tests")
    args = parser.parse_args()
    started = time.monotonic()
    runs = 4 if args.quick else args.runs
    todo = [s for s in bench.scenarios(runs) if s.family in args.families]
    with ProcessPoolExecutor(args.workers) as pool:
        results = list(pool.map(oracle_one, todo, [args.looks] * len(todo), chunksize=max(1, runs // 4)))
    report = {
        "by_scenario": summarize(todo, results),
        "setup": {
            "runs_per_scenario": runs,
            "looks": args.looks,
            "families": args.families,
            "alpha": ALPHA,
            "nulls": NULLS,
            "tolerance": bench.TOLERANCE,
            "controls": bench.CONTROLS,
            "baseline_samples": bench.BASELINE,
            "step_seconds": bench.STEP,
            "simulation": "SIMULATION (bench/judge_oracle.py docstring; bench/judge.py's series)",
        },
        "machine": f"{platform.machine()} cpus={os.cpu_count()} python={platform.python_version()}",
        "command": " ".join(["python", "bench/judge_oracle.py"] + sys.argv[1:]),
        "seconds": round(time.monotonic() - started, 1),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
