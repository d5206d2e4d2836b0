"""The gather ceiling: how fast any kernel can merely *read* the KV rows a decode call must read, through
the same shuffled kv_indices, doing no arithmetic but an XOR (so no byte can be skipped). Prints JSON.

    python bench/gather_ceiling.py --json

The copy ceiling (`timing.copy_ceiling_tbps`) streams contiguous memory; a paged decode gathers one
576-byte row per token from anywhere in a pool larger than the batch. This bench separates what the
access pattern costs from what the kernel costs: per shape, the best of a grid of plain-load gather
kernels over the shuffled indices, and over contiguous indices (rows in pool order) on the same pool.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import triton
import triton.language as tl

from gluon_agent.selftest import timing, triton_mla
from gluon_agent.selftest.problem import D_LATENT, D_ROPE, Problem

ROW_WORDS = (D_LATENT + D_ROPE) // 4  # a KV row as 32-bit words: 128 latent + 16 rope
LATENT_WORDS = D_LATENT // 4


@dataclass(frozen=True)
class GatherConfig:
    block_t: int  # rows per step
    num_warps: int
    num_stages: int
    tiles_per_program: int  # 0: as many programs as `waves` x SMs, each walking a range of rows
    waves: float = 8.0


GRID = [
    GatherConfig(block_t, warps, stages, tiles)
    for block_t, warps, stages, tiles in itertools.product((32, 64), (4, 8), (1, 3), (0, 1, 8))
]


@triton.jit
def _gather_xor_kernel(KV_WORDS, INDICES, OUT, n_rows, per_program, row_stride_words,
                       BLOCK_T: tl.constexpr, LATENT: tl.constexpr, ROPE: tl.constexpr):
    pid = tl.program_id(0)
    lo = pid * per_program
    hi = tl.minimum(lo + per_program, n_rows)
    offs_l = tl.arange(0, LATENT)
    offs_r = tl.arange(0, ROPE)
    acc_l = tl.zeros([BLOCK_T, LATENT], dtype=tl.int32)
    acc_r = tl.zeros([BLOCK_T, ROPE], dtype=tl.int32)
    for t0 in range(lo, hi, BLOCK_T):
        offs_t = t0 + tl.arange(0, BLOCK_T)
        mask_t = offs_t < hi
        tok = tl.load(INDICES + offs_t, mask=mask_t, other=0).to(tl.int64)
        row = KV_WORDS + tok[:, None] * row_stride_words
        acc_l ^= tl.load(row + offs_l[None, :], mask=mask_t[:, None], other=0)
        acc_r ^= tl.load(row + LATENT + offs_r[None, :], mask=mask_t[:, None], other=0)
    folded = tl.xor_sum(tl.xor_sum(acc_l, 1), 0) ^ tl.xor_sum(tl.xor_sum(acc_r, 1), 0)
    tl.store(OUT + pid, folded)


def programs_for(n_rows: int, config: GatherConfig, device: torch.device) -> tuple[int, int]:
    """(programs, rows per program), rows per program a whole number of steps."""
    if config.tiles_per_program:
        per_program = config.tiles_per_program * config.block_t
    else:
        target = max(1, int(config.waves * triton_mla.multiprocessors(device)))
        per_program = triton.cdiv(triton.cdiv(n_rows, target), config.block_t) * config.block_t
    return triton.cdiv(n_rows, per_program), per_program


def gather_xor(kv: torch.Tensor, indices: torch.Tensor, config: GatherConfig, out: torch.Tensor | None = None) -> torch.Tensor:
    """XOR of every 32-bit word of the rows kv[indices], one partial per program (fold them with xor)."""
    if kv.shape[-1] != 4 * ROW_WORDS or kv.stride(0) % 4 or kv.stride(-1) != 1:
        raise ValueError(f"gather_xor: kv {tuple(kv.shape)} stride {kv.stride()} is not rows of 576 bytes in whole words")
    programs, per_program = programs_for(indices.numel(), config, kv.device)
    if out is None:
        out = torch.empty(programs, dtype=torch.int32, device=kv.device)
    words = kv.view(torch.uint8).view(torch.int32)
    _gather_xor_kernel[(programs,)](
        words, indices, out, indices.numel(), per_program, kv.stride(0) // 4,
        BLOCK_T=config.block_t, LATENT=LATENT_WORDS, ROPE=ROW_WORDS - LATENT_WORDS,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )
    return out


def fold_xor(partials: torch.Tensor) -> int:
    value = 0
    for word in partials.cpu().tolist():
        value ^= word
    return value & 0xFFFFFFFF


def gather_ms(problems: list[Problem], config: GatherConfig, contiguous: bool) -> float:
    calls = []
    for p in problems:
        indices = torch.arange(p.kv_indices.numel(), dtype=torch.int32, device=p.kv.device) if contiguous else p.kv_indices
        out = torch.empty(programs_for(indices.numel(), config, p.kv.device)[0], dtype=torch.int32, device=p.kv.device)
        calls.append(lambda p=p, indices=indices, out=out: gather_xor(p.kv, indices, config, out))
    return timing.graph_ms_per_call(calls)


def best_gather(problems: list[Problem], contiguous: bool, grid: list[GatherConfig] = GRID) -> dict:
    """The fastest config of the grid: {"tbps", "ms", "config", "grid": [...]}. Bytes are the call's KV rows."""
    nbytes = problems[0].kv_bytes
    rows = []
    for config in grid:
        ms = gather_ms(problems, config, contiguous)
        rows.append({"config": dataclasses.asdict(config), "ms": ms, "tbps": timing.tbps(nbytes, ms)})
    best = max(rows, key=lambda row: row["tbps"])
    return {"tbps": best["tbps"], "ms": best["ms"], "config": best["config"], "grid": rows}


def main() -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    import mla_decode  # the recorded benchmark's shapes, problems and report format

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", action="store_true", help="print JSON (the only output format)")
    parser.parse_args()
    device = torch.device("cuda:0")
    ceiling = timing.copy_ceiling_tbps(device, nbytes=2**30)
    shapes = []
    for batch, kv_len in mla_decode.SHAPES:
        problems = mla_decode.rotating_problems(batch, kv_len, device)
        first = problems[0]
        expected = fold_xor(gather_xor(first.kv, first.kv_indices, GRID[0]))
        assert all(fold_xor(gather_xor(first.kv, first.kv_indices, c)) == expected for c in GRID), "a config skipped rows"
        shaped = {"batch": batch, "kv_len": kv_len, "kv_bytes": first.kv_bytes, "pool_rows": first.kv.shape[0]}
        for name, contiguous in (("shuffled", False), ("contiguous", True)):
            best = best_gather(problems, contiguous)
            shaped[name] = {**best, "ratio_to_copy_ceiling": best["tbps"] / ceiling}
        shapes.append(shaped)
        del problems, first
        torch.cuda.empty_cache()
    print(mla_decode.report_json("gather_ceiling", device, {"copy_ceiling_tbps": ceiling, "shapes": shapes}))


if __name__ == "__main__":
    main()
