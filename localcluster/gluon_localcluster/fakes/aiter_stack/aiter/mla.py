"""Fake of aiter.mla.mla_decode_fwd (ROCm/aiter e4048607 aiter/mla.py), the kernel SGLang's flag-0 route
and its q_len > 1 fallback call. It refuses what aiter refuses, runs what aiter runs, as aiter does:

- persistent mode is "work_meta_data given"; a head count the kernel table serves runs natively, else
  32..128 in steps of 16 are folded onto 16 heads, anything else is aiter's AssertionError;
- which kernel runs comes from aiter's table for this GPU (aiter._table): a combination it lacks raises
  aiter's RuntimeError "cannot get heuristic kernel! ...", e.g. the non-persistent bf16-q / fp8-KV
  16-head decode (SGLang PR #37438's crash);
- fp8 q needs q_scale and kv_scale; one KV head; q contiguous; head size matching the KV rows;
- what asm_mla.cu takes as raw pointers it reads as aiter does: int64 kv_indices are read as int32
  pairs, a scale tensor that is not float32 is read as float32 bits (both give wrong answers).

The persistent kernel computes from the work list and reduce maps it is given (aiter._compute), so
stale metadata gives a wrong answer. Returns what aiter returns, (logits, lse)."""

import torch

from aiter import _table
from aiter._compute import Works, empty_state, finish, merge, sequences, work_partials
from aiter._fake import apply_mode, arch, record, spoil
from aiter.ops.attention import get_mla_decode_fwd_max_splits


def dtype_name(dtype, what):
    names = {
        torch.bfloat16: "bf16",
        torch.float8_e4m3fn: "fp8",
        torch.float8_e4m3fnuz: "fp8",
        torch.int8: "byte",
        torch.uint8: "byte",
    }  # built here: the probe's stand-in torch has no dtypes
    if dtype not in names:
        raise RuntimeError(f"[AITER] mla_decode_stage1_asm_fwd: unsupport {what} dtype:{dtype}")
    return names[dtype]


def pointer_scale(scale, device):
    """A [1] scale as asm_mla.cu reads it (a float32 pointer); None when it would read other bits."""
    if scale is None:
        return 1.0
    if scale.dtype != torch.float32:
        return None
    return scale.reshape(-1)[:1].to(device)


