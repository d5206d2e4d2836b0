"""Portable Triton MLA decode: split-KV (flash-decoding) with an fp32 online softmax and a reduce step.

Layout as aiter's mla_gluon takes it from SGLang: q bf16 [B, H, 576] (512 latent + 64 rope), one shared
latent KV head fp8 e4m3fn [N, 576] with a scalar scale, page size 1 through kv_indptr [B+1] and int32
kv_indices. Heads sit in one 16-row tile (12 real rows masked), so each KV token is read from memory once
for all heads (the value product re-reads its 512 bytes from L2 as 32-bit words: see the kernel). Plain
tl.load/tl.dot only: runs on NVIDIA and AMD Triton, and under TRITON_INTERPRET=1.

Graph-safe: the split count depends on the batch and a length *bound* fixed at capture; each split's
token range comes from the live kv_indptr on the device, so replays at other lengths stay correct and
fast (the frozen-split bug of aiter PR #4555 cannot happen here).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .problem import D_LATENT, D_ROPE

HEAD_TILE = 16
LOG2E = 1.4426950408889634


@dataclass(frozen=True)
class KernelConfig:
    block_n: int = 64  # KV tokens per inner step
    num_warps: int = 4
    num_stages: int = 2
    d_chunk: int = 128  # QK in slices of the latent dim: q never sits whole in every warp's registers
    ctas_per_sm: int = 2  # programs resident per multiprocessor at this config (registers, shared memory)
    min_tokens_per_split: int = 512  # below this a split costs more in partials than it saves


# Best of the H200 sweeps (docs/benchmarks/mla_kernel_notes.md, in git history): 64-token tiles, 4 warps,
# 128-wide QK slices.
# 88 KB of shared memory (and 237 registers x 128 threads) leave room for two programs per multiprocessor
# (ctas_per_sm). An arithmetic-free kernel of this structure is no faster (bench/gather_ceiling.py's split
# floor): at 8 warps per SM the loop waits on memory. Configs with 12 or 16 warps per SM were slower still
# (maxnreg A/Bs of 2026-11-30): smaller tiles and register caps cost more than the warps hide. One config
# for every batch: the split count below is a launch quantity, so a cold self-test compiles one kernel.
DEFAULT_CONFIG = KernelConfig()
INTERPRET_CONFIG = KernelConfig(block_n=16, num_warps=1, num_stages=1, ctas_per_sm=1, min_tokens_per_split=16)


def default_config() -> KernelConfig:
    return INTERPRET_CONFIG if interpreting() else DEFAULT_CONFIG


last_split_launch = None  # the compiled split kernel of the last call (registers, spills) for bench/


@triton.jit
def _byte_as_dot(words, r: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """Byte r of each 32-bit word as an e4m3 value, in the dot's type."""
    return ((words >> (8 * r)) & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(DOT_DTYPE)


@triton.jit
def _value_products(p, alpha, words, acc0, acc1, acc2, acc3, DOT_DTYPE: tl.constexpr):
    """One column group's four quarter-width value products: byte r of word j feeds acc_r[:, j]."""
    acc0 = tl.dot(p, _byte_as_dot(words, 0, DOT_DTYPE), acc0 * alpha[:, None])
    acc1 = tl.dot(p, _byte_as_dot(words, 1, DOT_DTYPE), acc1 * alpha[:, None])
    acc2 = tl.dot(p, _byte_as_dot(words, 2, DOT_DTYPE), acc2 * alpha[:, None])
    acc3 = tl.dot(p, _byte_as_dot(words, 3, DOT_DTYPE), acc3 * alpha[:, None])
    return acc0, acc1, acc2, acc3


@triton.jit
def _feature_order(acc0, acc1, acc2, acc3, BLOCK_H: tl.constexpr, WIDTH: tl.constexpr):
    """A group's features back in order: feature 4j + r from acc_r[:, j]."""
    return tl.reshape(tl.join(tl.join(acc0, acc2), tl.join(acc1, acc3)), [BLOCK_H, WIDTH])


@triton.jit
def _concat(a, b, BLOCK_H: tl.constexpr, WIDTH: tl.constexpr):
    """[a | b] along features, each WIDTH wide."""
    return tl.reshape(tl.permute(tl.join(a, b), (0, 2, 1)), [BLOCK_H, 2 * WIDTH])


@triton.jit
def split_range(KV_INDPTR, b, s, num_splits, BLOCK: tl.constexpr):
    """Split s of sequence b: tokens [lo, hi) of kv_indices, read live from kv_indptr (so a graph captured
    at one length stays right at another), whole BLOCK-token tiles but the last."""
    return split_bounds(tl.load(KV_INDPTR + b), tl.load(KV_INDPTR + b + 1), s, num_splits, BLOCK)


@triton.jit
def split_bounds(start, end, s, num_splits, BLOCK: tl.constexpr):
    """Split s of the token range [start, end) of kv_indices."""
    per_split = tl.cdiv(tl.cdiv(end - start, num_splits), BLOCK) * BLOCK
    lo = start + s * per_split
    return lo, tl.minimum(lo + per_split, end)


@triton.jit
def query_split_range(KV_INDPTR, row, s, num_splits, qlen, BLOCK: tl.constexpr, MTP: tl.constexpr):
    """Split s of query row `row`'s tokens. With MTP the row is position row % qlen of sequence row // qlen
    and sees the first L - qlen + position + 1 tokens (causal within the q block); without, it compiles to
    split_range. qlen is a run-time value: every q_len > 1 shares one compiled kernel."""
    if MTP:
        seq = row // qlen
        end = tl.load(KV_INDPTR + seq + 1) - (qlen - 1 - row % qlen)
        lo, hi = split_bounds(tl.load(KV_INDPTR + seq), end, s, num_splits, BLOCK)
    else:
        lo, hi = split_range(KV_INDPTR, row, s, num_splits, BLOCK)
    return lo, hi


@triton.jit
def _split_kernel(
    Q,
    KV,
    KV_INDPTR,
    KV_INDICES,
    PART_O,
    PART_LSE,
    qk_scale_log2,
    kv_scale,
    num_heads,
    num_splits,
    qlen,
    stride_qb,
    stride_qh,
    stride_kv,
    stride_pb,
    stride_ps,
    stride_ph,
    stride_lb,
    stride_ls,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    D_NOPE: tl.constexpr,
    D_PE: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    D_CHUNK: tl.constexpr,
    MTP: tl.constexpr,
):
    b = tl.program_id(0)  # a query row: a sequence, or with MTP one position of one
    s = tl.program_id(1)
    lo, hi = query_split_range(KV_INDPTR, b, s, num_splits, qlen, BLOCK_N, MTP)

    offs_h = tl.arange(0, BLOCK_H)
    mask_h = offs_h < num_heads
    offs_d = tl.arange(0, D_NOPE)
    offs_r = tl.arange(0, D_PE)
    q_row = Q + b * stride_qb + offs_h[:, None] * stride_qh
    q_pe = tl.load(q_row + D_NOPE + offs_r[None, :], mask=mask_h[:, None], other=0.0).to(DOT_DTYPE)
    offs_c = tl.arange(0, D_CHUNK)

    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    # Row sums stay per element and are summed across warps once, after the loop: each tile then has one
    # cross-warp reduction (the max) instead of two, and four fewer barriers (H200: 3-4% at every shape).
    l_acc = tl.zeros([BLOCK_H, BLOCK_N], dtype=tl.float32)
    # The value product needs pairs of *tokens* per register; the cache holds each token's values
    # contiguously (sm_90 has no 8-bit transposing shared-memory load). Read as 32-bit words of four
    # features, each thread loads whole words of its two tokens and byte r of a word feeds the product of
    # features 4j + r: quarter-width products instead of one fed by byte-wise loads. The words come in four
    # column groups of 128 features (a..d), each with its own four products: when introduced (v12) that was
    # 217 registers instead of 255 and 1494 sm_90 loop instructions instead of 1658 (fewer register moves),
    # and 5-13% faster at every recorded shape than one group (earlier H200 records of docs/benchmarks/, in git
    # history).
    kv_words = KV.to(tl.pointer_type(tl.uint32), bitcast=True)
    GROUP: tl.constexpr = D_NOPE // 16  # words (of four features) in a column group
    offs_w = tl.arange(0, GROUP)
    zero = tl.zeros([BLOCK_H, GROUP], dtype=tl.float32)
    a0, a1, a2, a3, b0, b1, b2, b3 = zero, zero, zero, zero, zero, zero, zero, zero
    c0, c1, c2, c3, d0, d1, d2, d3 = zero, zero, zero, zero, zero, zero, zero, zero
    for n0 in range(lo, hi, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < hi
        tok = tl.load(KV_INDICES + offs_n, mask=mask_n, other=0).to(tl.int64)
        row = KV + tok[:, None] * stride_kv
        k_pe = tl.load(row + D_NOPE + offs_r[None, :], mask=mask_n[:, None], other=0.0).to(DOT_DTYPE)
        qk = tl.dot(q_pe, tl.trans(k_pe))
        # The q slices are loop-invariant (Triton keeps them in shared memory); the KV slices are the
        # tile's first (HBM) read, the value words below re-read the same lines from L2. Odd and even
        # slices accumulate separately: two independent MMA chains halve the dependent latency per tile.
        qk_odd = tl.zeros([BLOCK_H, BLOCK_N], dtype=tl.float32)
        for c in tl.static_range(D_NOPE // D_CHUNK):
            q_c = tl.load(q_row + c * D_CHUNK + offs_c[None, :], mask=mask_h[:, None], other=0.0).to(DOT_DTYPE)
            k_c = tl.load(row + c * D_CHUNK + offs_c[None, :], mask=mask_n[:, None], other=0.0).to(DOT_DTYPE)
            if c % 2 == 0:
                qk = tl.dot(q_c, tl.trans(k_c), qk)
            else:
                qk_odd = tl.dot(q_c, tl.trans(k_c), qk_odd)
        qk += qk_odd
        word_row = kv_words + tok[:, None] * (stride_kv // 4) + offs_w[None, :]
        wa = tl.load(word_row, mask=mask_n[:, None], other=0)
        wb = tl.load(word_row + GROUP, mask=mask_n[:, None], other=0)
        wc = tl.load(word_row + 2 * GROUP, mask=mask_n[:, None], other=0)
        wd = tl.load(word_row + 3 * GROUP, mask=mask_n[:, None], other=0)
        qk = tl.where(mask_n[None, :], qk * qk_scale_log2, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(qk - m_new[:, None])
        l_acc = l_acc * alpha[:, None] + p
        p = p.to(DOT_DTYPE)
        a0, a1, a2, a3 = _value_products(p, alpha, wa, a0, a1, a2, a3, DOT_DTYPE)
        b0, b1, b2, b3 = _value_products(p, alpha, wb, b0, b1, b2, b3, DOT_DTYPE)
        c0, c1, c2, c3 = _value_products(p, alpha, wc, c0, c1, c2, c3, DOT_DTYPE)
        d0, d1, d2, d3 = _value_products(p, alpha, wd, d0, d1, d2, d3, DOT_DTYPE)
        m_i = m_new

    l_i = tl.sum(l_acc, 1)
    empty = l_i == 0.0  # this split got no tokens (short sequence, many splits)
    safe_l = tl.where(empty, 1.0, l_i)
    W: tl.constexpr = 4 * GROUP  # features in a column group
    ab = _concat(_feature_order(a0, a1, a2, a3, BLOCK_H, W), _feature_order(b0, b1, b2, b3, BLOCK_H, W), BLOCK_H, W)
    cd = _concat(_feature_order(c0, c1, c2, c3, BLOCK_H, W), _feature_order(d0, d1, d2, d3, BLOCK_H, W), BLOCK_H, W)
    acc = _concat(ab, cd, BLOCK_H, 2 * W)
    out = acc * (kv_scale / safe_l)[:, None]
    lse = tl.where(empty, float("-inf"), m_i + tl.log2(safe_l))
    p_row = PART_O + b * stride_pb + s * stride_ps + offs_h[:, None] * stride_ph
    tl.store(p_row + offs_d[None, :], out, mask=mask_h[:, None])
    tl.store(PART_LSE + b * stride_lb + s * stride_ls + offs_h, lse, mask=mask_h)


@triton.jit
def _reduce_kernel(
    PART_O,
    PART_LSE,
    OUT,
    num_splits,
    stride_pb,
    stride_ps,
    stride_ph,
    stride_lb,
    stride_ls,
    stride_ob,
    stride_oh,
    BLOCK_D: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    # One pass over [BLOCK_S, BLOCK_D] tiles of splits with a running max (online softmax across splits):
    # one 128K sequence's 256 splits are then one dependent load, not two chains of eight.
    b = tl.program_id(0)
    h = tl.program_id(1)
    offs_d = tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D)
    offs_s = tl.arange(0, BLOCK_S)
    lse_row = PART_LSE + b * stride_lb + h
    m = tl.full([1], float("-inf"), dtype=tl.float32)
    weight_sum = tl.zeros([1], dtype=tl.float32)
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for s0 in range(0, num_splits, BLOCK_S):
        s = s0 + offs_s
        lse = tl.load(lse_row + s * stride_ls, mask=s < num_splits, other=float("-inf"))
        part_ptr = PART_O + b * stride_pb + s[:, None] * stride_ps + h * stride_ph + offs_d[None, :]
        part = tl.load(part_ptr, mask=(lse > float("-inf"))[:, None], other=0.0)  # empty splits: not read
        m_new = tl.maximum(m, tl.max(lse, 0))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # no split with a token yet: weights 0, not NaN
        rescale = tl.exp2(m - m_safe)
        w = tl.exp2(lse - m_safe)
        acc = acc * rescale + tl.sum(part * w[:, None], 0)
        weight_sum = weight_sum * rescale + tl.sum(w, 0)
        m = m_new
    # weight_sum > 0: every sequence has a token, so some split has one
    tl.store(OUT + b * stride_ob + h * stride_oh + offs_d, (acc / weight_sum).to(OUT.dtype.element_ty))


def multiprocessors(device: torch.device) -> int:
    if device.type == "cpu":
        return 4
    return torch.cuda.get_device_properties(device).multi_processor_count


REDUCE_TILE_ELEMENTS = 8192  # [splits, features] per reduce step: 64 fp32 registers a thread in 4 warps


def reduce_tile(rows: int, splits: int, device: torch.device) -> tuple[int, int]:
    """(features, splits) per reduce program and step. Whole 512-feature rows when there are enough rows
    (batch x heads) to give every SM two programs, else 32-feature slices; as many splits a step as the
    tile holds, 64 for up to 128 splits. Depends on batch x heads and the split count (itself from the
    length bound), so a captured graph stays valid at any length; three tile shapes keep the cold self-test
    to three reduce compiles. H200 (earlier records of docs/benchmarks/, in git history): a 128K sequence's
    reduce 4.6 -> 1.7 µs."""
    block_d = D_LATENT if rows >= 2 * multiprocessors(device) else 32
    most = REDUCE_TILE_ELEMENTS // block_d
    return block_d, most if splits > 128 or block_d == D_LATENT else 64


def split_count(batch: int, max_kv_len: int, device: torch.device, config: KernelConfig) -> int:
    """Splits per sequence: one wave of resident programs (batch x splits at most ctas_per_sm per
    multiprocessor, so no program waits for a second wave), and no split shorter than
    min_tokens_per_split. Depends on the length *bound*, so a captured graph stays valid. H200
    (docs/benchmarks/mla_kernel_notes.md, in git history): one wave beat 2 to 6 waves at every recorded shape, and a
    program count just over one wave (264 + 24) cost 32 x 8K 19%."""
    return splits_per_sequence(resident_programs(device, config), batch, max_kv_len, config.min_tokens_per_split)


def splits_per_sequence(programs: int, batch: int, max_kv_len: int, min_tokens: int) -> int:
    """`programs` split programs shared among `batch` sequences, none shorter than `min_tokens`, at least one."""
    return max(1, min(programs // batch, max_kv_len // min_tokens))


def resident_programs(device: torch.device, config: KernelConfig) -> int:
    """Split-kernel programs the GPU holds at once: one wave."""
    return config.ctas_per_sm * multiprocessors(device)


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def mla_decode(
    q: torch.Tensor,
    kv: torch.Tensor,
    kv_scale: float,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    sm_scale: float,
    out: torch.Tensor,
    max_kv_len: int,
    config: KernelConfig | None = None,
    q_len: int = 1,
) -> torch.Tensor:
    """Writes out[B * q_len, H, 512] (bf16). `max_kv_len` bounds every sequence's length; under graph
    capture pass the capacity the graph will be replayed with, never the current length. With q_len > 1
    q holds q_len query rows per sequence (as SGLang's verify step flattens them), causal within them."""
    batch, heads, dim = q.shape  # batch: query rows
    config = config or default_config()
    if heads > HEAD_TILE or dim != D_LATENT + D_ROPE or kv.shape[-1] != dim:
        raise ValueError(f"mla_decode: q {tuple(q.shape)} / kv {tuple(kv.shape)} are not MLA 576 with <= 16 heads")
    if q_len < 1 or batch != (kv_indptr.numel() - 1) * q_len:
        raise ValueError(
            f"mla_decode: q has {batch} rows, kv_indptr {kv_indptr.numel() - 1} sequences of "
            f"q_len {q_len}: they must agree"
        )
    if q.stride(-1) != 1 or kv.stride(-1) != 1:
        raise ValueError("mla_decode: q and kv need a contiguous last dimension")
    if kv.stride(0) % 4 or kv.data_ptr() % 4:
        raise ValueError(
            f"mla_decode: kv rows must start at byte offsets that are multiples of 4 (row stride "
            f"{kv.stride(0)}, address {kv.data_ptr()}) to be read as 32-bit words"
        )
    splits = split_count(batch, max_kv_len, q.device, config)
    part_o = torch.empty(batch, splits, HEAD_TILE, D_LATENT, dtype=torch.float32, device=q.device)
    part_lse = torch.empty(batch, splits, HEAD_TILE, dtype=torch.float32, device=q.device)
    global last_split_launch
    last_split_launch = _split_kernel[(batch, splits)](
        q,
        kv,
        kv_indptr,
        kv_indices,
        part_o,
        part_lse,
        sm_scale * kv_scale * LOG2E,
        kv_scale,
        heads,
        splits,
        q_len,
        q.stride(0),
        q.stride(1),
        kv.stride(0),
        part_o.stride(0),
        part_o.stride(1),
        part_o.stride(2),
        part_lse.stride(0),
        part_lse.stride(1),
        BLOCK_H=HEAD_TILE,
        BLOCK_N=config.block_n,
        D_NOPE=D_LATENT,
        D_PE=D_ROPE,
        # fp8 e4m3 -> fp16 is one conversion per pair and fp16 keeps 3 more mantissa bits than bf16 for P.
        # Triton's interpreter multiplies 16-bit floats as raw bits in tl.dot (seen with 3.9): fp32 there.
        DOT_DTYPE=tl.float32 if interpreting() else tl.float16,
        D_CHUNK=config.d_chunk,
        MTP=q_len > 1,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )
    return reduce_partials(part_o, part_lse, out)


def reduce_partials(part_o: torch.Tensor, part_lse: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """The reduce step: out[B, H, 512] from each split's normalised partial part_o[B, S, 16, 512] and its
    log2-sum-exp part_lse[B, S, 16] (-inf for a split with no token)."""
    batch, splits = part_o.shape[:2]
    heads = out.shape[1]
    block_d, block_s = reduce_tile(batch * heads, splits, out.device)
    _reduce_kernel[(batch, heads, D_LATENT // block_d)](
        part_o,
        part_lse,
        out,
        splits,
        part_o.stride(0),
        part_o.stride(1),
        part_o.stride(2),
        part_lse.stride(0),
        part_lse.stride(1),
        out.stride(0),
        out.stride(1),
        BLOCK_D=block_d,
        BLOCK_S=block_s,
        num_warps=4,
    )
    return out


def mla_decode_zero_pad(
    q: torch.Tensor,
    kv: torch.Tensor,
    kv_scale: float,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    sm_scale: float,
    out: torch.Tensor,
    max_kv_len: int,
    config: KernelConfig | None = None,
    q_len: int = 1,
) -> torch.Tensor:
    """SGLang's fallback shape: q zero-padded to 16 heads, a 16-head decode, output sliced back."""
    batch, heads, dim = q.shape
    q16 = q.new_zeros(batch, HEAD_TILE, dim)
    q16[:, :heads] = q
    o16 = out.new_empty(batch, HEAD_TILE, D_LATENT)
    mla_decode(q16, kv, kv_scale, kv_indptr, kv_indices, sm_scale, o16, max_kv_len, config, q_len)
    out.copy_(o16[:, :heads])
    return out
