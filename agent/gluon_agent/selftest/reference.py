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
) -> torch.Tensor:
    """out[b,h] = softmax(sm_scale * q[b,h] . K_t) @ V_t over t in kv_indices[kv_indptr[b]:kv_indptr[b+1]],
    with K_t = kv[t] * kv_scale (576) and V_t = its first 512. One sequence at a time bounds memory."""
    bounds = kv_indptr.tolist()
    out = torch.empty(len(bounds) - 1, q.shape[1], D_LATENT, dtype=torch.float32, device=q.device)
    for b in range(len(bounds) - 1):
        tokens = kv_indices[bounds[b] : bounds[b + 1]].long()
        keys = kv[tokens].float() * kv_scale  # [L, 576]
        scores = (q[b].float() @ keys.T) * sm_scale  # [H, L]
        out[b] = torch.softmax(scores, dim=-1) @ keys[:, :D_LATENT]
    return out
