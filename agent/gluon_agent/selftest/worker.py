"""One self-test child: one device, one path (accelerated or fallback). Imports torch; the parent never does.

    python -m gluon_agent.selftest.worker '<json spec>'
    python -m gluon_agent.selftest.worker - [DEVICE [PATH]]  # the spec as one line on stdin, once it is
                                                             # known; meanwhile DEVICE is made ready (prewarm)

Prints progress lines (so a crash can be attributed to the step that died) and one result line.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import sys
import time
from typing import Any

IMPORT_STARTED = time.monotonic()  # before torch: the report says how long the imports took

# The imports below come after IMPORT_STARTED on purpose (they are what it times), hence their noqa.
import torch  # noqa: E402 - timed from IMPORT_STARTED

from gluon_common import contract  # noqa: E402 - timed from IMPORT_STARTED

from . import cases, timing  # noqa: E402 - timed from IMPORT_STARTED
from .backends import BACKEND_SETS, Backend, Call, Serving  # noqa: E402 - timed from IMPORT_STARTED
from .capture_guard import CaptureGuard  # noqa: E402 - timed from IMPORT_STARTED
from .problem import Problem, make_problem  # noqa: E402 - timed from IMPORT_STARTED
from .reference import mla_decode_reference  # noqa: E402 - timed from IMPORT_STARTED

IMPORTS_DONE = time.monotonic()

ROTATION_L2_MULTIPLE = 3  # rotate through enough inputs to be several times the L2
MAX_ROTATIONS = 4


def emit(marker: str, payload: dict[str, Any]) -> None:
    sys.stdout.write(marker + json.dumps(payload) + "\n")
    sys.stdout.flush()


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reference_of(p: Problem) -> torch.Tensor:
    return mla_decode_reference(p.q, p.kv, p.kv_scale, p.kv_indptr, p.kv_indices, p.sm_scale, p.q_len)


def compare(out: torch.Tensor, ref: torch.Tensor) -> dict[str, Any]:
    values = out.float()
    unwritten = int((values == cases.POISON).sum())
    nonfinite = int((~torch.isfinite(values)).sum())
    if unwritten or nonfinite:
        return {"unwritten": unwritten, "nonfinite": nonfinite, "rel_l2": None, "cos_diff": None}
    x, y = values.double(), ref.double()
    rel_l2 = float((x - y).norm() / y.norm())
    cos_diff = float(1 - 2 * (x * y).sum() / (x * x + y * y).sum().clamp_min(1e-30))
    return {"unwritten": 0, "nonfinite": 0, "rel_l2": rel_l2, "cos_diff": cos_diff}


def serving_for(spec: dict[str, Any], q_len: int) -> Serving:
    """The serving setup the spec names, with this path's route for q_len (None: the default route)."""
    setup = spec.get("serving_setup") or {}
    route = (spec.get("routes") or {}).get(str(q_len))
    return Serving(
        speculative=bool(setup.get("speculative")),
        page_size=int(setup.get("page_size", 1)),
        dp_attention=bool(setup.get("dp_attention")),
        max_seqlen_qo=int(setup.get("max_seqlen_qo", 1)),
        route=route,
    )


def check_case(
    backend: Backend, case: cases.Case, device: torch.device, seed: int, heads: int, serving: Serving = Serving()
) -> tuple[cases.CaseResult, Problem]:
    p = make_problem(list(case.lengths), heads=heads, device=device, seed=seed, q_len=case.q_len)
    ref = reference_of(p)
    out = p.new_output(cases.POISON)
    started = time.perf_counter()
    raised = None
    try:
        backend.run(p, out, Call(max_kv_len=max(p.lengths)), serving)
        synchronize(device)
    except Exception as exc:  # noqa: BLE001 - the kernel's refusal is this case's result
        raised = f"{type(exc).__name__}: {str(exc)[:600]}"
    numbers = compare(out, ref) if raised is None else {"rel_l2": None, "cos_diff": None}
    result = cases.CaseResult(
        case=case.name,
        backend=backend.name,
        batch=p.batch,
        kv_lens=sorted(set(p.lengths)),
        seconds=round(time.perf_counter() - started, 4),
        q_len=p.q_len,
        raised=raised,
        **numbers,
    )
    return cases.judge_case(result), p


