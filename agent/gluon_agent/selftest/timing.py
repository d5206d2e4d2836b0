"""GPU timing: device events around graph replays of several calls over rotating inputs, median of many.

Graph replay keeps host launch overhead out of short kernels; rotating inputs keep the L2 from serving
repeated reads; warm-up keeps compilation out. See the method notes in docs/developing/benchmarks.md.
"""

from __future__ import annotations

import contextlib
import statistics
from typing import Callable, ContextManager, Sequence

import torch

WARMUP_CALLS = 2
REPLAYS = 25  # at most; fewer where each run is long (replays_for)
MIN_REPLAYS = 9
MEASURE_SECONDS = 0.1  # GPU time worth of runs a median needs: 25 of 4 ms, 9 of 11 ms or more
WARMUP_SECONDS = 0.05  # an idle GPU clocks down; replay until it has been busy this long
WARMUP_MAX_REPLAYS = 200


def event_ms(run: Callable[[], None], repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return times


def capture(calls: Sequence[Callable[[], None]], guard: ContextManager | None = None) -> torch.cuda.CUDAGraph:
    """One graph that runs every call once, in order. Warms each call up on a side stream first; `guard`
    (a CaptureGuard) watches the capture itself."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for call in calls:
            for _ in range(WARMUP_CALLS):
                call()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), guard or contextlib.nullcontext():
        for call in calls:
            call()
    return graph


def graph_ms_per_call(calls: Sequence[Callable[[], None]]) -> float:
    """Median milliseconds of one call, each call of `calls` working on its own inputs."""
    graph = capture(calls)
    return median_ms(graph.replay) / len(calls)


def replays_for(ms: float) -> int:
    """How many timed runs of `ms` each: REPLAYS where they fit MEASURE_SECONDS, else as many as fit, at
    least MIN_REPLAYS: a long run's jitter is a small share of it, so fewer of them give as steady a
    median (docs/developing/benchmarks.md, timing); short runs keep every
    replay."""
    if ms <= 0:
        return REPLAYS
    return max(MIN_REPLAYS, min(REPLAYS, int(MEASURE_SECONDS * 1e3 / ms)))


def warm_up(run: Callable[[], None]) -> float:
    """Runs until the GPU has been busy WARMUP_SECONDS; the last run's milliseconds."""
    busy, last = 0.0, 0.0
    for _ in range(WARMUP_MAX_REPLAYS):
        last = event_ms(run, 1)[0]
        busy += last * 1e-3
        if busy >= WARMUP_SECONDS:
            break
    return last


def median_ms(run: Callable[[], None], warm: bool = True) -> float:
    """Median milliseconds of `run` (a graph replay or an eager call), after warm-up unless the GPU has
    just been kept busy (`warm` False: one untimed run sizes the count)."""
    last = warm_up(run) if warm else event_ms(run, 1)[0]
    return statistics.median(event_ms(run, replays_for(last)))


def eager_ms(call: Callable[[], None]) -> float:
    return median_ms(call)


def tbps(nbytes: float, ms: float) -> float:
    """Bandwidth in TB/s of `nbytes` moved in `ms` milliseconds."""
    return nbytes / (ms * 1e-3) / 1e12


def copy_ceiling_tbps(device: torch.device, nbytes: int = 2**30) -> float:
    """Device-to-device copy bandwidth, counting bytes read plus bytes written (TB/s): the faster of an
    eager cudaMemcpy and a graph-replayed copy kernel. (On an H200 a memcpy node inside a CUDA graph
    ran at 2.7 TB/s against 4.2 for both of these: docs/benchmarks/README.md.)"""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).normal_()
    dst = torch.empty_like(src)
    kernel_ms = graph_ms_per_call([lambda: torch.add(src, 0.0, out=dst)])
    memcpy_ms = median_ms(lambda: dst.copy_(src), warm=False)  # the replays above warmed the GPU
    return tbps(2 * nbytes, min(kernel_ms, memcpy_ms))
