"""The GPU self-test on a machine without a GPU: reference, portable kernel under Triton's interpreter,
aiter adapters against a fake aiter with the documented signatures, verdict logic, and crash isolation
of the per-device, per-path children."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from gluon_agent import isolation
from gluon_agent.selftest import cases, runner
from gluon_agent.selftest.backends import BACKEND_SETS, Call
from gluon_agent.selftest.problem import D_LATENT, D_QK, make_problem
from gluon_agent.selftest.reference import mla_decode_reference
from gluon_localcluster.fakes.stacks import AITER_STACK, child_env, fresh_fake_aiter

CAPABLE_PROBE = {"capable": True, "gpus": [], "torch_version": "t", "triton_version": "x"}


def reference_of(p):
    return mla_decode_reference(p.q, p.kv, p.kv_scale, p.kv_indptr, p.kv_indices, p.sm_scale)


def numpy_decode(p) -> np.ndarray:
    """Float64 re-computation, independent of torch's kernels."""
    q = p.q.float().numpy().astype(np.float64)
    kv = p.kv.float().numpy().astype(np.float64) * p.kv_scale
    bounds, idx = p.kv_indptr.numpy(), p.kv_indices.numpy()
    out = np.empty((p.batch, p.heads, D_LATENT))
    for b in range(p.batch):
        keys = kv[idx[bounds[b] : bounds[b + 1]]]
        scores = q[b] @ keys.T * p.sm_scale
        weights = np.exp(scores - scores.max(axis=1, keepdims=True))
        weights /= weights.sum(axis=1, keepdims=True)
        out[b] = weights @ keys[:, :D_LATENT]
    return out


def rel_l2(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.double() - ref.double()).norm() / ref.double().norm())


@pytest.mark.parametrize("lengths", [[1], [3, 1, 40], [129, 2]])
def test_reference_matches_float64_numpy(lengths):
    p = make_problem(lengths, heads=12)
    ref = reference_of(p).double().numpy()
    assert np.abs(ref - numpy_decode(p)).max() / np.abs(ref).max() < 1e-5


def test_problems_are_fresh_random_and_paged():
    a, b = make_problem([64, 64]), make_problem([64, 64])
    assert a.seed != b.seed and not torch.equal(a.q, b.q)
    assert a.kv.dtype == torch.float8_e4m3fn and a.q.dtype == torch.bfloat16
    assert a.kv_indptr.tolist() == [0, 64, 128] and a.kv_indices.dtype == torch.int32
    assert a.kv.shape[0] > 128  # a larger pool than the batch uses
    assert len(set(a.kv_indices.tolist())) == 128  # distinct tokens...
    assert a.kv_indices.tolist() != sorted(a.kv_indices.tolist())  # ...shuffled, as a server has them
    assert a.q.float().abs().sum() > 0 and a.kv.float().abs().sum() > 0  # never zeros
    with pytest.raises(ValueError, match="at least one KV token"):
        make_problem([4, 0])


@pytest.mark.parametrize("backend", ["triton-native", "triton-zero-pad-16"])
@pytest.mark.parametrize("lengths", [[1, 1], [15, 16, 17], [1, 5, 33, 100]])
def test_portable_kernel_interpreted(backend, lengths):
    p = make_problem(lengths)
    out = p.new_output(cases.POISON)
    chosen = next(b for b in BACKEND_SETS["triton"].values() if b.name == backend)
    chosen.run(p, out, Call(max_kv_len=max(lengths)))
    assert not (out.float() == cases.POISON).any()
    assert rel_l2(out, reference_of(p)) < 1e-2


@pytest.mark.parametrize("capacity", [1, 16, 4096])
def test_split_count_from_capacity_keeps_answers_right(capacity):
    """A graph captured with one capacity replays at other lengths: answers must not depend on it."""
    from gluon_agent.selftest.triton_mla import mla_decode

    p = make_problem([1, 90, 300])
    out = p.new_output(cases.POISON)
    mla_decode(p.q, p.kv, p.kv_scale, p.kv_indptr, p.kv_indices, p.sm_scale, out, capacity)
    assert rel_l2(out, reference_of(p)) < 1e-2


