"""A stand-in for SGLang servers' /metrics (no GPU or model here): SGLang's real metric names and
labels, values integrated from a decode speed that follows the flag each node's pods really run with.

Metrics (as `--enable-metrics` serves them): histogram sglang:inter_token_latency_seconds, counter
sglang:generation_tokens_total, gauges sglang:gen_throughput, sglang:num_running_reqs,
sglang:num_queue_reqs, sglang:token_usage; labels model_name, engine_type, tp_rank. With `relabelled`
False it also adds node, flag, namespace and the pod's app label itself (for static scrape configs); with
True those come from the chart's PodMonitor relabelings, as on a cluster (the harness's Prometheus runs the
Prometheus Operator's config: monitoring.py), and each pod's series carries its own pod's flag label."""

from __future__ import annotations

import math
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

BASE_TOKENS_PER_SECOND = 30.0  # per sequence, flag 0, long-context Kimi-K3 decode
RUNNING_REQUESTS = 32


@dataclass
class NodeModel:
    """How one node's decode speed behaves: a hardware offset, the flag's effect, noise, shared drift."""

    node: str
    flag_effect: float = 2.2  # speed with flag 1 / speed with flag 0
    offset: float = 1.0
    noise: float = 0.02  # log-normal sigma per second
    traffic: float = 1.0  # 0 means no requests at all
    drift: Callable[[float], float] = lambda t: 1.0 + 0.08 * math.sin(t / 20.0)
    rng: random.Random = field(default_factory=random.Random)

    def speed(self, t: float, flag: str) -> float:
        effect = self.flag_effect if flag == "1" else 1.0
        return BASE_TOKENS_PER_SECOND * self.offset * effect * self.drift(t) * math.exp(self.rng.gauss(0, self.noise))


class FakeSglang:
    """One node's serving metrics on 127.0.0.1:port; `flag_of()` says which flag the node serves with."""

    def __init__(
        self,
        model: NodeModel,
        flag_of: Callable[[], str],
        namespace: str = "serving",
        app: str = "sglang",
        tick: float = 0.05,
        relabelled: bool = False,
    ) -> None:
        self.model, self.flag_of, self.namespace, self.app, self.tick = model, flag_of, namespace, app, tick
        self.relabelled = relabelled
        self.count: dict[str, float] = {}  # per flag value: tokens
        self.seconds: dict[str, float] = {}  # per flag value: seconds spent per token, summed
        self.speed = BASE_TOKENS_PER_SECOND
        self.flag = "0"
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.registry = CollectorRegistry()
        self.registry.register(self)
        self.port = 0

    def labels(self, flag: str) -> dict[str, str]:
        own = {"model_name": "kimi-k3", "engine_type": "unified", "tp_rank": "0"}
        if self.relabelled:
            return own
        return {
            **own,
            "node": self.model.node,
            "flag": flag,
            "namespace": self.namespace,
            "app": self.app,
        }

    def collect(self):
        with self._lock:
            families = {
                "itl": HistogramMetricFamily(
                    "sglang:inter_token_latency_seconds", "Inter-token latency", labels=list(self.labels("0"))
                ),
                "tokens": CounterMetricFamily(
                    "sglang:generation_tokens", "Generated tokens", labels=list(self.labels("0"))
                ),
                "throughput": GaugeMetricFamily(
                    "sglang:gen_throughput", "Generation throughput (tokens/s)", labels=list(self.labels("0"))
                ),
                "running": GaugeMetricFamily(
                    "sglang:num_running_reqs", "Running requests", labels=list(self.labels("0"))
                ),
                "queued": GaugeMetricFamily("sglang:num_queue_reqs", "Queued requests", labels=list(self.labels("0"))),
                "usage": GaugeMetricFamily("sglang:token_usage", "KV cache usage", labels=list(self.labels("0"))),
            }
            series: dict[tuple[str, ...], tuple[float, float]] = {}  # one per flag, or one in all when relabelled
            for flag, count in self.count.items():
                values = tuple(self.labels(flag).values())
                before = series.get(values, (0.0, 0.0))
                series[values] = (before[0] + count, before[1] + self.seconds[flag])
            for values, (count, seconds) in series.items():
                families["itl"].add_metric(list(values), buckets=[("+Inf", count)], sum_value=seconds)
                families["tokens"].add_metric(list(values), count)
            current = list(self.labels(self.flag).values())
            running = RUNNING_REQUESTS * self.model.traffic
            families["throughput"].add_metric(current, self.speed * running)
            families["running"].add_metric(current, running)
            families["queued"].add_metric(current, 0.0)
            families["usage"].add_metric(current, 0.6 if running else 0.0)
        yield from families.values()

    def _run(self) -> None:
        last, noise_until, speed = time.monotonic(), 0.0, BASE_TOKENS_PER_SECOND
        while not self._stop.wait(self.tick):
            now = time.monotonic()
            flag = self.flag_of()
            if now >= noise_until or flag != self.flag:  # the noise holds for a second, like a real interval
                speed, noise_until = self.model.speed(time.time(), flag), now + 1.0
            tokens = speed * RUNNING_REQUESTS * self.model.traffic * (now - last)
            with self._lock:
                self.flag, self.speed = flag, speed
                self.count[flag] = self.count.get(flag, 0.0) + tokens
                self.seconds[flag] = self.seconds.get(flag, 0.0) + tokens / speed
            last = now

    def start(self, port: int = 0, addr: str = "127.0.0.1") -> "FakeSglang":
        server, _ = start_http_server(port, addr=addr, registry=self.registry)
        self._server = server
        self.port = server.server_address[1]
        threading.Thread(target=self._run, daemon=True, name=f"sglang-{self.model.node}").start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._server.shutdown()
