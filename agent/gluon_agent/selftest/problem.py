"""MLA decode problems as a paged server has them: bf16 q, one fp8 e4m3fn latent KV head of 576
(512 latent + 64 rope) with a scale, page size 1 addressed through kv_indptr/kv_indices into a
larger, shuffled pool. Fresh random data every time; never zeros.

With q_len > 1 (speculative decoding's verify step, SGLang PR #37601) each sequence carries q_len query
tokens, flat in q as [B * q_len, H, 576] in (sequence, position) order, and its KV length counts them:
position i attends the first L - q_len + i + 1 tokens (the causal tail aiter's kernels apply)."""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass

import torch

D_LATENT = 512  # kv_lora_rank, also the value dim
D_ROPE = 64
D_QK = D_LATENT + D_ROPE  # 576
POOL_SLACK = 1.25  # the pool holds more tokens than the batch uses, as a server's does
KV_DTYPE = torch.float8_e4m3fn
GEN_CHUNK_ROWS = 65536


@dataclass
class Problem:
    q: torch.Tensor  # [B * q_len, H, 576] bf16
    kv: torch.Tensor  # [N, 576] float8_e4m3fn
    kv_scale: float
    kv_indptr: torch.Tensor  # [B+1] int32
    kv_indices: torch.Tensor  # [sum(lengths)] int32 token ids into kv
    sm_scale: float
    lengths: list[int]
    seed: int
    q_len: int = 1

    @property
    def batch(self) -> int:
        return len(self.lengths)

    @property
    def heads(self) -> int:
        return self.q.shape[1]

    @property
    def kv_bytes(self) -> int:
        """Bytes of fp8 KV the kernel must read at least once: every used token's 576 bytes."""
        return sum(self.lengths) * D_QK * self.kv.element_size()

    def new_output(self, poison: float = float("nan")) -> torch.Tensor:
        """An output buffer poisoned so that an element the kernel never wrote is caught."""
        return torch.full(
            (self.batch * self.q_len, self.heads, D_LATENT), poison, dtype=torch.bfloat16, device=self.q.device
        )


def make_problem(
    lengths: list[int], heads: int = 12, device: str | torch.device = "cpu", seed: int | None = None, q_len: int = 1
) -> Problem:
    if q_len < 1:
        raise ValueError(f"q_len must be at least 1, got {q_len}")
    if not lengths or min(lengths) < q_len:
        raise ValueError(
            f"every sequence needs at least one KV token per query token (q_len={q_len}), got lengths {lengths}"
        )
    seed = secrets.randbits(63) if seed is None else seed
    gen = torch.Generator(device=device).manual_seed(seed)
    cpu_gen = torch.Generator().manual_seed(seed)
    total = sum(lengths)
    pool = int(total * POOL_SLACK) + 16

    def uniform(lo: float, hi: float) -> float:
        return lo + (hi - lo) * torch.rand((), generator=cpu_gen).item()

    kv = torch.empty(pool, D_QK, dtype=KV_DTYPE, device=device)
    for row in range(0, pool, GEN_CHUNK_ROWS):  # chunks: the fp32 draw of a whole pool would be 4x its size
        rows = min(GEN_CHUNK_ROWS, pool - row)
        kv[row : row + rows] = torch.randn(rows, D_QK, generator=gen, device=device).to(KV_DTYPE)
    q = torch.randn(len(lengths) * q_len, heads, D_QK, generator=gen, device=device).to(torch.bfloat16)
    indices = torch.randperm(pool, generator=gen, device=device)[:total].to(torch.int32)
    indptr = torch.tensor([0] + list(_cumsum(lengths)), dtype=torch.int32, device=device)
    return Problem(
        q=q,
        kv=kv,
        kv_scale=uniform(0.25, 2.0),
        kv_indptr=indptr,
        kv_indices=indices,
        # The model's scale in production (never hard-coded); random around 1/sqrt(d) here.
        sm_scale=uniform(0.5, 1.5) / math.sqrt(D_QK),
        lengths=list(lengths),
        seed=seed,
        q_len=q_len,
    )


def _cumsum(values: list[int]):
    total = 0
    for v in values:
        total += v
        yield total