def kernel_for(q_type, kv_type, nhead, nhead_kv, persistent, max_seqlen_q, causal, lse):
    """(kernel name, heads it runs with): native where the table has the head count, else the fold."""

    def lookup(gqa):
        return _table.lookup(
            _table.Request(q_type, kv_type, gqa, persistent, max_seqlen_q, bool(causal), bool(lse), arch())
        )

    try:
        return lookup(nhead // nhead_kv), nhead
    except RuntimeError:
        if not persistent or nhead == 16 or nhead not in range(32, 129, 16):
            if persistent and nhead != 16 and nhead not in range(32, 129, 16):
                raise AssertionError(f"nhead={nhead} and max_seqlen_q={max_seqlen_q} not supported") from None
            raise
    return lookup(16 // nhead_kv), 16


def mla_decode_fwd(
    q,
    kv_buffer,
    o,
    qo_indptr,
    kv_indptr,
    kv_indices,
    kv_last_page_lens,
    max_seqlen_q,
    page_size=1,
    nhead_kv=1,
    sm_scale=None,
    logit_cap=0.0,
    num_kv_splits=None,
    num_kv_splits_indptr=None,
    work_meta_data=None,
    work_indptr=None,
    work_info_set=None,
    reduce_indptr=None,
    reduce_final_map=None,
    reduce_partial_map=None,
    q_scale=None,
    kv_scale=None,
    intra_batch_mode=False,
    return_logits=False,
    return_lse=False,
    g_kv_indptr=None,
    cp_world_size=1,
    cp_rank=0,
    causal=True,
):
    entry = record(
        dict(
            kernel="mla_decode_fwd",
            q=q,
            kv_buffer=kv_buffer,
            o=o,
            qo_indptr=qo_indptr,
            kv_indptr=kv_indptr,
            kv_indices=kv_indices,
            kv_last_page_lens=kv_last_page_lens,
            max_seqlen_q=max_seqlen_q,
            page_size=page_size,
            nhead_kv=nhead_kv,
            sm_scale=sm_scale,
            logit_cap=logit_cap,
            num_kv_splits=num_kv_splits,
            work_meta_data=work_meta_data,
            work_indptr=work_indptr,
            work_info_set=work_info_set,
            reduce_indptr=reduce_indptr,
            reduce_final_map=reduce_final_map,
            reduce_partial_map=reduce_partial_map,
            q_scale=q_scale,
            kv_scale=kv_scale,
            intra_batch_mode=intra_batch_mode,
            return_lse=return_lse,
            causal=causal,
        )
    )
    assert logit_cap <= 0, f"{logit_cap=} is not support yet"
    assert kv_buffer.dim() == 4, "kv_buffer must be [num_pages, page_size, nhead_kv, 576]"
    qk_head_dim = kv_buffer.shape[3]
    if sm_scale is None:
        sm_scale = 1.0 / qk_head_dim**0.5
    total_s, nhead, v_head_dim = o.shape
    persistent = work_meta_data is not None
    if persistent and num_kv_splits is None:
        num_kv_splits = get_mla_decode_fwd_max_splits(nhead, max_seqlen_q, q.dtype, kv_buffer.dtype)
    # asm_mla.cu's checks, then its table lookup
    if not q.is_contiguous():
        raise RuntimeError("[AITER] mla_decode_stage1_asm_fwd:only support Q.is_contiguous() for now")
    if nhead_kv != 1:
        raise RuntimeError("[AITER] mla_decode_stage1_asm_fwd:only support num_kv_heads==1 for now")
    if q.shape[2] != qk_head_dim:
        raise RuntimeError("[AITER] mla_decode_stage1_asm_fwd:only support head_size == KV.size(3) for now")
    q_type, kv_type = dtype_name(q.dtype, "Q"), dtype_name(kv_buffer.dtype, "KV")
    if q_type == "fp8" and (q_scale is None or kv_scale is None):
        raise RuntimeError("[AITER] mla_decode_stage1_asm_fwd: fp8 Q requires q_scale and kv_scale")
    kernel, _ = kernel_for(q_type, kv_type, nhead, nhead_kv, persistent, max_seqlen_q, causal, return_lse)
    entry["kernel_name"] = kernel
    garbage = apply_mode("mla_decode_fwd", o)
    indices = kv_indices if kv_indices.dtype == torch.int32 else kv_indices.contiguous().view(torch.int32)
    scale = pointer_scale(kv_scale, o.device)
    kv = kv_buffer.view(kv_buffer.shape[0] * kv_buffer.shape[1], -1)
    seqs = sequences(kv_indptr)
    if persistent:
        persistent_decode(
            q,
            kv,
            indices,
            seqs,
            1.0 if scale is None else scale,
            sm_scale,
            o,
            max_seqlen_q,
            work_indptr,
            work_info_set,
            reduce_indptr,
            reduce_final_map,
            reduce_partial_map,
        )
    else:
        batch = qo_indptr.numel() - 1
        bounds = qo_indptr.long()
        works = Works(
            torch.arange(batch, device=o.device), bounds[:-1], bounds[1:] - bounds[:-1], seqs[0], seqs[0] + seqs[1]
        )
        state = work_partials(q, kv, indices, seqs, 1.0 if scale is None else scale, sm_scale, max_seqlen_q, works)
        finish(state, o, nhead, max_seqlen_q, works.qo_start)
    if garbage or scale is None:
        spoil(o)
    final_lse = torch.empty((total_s, nhead), dtype=torch.float32, device=o.device) if return_lse else None
    if persistent:
        logits = torch.empty(
            (reduce_partial_map.size(0) * max_seqlen_q, 1, nhead, v_head_dim), dtype=torch.float32, device=o.device
        )
    else:
        logits = torch.empty((total_s, num_kv_splits or 1, nhead, v_head_dim), dtype=torch.float32, device=o.device)
    return logits, final_lse


def persistent_decode(
    q,
    kv,
    indices,
    seqs,
    scale,
    sm_scale,
    o,
    max_q,
    work_indptr,
    work_info_set,
    reduce_indptr,
    reduce_final_map,
    reduce_partial_map,
):
    """What the persistent kernel and mla_reduce_v1 do with the metadata: each listed work item's partial
    softmax; unsplit items (partial_qo_loc -1) written straight to o; split ones merged per reduce group
    (reduce_indptr ranges of reduce_partial_map slots) into the rows reduce_final_map names."""
    device, nhead = o.device, o.shape[1]
    info = work_info_set.long()
    listed = torch.arange(info.shape[0], device=device) < work_indptr.long()[-1]
    empty = torch.zeros_like(info[:, 4])
    works = Works(
        info[:, 0],
        info[:, 2],
        info[:, 3] - info[:, 2],
        torch.where(listed, info[:, 4], empty),
        torch.where(listed, info[:, 5], empty),
    )
    m, sums, acc = work_partials(q, kv, indices, seqs, scale, sm_scale, max_q, works)
    loc = info[:, 1]
    direct = listed & (loc < 0)
    finish(
        (torch.where(direct[:, None], m, torch.full_like(m, float("-inf"))), sums, acc), o, nhead, max_q, works.qo_start
    )
    slots = reduce_partial_map.numel() * max_q
    split = listed & (loc >= 0) & (loc < slots)
    slot_work = torch.full((slots + 1,), -1, dtype=torch.long, device=device)
    slot_work.index_copy_(
        0, torch.where(split, loc, torch.full_like(loc, slots)), torch.arange(info.shape[0], device=device)
    )
    groups = reduce_final_map.shape[0]
    entry = torch.arange(reduce_partial_map.numel(), device=device)
    bounds = reduce_indptr.long()
    group = torch.searchsorted(bounds[1:], entry, right=True)
    in_group = (entry >= bounds[0]) & (entry < bounds[-1]) & (group < groups)
    slot = reduce_partial_map.long().clamp(-1, slots)
    work = slot_work[torch.where(slot < 0, torch.full_like(slot, slots), slot)]
    use = in_group & (work >= 0)
    work = work.clamp_min(0)
    merged = empty_state(groups, m.shape[1], device)
    merge(merged, group, m[work], sums[work], acc[work], keep=use)
    finish(merged, o, nhead, max_q, reduce_final_map[:, 0])
