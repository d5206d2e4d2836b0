"""Fake of aiter/ops/triton/gluon/mla_gluon.py (ROCm/aiter e4048607): same signature, the same asserts
(gfx950; 3-D q/o or SGLang PR #37601's 4-D [batch, qlen, nhead, dim]; head dims 512 and 64; bf16 q;
KV bf16 or exactly float8_e4m3fn, so fnuz is refused) and the same return, (o, lse)."""

from aiter._fake import CALLS, arch, attend


def mla_gluon(q_nope, q_pe, kv_c, o, page_table, seq_info, sm_scale, k_pe=None, kv_pe_offset=512,
              use_2d_view=True, kv_scale=1.0, min_kv_seq_len=1, return_lse=False, has_pe=True, attn_sink=None):
    import torch

    CALLS.append(dict(kernel="mla_gluon", q_nope=q_nope, q_pe=q_pe, kv_c=kv_c, o=o, page_table=page_table,
                      seq_info=seq_info, sm_scale=sm_scale, k_pe=k_pe, kv_pe_offset=kv_pe_offset,
                      use_2d_view=use_2d_view, kv_scale=kv_scale, min_kv_seq_len=min_kv_seq_len,
                      return_lse=return_lse))
    if k_pe is None:
        k_pe = kv_c
    assert q_nope.dim() in (3, 4), f"q_nope must be 3-D or 4-D, got {q_nope.dim()}-D"
    mtp = q_nope.dim() == 4
    if mtp:
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
    assert q_nope.dtype == torch.bfloat16 and q_pe.dtype == torch.bfloat16, \
        f"q_nope/q_pe must be bf16, got {q_nope.dtype}/{q_pe.dtype}"
    assert k_pe.dtype == kv_c.dtype, f"kv_c/k_pe must be {kv_c.dtype}, got {kv_c.dtype}/{k_pe.dtype}"
    assert tuple(q_pe.shape[:-1]) == tuple(q_nope.shape[:-1]) and tuple(o.shape) == tuple(q_nope.shape), \
        f"q_pe {tuple(q_pe.shape)} / o {tuple(o.shape)} do not match q_nope {tuple(q_nope.shape)}"
    assert not use_2d_view and seq_info.numel() == batch + 1, "fake models SGLang's 1-D view: kv_indptr [batch+1]"
    # a tensor scale would reach the Triton kernel as a pointer, not a value
    assert isinstance(kv_scale, float), "mla_gluon: kv_scale is a Python float"
    q = torch.cat([q_nope, q_pe], dim=-1).reshape(batch * qlen, nhead, -1)
    attend("mla_gluon", q, kv_c, kv_scale, seq_info, page_table, sm_scale, o, q_len=qlen)
    lse = torch.empty((batch, qlen, nhead), dtype=torch.float32, device=o.device) if return_lse else None
    return o, lse
