"""Kernel backends behind one interface, each called exactly as its production caller calls it.

aiter-gluon     the accelerated path: SGLang's mla_gluon call (aiter_mla_gluon.py, PR #34647)
aiter-zero-pad  the rollback path: q zero-padded to 16 heads, aiter.mla.mla_decode_fwd, output sliced
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
    """How one invocation is made: `capturing` as SGLang knows it, `max_kv_len` the graph's capacity."""

    max_kv_len: int
    capturing: bool = False


Runner = Callable[[Problem, torch.Tensor, Call], None]


@dataclass(frozen=True)
class Backend:
    name: str
    path: str
    run: Runner


def run_aiter_gluon(p: Problem, out: torch.Tensor, call: Call) -> None:
    from aiter.ops.triton.gluon.mla_gluon import mla_gluon

    q_nope, q_pe = torch.split(p.q, [D_LATENT, D_ROPE], dim=-1)
    # SGLang passes max(seq_lens) when eager and 1 under graph capture (no host sync while capturing).
    min_kv_seq_len = 1 if call.capturing else max(p.lengths)
    mla_gluon(
        q_nope,
        q_pe,
        p.kv.view(-1, D_QK),
        out,
        p.kv_indices,
        p.kv_indptr,
        p.sm_scale,
        k_pe=None,
        kv_pe_offset=D_LATENT,
        use_2d_view=False,
        kv_scale=float(p.kv_scale),
        min_kv_seq_len=min_kv_seq_len,
    )


def run_aiter_zero_pad(p: Problem, out: torch.Tensor, call: Call) -> None:
    from aiter.mla import mla_decode_fwd

    batch, heads, _ = p.q.shape
    device = p.q.device
    q16 = p.q.new_zeros(batch, AITER_HEAD_TILE, D_QK)
    q16[:, :heads] = p.q
    o16 = out.new_empty(batch, AITER_HEAD_TILE, D_LATENT)
    mla_decode_fwd(
        q16,
        p.kv.view(-1, 1, 1, D_QK),
        o16,
        torch.arange(batch + 1, dtype=torch.int32, device=device),  # qo_indptr: one query token each
        p.kv_indptr,
        p.kv_indices,
        torch.ones(batch, dtype=torch.int32, device=device),  # kv_last_page_lens, page size 1
        1,  # max_seqlen_q
        page_size=1,
        nhead_kv=1,
        sm_scale=p.sm_scale,
        logit_cap=0.0,
        q_scale=None,
        kv_scale=torch.tensor([p.kv_scale], dtype=torch.float32, device=device),
    )
    out.copy_(o16[:, :heads])


def run_triton_native(p: Problem, out: torch.Tensor, call: Call) -> None:
    triton_mla.mla_decode(p.q, p.kv, p.kv_scale, p.kv_indptr, p.kv_indices, p.sm_scale, out, call.max_kv_len)


def run_triton_zero_pad(p: Problem, out: torch.Tensor, call: Call) -> None:
    triton_mla.mla_decode_zero_pad(p.q, p.kv, p.kv_scale, p.kv_indptr, p.kv_indices, p.sm_scale, out, call.max_kv_len)


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
