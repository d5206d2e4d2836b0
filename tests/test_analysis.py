"""The analysis judge (pure) and the Prometheus client against a real Prometheus."""

from __future__ import annotations

import asyncio
import math
import random

import pytest

from gluon_operator import analysis
from gluon_operator.analysis import JudgeConfig, decide, judge
from gluon_operator.promclient import PrometheusClient, PrometheusError
from tests.helpers import free_port

CFG = JudgeConfig(tolerance=0.05, confidence=0.95, min_samples=5)
ENABLE, WARMUP, WINDOW, BASELINE = 100.0, 10.0, 60.0, 100.0


def fleet(effect=1.0, noise=0.03, n_controls=5, drift=0.0, missing=0.0, seed=1, step=2.0, end=200.0, direction_lower=False):
    """Per-step samples: treated node (flag 1 from ENABLE on) and controls, sharing a load drift."""
    rng = random.Random(seed)
    times = [t * step for t in range(int(end / step))]
    load = {t: 1 + drift * math.sin(t / 30) for t in times}

    def series(factor_after):
        out = []
        for t in times:
            if rng.random() < missing:
                continue
            value = 30 * load[t] * (factor_after if t >= ENABLE else 1.0) * math.exp(rng.gauss(0, noise))
            out.append((t, 1 / value if direction_lower else value))
        return out

    return series(effect), [series(1.0) for _ in range(n_controls)]


def run(effect, **kw):
    cfg = kw.pop("cfg", CFG)
    treated, controls = fleet(effect, **kw)
    return judge(treated, controls, ENABLE, WARMUP, 200.0, WINDOW, BASELINE, cfg)


def test_speedup_passes_with_numbers():
    j = run(2.0)
    assert j.result == "pass" and 1.9 < j.effect < 2.1 and j.ci_low > 0.95 and j.n_post >= 25 and j.n_pre >= 25
    assert j.threshold == 0.95 and j.n_controls == 5 and "Yuen" in j.method
    assert j.to_dict()["effect"] == round(j.effect, 6)


def test_regression_fails_and_no_change_passes():
    j = run(0.85)
    assert j.result == "fail" and j.ci_high < 0.95 and 0.82 < j.effect < 0.88 and j.p_worse < 0.05
    assert run(1.0).result == "pass"


def test_small_regression_within_tolerance_is_not_a_failure():
    assert run(0.97).result in ("pass", "inconclusive")


def test_fail_needs_an_estimate_beyond_tolerance_and_significance():
    # 8% worse at 3% noise: beyond the 5% tolerance and clearly worse than half of it
    clear = run(0.92)
    assert clear.result == "fail" and clear.effect < 0.95 and clear.p_worse < 0.05
    # the same estimate drowned in 40% noise: not significant, so no rollback on it
    times = [t * 2.0 for t in range(100)]
    wobble = [(t, 30 * (0.92 if t >= ENABLE else 1.0) * math.exp((0.4 if t >= ENABLE else 0.01) * (-1) ** i))
              for i, t in enumerate(times)]
    noisy = judge(wobble, [[(t, 30.0) for t in times]], ENABLE, WARMUP, 200.0, WINDOW, BASELINE, CFG)
    assert noisy.result == "inconclusive" and noisy.effect < 0.95 and noisy.p_worse > 0.05, noisy.reason
    # significantly worse than unchanged, but the estimate is inside the tolerance: no rollback
    mild = run(0.965, noise=0.005)
    assert mild.result != "fail" and mild.effect > 0.95 and mild.p_worse < 0.05


def test_baseline_window_is_separate_from_the_judged_window():
    treated, controls = fleet(0.8)
    short = judge(treated, controls, ENABLE, WARMUP, 200.0, WINDOW, 20.0, CFG)
    long = judge(treated, controls, ENABLE, WARMUP, 200.0, WINDOW, 100.0, CFG)
    assert short.n_pre == 10 and long.n_pre == 50 and short.n_post == long.n_post == 30


def test_lower_is_better_metrics():
    cfg = JudgeConfig(direction="lower", tolerance=0.05, confidence=0.95, min_samples=5)
    assert run(0.85, direction_lower=True, cfg=cfg).result == "fail"  # latency went up ~18%
    assert run(2.0, direction_lower=True, cfg=cfg).result == "pass"


