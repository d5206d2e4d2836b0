"""Fake of the MLA work-metadata functions of aiter/ops/attention.py (ROCm/aiter e4048607), with their
signatures, buffer sizes and refusals. get_mla_metadata_v1 fills the buffers with aiter's layout
(csrc/include/mla.h: work_info_set rows [batch_idx, partial_qo_loc, qo_start, qo_end, kv_start, kv_end,
kv_offset, pad]; work_indptr per CU part; reduce_indptr / reduce_final_map / reduce_partial_map), splitting
each batch as v1_0_device.cuh (intra_batch_mode, SGLang's 12-head zero-pad case) or v1_2 (fast_mode)
does. The fake persistent mla_decode_fwd reads only these buffers, so stale or wrong metadata gives a
wrong answer, as on the GPU.

Unlike aiter's GPU builder, this one reads the lengths on the host, so it cannot be captured in a CUDA
graph; SGLang never captures it (it fills the graph's buffers before each replay)."""

from __future__ import annotations

import math

import torch

from aiter._fake import arch, cu_num, record

HEAD_CHECK = "only supports #heads in [16, 128], or (#head, uni_seqlen_qo) = (16*N, 1) where N is in [2, 8)"
SPLIT_DIVISOR = 196  # v1_0_device.cuh get_local_splits: "magic num 196"
DONE_TAIL = 4  # v1_0: a split whose tail is this many blocks or fewer is folded into the previous one


def is_fp8(dtype):
    return dtype in (torch.float8_e4m3fn, torch.float8_e4m3fnuz)


def get_mla_decode_fwd_max_splits(num_head_qo, max_seqlen_qo, q_dtype, kv_dtype):
    return cu_num()  # occupancy 1: the experimental m16x4 kernel is off


def get_mla_metadata_info_v1(
    batch_size,
    max_seqlen_qo,
    num_head_qo,
    q_dtype,
    kv_dtype,
    is_sparse,
    fast_mode=True,
    num_kv_splits=32,
    intra_batch_mode=False,
    max_split_per_batch=-1,
):
    assert num_head_qo % 8 == 0
    max_splits = get_mla_decode_fwd_max_splits(num_head_qo, max_seqlen_qo, q_dtype, kv_dtype)
    seqlen = 1 if is_sparse else max_seqlen_qo
    packed = seqlen * num_head_qo
    both_fp8 = is_fp8(q_dtype) and is_fp8(kv_dtype)
    both_bf16 = q_dtype == kv_dtype == torch.bfloat16
    tiles = math.ceil(packed / 16)
    if (
        arch() == "gfx950" and both_bf16 and packed >= 64 and num_head_qo <= 64 and (packed < 128 or num_head_qo == 48)
    ) or (arch() == "gfx950" and both_fp8 and num_head_qo == 32 and seqlen == 3):
        tiles = seqlen if num_head_qo * 2 > 64 else math.ceil(packed / 64)
    elif num_head_qo == 16 or (
        arch() == "gfx950" and both_fp8 and ((num_head_qo == 32 and seqlen == 4) or num_head_qo in (64, 128))
    ):
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


