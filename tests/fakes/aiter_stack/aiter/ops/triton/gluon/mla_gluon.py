"""Fake of aiter/ops/triton/gluon/mla_gluon.py: same signature and input assertions as aiter's."""

from aiter._fake import CALLS, attend


def mla_gluon(q_nope, q_pe, kv_c, o, page_table, seq_info, sm_scale, k_pe=None, kv_pe_offset=512,
              use_2d_view=True, kv_scale=1.0, min_kv_seq_len=1, return_lse=False, has_pe=True, attn_sink=None):
    import torch

    CALLS.append(dict(kernel="mla_gluon", q_nope=q_nope, q_pe=q_pe, kv_c=kv_c, o=o, page_table=page_table,
                      seq_info=seq_info, sm_scale=sm_scale, k_pe=k_pe, kv_pe_offset=kv_pe_offset,
                      use_2d_view=use_2d_view, kv_scale=kv_scale, min_kv_seq_len=min_kv_seq_len,
                      return_lse=return_lse))
    assert q_nope.dtype == torch.bfloat16 and q_pe.dtype == torch.bfloat16, "mla_gluon: q must be bf16"
    assert kv_c.dtype == torch.float8_e4m3fn, "mla_gluon: kv must be float8_e4m3fn (fnuz is rejected)"
    assert isinstance(kv_scale, float), "mla_gluon: kv_scale is a Python float"
    q = torch.cat([q_nope, q_pe], dim=-1)
    attend("mla_gluon", q, kv_c, kv_scale, seq_info, page_table, sm_scale, o)
    return o
