"""Fake of the MLA work-metadata functions of aiter/ops/attention.py (ROCm/aiter e4048607), with their
signatures. get_mla_metadata_info_v1 sizes the buffers by aiter's own rules (for the gfx950/gfx942
decode shapes); get_mla_metadata_v1 checks them and records which batch they describe, so the fake
persistent mla_decode_fwd can tell metadata built for this batch from stale or foreign buffers (the
real kernel would read them and compute garbage)."""

from __future__ import annotations

import math

import torch

from aiter._fake import CALLS, arch, cu_num

METADATA = {}  # work_metadata_ptrs.data_ptr() -> what get_mla_metadata_v1 built it for


def is_fp8(dtype):
    return dtype in (torch.float8_e4m3fn, torch.float8_e4m3fnuz)


def get_mla_decode_fwd_max_splits(num_head_qo, max_seqlen_qo, q_dtype, kv_dtype):
    return cu_num()  # occupancy 1: the experimental m16x4 kernel is off


def get_mla_metadata_info_v1(batch_size, max_seqlen_qo, num_head_qo, q_dtype, kv_dtype, is_sparse,
                             fast_mode=True, num_kv_splits=32, intra_batch_mode=False, max_split_per_batch=-1):
    assert num_head_qo % 8 == 0
    max_splits = get_mla_decode_fwd_max_splits(num_head_qo, max_seqlen_qo, q_dtype, kv_dtype)
    seqlen = 1 if is_sparse else max_seqlen_qo
    packed = seqlen * num_head_qo
    both_fp8 = is_fp8(q_dtype) and is_fp8(kv_dtype)
    both_bf16 = q_dtype == kv_dtype == torch.bfloat16
    tiles = math.ceil(packed / 16)
    if (arch() == "gfx950" and both_bf16 and packed >= 64 and num_head_qo <= 64 and (packed < 128 or num_head_qo == 48)) \
            or (arch() == "gfx950" and both_fp8 and num_head_qo == 32 and seqlen == 3):
        tiles = seqlen if num_head_qo * 2 > 64 else math.ceil(packed / 64)
    elif num_head_qo == 16 or (arch() == "gfx950" and both_fp8 and ((num_head_qo == 32 and seqlen == 4) or num_head_qo in (64, 128))):
        tiles = math.ceil(packed / 128)
    elif arch() == "gfx950" and (packed >= 128 or num_head_qo > 64) and both_bf16 and num_head_qo != 48:
        tiles = seqlen if num_head_qo * 2 > 128 else math.ceil(packed / 128)
    batch = batch_size * max_seqlen_qo if is_sparse else batch_size
    tile_cnt = batch * tiles
    if fast_mode:
        max_work = (batch + max_splits - 1) * tiles
        max_split_tiles = min(batch + max_splits - 1, (max_splits - 1) * 2) * tiles
    else:
        max_work = max_split_tiles = tile_cnt * max_splits
    if max_split_per_batch > 0:
        max_split_tiles = max(max_split_tiles, tile_cnt + min(max_splits, max_split_per_batch * batch))
    if intra_batch_mode:
        max_work = max_split_tiles = tile_cnt * num_kv_splits
    return (
        (2, torch.uint64),
        (max_splits + 1, torch.int32),
        ((max_work, 8), torch.int32),
        (tile_cnt + 1, torch.int32),
        ((tile_cnt, 2), torch.int32),
        (max_split_tiles, torch.int32),
    )


def get_mla_metadata_v1(seqlens_qo_indptr, seqlens_kv_indptr, kv_last_page_lens, num_heads_per_head_k, num_heads_k,
                        is_causal, work_metadata_ptrs, work_info_set, work_indptr, reduce_indptr, reduce_final_map,
                        reduce_partial_map, page_size=1, kv_granularity=16, max_seqlen_qo=-1, uni_seqlen_qo=-1,
                        fast_mode=True, topk=-1, max_split_per_batch=-1, intra_batch_mode=False,
                        is_cp_round_robin=False, mla_version=None, dtype_q_nope=None, dtype_q_rope=None,
                        dtype_kv_nope=None, dtype_kv_rope=None, dtype_q=None, dtype_kv=None):
    CALLS.append(dict(kernel="get_mla_metadata_v1", seqlens_qo_indptr=seqlens_qo_indptr,
                      seqlens_kv_indptr=seqlens_kv_indptr, kv_last_page_lens=kv_last_page_lens,
                      num_heads_per_head_k=num_heads_per_head_k, num_heads_k=num_heads_k, is_causal=is_causal,
                      work_metadata_ptrs=work_metadata_ptrs, page_size=page_size, kv_granularity=kv_granularity,
                      max_seqlen_qo=max_seqlen_qo, uni_seqlen_qo=uni_seqlen_qo, fast_mode=fast_mode,
                      max_split_per_batch=max_split_per_batch, intra_batch_mode=intra_batch_mode,
                      dtype_q=dtype_q, dtype_kv=dtype_kv))
    for name, tensor in (("seqlens_qo_indptr", seqlens_qo_indptr), ("seqlens_kv_indptr", seqlens_kv_indptr),
                         ("kv_last_page_lens", kv_last_page_lens), ("work_indptr", work_indptr),
                         ("work_info_set", work_info_set), ("reduce_indptr", reduce_indptr)):
        assert tensor.dtype == torch.int32, f"get_mla_metadata_v1: {name} must be int32, got {tensor.dtype}"
    assert work_metadata_ptrs.dtype == torch.uint64 and work_metadata_ptrs.numel() == 2, \
        "get_mla_metadata_v1: work_metadata_ptrs must be the 2 uint64 of get_mla_metadata_info_v1"
    batch = seqlens_kv_indptr.numel() - 1
    assert seqlens_qo_indptr.numel() == batch + 1 and kv_last_page_lens.numel() == batch
    METADATA[work_metadata_ptrs.data_ptr()] = dict(
        qo_indptr=seqlens_qo_indptr.clone(), kv_indptr=seqlens_kv_indptr.clone(),
        heads=num_heads_per_head_k * num_heads_k, reduce_partial_map=reduce_partial_map,
        work_indptr=work_indptr, work_info_set=work_info_set, max_seqlen_qo=max_seqlen_qo,
    )


def built_for(work_meta_data, qo_indptr, kv_indptr, heads):
    """Whether these work buffers were filled by get_mla_metadata_v1 for exactly this batch."""
    entry = METADATA.get(work_meta_data.data_ptr())
    return (entry is not None and entry["heads"] == heads and torch.equal(entry["qo_indptr"], qo_indptr)
            and torch.equal(entry["kv_indptr"], kv_indptr))
