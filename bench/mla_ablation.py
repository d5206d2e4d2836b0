"""Where the portable MLA decode kernel's time goes (NVIDIA or AMD GPU). Prints JSON.

    PYTHONPATH=agent python3 bench/mla_ablation.py --json
    PYTHONPATH=agent python3 bench/mla_ablation.py --once 32 65536   # three plain calls, for a profiler:
    PYTHONPATH=agent ncu --clock-control none -k regex:_split_kernel -s 2 -c 1 --section WarpStateStats \
        --section SourceCounters -o split python3 bench/mla_ablation.py --once 32 65536   # then bench/ncu_stalls.py

Each variant is generated from triton_mla._split_kernel's own source by text substitution (one stage
left out, or done another way), so no second copy of the kernel is kept; a substitution that no longer
matches the kernel is an error naming it. Timed like bench/mla_decode.py (graph replay over rotating
inputs, median). Variants that leave a stage out compute wrong answers on purpose: their rel_l2 shows it.
Each shape also times today's kernel under earlier configs and split rules (PREVIOUS), so a config
change stays an A/B anyone can rerun.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import inspect
import json
import math
import sys
import tempfile
from pathlib import Path
from typing import Callable

import torch

from gluon_agent.selftest import timing, triton_mla
from gluon_agent.selftest.problem import make_problem

sys.path.insert(0, str(Path(__file__).parent))
from mla_decode import (
    HEADS,
    kernel_mode,
    rel_l2,
    replacing,
    report_json,
    rotating_problems,
    time_mode,
    using_split_count,
)

WORDS_INIT = (
    "    zero = tl.zeros([BLOCK_H, GROUP], dtype=tl.float32)\n"
    "    a0, a1, a2, a3, b0, b1, b2, b3 = zero, zero, zero, zero, zero, zero, zero, zero\n"
    "    c0, c1, c2, c3, d0, d1, d2, d3 = zero, zero, zero, zero, zero, zero, zero, zero\n"
)
WORDS_LOAD = (
    "        word_row = kv_words + tok[:, None] * (stride_kv // 4) + offs_w[None, :]\n"
    "        wa = tl.load(word_row, mask=mask_n[:, None], other=0)\n"
    "        wb = tl.load(word_row + GROUP, mask=mask_n[:, None], other=0)\n"
    "        wc = tl.load(word_row + 2 * GROUP, mask=mask_n[:, None], other=0)\n"
    "        wd = tl.load(word_row + 3 * GROUP, mask=mask_n[:, None], other=0)\n"
)
WORDS_DOTS = (
    "        a0, a1, a2, a3 = _value_products(p, alpha, wa, a0, a1, a2, a3, DOT_DTYPE)\n"
    "        b0, b1, b2, b3 = _value_products(p, alpha, wb, b0, b1, b2, b3, DOT_DTYPE)\n"
    "        c0, c1, c2, c3 = _value_products(p, alpha, wc, c0, c1, c2, c3, DOT_DTYPE)\n"
    "        d0, d1, d2, d3 = _value_products(p, alpha, wd, d0, d1, d2, d3, DOT_DTYPE)\n"
)
WORDS_JOIN = (
    "    W: tl.constexpr = 4 * GROUP  # features in a column group\n"
    "    ab = _concat(_feature_order(a0, a1, a2, a3, BLOCK_H, W), _feature_order(b0, b1, b2, b3, BLOCK_H, W), "
    "BLOCK_H, W)\n"
    "    cd = _concat(_feature_order(c0, c1, c2, c3, BLOCK_H, W), _feature_order(d0, d1, d2, d3, BLOCK_H, W), "
    "BLOCK_H, W)\n"
    "    acc = _concat(ab, cd, BLOCK_H, 2 * W)\n"
)
QUARTER_INIT = "".join(f"    acc{r} = tl.zeros([BLOCK_H, D_NOPE // 4], dtype=tl.float32)\n" for r in range(4))
QUARTER_JOIN = "    acc = _feature_order(acc0, acc1, acc2, acc3, BLOCK_H, D_NOPE)\n"
LATENT_QK = "        for c in tl.static_range(D_NOPE // D_CHUNK):\n"
ODD_SLICES = "                qk_odd = tl.dot(q_c, tl.trans(k_c), qk_odd)\n"
VARIANTS: dict[str, list[tuple[str, str]]] = {
    "kernel": [],
    # the value product left out (p still summed): loads + QK + softmax
    "no_value_product": [
        (WORDS_LOAD, ""),
        (WORDS_DOTS, "        a0 = a0 * alpha[:, None] + tl.sum(p.to(tl.float32), 1)[:, None]\n"),
        (WORDS_JOIN, "    acc = tl.zeros([BLOCK_H, D_NOPE], dtype=tl.float32) + tl.sum(a0, 1)[:, None]\n"),
    ],
    # v12's and earlier row sums: summed across warps every tile
    "row_sums_per_tile": [
        (
            "    l_acc = tl.zeros([BLOCK_H, BLOCK_N], dtype=tl.float32)\n",
            "    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)\n",
        ),
        ("        l_acc = l_acc * alpha[:, None] + p\n", "        l_i = l_i * alpha + tl.sum(p, 1)\n"),
        ("    l_i = tl.sum(l_acc, 1)\n", ""),
    ],
    # the 512-wide latent QK left out (rope part only): loads + PV + softmax
    "no_latent_qk": [(LATENT_QK, "        for c in tl.static_range(0):\n")],
    # v6's and earlier latent QK: every slice accumulates into one chain
    "one_qk_chain": [(ODD_SLICES, "                qk = tl.dot(q_c, tl.trans(k_c), qk)\n")],
    # v8 to v11's value tile: all 128 words in one group, four products of 128 features
    "one_word_group": [
        (WORDS_INIT, QUARTER_INIT),
        (
            WORDS_LOAD,
            "        w = tl.load(kv_words + tok[:, None] * (stride_kv // 4) + tl.arange(0, D_NOPE // 4)[None, :],"
            " mask=mask_n[:, None], other=0)\n"
            + "".join(f"        v{r} = _byte_as_dot(w, {r}, DOT_DTYPE)\n" for r in range(4)),
        ),
        (WORDS_DOTS, "".join(f"        acc{r} = tl.dot(p, v{r}, acc{r} * alpha[:, None])\n" for r in range(4))),
        (WORDS_JOIN, QUARTER_JOIN),
    ],
    # each word group loaded after the softmax, right before its products (tried on v12: 172 registers)
    "words_after_softmax": [
        (WORDS_LOAD, ""),
        (
            WORDS_DOTS,
            "        word_row = kv_words + tok[:, None] * (stride_kv // 4) + offs_w[None, :]\n"
            + "".join(
                f"        {g}0, {g}1, {g}2, {g}3 = _value_products(p, alpha, tl.load(word_row + {i} * GROUP, "
                f"mask=mask_n[:, None], other=0), {g}0, {g}1, {g}2, {g}3, DOT_DTYPE)\n"
                for i, g in enumerate("abcd")
            ),
        ),
    ],
    # v4 to v7's value tile: 16-bit feature pairs through a transposing ldmatrix, two half-width products
    "pair_value_tile": [
        (WORDS_LOAD, ""),
        (
            WORDS_INIT,
            "    acc_even = tl.zeros([BLOCK_H, D_NOPE // 2], dtype=tl.float32)\n"
            "    acc_odd = tl.zeros([BLOCK_H, D_NOPE // 2], dtype=tl.float32)\n"
            "    kv_pairs = KV.to(tl.pointer_type(tl.uint16), bitcast=True)\n"
            "    offs_p = tl.arange(0, D_NOPE // 2)\n",
        ),
        (
            WORDS_DOTS,
            "        w = tl.load(kv_pairs + tok[:, None] * (stride_kv // 2) + offs_p[None, :], mask=mask_n[:, None], "
            "other=0)\n"
            "        v_even = (w & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(DOT_DTYPE)\n"
            "        v_odd = (w >> 8).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(DOT_DTYPE)\n"
            "        acc_even = tl.dot(p, v_even, acc_even * alpha[:, None])\n"
            "        acc_odd = tl.dot(p, v_odd, acc_odd * alpha[:, None])\n",
        ),
        (WORDS_JOIN, "    acc = tl.reshape(tl.join(acc_even, acc_odd), [BLOCK_H, D_NOPE])\n"),
    ],
    # v1 to v3's value tile: one fp8 [tokens, 512] load, fed to the product by byte-wise shared loads
    "byte_value_tile": [
        (WORDS_LOAD, ""),
        (WORDS_INIT, "    acc = tl.zeros([BLOCK_H, D_NOPE], dtype=tl.float32)\n"),
        (
            WORDS_DOTS,
            "        v = tl.load(row + offs_d[None, :], mask=mask_n[:, None], other=0.0).to(DOT_DTYPE)\n"
            "        acc = tl.dot(p, v, acc * alpha[:, None])\n",
        ),
        (WORDS_JOIN, ""),
    ],
    # tried on v9: the fp8 tile in feature order, converted in adjacent-feature pairs, then split four ways
    # by tl.split (no byte extraction: 1555 instructions per tile and warp against 1658, but slower)
    "split_value_tile": [
        (WORDS_LOAD, ""),
        (WORDS_INIT, QUARTER_INIT),
        (
            WORDS_DOTS,
            "        v = tl.load(row + offs_d[None, :], mask=mask_n[:, None], other=0.0).to(DOT_DTYPE)\n"
            "        v_even, v_odd = tl.split(tl.reshape(v, [BLOCK_N, D_NOPE // 4, 2, 2]))\n"
            "        v0, v2 = tl.split(v_even)\n"
            "        v1, v3 = tl.split(v_odd)\n"
            + "".join(f"        acc{r} = tl.dot(p, v{r}, acc{r} * alpha[:, None])\n" for r in range(4)),
        ),
        (WORDS_JOIN, QUARTER_JOIN),
    ],
}
SHAPES = [(32, 65536), (1, 131072), (4, 32768)]


def v9_split_count(batch: int, max_kv_len: int, device: torch.device, config: triton_mla.KernelConfig) -> int:
    """v9's split rule: 8 waves of programs per SM (2 below batch 8), at least 256 tokens a split."""
    waves = 2 if batch < 8 else 8
    return max(1, min(math.ceil(waves * triton_mla.multiprocessors(device) / batch), math.ceil(max_kv_len / 256)))