def local_splits(kv_len, num_splits):
    """v1_0_device.cuh get_local_splits on gfx950: 0 for KV lengths under 196 (the kernel then divides by
    it; the fake keeps one split and reports the batch in ZERO_SPLIT_BATCHES)."""
    return min(kv_len // SPLIT_DIVISOR, num_splits)


def ranges(kv_len, splits, granularity):
    """(start, end) of each split of one batch, in kv positions relative to its start: ceil(blocks /
    splits) blocks of `granularity` each, a tail of DONE_TAIL blocks or fewer folded into the one before."""
    blocks = -(-kv_len // granularity)
    payload = -(-blocks // splits)
    cuts = list(range(0, blocks, payload)) + [blocks]
    if len(cuts) > 2 and cuts[-1] - cuts[-2] <= DONE_TAIL:
        del cuts[-2]
    return [(a * granularity, min(b * granularity, kv_len)) for a, b in zip(cuts, cuts[1:])]


def get_mla_metadata_v1(
    seqlens_qo_indptr,
    seqlens_kv_indptr,
    kv_last_page_lens,
    num_heads_per_head_k,
    num_heads_k,
    is_causal,
    work_metadata_ptrs,
    work_info_set,
    work_indptr,
    reduce_indptr,
    reduce_final_map,
    reduce_partial_map,
    page_size=1,
    kv_granularity=16,
    max_seqlen_qo=-1,
    uni_seqlen_qo=-1,
    fast_mode=True,
    topk=-1,
    max_split_per_batch=-1,
    intra_batch_mode=False,
    is_cp_round_robin=False,
    mla_version=None,
    dtype_q_nope=None,
    dtype_q_rope=None,
    dtype_kv_nope=None,
    dtype_kv_rope=None,
    dtype_q=None,
    dtype_kv=None,
):
    record(
        dict(
            kernel="get_mla_metadata_v1",
            seqlens_qo_indptr=seqlens_qo_indptr,
            seqlens_kv_indptr=seqlens_kv_indptr,
            kv_last_page_lens=kv_last_page_lens,
            num_heads_per_head_k=num_heads_per_head_k,
            num_heads_k=num_heads_k,
            is_causal=is_causal,
            work_metadata_ptrs=work_metadata_ptrs,
            page_size=page_size,
            kv_granularity=kv_granularity,
            max_seqlen_qo=max_seqlen_qo,
            uni_seqlen_qo=uni_seqlen_qo,
            fast_mode=fast_mode,
            max_split_per_batch=max_split_per_batch,
            intra_batch_mode=intra_batch_mode,
            dtype_q=dtype_q,
            dtype_kv=dtype_kv,
        )
    )
    # metadata.cu's checks
    for name, value in (("kv_granularity", kv_granularity), ("page_size", page_size)):
        if value < 1 or value & (value - 1):
            raise RuntimeError(f"get_mla_metadata_v1: {name} must be a power of 2, got {value}")
    for name, tensor in (
        ("seqlens_qo_indptr", seqlens_qo_indptr),
        ("seqlens_kv_indptr", seqlens_kv_indptr),
        ("kv_last_page_lens", kv_last_page_lens),
    ):
        if tensor.dtype != torch.int32 or not tensor.is_contiguous():
            raise RuntimeError(
                f"get_mla_metadata_v1: {name}: element type should be int! (and contiguous), got {tensor.dtype}"
            )
    for name, tensor in (
        ("work_indptr", work_indptr),
        ("work_info_set", work_info_set),
        ("reduce_indptr", reduce_indptr),
        ("reduce_final_map", reduce_final_map),
        ("reduce_partial_map", reduce_partial_map),
    ):
        assert tensor.dtype == torch.int32, f"get_mla_metadata_v1: {name} must be int32, got {tensor.dtype}"
    assert work_metadata_ptrs.dtype == torch.uint64 and work_metadata_ptrs.numel() == 2, (
        "get_mla_metadata_v1: work_metadata_ptrs must be the 2 uint64 of get_mla_metadata_info_v1"
    )
    heads = num_heads_per_head_k * num_heads_k
    batch = seqlens_kv_indptr.numel() - 1
    assert seqlens_qo_indptr.numel() == batch + 1 and kv_last_page_lens.numel() == batch
    kv_bounds = seqlens_kv_indptr.tolist()
    qo_bounds = seqlens_qo_indptr.tolist()
    if fast_mode:
        works = fast_mode_works(kv_bounds, qo_bounds, kv_granularity, max_split_per_batch)
    else:
        if not (heads == 16 or heads == 128 or (heads % 16 == 0 and 16 < heads < 128 and uni_seqlen_qo == 1)):
            raise RuntimeError(f"get_mla_metadata_v1 (v1_0_device.cuh): {HEAD_CHECK}, got {heads}")
        if uni_seqlen_qo < 1:
            raise RuntimeError(
                f"get_mla_metadata_v1 (v1_0_device.cuh): uni_seqlen_qo must be >= 1 (qo_start = bid * "
                f"uni_seqlen_qo), got {uni_seqlen_qo}"
            )
        if max_split_per_batch < 1:
            raise RuntimeError(
                f"get_mla_metadata_v1 (v1_0_device.cuh): max_split_per_batch must be >= 1 (the split "
                f"count is min(..., max_split_per_batch)), got {max_split_per_batch}"
            )
        works = intra_batch_works(kv_bounds, uni_seqlen_qo, kv_granularity, max_split_per_batch)
    write(
        works,
        batch,
        work_metadata_ptrs,
        work_info_set,
        work_indptr,
        reduce_indptr,
        reduce_final_map,
        reduce_partial_map,
    )


ZERO_SPLIT_BATCHES = []  # (kv_len,) of every batch v1_0 gave 0 splits, latest build only


def intra_batch_works(kv_bounds, uni_seqlen_qo, granularity, max_split_per_batch):
    """v1_0_device.cuh: per batch its own splits; an unsplit batch writes straight to the output."""
    works = []
    ZERO_SPLIT_BATCHES.clear()
    for b, (start, end) in enumerate(zip(kv_bounds, kv_bounds[1:])):
        kv_len = end - start
        splits = local_splits(kv_len, max_split_per_batch)
        if splits == 0:
            ZERO_SPLIT_BATCHES.append(kv_len)
        pieces = ranges(kv_len, max(splits, 1), granularity) if kv_len else [(0, 0)]
        qo_start = b * uni_seqlen_qo
        for a, z in pieces:
            works.append(
                [
                    b,
                    -2 if len(pieces) > 1 else -1,
                    qo_start,
                    qo_start + uni_seqlen_qo,
                    start + a,
                    start + z,
                    kv_len - z,
                    0,
                ]
            )
    return works


def fast_mode_works(kv_bounds, qo_bounds, granularity, max_split_per_batch):
    """v1_2 (fast_mode): the CU parts' budget shared by every batch, payload ceil(blocks / parts)."""
    parts = cu_num() if max_split_per_batch < 0 else min(cu_num(), max_split_per_batch * (len(kv_bounds) - 1))
    blocks = sum(-(-(z - a) // granularity) for a, z in zip(kv_bounds, kv_bounds[1:]))
    payload = max(1, -(-blocks // max(parts, 1)) + 1)
    works = []
    for b, (start, end) in enumerate(zip(kv_bounds, kv_bounds[1:])):
        kv_len = end - start
        splits = max(1, -(-(-(-kv_len // granularity)) // payload))
        pieces = ranges(kv_len, splits, granularity) if kv_len else [(0, 0)]
        for a, z in pieces:
            works.append(
                [b, -2 if len(pieces) > 1 else -1, qo_bounds[b], qo_bounds[b + 1], start + a, start + z, kv_len - z, 0]
            )
    return works


def write(
    works, batch, work_metadata_ptrs, work_info_set, work_indptr, reduce_indptr, reduce_final_map, reduce_partial_map
):
    """Lays the works out as aiter does: split works get partial_qo_loc slots, grouped per batch in the
    reduce maps; every buffer must hold what it is given (aiter would write past its end)."""
    partial_rows, reduce_groups, partial_map = 0, [], []
    for w in works:
        if w[1] == -2:
            w[1] = partial_rows
            partial_map.append(partial_rows)
            partial_rows += w[3] - w[2]
    for b in range(batch):
        mine = [w for w in works if w[0] == b]
        reduce_groups.append((mine[0][2], mine[0][3], sum(1 for w in mine if w[1] >= 0)))
    for name, need, have in (
        ("work_info_set", len(works), work_info_set.shape[0]),
        ("reduce_partial_map", len(partial_map), reduce_partial_map.numel()),
        ("reduce_final_map", batch, reduce_final_map.shape[0]),
        ("reduce_indptr", batch + 1, reduce_indptr.numel()),
    ):
        if need > have:
            raise RuntimeError(
                f"get_mla_metadata_v1: {name} holds {have} entries, this batch needs {need} "
                "(size it with get_mla_metadata_info_v1 for this batch and max_seqlen_qo)"
            )
    device = work_info_set.device
    work_info_set.zero_()
    if works:
        work_info_set[: len(works)] = torch.tensor(works, dtype=torch.int32).to(device)
    parts = work_indptr.numel() - 1
    per_part = -(-len(works) // parts)
    work_indptr.copy_(
        torch.tensor([min(i * per_part, len(works)) for i in range(parts + 1)], dtype=torch.int32).to(device)
    )
    indptr = [0]
    for _, _, n in reduce_groups:
        indptr.append(indptr[-1] + n)
    reduce_indptr.zero_()
    reduce_indptr[: batch + 1] = torch.tensor(indptr, dtype=torch.int32).to(device)
    reduce_final_map.zero_()
    reduce_final_map[:batch] = (
        torch.tensor([[a, z] for a, z, _ in reduce_groups], dtype=torch.int32).to(device).reshape(batch, 2)
    )
    reduce_partial_map.fill_(-1)
    if partial_map:
        reduce_partial_map[: len(partial_map)] = torch.tensor(partial_map, dtype=torch.int32).to(device)