@pytest.mark.parametrize(
    "batch, max_kv_len, splits",
    [
        (1, 131072, 256),  # the length floor (512 tokens a split) binds before one wave (264)
        (4, 32768, 64),
        (32, 8192, 8),  # one wave: 256 programs of 264 resident, never 288 (a second wave of 24)
        (32, 65536, 8),
        (128, 8192, 2),
        (264, 8192, 1),
        (1000, 8192, 1),  # more sequences than resident programs: one split each
        (1, 1, 1),
        (8, 1023, 1),
    ],
)
def test_split_count_fills_one_wave_of_resident_programs(batch, max_kv_len, splits, monkeypatch):
    from gluon_agent.selftest import triton_mla

    monkeypatch.setattr(triton_mla, "multiprocessors", lambda device: 132)  # an H200
    assert triton_mla.split_count(batch, max_kv_len, torch.device("cpu"), triton_mla.DEFAULT_CONFIG) == splits
    assert batch * splits <= max(batch, triton_mla.DEFAULT_CONFIG.ctas_per_sm * 132)


@pytest.mark.parametrize(
    "rows, splits, tile",
    [
        (12, 256, (32, 256)),  # one 128K sequence: all its splits in one step
        (48, 64, (32, 64)),
        (12, 129, (32, 256)),
        (12, 128, (32, 64)),
        (263, 1, (32, 64)),
        (264, 8, (512, 16)),  # enough rows for two programs per SM: whole rows
        (1536, 2, (512, 16)),
    ],
)
def test_reduce_tile_by_rows_and_splits(rows, splits, tile, monkeypatch):
    from gluon_agent.selftest import triton_mla

    monkeypatch.setattr(triton_mla, "multiprocessors", lambda device: 132)  # an H200
    block_d, block_s = triton_mla.reduce_tile(rows, splits, torch.device("cpu"))
    assert (block_d, block_s) == tile and block_d * block_s <= triton_mla.REDUCE_TILE_ELEMENTS


def test_reduce_in_feature_slices_over_many_splits(monkeypatch):
    """The slice path (few rows) with 130 splits in one 256-split step, most of them empty."""
    from gluon_agent.selftest import triton_mla

    monkeypatch.setattr(triton_mla, "multiprocessors", lambda device: 65)
    config = triton_mla.KernelConfig(block_n=16, num_warps=1, num_stages=1, ctas_per_sm=2, min_tokens_per_split=4)
    p = make_problem([600])
    splits = triton_mla.split_count(p.batch, 600, p.q.device, config)
    assert splits == 130 and triton_mla.reduce_tile(p.batch * p.heads, splits, p.q.device) == (32, 256)
    out = p.new_output(cases.POISON)
    triton_mla.mla_decode(p.q, p.kv, p.kv_scale, p.kv_indptr, p.kv_indices, p.sm_scale, out, 600, config)
    assert rel_l2(out, reference_of(p)) < 1e-2


def test_reduce_over_more_splits_than_one_tile_with_empty_splits():
    """38 splits: the reduce walks three 16-split steps; the 1-token sequence leaves 37 of its splits empty."""
    from gluon_agent.selftest.triton_mla import KernelConfig, mla_decode, split_count

    # the CPU counts as 4 multiprocessors: 19 x 4 // 2 sequences = 38, under 600 // 15 = 40
    config = KernelConfig(block_n=16, num_warps=1, num_stages=1, ctas_per_sm=19, min_tokens_per_split=15)
    p = make_problem([1, 600])
    assert split_count(p.batch, 600, p.q.device, config) == 38
    out = p.new_output(cases.POISON)
    mla_decode(p.q, p.kv, p.kv_scale, p.kv_indptr, p.kv_indices, p.sm_scale, out, 600, config)
    assert not (out.float() == cases.POISON).any()
    assert rel_l2(out, reference_of(p)) < 1e-2


def test_portable_kernel_rejects_non_mla_shapes():
    from gluon_agent.selftest.triton_mla import mla_decode

    p = make_problem([4])
    with pytest.raises(ValueError, match="not MLA 576"):
        mla_decode(p.q[..., :512], p.kv, 1.0, p.kv_indptr, p.kv_indices, 0.1, p.new_output(), 4)
    for pad in (1, 2):  # rows read as 32-bit words: a stride of 577 or 578 bytes is refused
        unaligned_rows = torch.zeros(p.kv.shape[0], D_QK + pad, dtype=p.kv.dtype)[:, :D_QK]
        with pytest.raises(ValueError, match="multiples of 4"):
            mla_decode(p.q, unaligned_rows, 1.0, p.kv_indptr, p.kv_indices, 0.1, p.new_output(), 4)


@pytest.fixture
def fake_aiter(monkeypatch):
    return fresh_fake_aiter(monkeypatch)