@dataclasses.dataclass(frozen=True)
class Previous:
    """A config or split rule used before, timed with today's kernel: a change stays an A/B anyone can rerun."""

    label: str
    config: triton_mla.KernelConfig
    split_count: Callable[[int, int, torch.device, triton_mla.KernelConfig], int] = triton_mla.split_count


PREVIOUS = [
    Previous("v9 split rule", triton_mla.DEFAULT_CONFIG, v9_split_count),
    Previous("64-wide QK slices", dataclasses.replace(triton_mla.DEFAULT_CONFIG, d_chunk=64)),
]


def variant_kernel(name: str, workdir: Path):
    source = inspect.getsource(triton_mla)
    for old, new in VARIANTS[name]:
        if old not in source:
            raise SystemExit(f"mla_ablation: variant {name!r} no longer matches triton_mla.py: {old.strip()!r}")
        source = source.replace(old, new)
    path = workdir / f"ablation_{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"gluon_agent.selftest.ablation_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look themselves up there
    spec.loader.exec_module(module)
    return module._split_kernel


def using_kernel(kernel) -> contextlib.AbstractContextManager[None]:
    """triton_mla.mla_decode launches `kernel` instead of its own split kernel, until the block ends."""
    return replacing("_split_kernel", kernel)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", action="store_true", help="print JSON (the only output format)")
    parser.add_argument(
        "--once",
        nargs=2,
        type=int,
        metavar=("BATCH", "KV_LEN"),
        help="only run the kernel three times on one shape (for a profiler)",
    )
    args = parser.parse_args()
    device = torch.device("cuda:0")
    if args.once:
        p = make_problem([args.once[1]] * args.once[0], heads=HEADS, device=device)
        out, run = p.new_output(), kernel_mode("native-12", None)
        for _ in range(3):
            run(p, out)
        torch.cuda.synchronize()
        print(json.dumps({"ran": args.once, "rel_l2": rel_l2(p, run)}))
        return
    ceiling = timing.copy_ceiling_tbps(device)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        kernels = {name: variant_kernel(name, Path(tmp)) for name in VARIANTS}
        for batch, kv_len in SHAPES:
            problems = rotating_problems(batch, kv_len, device)
            first = problems[0]
            config = triton_mla.default_config()
            runs = [(name, kernel, config, triton_mla.split_count) for name, kernel in kernels.items()]
            runs += [(f"kernel, {prev.label}", kernels["kernel"], prev.config, prev.split_count) for prev in PREVIOUS]
            for name, kernel, run_config, rule in runs:
                run = kernel_mode("native-12", run_config)
                with using_kernel(kernel), using_split_count(rule):
                    ms = time_mode(problems, run)
                    err = rel_l2(first, run)
                tbps = timing.tbps(first.kv_bytes, ms)
                splits = rule(batch, kv_len, device, run_config)
                rows.append(
                    {
                        "batch": batch,
                        "kv_len": kv_len,
                        "variant": name,
                        "splits": splits,
                        "config": dataclasses.asdict(run_config),
                        "ms": ms,
                        "ratio_to_ceiling": tbps / ceiling,
                        "rel_l2": err,
                        "registers": getattr(triton_mla.last_split_launch, "n_regs", None),
                    }
                )
            del problems, first
            torch.cuda.empty_cache()
    print(report_json("mla_ablation", device, {"ceiling_tbps": ceiling, "cases": rows}))


if __name__ == "__main__":
    main()