def rotations_for(p: Problem, device: torch.device) -> int:
    l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 64 * 2**20)
    return max(1, min(MAX_ROTATIONS, -(-ROTATION_L2_MULTIPLE * l2 // p.kv_bytes)))


def time_case(
    backend: Backend, case: cases.Case, first: Problem, device: torch.device, seed: int, serving: Serving = Serving()
) -> dict[str, Any]:
    """Median ms per call under graph replay (as SGLang decodes), rotating through fresh inputs. The work
    metadata is filled before capture and not timed: SGLang fills it once per step for every layer."""
    problems = [first] + [
        make_problem(list(case.lengths), heads=first.heads, device=device, seed=seed + 1000 + i)
        for i in range(rotations_for(first, device) - 1)
    ]
    outs = [p.new_output() for p in problems]
    call = Call(max_kv_len=max(first.lengths), capturing=True)
    bound = [backend.bind(p, call, serving) for p in problems]
    for b in bound:
        b.refresh()
    ms = timing.graph_ms_per_call([lambda b=b, o=o: b.launch(o) for b, o in zip(bound, outs)])
    return {
        "case": case.name,
        "backend": backend.name,
        "batch": first.batch,
        "kv_len": max(first.lengths),
        "rotations": len(problems),
        "ms": ms,
        "kv_bytes": first.kv_bytes,
        "kv_tbps": timing.tbps(first.kv_bytes, ms),
    }


def relative(a: torch.Tensor, b: torch.Tensor) -> float | None:
    a, b = a.double(), b.double()
    if not torch.isfinite(a).all():
        return None
    return float((a - b).norm() / b.norm())


def check_graph(
    backend: Backend, device: torch.device, seed: int, heads: int, serving: Serving = Serving()
) -> cases.GraphResult:
    """Capture once at the largest length, then replay at each length with new token tables written in
    place and the metadata refilled outside the graph, as a serving engine's decode graph is reused across
    steps. Nothing of ours may allocate or copy from the host inside the capture (CaptureGuard)."""
    batch, capture_len = cases.GPU_GRAPH_BATCH, cases.GPU_GRAPH_LENGTHS[0]
    p = make_problem([capture_len] * batch, heads=heads, device=device, seed=seed)
    static_out = p.new_output(cases.POISON)
    bound = backend.bind(p, Call(max_kv_len=capture_len, capturing=True), serving)
    bound.refresh()
    guard = CaptureGuard()
    graph = timing.capture([lambda: bound.launch(static_out)], guard=guard)
    gen = torch.Generator(device=device).manual_seed(seed + 7)
    replays, replay_ms, eager_ms = [], None, None
    for kv_len in cases.GPU_GRAPH_LENGTHS:
        p.kv_indptr.copy_(torch.arange(batch + 1, device=device, dtype=torch.int32) * kv_len)
        p.kv_indices[: batch * kv_len] = torch.randperm(p.kv.shape[0], generator=gen, device=device)[
            : batch * kv_len
        ].int()
        view = dataclasses.replace(p, lengths=[kv_len] * batch)
        bound.refresh()
        static_out.fill_(cases.POISON)
        graph.replay()
        synchronize(device)
        replayed = static_out.clone()
        eager = view.new_output(cases.POISON)
        eager_call = Call(max_kv_len=kv_len)
        eager_bound = backend.bind(view, eager_call, serving)
        eager_bound.refresh()
        eager_bound.launch(eager)
        synchronize(device)
        ref = reference_of(view)
        replays.append(
            {
                "kv_len": kv_len,
                "rel_l2": compare(replayed, ref)["rel_l2"],
                "rel_vs_eager": relative(replayed, eager.float()),
            }
        )
        if kv_len == capture_len:
            eager_ms = timing.eager_ms(lambda: eager_bound.launch(eager))
            replay_ms = timing.median_ms(graph.replay, warm=False)  # the eager runs have just warmed the GPU
    return cases.judge_graph(
        cases.GraphResult(
            backend.name, batch, capture_len, replays, replay_ms, eager_ms, capture_violations=guard.violations
        )
    )


def device_hooks() -> Any | None:
    """The module contract.ENV_SELFTEST_DEVICE_HOOKS names, or None: what a device that is not a GPU does
    (its free memory, a fault at its first case). The local-cluster harness fills this seam with fake
    devices on the CPU (gluon_localcluster.fakes.devices); a deployment leaves it unset."""
    name = os.environ.get(contract.ENV_SELFTEST_DEVICE_HOOKS)
    return importlib.import_module(name) if name else None


def memory_info(device: torch.device) -> tuple[int, int] | None:
    """(free, total) bytes of the device; a device that is not a GPU has them only when its hooks say."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)
    hooks = device_hooks()
    return None if hooks is None else hooks.memory_info(device)


def prepare_device(device: torch.device, limit: int) -> str | None:
    """Bounds our GPU memory; returns a deferral reason when the GPU lacks the free memory."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
    info = memory_info(device)
    if info is None:
        return None
    free, total = info
    if free < limit:
        return (
            f"{device}: {free / cases.GiB:.1f} GiB free of {total / cases.GiB:.1f} GiB, the self-test needs "
            f"{limit / cases.GiB:.1f} GiB"
        )
    if device.type == "cuda":
        torch.cuda.set_per_process_memory_fraction(min(1.0, limit / total), device)
        torch.cuda.reset_peak_memory_stats(device)
    return None


def before_first_case(device: torch.device, path: str) -> None:
    """A CPU device's hooks, at its first case (a fake device's crash or hang); never a real GPU's."""
    hooks = device_hooks() if device.type == "cpu" else None
    if hooks is not None:
        hooks.before_first_case(device, path)


class StepClock:
    """Seconds per step, so a slow self-test says where its time went."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._name: str | None = None
        self._at = time.monotonic()

    def start(self, name: str | None) -> None:
        now = time.monotonic()
        if self._name is not None:
            self.seconds[self._name] = round(self.seconds.get(self._name, 0.0) + now - self._at, 3)
        self._name, self._at = name, now


def run(spec: dict[str, Any]) -> dict[str, Any]:
    clock = StepClock()
    imports = round(IMPORTS_DONE - IMPORT_STARTED, 3)
    waited = round(time.monotonic() - PREWARM["done_at"], 3)  # for the spec: the probe, or the other path's GPU turn
    clock.start("device setup")
    device = torch.device(spec["device"])
    limit = int(spec.get("memory_limit_bytes", cases.MEMORY_LIMIT_BYTES))
    deferred = prepare_device(device, limit)
    if deferred:
        return {"deferred": deferred}
    backend = BACKEND_SETS[spec["backend_set"]][spec["path"]]
    on_gpu = device.type == "cuda"
    to_run = (cases.GPU_CASES if on_gpu else cases.CPU_CASES) + cases.mtp_cases(spec.get("mtp_q_lens", ()), on_gpu)
    seed, heads = int(spec["seed"]), int(spec.get("heads", 12))
    started = time.perf_counter()
    results, timings, graphs = [], [], []
    for index, case in enumerate(to_run):
        emit(cases.PROGRESS_MARKER, {"step": f"case {case.name}", "backend": backend.name})
        clock.start(f"case {case.name}")
        if index == 0:
            before_first_case(device, spec["path"])
        serving = serving_for(spec, case.q_len)
        result, problem = check_case(backend, case, device, seed + index, heads, serving)
        results.append(result)
        if on_gpu and case.timed and spec.get("timing", True) and result.ok:
            emit(cases.PROGRESS_MARKER, {"step": f"timing {case.name}", "backend": backend.name})
            clock.start(f"timing {case.name}")
            timings.append(time_case(backend, case, problem, device, seed + index, serving))
        del problem
    decode_serves = all(r.ok for r in results if r.q_len == 1)
    if on_gpu and spec.get("graph", True) and decode_serves:
        emit(cases.PROGRESS_MARKER, {"step": "graph", "backend": backend.name})
        clock.start("graph")
        graphs.append(check_graph(backend, device, seed + 99, heads, serving_for(spec, 1)))
    ceiling = None
    if on_gpu and spec.get("timing", True):
        emit(cases.PROGRESS_MARKER, {"step": "copy ceiling", "backend": backend.name})
        clock.start("copy ceiling")
        torch.cuda.empty_cache()  # the graphs' pools are gone; their cached blocks would count against the cap
        ceiling = timing.copy_ceiling_tbps(device)
        for t in timings:
            t["ceiling_tbps"] = ceiling
            t["ratio_to_ceiling"] = t["kv_tbps"] / ceiling
    clock.start(None)
    return {
        "device": str(device),
        "import_seconds": imports,
        "prewarm_seconds": PREWARM["seconds"],
        "waited_seconds": waited,
        "step_seconds": clock.seconds,
        "name": torch.cuda.get_device_name(device) if on_gpu else "cpu (TRITON_INTERPRET=1)",
        "backend": backend.name,
        "path": spec["path"],
        "cases": [dataclasses.asdict(r) for r in results],
        "timing": timings,
        "graph": [dataclasses.asdict(g) | {"ratio": g.ratio} for g in graphs],
        "ceiling_tbps": ceiling,
        "peak_memory_bytes": torch.cuda.max_memory_allocated(device) if on_gpu else None,
        "seconds": round(time.perf_counter() - started, 3),
    }


def prewarm(name: str, path: str = "") -> float | None:
    """What every path pays once before its first case, done while the spec is on its way: the device's
    context, the BLAS handle and the first load of the kernels that make, check and compare a problem,
    on a tiny one. No kernel of either path runs, nothing is timed, and it is freed before the spec is
    read. The fallback child, which waits for the whole accelerated run, also imports the portable
    kernel's module (Triton), in case its backend is that one. Seconds taken, None where there is
    nothing to prepare; an error is left for the run to meet (and report: a GPU without memory is
    deferred there)."""
    device = torch.device(name)
    if device.type != "cuda":
        return None
    started = time.monotonic()
    if path == "fallback":
        try:
            from . import triton_mla  # noqa: F401
        except Exception:  # noqa: BLE001 - a stack without Triton; only the portable kernel needs it
            pass
    try:
        torch.cuda.set_device(device)
        p = make_problem([3, 2], device=device, seed=0)
        compare(p.new_output(0.0), reference_of(p))
        synchronize(device)
        del p
        torch.cuda.empty_cache()
    except Exception:  # noqa: BLE001 - the run meets it again, at its own step
        pass
    return round(time.monotonic() - started, 3)


PREWARM: dict[str, float | None] = {"seconds": None, "done_at": IMPORTS_DONE}


def main(argv: list[str]) -> int:
    """The spec as the argument, or '-': one line on stdin, sent once known (the imports above run
    meanwhile, then the named device's prewarm); an empty line means cancelled."""
    if argv[0] == "-" and len(argv) > 1:
        PREWARM["seconds"] = prewarm(*argv[1:3])
        PREWARM["done_at"] = time.monotonic()
    text = sys.stdin.readline() if argv[0] == "-" else argv[0]
    if not text.strip():
        return 0
    emit(cases.RESULT_MARKER, run(json.loads(text)))
    return 0


def exit_now(code: int) -> None:
    """Leave without the interpreter's teardown: with torch and a CUDA context loaded it took most of a
    second, and the fallback child waits for this one to end (the driver frees the GPU at exit)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_now(main(sys.argv[1:]))
