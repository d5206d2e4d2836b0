"""Fake of aiter.mla.mla_decode_fwd (the zero-pad fallback path SGLang rolls back to)."""

from aiter._fake import CALLS, attend


def mla_decode_fwd(q, kv_buffer, o, qo_indptr, kv_indptr, kv_indices, kv_last_page_lens, max_seqlen_q,
                   page_size=1, nhead_kv=1, sm_scale=None, logit_cap=0.0, num_kv_splits=None,
                   num_kv_splits_indptr=None, work_meta_data=None, work_indptr=None, work_info_set=None,
                   reduce_indptr=None, reduce_final_map=None, reduce_partial_map=None, q_scale=None,
                   kv_scale=None, intra_batch_mode=False):
    CALLS.append(dict(kernel="mla_decode_fwd", q=q, kv_buffer=kv_buffer, o=o, qo_indptr=qo_indptr,
                      kv_indptr=kv_indptr, kv_indices=kv_indices, kv_last_page_lens=kv_last_page_lens,
                      max_seqlen_q=max_seqlen_q, page_size=page_size, nhead_kv=nhead_kv, sm_scale=sm_scale,
                      q_scale=q_scale, kv_scale=kv_scale))
    assert q.shape[1] % 16 == 0, "mla_decode_fwd: cannot get heuristic kernel for gqa %d" % q.shape[1]
    assert kv_buffer.dim() == 4 and kv_buffer.shape[1:3] == (1, 1), "kv_buffer must be [N,1,1,576]"
    scale = 1.0 if kv_scale is None else float(kv_scale.reshape(-1)[0])
    attend("mla_decode_fwd", q, kv_buffer.view(kv_buffer.shape[0], -1), scale, kv_indptr, kv_indices, sm_scale, o)
    return o
