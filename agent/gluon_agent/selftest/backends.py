"""Kernel backends behind one interface, each called exactly as its production caller calls it.

aiter-gluon     the accelerated path: SGLang's mla_gluon call (aiter_mla_gluon.py, PR #34647)
aiter-zero-pad  the rollback path: q zero-padded to 16 heads, aiter.mla.mla_decode_fwd in persistent mode
                with SGLang's work metadata (PR #37438), output sliced
triton-native   our portable kernel, 12 heads masked in a 16-row tile (stands in for the accelerated path
                where aiter cannot run: any GPU but gfx950)
triton-zero-pad-16  our portable kernel on q zero-padded to 16 heads (stands in for the rollback path)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from . import triton_mla
from .problem import D_LATENT, D_QK, D_ROPE, Problem

ACCELERATED = "accelerated"
FALLBACK = "fallback"
PATHS = (ACCELERATED, FALLBACK)
AITER_HEAD_TILE = 16  # mla_decode_fwd's qh16 kernel


@dataclass(frozen=True)
class Call:
    """How one invocation is made: `capturing` as SGLang knows it, `max_kv_len` the graph's capacity.
    `metadata_per_call`: the fallback's work metadata is built inside the call (so a graph replayed at
    new lengths rebuilds it); False builds it once per problem, as SGLang does once per forward step for
    all of a model's layers, so timing measures the kernel that serves."""

    max_kv_len: int
    capturing: bool = False
    metadata_per_call: bool = True


Runner = Callable[[Problem, torch.Tensor, Call], None]


@dataclass(frozen=True)
class Backend:
    name: str
    path: str
    run: Runner


# SGLang's calls are copied from sgl-project/sglang at 003c5589f7d3eca71d5d42127e611ee834162b91 (after
# PR #37438): python/sglang/srt/layers/attention/aiter_backend.py (AiterAttnBackend: __init__'s persistent
# switches, make_mla_decode_meta_data_buffer, make_mla_meta_data, _forward_mla_decode,
# _mla_decode_fwd_with_head_pad, _resolve_mla_gluon_min_kv_seq_len) and, for q_len > 1 (PR #37601), at
# 2ee4570a5f1414e6980ea3eeeaf05cc5a8a0b0d0: python/sglang/srt/layers/attention/aiter_mla_gluon.py
# (mla_gluon_decode). aiter's side: ROCm/aiter at e4048607a535ace3a2b51ded31b1c8c2d45c0879.

# aiter_backend.py module level and __init__: SGLANG_AITER_MLA_PERSIST defaults on; for 12 heads (padded
# to 16, so not 32/64/128) fast_mode stays False and intra_batch_mode True ("fake non-ps"); persistent
# stays on for the zero-pad fp8 case unless Gluon is selected (#37438); splits per batch 64 without
# speculative decoding, 32 with it.
SGLANG_FAST_MODE = False
SGLANG_INTRA_BATCH_MODE = True
SGLANG_MAX_SPLIT_PER_BATCH = {False: 64, True: 32}  # keyed by "speculative decoding on"


def min_kv_seq_len_for(p: Problem, call: Call) -> int:
    """SGLang's _resolve_mla_gluon_min_kv_seq_len: max_context_len while a graph is being captured (the
    captured kernel must serve any length up to it), else the batch's longest sequence. Here the graph's
    capacity (call.max_kv_len) stands for the served model's context length."""
    return call.max_kv_len if call.capturing else max(p.lengths)


def run_aiter_gluon(p: Problem, out: torch.Tensor, call: Call) -> None:
    from aiter.ops.triton.gluon.mla_gluon import mla_gluon

    # aiter_mla_gluon.py mla_gluon_decode: split the fused q; with qlen > 1 (#37601) q and o are 4-D
    # [batch, qlen, heads, dim] views (splitting the leading dim keeps them views of the split).
    q_nope, q_pe = torch.split(p.q, [D_LATENT, D_ROPE], dim=-1)
    o = out
    if p.q_len > 1:
        q_nope = q_nope.view(p.batch, p.q_len, p.heads, D_LATENT)
        q_pe = q_pe.view(p.batch, p.q_len, p.heads, D_ROPE)
        o = out.view(p.batch, p.q_len, p.heads, D_LATENT)
    mla_gluon(
        q_nope,
        q_pe,
        p.kv.view(-1, D_QK),
        o,
        p.kv_indices,
        p.kv_indptr,
        p.sm_scale,
        k_pe=None,
        kv_pe_offset=D_LATENT,
        use_2d_view=False,
        kv_scale=float(p.kv_scale),  # _resolve_fp8_kv_scale_float: the layer's k scale as a Python float
        min_kv_seq_len=min_kv_seq_len_for(p, call),
    )