@pytest.mark.parametrize("capturing", [False, True])
def test_aiter_gluon_adapter_calls_like_sglang(fake_aiter, capturing):
    p = make_problem([5, 130, 7])
    out = p.new_output(cases.POISON)
    BACKEND_SETS["aiter"]["accelerated"].run(p, out, Call(max_kv_len=4096 if capturing else 130, capturing=capturing))
    (call,) = fake_aiter
    assert call["kernel"] == "mla_gluon"
    assert call["q_nope"].shape == (3, 12, 512) and call["q_pe"].shape == (3, 12, 64)
    assert call["q_nope"].dtype == call["q_pe"].dtype == torch.bfloat16
    assert torch.equal(torch.cat([call["q_nope"], call["q_pe"]], -1), p.q)
    assert call["kv_c"].shape == (p.kv.shape[0], D_QK) and call["kv_c"].dtype == torch.float8_e4m3fn
    assert call["kv_c"].data_ptr() == p.kv.data_ptr()  # a view of the pool, not a copy
    assert call["o"] is out
    assert call["page_table"] is p.kv_indices and call["seq_info"] is p.kv_indptr
    assert call["use_2d_view"] is False and call["k_pe"] is None and call["kv_pe_offset"] == 512
    assert type(call["kv_scale"]) is float and call["kv_scale"] == p.kv_scale
    assert call["sm_scale"] == p.sm_scale and call["return_lse"] is False
    # SGLang's _resolve_mla_gluon_min_kv_seq_len: the context capacity under capture, else max(seq_lens)
    assert call["min_kv_seq_len"] == (4096 if capturing else 130)
    assert rel_l2(out, reference_of(p)) < 1e-2


# ---------------------------------------------------------------- verdicts (pure)


def case(**overrides):
    values = dict(case="c", backend="b", batch=1, kv_lens=[1], seconds=0.0, rel_l2=1e-3, cos_diff=1e-6)
    values.update(overrides)
    return cases.judge_case(cases.CaseResult(**values))


@pytest.mark.parametrize(
    "overrides,expected",
    [
        ({}, []),
        ({"unwritten": 3, "rel_l2": None, "cos_diff": None}, ["3 output elements never written"]),
        ({"nonfinite": 2, "rel_l2": None, "cos_diff": None}, ["2 NaN/Inf output elements"]),
        ({"rel_l2": 0.05}, ["relative L2 error 0.05 > 0.02"]),
        ({"rel_l2": float("nan")}, ["relative L2 error nan"]),
        ({"cos_diff": 0.2}, ["cosine difference 0.2 > 0.03"]),
    ],
)
def test_judge_case(overrides, expected):
    problems = case(**overrides).problems
    for text in expected:
        assert any(p.startswith(text) for p in problems), problems
    if not expected:
        assert problems == []


def graph(ratio_ms=(1.0, 1.0), rel=1e-3, vs_eager=1e-3):
    replays = [{"kv_len": n, "rel_l2": rel, "rel_vs_eager": vs_eager} for n in (32768, 8192, 1024)]
    return cases.judge_graph(cases.GraphResult("b", 4, 32768, replays, *ratio_ms))


def test_judge_graph_catches_frozen_splits_and_wrong_replays():
    assert graph().problems == []
    assert graph((0.129, 0.1)).problems == []  # 1.29x is within 1.3x
    frozen = graph((2.5, 0.05)).problems
    assert len(frozen) == 1 and "50.00x eager" in frozen[0] and "frozen" in frozen[0]
    assert len(graph(rel=0.5).problems) == 3
    assert len(graph(vs_eager=None).problems) == 3


def test_path_verdicts_and_worst():
    ok_child = {"cases": [{"case": "c", "problems": []}], "graph": []}
    bad_child = {"cases": [{"case": "c", "problems": ["relative L2 error 0.5 > 0.02"]}], "graph": []}
    assert cases.path_verdict(ok_child, None) == ("pass", [])
    assert cases.path_verdict(bad_child, None) == ("fail", ["c: relative L2 error 0.5 > 0.02"])
    assert cases.path_verdict(None, "child killed by SIGABRT") == ("error", ["child killed by SIGABRT"])
    assert cases.path_verdict({"deferred": "cuda:0: 1.0 GiB free"}, None) == ("deferred", ["cuda:0: 1.0 GiB free"])
    assert cases.worst(["pass", "deferred", "fail"]) == "fail"
    assert cases.worst(["pass", "error", "fail"]) == "error"
    assert cases.worst(["pass", "pass"]) == "pass"
    assert cases.worst([]) == "pending"


def test_speed_gate():
    assert cases.speed_gate("aiter", {"a": 1.9, "b": 2.7}) is None
    assert "not faster" in cases.speed_gate("aiter", {"a": 0.8, "b": 0.9})
    assert cases.speed_gate("triton", {"a": 0.5}) is None  # the portable kernel's modes are not gated
    assert cases.speedups([{"case": "x", "ms": 1.0}], [{"case": "x", "ms": 2.5}]) == {"x": 2.5}


