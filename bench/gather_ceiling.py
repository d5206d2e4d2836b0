"""The gather ceiling: how fast any kernel can merely *read* the KV rows a decode call must read, through
the same shuffled kv_indices, doing no arithmetic but an XOR (so no byte can be skipped). Prints JSON.

    python bench/gather_ceiling.py --json

The copy ceiling (`timing.copy_ceiling_tbps`) streams contiguous memory; a paged decode gathers one
576-byte row per token from anywhere in a pool larger than the batch. This bench separates what the
access pattern costs from what the kernel costs: per shape, the best of a grid of plain-load gather
kernels over the shuffled indices, and over contiguous indices (rows in pool order) on the same pool.

`split_floor` is the floor of the decode kernel's own design (split-KV, then a reduce step): programs that
take the split kernel's token ranges, read every row once and write a partial and a log-sum-exp per
split like it does, then the kernel's own reduce, with no arithmetic in between. A split-KV kernel with a
separate reduce does all of that and its arithmetic besides, so a speed target that the grid's best
(tile and warp shapes, half a wave to four waves of splits, fp32 or fp16 partials) misses is out of reach
for that design on the machine, unless a structure outside the grid reads faster.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

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
def _xor_of_rows(
    KV_WORDS, INDICES, lo, hi, row_stride_words, BLOCK_T: tl.constexpr, LATENT: tl.constexpr, ROPE: tl.constexpr
):
    """XOR of every 32-bit word of the rows INDICES[lo:hi] name."""
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
    return tl.xor_sum(tl.xor_sum(acc_l, 1), 0) ^ tl.xor_sum(tl.xor_sum(acc_r, 1), 0)


@triton.jit
def _gather_xor_kernel(
    KV_WORDS,
    INDICES,
    OUT,
    n_rows,
    per_program,
    row_stride_words,
    BLOCK_T: tl.constexpr,
    LATENT: tl.constexpr,
    ROPE: tl.constexpr,
):
    pid = tl.program_id(0)
    lo = pid * per_program
    hi = tl.minimum(lo + per_program, n_rows)
    tl.store(OUT + pid, _xor_of_rows(KV_WORDS, INDICES, lo, hi, row_stride_words, BLOCK_T, LATENT, ROPE))


@triton.jit
def _split_floor_kernel(
    KV_WORDS,
    KV_INDPTR,
    INDICES,
    OUT,
    PART_O,
    PART_LSE,
    num_heads,
    num_splits,
    row_stride_words,
    stride_pb,
    stride_ps,
    stride_ph,
    stride_lb,
    stride_ls,
    BLOCK_T: tl.constexpr,
    LATENT: tl.constexpr,
    ROPE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    D: tl.constexpr,
):
    # The split kernel's ranges, reads and writes (a partial per split, its log-sum-exp) with no arithmetic.
    b = tl.program_id(0)
    s = tl.program_id(1)
    lo, hi = triton_mla.split_range(KV_INDPTR, b, s, num_splits, BLOCK_T)
    folded = _xor_of_rows(KV_WORDS, INDICES, lo, hi, row_stride_words, BLOCK_T, LATENT, ROPE)
    tl.store(OUT + b * num_splits + s, folded)
    bit = (folded & 1).to(tl.float32)  # partials that depend on every word read
    offs_h = tl.arange(0, BLOCK_H)
    mask_h = offs_h < num_heads
    part = tl.zeros([BLOCK_H, D], dtype=tl.float32) + bit
    p_row = PART_O + b * stride_pb + s * stride_ps + offs_h[:, None] * stride_ph
    tl.store(p_row + tl.arange(0, D)[None, :], part.to(PART_O.dtype.element_ty), mask=mask_h[:, None])
    lse = tl.where(hi > lo, tl.zeros([BLOCK_H], dtype=tl.float32) + bit, float("-inf"))
    tl.store(PART_LSE + b * stride_lb + s * stride_ls + offs_h, lse, mask=mask_h)


def programs_for(n_rows: int, config: GatherConfig, device: torch.device) -> tuple[int, int]:
    """(programs, rows per program), rows per program a whole number of steps."""
    if config.tiles_per_program:
        per_program = config.tiles_per_program * config.block_t
    else:
        target = max(1, int(config.waves * triton_mla.multiprocessors(device)))
        per_program = triton.cdiv(triton.cdiv(n_rows, target), config.block_t) * config.block_t
    return triton.cdiv(n_rows, per_program), per_program


def gather_xor(
    kv: torch.Tensor, indices: torch.Tensor, config: GatherConfig, out: torch.Tensor | None = None
) -> torch.Tensor:
    """XOR of every 32-bit word of the rows kv[indices], one partial per program (fold them with xor)."""
    if kv.shape[-1] != 4 * ROW_WORDS or kv.stride(0) % 4 or kv.stride(-1) != 1:
        raise ValueError(
            f"gather_xor: kv {tuple(kv.shape)} stride {kv.stride()} is not rows of 576 bytes in whole words"
        )
    programs, per_program = programs_for(indices.numel(), config, kv.device)
    if out is None:
        out = torch.empty(programs, dtype=torch.int32, device=kv.device)
    words = kv.view(torch.uint8).view(torch.int32)
    _gather_xor_kernel[(programs,)](
        words,
        indices,
        out,
        indices.numel(),
        per_program,
        kv.stride(0) // 4,
        BLOCK_T=config.block_t,
        LATENT=LATENT_WORDS,
        ROPE=ROW_WORDS - LATENT_WORDS,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
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
        indices = (
            torch.arange(p.kv_indices.numel(), dtype=torch.int32, device=p.kv.device) if contiguous else p.kv_indices
        )
        out = torch.empty(programs_for(indices.numel(), config, p.kv.device)[0], dtype=torch.int32, device=p.kv.device)
        calls.append(lambda p=p, indices=indices, out=out: gather_xor(p.kv, indices, config, out))
    return timing.graph_ms_per_call(calls)


def best_gather(problems: list[Problem], contiguous: bool, grid: list[GatherConfig] = GRID) -> dict:
    """The fastest config of the grid: {"tbps", "ms", "config", "grid": [...]}. Bytes are the call's KV rows."""
    return best_of(grid, lambda config: gather_ms(problems, config, contiguous), problems[0].kv_bytes)