def work_metadata(p: Problem, qo_indptr: torch.Tensor, kv_last_page_lens: torch.Tensor) -> dict[str, torch.Tensor]:
    """The persistent kernel's work buffers, sized and filled as SGLang does for one batch."""
    from aiter import get_mla_metadata_info_v1, get_mla_metadata_v1

    device = p.q.device
    splits = SGLANG_MAX_SPLIT_PER_BATCH[p.q_len > 1]
    # make_mla_decode_meta_data_buffer: both dtypes are the KV cache's, even for a bf16 q
    sizes = get_mla_metadata_info_v1(
        p.batch,
        p.q_len,
        AITER_HEAD_TILE,
        p.kv.dtype,
        p.kv.dtype,
        is_sparse=False,
        fast_mode=SGLANG_FAST_MODE,
        num_kv_splits=splits,
        intra_batch_mode=SGLANG_INTRA_BATCH_MODE,
    )
    names = ("work_meta_data", "work_indptr", "work_info_set", "reduce_indptr", "reduce_final_map", "reduce_partial_map")
    meta = {n: torch.empty(size, dtype=dtype, device=device) for n, (size, dtype) in zip(names, sizes)}
    # make_mla_meta_data (nhead_kv 1, page size 1, not causal for the scheduler)
    get_mla_metadata_v1(
        qo_indptr,
        p.kv_indptr,
        kv_last_page_lens,
        AITER_HEAD_TILE,
        1,
        False,
        meta["work_meta_data"],
        meta["work_info_set"],
        meta["work_indptr"],
        meta["reduce_indptr"],
        meta["reduce_final_map"],
        meta["reduce_partial_map"],
        kv_granularity=16,  # max(page_size, 16)
        max_seqlen_qo=p.q_len,
        uni_seqlen_qo=p.q_len,
        fast_mode=SGLANG_FAST_MODE,
        max_split_per_batch=splits,
        intra_batch_mode=SGLANG_INTRA_BATCH_MODE,
        dtype_q=p.kv.dtype,
        dtype_kv=p.kv.dtype,
    )
    return meta | {"num_kv_splits": splits}


_REUSED: dict[int, tuple[Problem, dict[str, torch.Tensor]]] = {}
REUSED_MAX = 16


def reused_metadata(p: Problem, qo_indptr: torch.Tensor, kv_last_page_lens: torch.Tensor) -> dict[str, torch.Tensor]:
    """The work metadata built the first time this problem ran (kept alive with it, at most REUSED_MAX)."""
    held = _REUSED.get(id(p))
    if held is None or held[0] is not p:
        if len(_REUSED) >= REUSED_MAX:
            _REUSED.clear()
        held = _REUSED[id(p)] = (p, work_metadata(p, qo_indptr, kv_last_page_lens))
    return held[1]


def run_aiter_zero_pad(p: Problem, out: torch.Tensor, call: Call) -> None:
    """SGLang's flag-0 route for 12 heads with fp8 KV: q zero-padded to 16, the persistent kernel with
    work metadata built for this batch, output sliced back. SGLang builds the metadata in
    init_forward_metadata, or before each graph replay into the captured buffers; here it is part of the
    call (for device tensors aiter builds it with a GPU kernel, csrc/kernels/mla/metadata/v1_2_device.cuh,
    so it is captured too), so a replay rebuilds it for the live kv_indptr."""
    from aiter.mla import mla_decode_fwd

    rows, heads, _ = p.q.shape
    device = p.q.device
    # init_forward_metadata: qo_indptr is the cumsum of the q lengths, page size 1
    qo_indptr = torch.arange(p.batch + 1, dtype=torch.int32, device=device) * p.q_len
    kv_last_page_lens = torch.ones(p.batch, dtype=torch.int32, device=device)
    meta = work_metadata(p, qo_indptr, kv_last_page_lens) if call.metadata_per_call else reused_metadata(p, qo_indptr, kv_last_page_lens)
    # _mla_decode_fwd_with_head_pad, head_pad_mode "zero"
    q16 = p.q.new_zeros(rows, AITER_HEAD_TILE, D_QK)
    q16[:, :heads] = p.q
    o16 = out.new_empty(rows, AITER_HEAD_TILE, D_LATENT)
    # the layer's k_descale: a float32 tensor, passed as both q_scale and kv_scale
    k_descale = torch.tensor([p.kv_scale], dtype=torch.float32, device=device)
    # _forward_mla_decode
    mla_decode_fwd(
        q16,
        p.kv.view(-1, 1, 1, D_QK),
        o16,
        qo_indptr=qo_indptr,
        kv_indptr=p.kv_indptr,
        kv_indices=p.kv_indices,
        kv_last_page_lens=kv_last_page_lens,
        max_seqlen_q=p.q_len,
        sm_scale=p.sm_scale,
        logit_cap=0.0,  # layer.logit_cap: MLA models have none
        work_meta_data=meta["work_meta_data"],
        work_indptr=meta["work_indptr"],
        work_info_set=meta["work_info_set"],
        reduce_indptr=meta["reduce_indptr"],
        reduce_final_map=meta["reduce_final_map"],
        reduce_partial_map=meta["reduce_partial_map"],
        q_scale=k_descale,
        kv_scale=k_descale,
        intra_batch_mode=SGLANG_INTRA_BATCH_MODE,
        num_kv_splits=meta["num_kv_splits"],
    )
    out.copy_(o16[:, :heads])


def run_triton_native(p: Problem, out: torch.Tensor, call: Call) -> None:
    triton_mla.mla_decode(p.q, p.kv, p.kv_scale, p.kv_indptr, p.kv_indices, p.sm_scale, out, call.max_kv_len, q_len=p.q_len)


def run_triton_zero_pad(p: Problem, out: torch.Tensor, call: Call) -> None:
    triton_mla.mla_decode_zero_pad(p.q, p.kv, p.kv_scale, p.kv_indptr, p.kv_indices, p.sm_scale, out, call.max_kv_len,
                                   q_len=p.q_len)


BACKEND_SETS: dict[str, dict[str, Backend]] = {
    "aiter": {
        ACCELERATED: Backend("aiter-gluon", ACCELERATED, run_aiter_gluon),
        FALLBACK: Backend("aiter-zero-pad", FALLBACK, run_aiter_zero_pad),
    },
    "triton": {
        ACCELERATED: Backend("triton-native", ACCELERATED, run_triton_native),
        FALLBACK: Backend("triton-zero-pad-16", FALLBACK, run_triton_zero_pad),
    },
}