def test_deferral_when_gpu_memory_is_short(monkeypatch):
    from gluon_agent.selftest import worker

    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (1 * 2**30, 80 * 2**30))
    reason = worker.prepare_device(torch.device("cuda:0"), cases.MEMORY_LIMIT_BYTES)
    assert reason == "cuda:0: 1.0 GiB free of 80.0 GiB, the self-test needs 4.0 GiB"
    assert worker.run({"device": "cuda:0", "backend_set": "triton", "path": "accelerated", "seed": 1}) == {
        "deferred": reason
    }


# ---------------------------------------------------------------- children, isolation, CLI


def test_backend_choice():
    assert runner.choose_backend_set({"capable": True}, None) == "aiter"
    assert runner.choose_backend_set({"capable": False}, "auto") == "triton"
    assert runner.choose_backend_set({"capable": True}, "triton") == "triton"


def test_crash_hang_and_garbage_are_reported_per_device_and_path(clean_env):
    env = child_env(clean_env, AITER_STACK)
    env["FAKE_AITER_MODE"] = "1:abort:mla_gluon,2:hang:mla_decode_fwd,3:garbage:mla_gluon"
    report = runner.run_selftest(
        dict(CAPABLE_PROBE, sglang={"version": "0.5.20", "flag0_route": "persistent", "mtp_through_gluon": True}),
        cpu_interpret=True,
        cpu_devices=4,
        timeout=40,
        env=env,
        seed=5,
    )
    gpus = report["gpus"]
    assert report["backend_set"] == "aiter"
    assert [g["result"] for g in gpus] == [
        {"accelerated": "pass", "fallback": "pass"},
        {"accelerated": "error", "fallback": "pass"},
        {"accelerated": "pass", "fallback": "error"},
        {"accelerated": "fail", "fallback": "pass"},
    ]
    abort = gpus[1]["paths"]["accelerated"]["reasons"][0]
    assert abort.startswith("child killed by SIGABRT during case single-token (aiter-gluon)")
    hang = gpus[2]["paths"]["fallback"]["reasons"][0]
    assert hang.startswith("child timed out after 40 s (killed) during case single-token (aiter-zero-pad)")
    garbage = gpus[3]["paths"]["accelerated"]["reasons"]
    all_cases = cases.CPU_CASES + cases.mtp_cases(cases.MTP_Q_LENS, on_gpu=False)
    assert {r.split(":")[0] for r in garbage if "relative L2 error" in r} == {c.name for c in all_cases}
    # the serving SGLang has PR #37601: both paths run the MTP cases
    assert [c["case"] for c in gpus[0]["paths"]["fallback"]["child"]["cases"]] == [c.name for c in all_cases]
    assert report["result"] == "error"
    assert report["thresholds"]["rel_l2_max"] == cases.REL_L2_MAX


def run_cli(*args, env):
    return subprocess.run(
        [sys.executable, "-m", "gluon_agent", *args], capture_output=True, text=True, env=env, timeout=300
    )


def test_cli_cpu_interpret_json(clean_env):
    done = run_cli("selftest", "--cpu-interpret", "--json", "--mtp-q-lens", "3", env=child_env(clean_env))
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["mode"] == "cpu-interpret" and report["result"] == "pass"
    assert report["backends"] == {"accelerated": "triton-native", "fallback": "triton-zero-pad-16"}
    (gpu,) = report["gpus"]
    ran = gpu["paths"]["accelerated"]["child"]["cases"]
    assert [c["case"] for c in ran] == [c.name for c in cases.CPU_CASES] + ["mtp-q3"]
    assert ran[-1]["q_len"] == 3
    assert all(c["rel_l2"] < cases.REL_L2_MAX for c in ran)
    assert len(report["fingerprint"]) == 16 and report["fingerprint_parts"]["kernel"]


def test_cli_reports_failure_exit_code(clean_env):
    env = dict(child_env(clean_env, AITER_STACK), FAKE_AITER_MODE="*:garbage:mla_decode_fwd")
    done = run_cli("selftest", "--cpu-interpret", "--backends", "aiter", "--mtp-q-lens", "", env=env)
    assert done.returncode == 1
    assert "self-test FAIL" in done.stdout and "fallback=fail" in done.stdout


def test_no_gpu_is_an_error_not_a_pass():
    report = runner.run_selftest({"capable": False, "gpus": []})
    assert report["result"] == "error" and report["problems"] == ["no GPU visible: nothing to test"]


