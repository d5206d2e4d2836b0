"""What the self-test runs and how it judges: plain data and pure functions (stdlib only, so the
agent daemon can read verdicts without importing torch)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable

# ---------------------------------------------------------------- thresholds (stated in every report)
# Errors are against an fp32 reference on the *same* dequantized fp8 KV, so only bf16 rounding of q, P
# and the output remains: bf16 operands land between 1e-3 and 1e-2 relative L2. aiter PR #4480 reports
# 0.26% max relative error for its Gluon kernel. Dropping one token of 129 costs ~9% (1/sqrt(L)).
REL_L2_MAX = 2e-2
# aiter's own test bound for fp8 KV: cos_diff = 1 - 2<x,y>/(|x|^2+|y|^2) (FlashMLA's cal_diff).
COS_DIFF_MAX = 3e-2
# Graph replay at long context may cost at most this much over eager (catches aiter PR #4555's bug:
# splits frozen at capture made a 100k-token decode thousands of µs instead of tens).
GRAPH_REPLAY_MAX_RATIO = 1.3
# Graph replay must reproduce eager's answers (different split counts reorder fp32 sums only).
GRAPH_VS_EAGER_REL_MAX = 1e-2
# The accelerated path must not be slower than the fallback (geometric mean over timed shapes) where
# it is the real aiter pair; the portable kernel's two modes are the same kernel, so no speed gate there.
MIN_SPEEDUP = {"aiter": 1.0, "triton": None}
MEMORY_LIMIT_BYTES = 4 * 2**30
POISON = 2.0**100  # exactly representable in bf16, never a real output here
GiB = 2**30
RESULT_MARKER = "GLUON_SELFTEST_RESULT "  # child stdout line carrying the result JSON
PROGRESS_MARKER = "GLUON_SELFTEST_PROGRESS "  # child stdout line naming the step it starts


@dataclass(frozen=True)
class Case:
    name: str
    lengths: tuple[int, ...]  # KV tokens per sequence, its q_len new ones included
    timed: bool = False
    q_len: int = 1


GPU_CASES = (
    Case("single-token", (1,) * 8),
    Case("edge-127", (127,) * 4),
    Case("edge-128", (128,) * 4),
    Case("edge-129", (129,) * 4),
    Case("mixed", (1, 17, 127, 128, 129, 1000, 4097, 9000)),
    Case("long-b1-128k", (131072,), timed=True),
    Case("long-b32-64k", (65536,) * 32, timed=True),
)
GPU_GRAPH_BATCH = 4
GPU_GRAPH_LENGTHS = (32768, 8192, 1024)  # captured at the first (largest), replayed at all three

# Speculative decoding's verify step (MTP): q_len query tokens per sequence, causal among themselves.
# Which q_lens run comes from the serving config (sglang_routes.ServingConfig); until the operator
# delivers one, 2..4. aiter's only bf16-q / fp8-KV 16-head kernel pads q_len up to 4 and no further
# (hsa/gfx950/mla/mla_asm.csv): a longer verify (DSpark block 7: q_len 8) has no flag-0 route there.
MTP_Q_LENS = (2, 3, 4)
MTP_MAX_Q_LEN = 16
GPU_MTP_LENGTHS = (129, 4097, 9000)  # 3 sequences: 17 splits at every q_len 2..4, one compile (16 would be another)
CPU_MTP_LENGTHS = (5, 33)

# Tiny shapes for TRITON_INTERPRET=1 on the CPU (the interpreter's block is 16 tokens).
CPU_CASES = (
    Case("single-token", (1, 1)),
    Case("block-edges", (15, 16, 17)),
    Case("mixed", (1, 5, 33, 100)),
    Case("long", (300,)),
)


def mtp_cases(q_lens: Iterable[int], on_gpu: bool) -> tuple[Case, ...]:
    lengths = GPU_MTP_LENGTHS if on_gpu else CPU_MTP_LENGTHS
    return tuple(Case(f"mtp-q{n}", lengths, q_len=n) for n in q_lens)


def parse_q_lens(text: str) -> tuple[int, ...]:
    """ "2,3,4" -> (2, 3, 4); an empty string is no MTP cases. Each between 2 and MTP_MAX_Q_LEN."""
    values = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        if not part.isdigit() or not 2 <= int(part) <= MTP_MAX_Q_LEN:
            raise ValueError(f"MTP q_len {part!r} in {text!r}: each must be an integer from 2 to {MTP_MAX_Q_LEN}")
        values.append(int(part))
    return tuple(sorted(set(values)))


def path_plan(
    backend_set: str, routes_by_flag: dict[str, dict[str, Any]], q_lens: Iterable[int]
) -> dict[str, dict[str, Any]]:
    """What each path runs: the serving config's q_lens > 1 as extra cases, and for aiter the route its
    flag takes at each q_len (sglang_routes.flag_routes: accelerated is flag 1, fallback flag 0). The
    portable kernel stands in for both routes and runs every q_len on both paths."""
    extra = [q for q in q_lens if q > 1]
    plans = {}
    for path, flag in (("accelerated", "1"), ("fallback", "0")):
        routes = routes_by_flag.get(flag, {}) if backend_set == "aiter" else {}
        plans[path] = {
            "q_lens": extra,
            "routes": routes,
            "no_route": [
                f"q_len {q}: {r['aborts']}"
                for q, r in sorted(routes.items(), key=lambda kv: int(kv[0]))
                if r.get("aborts")
            ],
        }
    return plans


def no_route_reason(flag: str, planned: dict[str, Any]) -> str | None:
    """The first route of this path known to abort or be refused, with its evidence, or None."""
    for q_len, route in sorted(planned.get("routes", {}).items(), key=lambda kv: int(kv[0])):
        if route.get("aborts"):
            return (
                f"no route at flag {flag}: {route.get('evidence') or route['aborts']} (q_len {q_len}: "
                f"{route['aborts']})"
            )
    return None


@dataclass
class CaseResult:
    case: str
    backend: str
    batch: int
    kv_lens: list[int]
    seconds: float
    q_len: int = 1
    unwritten: int = 0
    nonfinite: int = 0
    rel_l2: float | None = None
    cos_diff: float | None = None
    raised: str | None = None  # the kernel's (or SGLang's) refusal: this route cannot serve
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def judge_case(result: CaseResult) -> CaseResult:
    """Fills result.problems from its numbers; an empty list is a pass."""
    if result.raised:
        result.problems = [f"the call raised {result.raised}"]
        return result
    problems = []
    if result.unwritten:
        problems.append(f"{result.unwritten} output elements never written (poison left)")
    if result.nonfinite:
        problems.append(f"{result.nonfinite} NaN/Inf output elements")
    if result.rel_l2 is None or not math.isfinite(result.rel_l2) or result.rel_l2 > REL_L2_MAX:
        problems.append(f"relative L2 error {result.rel_l2} > {REL_L2_MAX}")
    if result.cos_diff is None or not math.isfinite(result.cos_diff) or result.cos_diff > COS_DIFF_MAX:
        problems.append(f"cosine difference {result.cos_diff} > {COS_DIFF_MAX}")
    result.problems = problems
    return result


@dataclass
class GraphResult:
    backend: str
    batch: int
    capture_len: int
    replays: list[dict[str, Any]]  # per length: kv_len, rel_l2 vs reference, rel_vs_eager, ok
    replay_ms: float | None
    eager_ms: float | None
    capture_violations: list[str] = field(default_factory=list)  # our allocations / host copies inside capture
    problems: list[str] = field(default_factory=list)

    @property
    def ratio(self) -> float | None:
        if self.replay_ms is None or not self.eager_ms:
            return None
        return self.replay_ms / self.eager_ms


def judge_graph(result: GraphResult) -> GraphResult:
    problems = [f"inside capture: {v}" for v in result.capture_violations]
    for replay in result.replays:
        if replay["rel_l2"] is None or replay["rel_l2"] > REL_L2_MAX:
            problems.append(f"replay at {replay['kv_len']}: relative L2 {replay['rel_l2']} > {REL_L2_MAX}")
        if replay["rel_vs_eager"] is None or replay["rel_vs_eager"] > GRAPH_VS_EAGER_REL_MAX:
            problems.append(
                f"replay at {replay['kv_len']}: differs from eager by {replay['rel_vs_eager']} > "
                f"{GRAPH_VS_EAGER_REL_MAX}"
            )
    ratio = result.ratio
    if ratio is not None and ratio > GRAPH_REPLAY_MAX_RATIO:
        problems.append(
            f"graph replay at {result.capture_len} tokens {result.replay_ms:.3f} ms is {ratio:.2f}x eager "
            f"{result.eager_ms:.3f} ms (> {GRAPH_REPLAY_MAX_RATIO}x: split count frozen at capture?)"
        )
    result.problems = problems
    return result


def geometric_mean(values: Iterable[float]) -> float | None:
    values = [v for v in values if v and v > 0]
    if not values:
        return None
    return math.exp(sum(math.log(v) for v in values) / len(values))


def speedups(accelerated: list[dict], fallback: list[dict]) -> dict[str, float]:
    """fallback ms / accelerated ms per timed case both paths measured."""
    fallback_ms = {t["case"]: t["ms"] for t in fallback}
    return {t["case"]: fallback_ms[t["case"]] / t["ms"] for t in accelerated if t["case"] in fallback_ms and t["ms"]}


def path_verdict(child: dict[str, Any] | None, failure: str | None) -> tuple[str, list[str]]:
    """pass / fail / error / deferred for one path on one GPU, with the reasons."""
    if failure is not None:
        return "error", [failure]
    assert child is not None
    if child.get("deferred"):
        return "deferred", [child["deferred"]]
    reasons = [f"{c['case']}: {p}" for c in child["cases"] for p in c["problems"]]
    reasons += [f"graph: {p}" for g in child.get("graph", []) for p in g["problems"]]
    return ("fail" if reasons else "pass"), reasons


def speed_gate(backend_set: str, speedup_by_case: dict[str, float]) -> str | None:
    """A reason the accelerated path fails on speed, or None."""
    minimum = MIN_SPEEDUP.get(backend_set)
    mean = geometric_mean(speedup_by_case.values())
    if minimum is None or mean is None:
        return None
    if mean < minimum:
        return f"accelerated path is not faster: geometric-mean speedup {mean:.3f} < {minimum}"
    return None


def gpu_failures(gpus: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each GPU path that did not pass, with its first reason: which GPU failed, and why."""
    return [
        {
            "gpu": gpu["index"],
            "device": gpu["device"],
            "path": path,
            "result": result,
            "reason": (gpu["paths"][path]["reasons"] or [""])[0],
        }
        for gpu in gpus
        for path, result in gpu["result"].items()
        if result != "pass"
    ]


WORST_FIRST = ("error", "fail", "deferred", "pending", "pass")


def worst(results: Iterable[str]) -> str:
    results = list(results)
    if not results:
        return "pending"
    return min(results, key=WORST_FIRST.index)


def thresholds(backend_set: str) -> dict[str, Any]:
    return {
        "rel_l2_max": REL_L2_MAX,
        "cos_diff_max": COS_DIFF_MAX,
        "graph_replay_max_ratio": GRAPH_REPLAY_MAX_RATIO,
        "graph_vs_eager_rel_max": GRAPH_VS_EAGER_REL_MAX,
        "min_speedup": MIN_SPEEDUP.get(backend_set),
        "memory_limit_bytes": MEMORY_LIMIT_BYTES,
    }
