"""Experiment: the portable kernel with fp8 tensor-core dots (q quantized per row to e4m3; P scaled by 256
into e4m3 for the value dot), against the fp16-dot kernel. Prints JSON: ms, ratio to the copy ceiling and
relative L2 error per variant and config, on 32 x 64K and 1 x 128K.

    PYTHONPATH=agent python bench/exp_fp8_dot.py   (needs a GPU; JSON on stdout, each row also on stderr)
"""

from __future__ import annotations

import itertools
import json
import sys

import torch
import triton
import triton.language as tl

from gluon_agent.selftest import timing, triton_mla
from gluon_agent.selftest.problem import D_LATENT, D_ROPE, Problem, make_problem
from gluon_agent.selftest.reference import mla_decode_reference
from gluon_agent.selftest.worker import rotations_for

P_SCALE = 256.0  # P in (0, 1] -> (0, 256]: keeps small probabilities above e4m3's subnormals


@triton.jit
def _split_fp8(
    Q8, Q_SCALE, KV, KV_INDPTR, KV_INDICES, PART_O, PART_LSE,
    qk_scale_log2, out_scale, num_heads, num_splits,
    stride_qb, stride_qh, stride_kv,
    stride_pb, stride_ps, stride_ph,
    stride_lb, stride_ls,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, D_NOPE: tl.constexpr, D_PE: tl.constexpr,
    PV_FP8: tl.constexpr, D_CHUNK: tl.constexpr,
):
    b = tl.program_id(0)
    s = tl.program_id(1)
    start = tl.load(KV_INDPTR + b)
    end = tl.load(KV_INDPTR + b + 1)
    per_split = tl.cdiv(tl.cdiv(end - start, num_splits), BLOCK_N) * BLOCK_N
    lo = start + s * per_split
    hi = tl.minimum(lo + per_split, end)

    offs_h = tl.arange(0, BLOCK_H)
    mask_h = offs_h < num_heads
    offs_d = tl.arange(0, D_NOPE)
    offs_r = tl.arange(0, D_PE)
    offs_c = tl.arange(0, D_CHUNK)
    q_row = Q8 + b * stride_qb + offs_h[:, None] * stride_qh
    q_pe = tl.load(q_row + D_NOPE + offs_r[None, :], mask=mask_h[:, None], other=0.0)
    row_scale = tl.load(Q_SCALE + b * num_heads + offs_h, mask=mask_h, other=0.0) * qk_scale_log2

    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, D_NOPE], dtype=tl.float32)
    for n0 in range(lo, hi, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < hi
        tok = tl.load(KV_INDICES + offs_n, mask=mask_n, other=0).to(tl.int64)
        row = KV + tok[:, None] * stride_kv
        k_pe = tl.load(row + D_NOPE + offs_r[None, :], mask=mask_n[:, None], other=0.0)
        qk = tl.dot(q_pe, tl.trans(k_pe))
        for c in tl.static_range(D_NOPE // D_CHUNK):
            q_c = tl.load(q_row + c * D_CHUNK + offs_c[None, :], mask=mask_h[:, None], other=0.0)
            k_c = tl.load(row + c * D_CHUNK + offs_c[None, :], mask=mask_n[:, None], other=0.0)
            qk = tl.dot(q_c, tl.trans(k_c), qk)
        v = tl.load(row + offs_d[None, :], mask=mask_n[:, None], other=0.0)
        qk = tl.where(mask_n[None, :], qk * row_scale[:, None], float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(qk - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if PV_FP8:
            acc = tl.dot((p * 256.0).to(tl.float8e4nv), v, acc * alpha[:, None])
        else:
            acc = tl.dot(p.to(tl.float16), v.to(tl.float16), acc * alpha[:, None])
        m_i = m_new

    empty = l_i == 0.0
    safe_l = tl.where(empty, 1.0, l_i)
    pv_scale = 1.0 / 256.0 if PV_FP8 else 1.0
    out = acc * (out_scale * pv_scale / safe_l)[:, None]
    lse = tl.where(empty, float("-inf"), m_i + tl.log2(safe_l))
    p_row = PART_O + b * stride_pb + s * stride_ps + offs_h[:, None] * stride_ph
    tl.store(p_row + offs_d[None, :], out, mask=mask_h[:, None])
    tl.store(PART_LSE + b * stride_lb + s * stride_ls + offs_h, lse, mask=mask_h)


def quantize_q(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scale = q.float().abs().amax(-1).clamp(min=1e-12) / 448.0  # [B, H]
    return (q.float() / scale[..., None]).to(torch.float8_e4m3fn), scale.contiguous()


def run_fp8(p: Problem, out: torch.Tensor, config: triton_mla.KernelConfig, pv_fp8: bool) -> None:
    q8, q_scale = quantize_q(p.q)
    batch, heads, _ = p.q.shape
    splits = triton_mla.split_count(batch, max(p.lengths), p.q.device, config)
    part_o = torch.empty(batch, splits, 16, D_LATENT, dtype=torch.float32, device=p.q.device)
    part_lse = torch.empty(batch, splits, 16, dtype=torch.float32, device=p.q.device)
    _split_fp8[(batch, splits)](
        q8, q_scale, p.kv, p.kv_indptr, p.kv_indices, part_o, part_lse,
        p.sm_scale * p.kv_scale * triton_mla.LOG2E, p.kv_scale, heads, splits,
        q8.stride(0), q8.stride(1), p.kv.stride(0),
        part_o.stride(0), part_o.stride(1), part_o.stride(2), part_lse.stride(0), part_lse.stride(1),
        BLOCK_H=16, BLOCK_N=config.block_n, D_NOPE=D_LATENT, D_PE=D_ROPE, PV_FP8=pv_fp8, D_CHUNK=config.d_chunk,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )
    triton_mla._reduce_kernel[(batch, heads, D_LATENT // 128)](
        part_o, part_lse, out, splits, part_o.stride(0), part_o.stride(1), part_o.stride(2),
        part_lse.stride(0), part_lse.stride(1), out.stride(0), out.stride(1), BLOCK_D=128, num_warps=4)


def variant(name: str, config: triton_mla.KernelConfig):
    if name == "fp16":
        return lambda p, o: triton_mla.mla_decode(p.q, p.kv, p.kv_scale, p.kv_indptr, p.kv_indices, p.sm_scale, o, max(p.lengths), config)
    return lambda p, o: run_fp8(p, o, config, pv_fp8=(name == "fp8-qk-pv"))


def main() -> None:
    device = torch.device("cuda:0")
    ceiling = timing.copy_ceiling_tbps(device, nbytes=2**30)
    rows = []
    for batch, kv_len in ((32, 65536), (1, 131072)):
        first = make_problem([kv_len] * batch, heads=12, device=device)
        problems = [first] + [make_problem([kv_len] * batch, heads=12, device=device) for _ in range(rotations_for(first, device) - 1)]
        ref = mla_decode_reference(first.q, first.kv, first.kv_scale, first.kv_indptr, first.kv_indices, first.sm_scale).double()
        base = triton_mla.config_for(batch)
        for name, (block_n, warps, stages, d_chunk) in itertools.product(
                ("fp16", "fp8-qk", "fp8-qk-pv"), ((128, 8, 2, 64), (64, 4, 2, 64), (64, 4, 3, 64), (128, 4, 2, 64), (64, 8, 2, 128), (32, 4, 3, 64))):
            config = triton_mla.KernelConfig(block_n, warps, stages, base.waves, base.min_tokens_per_split, d_chunk)
            run = variant(name, config)
            try:
                out = first.new_output()
                run(first, out)
                err = float((out.double() - ref).norm() / ref.norm())
                outs = [p.new_output() for p in problems]
                ms = timing.graph_ms_per_call([lambda p=p, o=o: run(p, o) for p, o in zip(problems, outs)])
            except Exception as exc:
                rows.append({"shape": f"{batch}x{kv_len}", "variant": name, "config": [block_n, warps, stages, d_chunk], "error": str(exc)[:300]})
                continue
            tbps = first.kv_bytes / (ms * 1e-3) / 1e12
            rows.append({"shape": f"{batch}x{kv_len}", "variant": name, "config": [block_n, warps, stages, d_chunk], "ms": round(ms, 4),
                         "ratio_to_ceiling": round(tbps / ceiling, 3), "rel_l2": err})
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
        del problems, first
        torch.cuda.empty_cache()
    print(json.dumps({"ceiling_tbps": ceiling, "gpu": torch.cuda.get_device_name(device), "triton": triton.__version__, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
