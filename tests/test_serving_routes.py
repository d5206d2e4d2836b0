"""The serving configuration decides the routes, and the aiter stand-in refuses and accepts what aiter does
(ROCm/aiter e4048607; SGLang aiter_backend.py 003c5589, aiter_mla_gluon.py 2ee4570a, PRs #34432, #37438,
#37601, #40750)."""

from __future__ import annotations

import pytest
import torch

from gluon_agent.selftest.backends import BACKEND_SETS, Call, Serving
from gluon_agent.selftest.capture_guard import CaptureGuard
from gluon_agent.selftest.problem import D_QK, make_problem
from gluon_agent.selftest.reference import mla_decode_reference
from gluon_common.sglang_routes import ABORTS, NO_GLUON, PERSISTENT, ServingConfig, flag_routes
from gluon_localcluster.fakes.stacks import fresh_fake_aiter

NEW = {"flag0_route": PERSISTENT, "mtp_through_gluon": True, "version": "0.5.20"}
NO_MTP = {"flag0_route": PERSISTENT, "mtp_through_gluon": False, "version": "0.5.19"}
OLD = {"flag0_route": ABORTS, "mtp_through_gluon": False, "version": "0.5.19rc0"}
PRE = {"flag0_route": NO_GLUON, "mtp_through_gluon": False, "version": "0.5.18"}


def kernels(routes, flag):
    return {q: (r["kernel"], r["persistent"], bool(r["aborts"])) for q, r in routes[flag].items()}


# (SGLang, config) -> flag 1 and flag 0 routes per q_len: (kernel, persistent, known to abort)
@pytest.mark.parametrize(
    "sglang, config, flag1, flag0",
    [
        (NEW, ServingConfig(), {"1": ("mla_gluon", False, False)}, {"1": ("mla_decode_fwd", True, False)}),
        (
            NEW,
            ServingConfig(verify_q_lens=(4,)),
            {"1": ("mla_gluon", False, False), "4": ("mla_gluon", False, False)},
            {"1": ("mla_decode_fwd", True, False), "4": ("mla_decode_fwd", True, False)},
        ),
        # DSpark block 7 verifies q_len 8: no flag-0 kernel pads that far
        (
            NEW,
            ServingConfig(verify_q_lens=(8,)),
            {"1": ("mla_gluon", False, False), "8": ("mla_gluon", False, False)},
            {"1": ("mla_decode_fwd", True, False), "8": ("mla_decode_fwd", True, True)},
        ),
        # without #37601 flag 1 turns persistent off and verify runs non-persistent mla_decode_fwd: aborts
        (
            NO_MTP,
            ServingConfig(verify_q_lens=(2,)),
            {"1": ("mla_gluon", False, False), "2": ("mla_decode_fwd", False, True)},
            {"1": ("mla_decode_fwd", True, False), "2": ("mla_decode_fwd", True, False)},
        ),
        # #34647 without #37438: flag 0 is non-persistent: aborts
        (OLD, ServingConfig(), {"1": ("mla_gluon", False, False)}, {"1": ("mla_decode_fwd", False, True)}),
        (NEW, ServingConfig(persist=False), {"1": ("mla_gluon", False, False)}, {"1": ("mla_decode_fwd", False, True)}),
        # DCP: decode always uses Gluon; flag 0 is refused by SGLang itself
        (NEW, ServingConfig(dcp_size=2), {"1": ("mla_gluon", False, False)}, {"1": ("refused", False, True)}),
        (
            NEW,
            ServingConfig(dcp_size=2, dcp_decode_backend="asm"),
            {"1": ("mla_decode_fwd", True, False)},
            {"1": ("mla_decode_fwd", True, False)},
        ),
        # before #34647 the flag does nothing
        (PRE, ServingConfig(), {"1": ("mla_decode_fwd", True, False)}, {"1": ("mla_decode_fwd", True, False)}),
        (None, ServingConfig(page_size=64), {"1": ("mla_gluon", False, False)}, {"1": ("mla_decode_fwd", True, False)}),
    ],
)
def test_route_table(sglang, config, flag1, flag0):
    routes = flag_routes(sglang, config)
    assert kernels(routes, "1") == flag1 and kernels(routes, "0") == flag0
    assert all(r["evidence"] for flag in routes.values() for r in flag.values())