def test_daemon_side_never_imports_torch():
    code = "import sys, gluon_agent.selftest.runner, gluon_agent.probe, gluon_agent.cli; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ))
    assert done.stdout.strip() == "False", done.stderr


# ---------------------------------------------------------------- children started before the probe ends


def slow_probe(seconds: float, report: dict):
    def probe():
        time.sleep(seconds)
        return report

    return probe


def test_children_import_while_the_probe_runs(clean_env):
    """The probe as a callable: the children exist (importing) while it runs; results are unchanged."""
    report = runner.run_selftest(
        slow_probe(4.0, {"capable": False, "gpus": []}),
        cpu_interpret=True,
        env=child_env(clean_env),
        seed=3,
        mtp_q_lens=(),
    )
    (gpu,) = report["gpus"]
    assert report["result"] == "pass" and gpu["result"] == {"accelerated": "pass", "fallback": "pass"}
    assert gpu["paths"]["accelerated"]["child_seconds"] > 4.0  # started before the probe's 4 s were over
    assert gpu["paths"]["accelerated"]["child"]["import_seconds"] < gpu["paths"]["accelerated"]["child_seconds"]


def test_a_wrong_device_guess_cancels_the_early_children(clean_env, monkeypatch):
    monkeypatch.setattr(runner, "guess_devices", lambda cpu_interpret, cpu_devices: ["cpu", "cpu", "cpu"])
    report = runner.run_selftest(
        slow_probe(0.5, {"capable": False, "gpus": []}),
        cpu_interpret=True,
        env=child_env(clean_env),
        seed=4,
        mtp_q_lens=(),
    )
    assert len(report["gpus"]) == 1 and report["result"] == "pass"
    assert not isolation._live_groups  # no child left behind


def test_a_probe_that_raises_leaves_no_child(clean_env):
    def broken():
        time.sleep(0.5)
        raise RuntimeError("probe broke")

    with pytest.raises(RuntimeError, match="probe broke"):
        runner.run_selftest(broken, cpu_interpret=True, env=clean_env)
    assert not isolation._live_groups


def test_cancelled_child_is_killed_before_its_input():
    started = time.monotonic()
    outcome = isolation.run_isolated(
        [sys.executable, "-c", "import sys, time; sys.stdin.readline(); time.sleep(60)"],
        timeout=5,
        stdin_text=lambda: None,
    )
    assert outcome.status == "cancelled" and time.monotonic() - started < 5 and not isolation._live_groups


def test_guessed_devices_follow_the_visible_devices_variable(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert runner.guess_devices(False, 1) == ["cuda:0", "cuda:1"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert runner.guess_devices(False, 1) == []
    assert runner.guess_devices(True, 2) == ["cpu", "cpu"]


def test_capture_guard_does_not_import_dynamo_and_still_names_an_allocation():
    """torch wraps a dispatch mode's handler in torch._disable_dynamo unless the mode opts out; its first
    call then imports torch._dynamo (4-5 s of the H200 self-test's graph step). The guard opts out and
    still records what it is there for."""
    code = (
        "import sys, torch\n"
        "from gluon_agent.selftest.capture_guard import CaptureGuard\n"
        "x = torch.ones(4)\n"
        "guard = CaptureGuard()\n"
        "with guard:\n"
        "    y = x + 1\n"
        "print('torch._dynamo' in sys.modules, len(guard.violations), guard.violations[0].split(' at ')[0])\n"
    )
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(runner_source()), os.environ.get("PYTHONPATH", "")]))
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "1", "allocation", "aten.add.Tensor"]


def runner_source():
    from pathlib import Path

    return Path(runner.__file__).resolve().parents[2]


@pytest.mark.parametrize("ms, replays", [(0.0, 25), (0.05, 25), (4.0, 25), (8.0, 12), (11.0, 9), (50.0, 9)])
def test_timed_runs_are_fewer_only_where_each_is_long(ms, replays):
    from gluon_agent.selftest import timing

    assert timing.replays_for(ms) == replays


def test_a_cpu_child_has_nothing_to_prewarm():
    from gluon_agent.selftest import worker

    assert worker.prewarm("cpu") is None


def test_a_worker_on_the_aiter_paths_does_not_import_triton():
    """Triton is the portable kernel's; a child running aiter's paths imports it only if it is that
    path's backend (it was a few tenths of a second of each child's imports)."""
    code = "import sys, gluon_agent.selftest.worker\nprint('triton' in sys.modules)\n"
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(runner_source()), os.environ.get("PYTHONPATH", "")]))
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False"]