def best_of(grid: list, ms_of: Callable[[Any], float], nbytes: int) -> dict:
    rows = []
    for config in grid:
        ms = ms_of(config)
        rows.append({"config": dataclasses.asdict(config), "ms": ms, "tbps": timing.tbps(nbytes, ms)})
    best = max(rows, key=lambda row: row["tbps"])
    return {"tbps": best["tbps"], "ms": best["ms"], "config": best["config"], "grid": rows}


@dataclass(frozen=True)
class SplitFloorConfig:
    block_t: int
    num_warps: int
    num_stages: int
    waves: float  # split programs, in waves of the decode kernel's resident programs
    partial_dtype: str  # "float32" (the kernel's) or "float16"


def kernel_structure(config: triton_mla.KernelConfig = triton_mla.DEFAULT_CONFIG) -> SplitFloorConfig:
    """The floor config shaped like the decode kernel: its tile, warps and stages, one wave, fp32 partials."""
    return SplitFloorConfig(config.block_n, config.num_warps, config.num_stages, 1.0, "float32")


SPLIT_FLOOR_GRID = [
    SplitFloorConfig(block_t, warps, stages, waves, dtype)
    for (block_t, warps, stages), waves, dtype in itertools.product(
        ((32, 4, 1), (32, 4, 3), (64, 4, 2), (64, 8, 1), (64, 8, 3), (128, 8, 1), (64, 16, 1), (128, 16, 1)),
        (0.5, 1.0, 2.0, 4.0),
        ("float32", "float16"),
    )
]
assert kernel_structure() in SPLIT_FLOOR_GRID


