"""The fake's kernel table: which MLA decode kernels aiter ships per GPU, and the lookup that picks one.

The tables are verbatim copies of aiter's hsa/<arch>/mla/mla_asm.csv (localcluster/gluon_localcluster/fakes/upstream/,
with their provenance). The lookup re-implements, for decode (prefill=0), what ROCm/aiter at e4048607 does in
csrc/py_itfs_cu/asm_mla.cu `mla_decode_stage1_asm_fwd` (the padding rules that map a request onto a table
row: q length padded to 4, gqa folded onto 16/32/64, causal forced on for one query token) and
`get_heuristic_kernel_mla` (exact match on every column, else `cannot get heuristic kernel!`).
"""

from __future__ import annotations

import csv
import functools
from dataclasses import dataclass
from pathlib import Path

TABLES = Path(__file__).resolve().parents[2] / "upstream"
CHECK_SITE = "/sgl-workspace/aiter/aiter_meta/csrc/py_itfs_cu/asm_mla.cu:193"  # where aiter raises it


@dataclass(frozen=True)
class Request:
    """One decode call as asm_mla.cu sees it."""

    q_type: str  # bf16 | fp8
    kv_type: str  # bf16 | fp8 | byte
    gqa: int  # q heads per KV head
    persistent: bool
    max_seqlen_q: int
    causal: bool
    lse: bool  # a final lse buffer was passed
    arch: str


@functools.lru_cache(maxsize=None)
def rows(arch: str) -> tuple[dict[str, str], ...]:
    path = TABLES / f"aiter-{arch}-mla_asm.csv"
    if not path.exists():
        raise RuntimeError(f"[AITER] fake: no MLA kernel table for {arch} (only gfx942 and gfx950 are copied)")
    with path.open() as handle:
        return tuple(csv.DictReader(handle))


def table_key(r: Request) -> dict[str, int | str]:
    """The columns asm_mla.cu looks up for this request, after its padding rules."""
    ps = 1 if r.persistent else 0
    causal = 1 if (r.causal or r.max_seqlen_q == 1) else 0  # one query token: the mask is a no-op
    seqlen, gqa = r.max_seqlen_q, r.gqa
    bf16, fp8 = r.q_type == "bf16", r.q_type == "fp8"
    if r.gqa == 128:
        seqlen = 0
        if bf16 and r.kv_type == "bf16" and r.arch == "gfx942":
            ps = 0
    elif r.gqa == 16:
        if bf16 and r.kv_type == "bf16":
            if r.persistent:
                seqlen = 4 if r.max_seqlen_q <= 4 else seqlen
            else:
                seqlen = 1 if r.max_seqlen_q == 1 else 4 if r.max_seqlen_q <= 4 else 8
        elif bf16 and r.kv_type in ("fp8", "byte"):
            if r.persistent and r.max_seqlen_q <= 4:
                seqlen = 4  # the only bf16-q / fp8-KV 16-head kernels are qSeqLen 4, persistent
        elif fp8:
            if r.max_seqlen_q in (1, 2):
                seqlen = r.max_seqlen_q
            elif r.max_seqlen_q <= 4:
                seqlen = 4
            elif r.persistent and r.arch == "gfx950":
                seqlen, gqa = 4, 32
            else:
                raise RuntimeError(
                    "[AITER] mla_decode_stage1_asm_fwd:only support gqa_ratio=16 fp8 mla decoding with "
                    "qo_len <= 4 and qo_len>4 in persistent mode on gfx950"
                )
    elif r.gqa == 32:
        if bf16 and r.kv_type == "bf16" and not r.persistent:
            seqlen = 0
        elif fp8 and r.kv_type == "fp8":
            if r.max_seqlen_q == 1:
                seqlen = 1
            elif r.max_seqlen_q >= 3 and r.persistent and r.arch == "gfx950":
                seqlen = 4
            elif r.max_seqlen_q == 2 and r.persistent:
                seqlen = 2
            else:
                raise RuntimeError(
                    "[AITER] mla_decode_stage1_asm_fwd: fp8/fp8 with gqa_ratio=32 only supports "
                    "decode_qlen=1,2 in persistent mode and decode_qlen>=3 in persistent mode on gfx950"
                )
    elif r.gqa == 64:
        if bf16 and r.kv_type == "bf16" and not r.persistent:
            seqlen = 1 if r.max_seqlen_q == 1 else 0
        elif fp8 and r.kv_type == "fp8":
            if not r.persistent:
                raise RuntimeError(
                    "[AITER] mla_decode_stage1_asm_fwd: fp8/fp8 with gqa_ratio=64 only supports persistent mode"
                )
            seqlen = 1 if r.max_seqlen_q == 1 else 4
    elif r.gqa == 8 and fp8 and r.kv_type == "fp8" and not r.persistent and r.max_seqlen_q == 1:
        seqlen = 1
    if r.arch == "gfx950" and r.persistent:
        packed = r.gqa * r.max_seqlen_q
        if bf16 and r.kv_type == "bf16" and (packed >= 128 or r.gqa > 64) and r.gqa != 48:
            seqlen, gqa = 4, 32
        elif bf16 and r.kv_type == "bf16" and (packed >= 64 or r.gqa >= 16):
            seqlen, gqa = 1, 64
        elif (
            fp8
            and r.kv_type == "fp8"
            and ((r.gqa == 32 and r.max_seqlen_q >= 4) or (r.gqa == 64 and r.max_seqlen_q >= 2) or r.gqa == 128)
        ):
            seqlen, gqa = 4, 32
        elif (
            fp8
            and r.kv_type == "fp8"
            and (
                (r.gqa == 16 and r.max_seqlen_q in (3, 4))
                or (r.gqa == 32 and r.max_seqlen_q in (2, 3))
                or (r.gqa == 64 and r.max_seqlen_q == 1)
            )
        ):
            seqlen, gqa = 4, 16
    lse = 1 if (r.lse and r.persistent) else 0  # only the persistent kernels take the lse buffer
    return {
        "qType": r.q_type,
        "kvType": r.kv_type,
        "Gqa": gqa,
        "ps": ps,
        "prefill": 0,
        "causal": causal,
        "qSeqLen": seqlen,
        "lse": lse,
        "cprr": 0,
    }


def lookup(r: Request) -> str:
    """The kernel aiter runs for this request, or aiter's RuntimeError."""
    key = table_key(r)
    for row in rows(r.arch):
        if all(str(value) == row.get(column, "0") for column, value in key.items()):
            return row["knl_name"]
    raise RuntimeError(
        f"[AITER] {CHECK_SITE} get_heuristic_kernel_mla: cannot get heuristic kernel! q_type:{key['qType']} "
        f"kv_type:{key['kvType']} gqa:{key['Gqa']} ps:{key['ps']} prefill:0 causal:{key['causal']} "
        f"qseqlen:{key['qSeqLen']} lse:{key['lse']} cprr:0"
    )