def test_route_evidence_names_the_pull_requests():
    assert "#37601" in flag_routes(NO_MTP, ServingConfig(verify_q_lens=(2,)))["1"]["2"]["evidence"]
    assert "v0.5.19 by PR #37856" in flag_routes(OLD, ServingConfig())["0"]["1"]["evidence"]
    assert "#34432" in flag_routes(NEW, ServingConfig(dcp_size=4))["0"]["1"]["evidence"]
    assert "current upstream" in flag_routes(None, ServingConfig())["0"]["1"]["evidence"]
    asm = flag_routes(NEW, ServingConfig(dcp_size=8, dcp_decode_backend="asm", verify_q_lens=(4,)))
    assert (
        "q quantized to fp8 over the 96 gathered heads" in asm["0"]["1"]["evidence"]
        and "in its place" in asm["1"]["1"]["evidence"]
    )
    assert asm["0"]["4"]["refusal"]  # #40750 is decode only: target verify under DCP stays on Gluon, flag 0 has none


def test_serving_config_round_trip_and_digest():
    config = ServingConfig(verify_q_lens=(8,), dcp_size=2, page_size=64, dp_attention=True)
    assert ServingConfig.from_dict(config.as_dict()) == config
    assert config.digest != ServingConfig().digest and len(config.digest) == 16
    assert config.q_lens == (1, 8)


@pytest.mark.parametrize(
    "data, message",
    [
        ({"verifyQLens": [1]}, "verifyQLens: at most 8 integers from 2 to 16"),
        ({"verifyQLens": "8"}, "verifyQLens"),
        ({"dcpSize": 0}, "dcpSize: must be an integer from 1 to 64"),
        ({"dcpDecodeBackend": "flash"}, "dcpDecodeBackend: must be 'gluon' or 'asm'"),
        ({"pageSize": 48}, "pageSize: must be a power of 2"),
        ({"persist": "yes"}, "persist: must be true or false"),
        ({"draftTokens": 4}, "unknown field"),
        ([], "must be an object"),
    ],
)
def test_serving_config_refuses(data, message):
    with pytest.raises(ValueError, match=message):
        ServingConfig.from_dict(data, "spec.serving")


# ---------------------------------------------------------------- the stand-in: refusals and acceptances


@pytest.fixture
def fake_aiter(monkeypatch):
    return fresh_fake_aiter(monkeypatch)


def metadata(p, heads=16, **overrides):
    from aiter import get_mla_metadata_info_v1, get_mla_metadata_v1

    sizes = get_mla_metadata_info_v1(
        p.batch, p.q_len, 16, p.kv.dtype, p.kv.dtype, False, fast_mode=False, num_kv_splits=64, intra_batch_mode=True
    )
    buffers = [torch.empty(size, dtype=dtype) for size, dtype in sizes]
    qo = torch.arange(p.batch + 1, dtype=torch.int32) * p.q_len
    args = dict(
        kv_granularity=16,
        max_seqlen_qo=p.q_len,
        uni_seqlen_qo=p.q_len,
        fast_mode=False,
        max_split_per_batch=64,
        intra_batch_mode=True,
    )
    args.update(overrides)
    truncate = args.pop("truncate_partial_map", False)
    if truncate:
        buffers[5] = buffers[5][:1]
    get_mla_metadata_v1(
        qo,
        p.kv_indptr,
        torch.ones(p.batch, dtype=torch.int32),
        heads,
        1,
        False,
        buffers[0],
        buffers[2],
        buffers[1],
        buffers[3],
        buffers[4],
        buffers[5],
        **args,
    )
    return buffers