@dataclass
class SplitFloorCall:
    """One problem's split-design floor call and the buffers it writes."""

    problem: Problem
    config: SplitFloorConfig
    splits: int
    folded: torch.Tensor  # [B * splits] int32: each split's XOR, for the check that no row was skipped
    part_o: torch.Tensor
    part_lse: torch.Tensor
    out: torch.Tensor

    @classmethod
    def build(cls, p: Problem, config: SplitFloorConfig) -> "SplitFloorCall":
        resident = triton_mla.resident_programs(p.q.device, triton_mla.DEFAULT_CONFIG)
        splits = triton_mla.splits_per_sequence(int(config.waves * resident), p.batch, max(p.lengths), config.block_t)
        part_o = torch.empty(
            p.batch,
            splits,
            triton_mla.HEAD_TILE,
            D_LATENT,
            dtype=getattr(torch, config.partial_dtype),
            device=p.q.device,
        )
        part_lse = torch.empty(p.batch, splits, triton_mla.HEAD_TILE, dtype=torch.float32, device=p.q.device)
        folded = torch.empty(p.batch * splits, dtype=torch.int32, device=p.q.device)
        return cls(p, config, splits, folded, part_o, part_lse, p.new_output())

    def __call__(self) -> None:
        p, c = self.problem, self.config
        _split_floor_kernel[(p.batch, self.splits)](
            p.kv.view(torch.uint8).view(torch.int32),
            p.kv_indptr,
            p.kv_indices,
            self.folded,
            self.part_o,
            self.part_lse,
            p.heads,
            self.splits,
            p.kv.stride(0) // 4,
            self.part_o.stride(0),
            self.part_o.stride(1),
            self.part_o.stride(2),
            self.part_lse.stride(0),
            self.part_lse.stride(1),
            BLOCK_T=c.block_t,
            LATENT=LATENT_WORDS,
            ROPE=ROW_WORDS - LATENT_WORDS,
            BLOCK_H=triton_mla.HEAD_TILE,
            D=D_LATENT,
            num_warps=c.num_warps,
            num_stages=c.num_stages,
        )
        triton_mla.reduce_partials(self.part_o, self.part_lse, self.out)


def best_split_floor(problems: list[Problem], grid: list[SplitFloorConfig] = SPLIT_FLOOR_GRID) -> dict:
    """The floor of the kernel's design: split-KV programs that read every row once and write their
    partials, then the kernel's own reduce step, with no arithmetic in between. Fastest config of the
    grid, plus `kernel_structure`: the grid's row shaped like the decode kernel."""
    expected = fold_xor(gather_xor(problems[0].kv, problems[0].kv_indices, GRID[0]))

    def ms_of(config: SplitFloorConfig) -> float:
        calls = [SplitFloorCall.build(p, config) for p in problems]
        calls[0]()
        if fold_xor(calls[0].folded) != expected:
            raise AssertionError(f"split floor {config} skipped rows")
        return timing.graph_ms_per_call(calls)

    best = best_of(grid, ms_of, problems[0].kv_bytes)
    structure = dataclasses.asdict(kernel_structure())
    best["kernel_structure"] = next(row for row in best["grid"] if row["config"] == structure)
    return best


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
        assert all(fold_xor(gather_xor(first.kv, first.kv_indices, c)) == expected for c in GRID), (
            "a config skipped rows"
        )
        shaped = {"batch": batch, "kv_len": kv_len, "kv_bytes": first.kv_bytes, "pool_rows": first.kv.shape[0]}
        for name, contiguous in (("shuffled", False), ("contiguous", True)):
            best = best_gather(problems, contiguous)
            shaped[name] = {**best, "ratio_to_copy_ceiling": best["tbps"] / ceiling}
        best = best_split_floor(problems)
        shaped["split_floor"] = {**best, "ratio_to_copy_ceiling": best["tbps"] / ceiling}
        shapes.append(shaped)
        del problems, first
        torch.cuda.empty_cache()
    print(mla_decode.report_json("gather_ceiling", device, {"copy_ceiling_tbps": ceiling, "shapes": shapes}))


if __name__ == "__main__":
    main()
