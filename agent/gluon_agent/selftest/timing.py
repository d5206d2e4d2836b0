"""GPU timing: device events around graph replays of several calls over rotating inputs, median of many.

Graph replay keeps host launch overhead out of short kernels; rotating inputs keep the L2 from serving
repeated reads; warm-up keeps compilation out. See the device method notes in docs/benchmarks/README.md.
"""

from __future__ import annotations

import contextlib
import statistics
from typing import Callable, ContextManager, Sequence

import torch

WARMUP_CALLS = 2
REPLAYS = 25
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
    with torch.cuda.graph(graph), (guard or contextlib.nullcontext()):
        for call in calls:
            call()
    return graph


def graph_ms_per_call(calls: Sequence[Callable[[], None]], replays: int = REPLAYS) -> float:
    """Median milliseconds of one call, each call of `calls` working on its own inputs."""
    graph = capture(calls)
    warm_up(graph.replay)
    per_replay = event_ms(graph.replay, replays)
    return statistics.median(per_replay) / len(calls)


def warm_up(run: Callable[[], None]) -> None:
    busy = 0.0
    for _ in range(WARMUP_MAX_REPLAYS):
        busy += event_ms(run, 1)[0] * 1e-3
        if busy >= WARMUP_SECONDS:
            return


def eager_ms(call: Callable[[], None], replays: int = REPLAYS) -> float:
    warm_up(call)
    return statistics.median(event_ms(call, replays))


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
    memcpy_ms = eager_ms(lambda: dst.copy_(src))
    del src, dst
    return tbps(2 * nbytes, min(kernel_ms, memcpy_ms))