@pytest.mark.parametrize(
    "heads, overrides, message",
    [
        (12, {}, "only supports #heads in \\[16, 128\\]"),  # v1_0_device.cuh's head check
        (16, {"max_split_per_batch": -1}, "max_split_per_batch must be >= 1"),
        (16, {"uni_seqlen_qo": -1}, "uni_seqlen_qo must be >= 1"),
        (16, {"kv_granularity": 24}, "kv_granularity must be a power of 2"),
        (16, {"truncate_partial_map": True}, "reduce_partial_map holds 1 entries"),
    ],
)
def test_metadata_refuses_what_aiter_refuses(fake_aiter, heads, overrides, message):
    with pytest.raises(RuntimeError, match=message):
        metadata(make_problem([300, 500]), heads, **overrides)


def fallback_call(p, **overrides):
    from aiter.mla import mla_decode_fwd

    meta = metadata(p)
    q16 = torch.zeros(p.batch * p.q_len, 16, D_QK, dtype=torch.bfloat16)
    q16[:, :12] = p.q
    o = torch.empty(p.batch * p.q_len, 16, 512, dtype=torch.bfloat16)
    args = dict(
        work_meta_data=meta[0],
        work_indptr=meta[1],
        work_info_set=meta[2],
        reduce_indptr=meta[3],
        reduce_final_map=meta[4],
        reduce_partial_map=meta[5],
        sm_scale=p.sm_scale,
        q_scale=torch.tensor([p.kv_scale]),
        kv_scale=torch.tensor([p.kv_scale]),
        num_kv_splits=64,
    )
    indices = overrides.pop("kv_indices", p.kv_indices)
    args.update(overrides)
    mla_decode_fwd(
        q16,
        p.kv.view(-1, 1, 1, D_QK),
        o,
        torch.arange(p.batch + 1, dtype=torch.int32) * p.q_len,
        p.kv_indptr,
        indices,
        torch.ones(p.batch, dtype=torch.int32),
        p.q_len,
        **args,
    )
    ref = mla_decode_reference(p.q, p.kv, p.kv_scale, p.kv_indptr, p.kv_indices, p.sm_scale, p.q_len)
    return float((o[:, :12].double() - ref.double()).norm() / ref.double().norm())


def test_split_metadata_is_read_back(fake_aiter):
    """Long sequences split (v1_0: kv_len // 196 splits), merged through the reduce maps: right answers."""
    from aiter.ops.attention import ZERO_SPLIT_BATCHES

    assert fallback_call(make_problem([900, 2000, 17])) < 1e-2
    assert ZERO_SPLIT_BATCHES == [17]  # the one under 196: v1_0 computes 0 splits there


@pytest.mark.parametrize(
    "overrides",
    [
        lambda p: {"kv_indices": p.kv_indices.long()},  # raw int32 pointer reads the int64 halves
        lambda p: {"kv_scale": torch.tensor([p.kv_scale], dtype=torch.bfloat16)},  # read as float32 bits
    ],
)
def test_raw_pointer_misreads_give_wrong_answers(fake_aiter, overrides):
    p = make_problem([300, 500])
    assert not fallback_call(p, **overrides(p)) < 1e-2


def test_persistent_fp8_with_8_heads_at_q_len_4_runs(fake_aiter):
    from aiter.mla import kernel_for

    assert kernel_for("fp8", "fp8", 8, 1, True, 4, True, False)[1] == 8  # row fp8,fp8,8,1,4
    assert kernel_for("fp8", "fp8", 32, 1, True, 1, True, False)[1] == 32  # native on gfx950, not folded
    assert kernel_for("bf16", "fp8", 48, 1, True, 1, True, False)[1] == 16  # folded onto 16
    with pytest.raises(AssertionError, match="nhead=12"):
        kernel_for("bf16", "fp8", 12, 1, True, 1, True, False)


