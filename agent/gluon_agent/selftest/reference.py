"""fp32 torch reference of MLA decode on the dequantized KV (the same fp8 values the kernels read)."""

from __future__ import annotations

import torch

from .problem import D_LATENT


def mla_decode_reference(
    q: torch.Tensor,
    kv: torch.Tensor,
    kv_scale: float,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    sm_scale: float,
    q_len: int = 1,
) -> torch.Tensor:
    """out[b*q_len+i, h] = softmax(sm_scale * q[b*q_len+i, h] . K_t) @ V_t over the first L_b - q_len + i + 1
    tokens t of kv_indices[kv_indptr[b]:kv_indptr[b+1]], with K_t = kv[t] * kv_scale (576) and V_t its first
    512. Causal within the q block: query position i sees the tokens before it and itself, as aiter's
    mla_gluon ("attends KV [0, seq_len-qlen+q_pos]") and mla_decode_fwd (causal=True, its default and
    SGLang's) do. One sequence at a time bounds memory."""
    bounds = kv_indptr.tolist()
    out = torch.empty(q.shape[0], q.shape[1], D_LATENT, dtype=torch.float32, device=q.device)
    for b in range(len(bounds) - 1):
        tokens = kv_indices[bounds[b] : bounds[b + 1]].long()
        keys = kv[tokens].float() * kv_scale  # [L, 576]
        for i in range(q_len):
            seen = len(tokens) - q_len + i + 1
            row = b * q_len + i
            scores = (q[row].float() @ keys[:seen].T) * sm_scale  # [H, seen]
            out[row] = torch.softmax(scores, dim=-1) @ keys[:seen, :D_LATENT]
    return out