def test_common_load_drift_cancels():
    assert run(1.0, drift=0.3).result == "pass"


def test_no_data_and_no_control_are_inconclusive():
    treated, controls = fleet(0.5)
    assert judge([], controls, ENABLE, WARMUP, 200.0, WINDOW, BASELINE, CFG).result == "inconclusive"
    j = judge(treated, [], ENABLE, WARMUP, 200.0, WINDOW, BASELINE, CFG)
    assert j.result == "inconclusive" and "no control" in j.reason
    few = judge(treated[-3:], controls, ENABLE, WARMUP, 200.0, WINDOW, BASELINE, CFG)
    assert few.result == "inconclusive" and "3 samples" in few.reason


def test_too_little_traffic_is_inconclusive():
    cfg = JudgeConfig(min_traffic=1000.0)
    assert run(0.5, cfg=cfg).result == "inconclusive"


def test_no_pre_enable_baseline_falls_back_to_one_sample():
    treated, controls = fleet(0.8)
    j = judge([s for s in treated if s[0] >= ENABLE], controls, ENABLE, WARMUP, 200.0, WINDOW, BASELINE, CFG)
    assert j.result == "fail" and j.n_pre == 0 and "one-sample" in j.method


def test_heavy_tailed_outliers_do_not_decide():
    treated, controls = fleet(1.0, seed=3)
    spiky = [(t, v * (0.2 if i % 9 == 0 else 1.0)) for i, (t, v) in enumerate(treated)]
    assert judge(spiky, controls, ENABLE, WARMUP, 200.0, WINDOW, BASELINE, CFG).result != "fail"


@pytest.mark.parametrize("results,expected", [
    (["fail", "fail", "fail"], [None, None, "fail"]),
    (["fail", "inconclusive", "fail", "fail"], [None, None, None, None]),
    (["fail", "pass"], [None, "pass"]),
])
def test_consecutive_failures(results, expected):
    streak, since, got = 0, None, []
    for i, r in enumerate(results):
        d = decide(analysis.Judgement(r, r), streak, since, float(i), 3, "hold", 100)
        streak, since = d.streak, d.inconclusive_since
        got.append(d.verdict)
    assert got == expected


@pytest.mark.parametrize("on_no_data,verdict", [("hold", None), ("promote", "pass"), ("rollback", "fail")])
def test_on_no_data_after_deadline(on_no_data, verdict):
    first = decide(analysis.Judgement("inconclusive", "no data"), 0, None, 0.0, 3, on_no_data, 60)
    assert first.verdict is None and first.inconclusive_since == 0.0
    later = decide(analysis.Judgement("inconclusive", "no data"), 0, first.inconclusive_since, 61.0, 3, on_no_data, 60)
    assert later.verdict == verdict


def test_render_query():
    q = analysis.render(analysis.DEFAULT_QUERY, "serving", {"app.kubernetes.io/name": "sglang"}, 30)
    assert 'namespace="serving",app_kubernetes_io_name="sglang"' in q and "[30s]" in q and "{{" not in q


def test_series_by_node():
    result = [{"metric": {"node": "a"}, "values": [[1, "2.5"], [2, "3"]]}, {"metric": {}, "values": [[1, "9"]]},
              {"metric": {"node": "b"}, "value": [5, "1"]}]
    assert analysis.series_by_node(result) == {"a": [(1.0, 2.5), (2.0, 3.0)], "b": [(5.0, 1.0)]}


def test_prometheus_client_errors_quote_query_and_message(tmp_path):
    from tests.helpers import prometheus

    with prometheus({"self": []}) as prom:
        client = PrometheusClient(prom.url)
        assert asyncio.run(client.query("vector(1)"))[0]["value"][1] == "1"
        with pytest.raises(PrometheusError) as bad:
            asyncio.run(client.query("sum(rate(x[5m])"))
        assert "sum(rate(x[5m])" in str(bad.value) and bad.value.kind == "bad_data" and "parse error" in bad.value.message
    down = PrometheusClient(f"http://127.0.0.1:{free_port()}", retries=1, backoff=0.01)
    with pytest.raises(PrometheusError) as gone:
        asyncio.run(down.query_range("up", 0, 10, 1))
    assert gone.value.kind == "unreachable" and "'up'" in str(gone.value)
