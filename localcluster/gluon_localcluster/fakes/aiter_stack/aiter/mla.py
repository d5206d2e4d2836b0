"""Fake of aiter.mla.mla_decode_fwd (ROCm/aiter e4048607 aiter/mla.py), the kernel SGLang's flag-0 route
and its q_len > 1 fallback call. It refuses what aiter refuses, as aiter does:

- persistent mode is "work_meta_data given"; only 16 q heads run natively, 32..128 in steps of 16 are
  folded onto 16, anything else is aiter's AssertionError;
- which kernel runs comes from aiter's table for this GPU (aiter._table): a combination it lacks raises
  aiter's RuntimeError "cannot get heuristic kernel! ...", e.g. the non-persistent bf16-q / fp8-KV
  16-head decode (SGLang PR #37438's crash);
- fp8 q needs q_scale and kv_scale; one KV head; q contiguous; head size matching the KV rows.

Returns what aiter returns, (logits, lse): logits is the fp32 split buffer, the answer is written to o.
"""

import torch

from aiter import _table
from aiter._fake import CALLS, arch, attend
from aiter.ops.attention import built_for, get_mla_decode_fwd_max_splits

def dtype_name(dtype, what):
    names = {torch.bfloat16: "bf16", torch.float8_e4m3fn: "fp8", torch.float8_e4m3fnuz: "fp8",
             torch.int8: "byte", torch.uint8: "byte"}  # built here: the probe's stand-in torch has no dtypes
    if dtype not in names:
        raise RuntimeError(f"[AITER] mla_decode_stage1_asm_fwd: unsupport {what} dtype:{dtype}")
    return names[dtype]


def mla_decode_fwd(q, kv_buffer, o, qo_indptr, kv_indptr, kv_indices, kv_last_page_lens, max_seqlen_q,
                   page_size=1, nhead_kv=1, sm_scale=None, logit_cap=0.0, num_kv_splits=None,
                   num_kv_splits_indptr=None, work_meta_data=None, work_indptr=None, work_info_set=None,
                   reduce_indptr=None, reduce_final_map=None, reduce_partial_map=None, q_scale=None,
                   kv_scale=None, intra_batch_mode=False, return_logits=False, return_lse=False,
                   g_kv_indptr=None, cp_world_size=1, cp_rank=0, causal=True):
    CALLS.append(dict(kernel="mla_decode_fwd", q=q, kv_buffer=kv_buffer, o=o, qo_indptr=qo_indptr,
                      kv_indptr=kv_indptr, kv_indices=kv_indices, kv_last_page_lens=kv_last_page_lens,
                      max_seqlen_q=max_seqlen_q, page_size=page_size, nhead_kv=nhead_kv, sm_scale=sm_scale,
                      logit_cap=logit_cap, num_kv_splits=num_kv_splits, work_meta_data=work_meta_data,
                      work_indptr=work_indptr, work_info_set=work_info_set, reduce_indptr=reduce_indptr,
                      reduce_final_map=reduce_final_map, reduce_partial_map=reduce_partial_map,
                      q_scale=q_scale, kv_scale=kv_scale, intra_batch_mode=intra_batch_mode,
                      return_lse=return_lse, causal=causal))
    assert logit_cap <= 0, f"{logit_cap=} is not support yet"
    assert kv_buffer.dim() == 4, "kv_buffer must be [num_pages, page_size, nhead_kv, 576]"
    qk_head_dim = kv_buffer.shape[3]
    if sm_scale is None:
        sm_scale = 1.0 / qk_head_dim**0.5
    total_s, nhead, v_head_dim = o.shape
    persistent = work_meta_data is not None
    if persistent:
        if num_kv_splits is None:
            num_kv_splits = get_mla_decode_fwd_max_splits(nhead, max_seqlen_q, q.dtype, kv_buffer.dtype)
        if nhead != 16 and not (nhead in range(32, 129, 16)):
            raise AssertionError(f"nhead={nhead} and max_seqlen_q={max_seqlen_q} not supported")
    # asm_mla.cu's checks, then its table lookup (gqa after the 32..128 -> 16 fold)
    if not q.is_contiguous():
        raise RuntimeError("[AITER] mla_decode_stage1_asm_fwd:only support Q.is_contiguous() for now")
    if nhead_kv != 1:
        raise RuntimeError("[AITER] mla_decode_stage1_asm_fwd:only support num_kv_heads==1 for now")
    if q.shape[2] != qk_head_dim:
        raise RuntimeError("[AITER] mla_decode_stage1_asm_fwd:only support head_size == KV.size(3) for now")
    q_type, kv_type = dtype_name(q.dtype, "Q"), dtype_name(kv_buffer.dtype, "KV")
    if q_type == "fp8" and (q_scale is None or kv_scale is None):
        raise RuntimeError("[AITER] mla_decode_stage1_asm_fwd: fp8 Q requires q_scale and kv_scale")
    gqa = (16 if persistent and nhead != 16 else nhead) // nhead_kv
    kernel = _table.lookup(_table.Request(q_type, kv_type, gqa, persistent, max_seqlen_q, bool(causal),
                                          bool(return_lse), arch()))
    CALLS[-1]["kernel_name"] = kernel
    batch = qo_indptr.numel() - 1
    if total_s != batch * max_seqlen_q or q.shape[0] != total_s:
        raise RuntimeError(f"fake aiter: q/o rows {q.shape[0]}/{total_s} are not batch {batch} x max_seqlen_q {max_seqlen_q}")
    stale = persistent and not built_for(work_meta_data, qo_indptr, kv_indptr, nhead)  # real: garbage out
    scale = 1.0 if kv_scale is None else float(kv_scale.reshape(-1)[0])
    attend("mla_decode_fwd", q, kv_buffer.view(kv_buffer.shape[0], -1), scale, kv_indptr, kv_indices, sm_scale, o,
           q_len=max_seqlen_q, garbage=stale)
    final_lse = torch.empty((total_s, nhead), dtype=torch.float32, device=o.device) if return_lse else None
    if persistent:
        logits = torch.empty((reduce_partial_map.size(0) * max_seqlen_q, 1, nhead, v_head_dim),
                             dtype=torch.float32, device=o.device)
    else:
        splits = num_kv_splits or 1
        logits = torch.empty((total_s, splits, nhead, v_head_dim), dtype=torch.float32, device=o.device)
    return logits, final_lse
