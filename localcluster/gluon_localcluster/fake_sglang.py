"""A stand-in for SGLang servers' /metrics (no GPU or model here): SGLang's real metric names and
labels, values integrated from a decode speed that follows the flag each node's pods really run with.

Metrics (as `--enable-metrics` serves them): histogram sglang:inter_token_latency_seconds, counter
sglang:generation_tokens_total, gauges sglang:gen_throughput, sglang:num_running_reqs,
sglang:num_queue_reqs, sglang:token_usage; labels model_name, engine_type, tp_rank, and no others: node,
flag, namespace and the pod's labels come from the chart's serving PodMonitor's relabelings, as on a cluster
(the harness's Prometheus runs the Prometheus Operator's config: monitoring.py), so each pod's series
carries its own pod's flag label."""

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

    LABELS = {"model_name": "kimi-k3", "engine_type": "unified", "tp_rank": "0"}  # SGLang's own, no others

    def __init__(self, model: NodeModel, flag_of: Callable[[], str], tick: float = 0.05) -> None:
        self.model, self.flag_of, self.tick = model, flag_of, tick
        self.count = 0.0  # tokens generated
        self.seconds = 0.0  # seconds spent per token, summed
        self.speed = BASE_TOKENS_PER_SECOND
        self.flag = "0"
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.registry = CollectorRegistry()
        self.registry.register(self)
        self.port = 0

    def collect(self):
        with self._lock:
            names, values = list(self.LABELS), list(self.LABELS.values())
            families = {
                "itl": HistogramMetricFamily("sglang:inter_token_latency_seconds", "Inter-token latency", labels=names),
                "tokens": CounterMetricFamily("sglang:generation_tokens", "Generated tokens", labels=names),
                "throughput": GaugeMetricFamily(
                    "sglang:gen_throughput", "Generation throughput (tokens/s)", labels=names
                ),
                "running": GaugeMetricFamily("sglang:num_running_reqs", "Running requests", labels=names),
                "queued": GaugeMetricFamily("sglang:num_queue_reqs", "Queued requests", labels=names),
                "usage": GaugeMetricFamily("sglang:token_usage", "KV cache usage", labels=names),
            }
            # One counter across the node's pods: a restarted pod is a new series (its pod and flag labels).
            families["itl"].add_metric(values, buckets=[("+Inf", self.count)], sum_value=self.seconds)
            families["tokens"].add_metric(values, self.count)
            running = RUNNING_REQUESTS * self.model.traffic
            families["throughput"].add_metric(values, self.speed * running)
            families["running"].add_metric(values, running)
            families["queued"].add_metric(values, 0.0)
            families["usage"].add_metric(values, 0.6 if running else 0.0)
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
                self.count += tokens
                self.seconds += tokens / speed
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