def test_non_uniform_q_rows_are_served(fake_aiter):
    """mla_decode_fwd reads qo_indptr: sequences with different q lengths (the non-persistent path here)."""
    from aiter._compute import Works, finish, sequences, work_partials

    p = make_problem([40, 60], q_len=2)
    works = Works(torch.tensor([0, 1]), torch.tensor([0, 2]), torch.tensor([2, 2]), p.kv_indptr[:-1], p.kv_indptr[1:])
    out = p.new_output()
    finish(
        work_partials(p.q, p.kv, p.kv_indices, sequences(p.kv_indptr), p.kv_scale, p.sm_scale, 2, works),
        out,
        12,
        2,
        works.qo_start,
    )
    ref = mla_decode_reference(p.q, p.kv, p.kv_scale, p.kv_indptr, p.kv_indices, p.sm_scale, 2)
    assert float((out.double() - ref.double()).norm() / ref.double().norm()) < 1e-2


def test_mla_gluon_takes_an_int_scale_and_the_2d_view(fake_aiter):
    from aiter.ops.triton.gluon.mla_gluon import mla_gluon

    p = make_problem([20, 20])
    q_nope, q_pe = torch.split(p.q, [512, 64], -1)
    o = p.new_output()
    mla_gluon(
        q_nope,
        q_pe,
        p.kv,
        o,
        p.kv_indices.view(2, 20),
        torch.tensor([20, 20], dtype=torch.int32),
        p.sm_scale,
        use_2d_view=True,
        kv_scale=1,
    )
    ref = mla_decode_reference(p.q, p.kv, 1.0, p.kv_indptr, p.kv_indices, p.sm_scale)
    assert float((o.double() - ref.double()).norm() / ref.double().norm()) < 1e-2
    with pytest.raises(AssertionError, match="kv_scale is a Python number"):
        mla_gluon(
            q_nope,
            q_pe,
            p.kv,
            o,
            p.kv_indices,
            p.kv_indptr,
            p.sm_scale,
            use_2d_view=False,
            kv_scale=torch.tensor([1.0]),
        )


def test_dp_attention_recomputes_the_split_cap(fake_aiter):
    p = make_problem([300] * 8)
    BACKEND_SETS["aiter"]["fallback"].run(p, p.new_output(), Call(max_kv_len=300), Serving(dp_attention=True))
    assert fake_aiter[0]["max_split_per_batch"] == 32  # min(ceil(256 CUs / 8), 64)
    fake_aiter.clear()
    BACKEND_SETS["aiter"]["fallback"].run(p, p.new_output(), Call(max_kv_len=300), Serving(page_size=64))
    assert fake_aiter[0]["kv_granularity"] == 64 and fake_aiter[0]["max_split_per_batch"] == 64


def test_refused_route_raises_sglangs_message(fake_aiter):
    route = flag_routes(NEW, ServingConfig(dcp_size=2))["0"]["1"]
    with pytest.raises(RuntimeError, match="AITER Gluon MLA is required for DCP"):
        BACKEND_SETS["aiter"]["fallback"].run(
            make_problem([9]), make_problem([9]).new_output(), Call(max_kv_len=9), Serving(route=route)
        )


def test_capture_guard_names_our_allocations_and_host_copies_not_aiters(fake_aiter):
    """The guard's rules on the CPU (the real capture runs in bench/capture_check.py on a GPU)."""
    p = make_problem([40])
    bound = BACKEND_SETS["aiter"]["fallback"].bind(p, Call(max_kv_len=40, capturing=True), Serving())
    bound.refresh()
    out = p.new_output()
    with CaptureGuard() as guard:
        bound.launch(out)  # aiter's wrapper allocates; ours does not
    assert guard.violations == []
    with CaptureGuard() as guard:
        torch.empty(3)
    assert guard.violations and guard.violations[0].startswith("allocation aten.empty")
