"""Fake of aiter/ops/triton/gluon/mla_gluon.py (ROCm/aiter e4048607): same signature, the same asserts
(gfx950; 3-D q/o or SGLang PR #37601's 4-D [batch, qlen, nhead, dim]; head dims 512 and 64; bf16 q;
KV bf16 or exactly float8_e4m3fn, so fnuz is refused) and the same return, (o, lse).

It computes split-KV as the kernel does ("bh16bn128": splits = max(1, 256 // (B * qlen * ceil(H / 16))),
each sequence cut into that many ranges on the device), in _compute's capture-safe torch ops."""

import math

from aiter._compute import Works, empty_state, finish, merge, sequences, work_partials
from aiter._fake import apply_mode, arch, record, spoil

SPLIT_BUDGET = 256


def gluon_splits(batch, qlen, nhead):
    return max(1, SPLIT_BUDGET // (batch * qlen * math.ceil(nhead / 16)))


def gluon_works(seqs, batch, qlen, splits):
    """`splits` ranges per sequence, each a multiple of 16 tokens but the last, from the live lengths."""
    import torch

    device = seqs[0].device
    b = torch.arange(batch, device=device).repeat_interleave(splits)
    k = torch.arange(splits, device=device).repeat(batch)
    start = seqs[0][b]
    end = start + seqs[1][b]
    chunk = (end - start).add(splits - 1).div(splits, rounding_mode="floor").add(15).div(16, rounding_mode="floor") * 16
    kv_start = (start + k * chunk).clamp(max=end)
    return Works(b, b * qlen, torch.full_like(b, qlen), kv_start, (kv_start + chunk).clamp(max=end))


def mla_gluon(
    q_nope,
    q_pe,
    kv_c,
    o,
    page_table,
    seq_info,
    sm_scale,
    k_pe=None,
    kv_pe_offset=512,
    use_2d_view=True,
    kv_scale=1.0,
    min_kv_seq_len=1,
    return_lse=False,
    has_pe=True,
    attn_sink=None,
):
    import torch

    record(
        dict(
            kernel="mla_gluon",
            q_nope=q_nope,
            q_pe=q_pe,
            kv_c=kv_c,
            o=o,
            page_table=page_table,
            seq_info=seq_info,
            sm_scale=sm_scale,
            k_pe=k_pe,
            kv_pe_offset=kv_pe_offset,
            use_2d_view=use_2d_view,
            kv_scale=kv_scale,
            min_kv_seq_len=min_kv_seq_len,
            return_lse=return_lse,
        )
    )
    if k_pe is None:
        k_pe = kv_c
    assert q_nope.dim() in (3, 4), f"q_nope must be 3-D or 4-D, got {q_nope.dim()}-D"
    if q_nope.dim() == 4:
        batch, qlen, nhead, head_dim_ckv = q_nope.shape
    else:
        (batch, nhead, head_dim_ckv), qlen = q_nope.shape, 1
    head_dim_kpe = q_pe.shape[-1] if has_pe else 64
    assert arch() == "gfx950", f"mla_gluon requires gfx950 (CDNA4), got {arch()}"
    assert head_dim_ckv == 512, f"mla_gluon requires head_dim_ckv=512, got {head_dim_ckv}"
    assert head_dim_kpe == 64, f"mla_gluon requires head_dim_kpe=64, got {head_dim_kpe}"
    if not 1 <= nhead <= 96 or nhead == 64:
        raise AssertionError(f"fake mla_gluon models only the bh16 regimes (nhead <= 96, not 64), got {nhead}")
    if kv_c.dtype not in (torch.bfloat16, torch.float8_e4m3fn):
        raise AssertionError(f"mla_gluon[bh16*] requires kv_c.dtype in (bfloat16, float8_e4m3fn), got {kv_c.dtype}")
    assert q_nope.dtype == torch.bfloat16 and q_pe.dtype == torch.bfloat16, (
        f"q_nope/q_pe must be bf16, got {q_nope.dtype}/{q_pe.dtype}"
    )
    assert k_pe.dtype == kv_c.dtype, f"kv_c/k_pe must be {kv_c.dtype}, got {kv_c.dtype}/{k_pe.dtype}"
    assert tuple(q_pe.shape[:-1]) == tuple(q_nope.shape[:-1]) and tuple(o.shape) == tuple(q_nope.shape), (
        f"q_pe {tuple(q_pe.shape)} / o {tuple(o.shape)} do not match q_nope {tuple(q_nope.shape)}"
    )
    if use_2d_view:
        # page_table [batch, max_len] of token ids, seq_info [batch] lengths
        assert page_table.dim() == 2 and page_table.shape[0] == batch and seq_info.numel() == batch, (
            "use_2d_view: page_table [batch, max_len] and seq_info [batch], got "
            f"{tuple(page_table.shape)}/{tuple(seq_info.shape)}"
        )
        seqs = (torch.arange(batch, device=seq_info.device) * page_table.shape[1], seq_info.long())
        page_table = page_table.reshape(-1)
    else:
        assert seq_info.numel() == batch + 1, f"1-D view: seq_info is kv_indptr [batch+1], got {tuple(seq_info.shape)}"
        seqs = sequences(seq_info)
    # a tensor would reach the Triton kernel as a pointer, not a value; Python numbers are taken
    assert isinstance(kv_scale, (int, float)) and not isinstance(kv_scale, bool), (
        f"mla_gluon: kv_scale is a Python number, got {type(kv_scale).__name__}"
    )
    assert page_table.dtype == torch.int32, f"mla_gluon: page_table must be int32, got {page_table.dtype}"
    garbage = apply_mode("mla_gluon", o)
    q = torch.cat([q_nope, q_pe], dim=-1).reshape(batch * qlen, nhead, -1)
    works = gluon_works(seqs, batch, qlen, gluon_splits(batch, qlen, nhead))
    state = work_partials(q, kv_c, page_table, seqs, float(kv_scale), sm_scale, qlen, works)
    merged = empty_state(batch, qlen * nhead, q.device)
    merge(merged, works.batch, *state)
    finish(merged, o.view(batch * qlen, nhead, -1), nhead, qlen, torch.arange(batch, device=q.device) * qlen)
    if garbage:
        spoil(o)
    lse = torch.empty((batch, qlen, nhead), dtype=torch.float32, device=o.device) if return_lse else None
    return o, lse
