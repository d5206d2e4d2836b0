"""The agent's Prometheus metrics (names from the contract), filled from probe and self-test reports."""

from __future__ import annotations

from typing import Any, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info

from gluon_common import contract

from .selftest.cases import WORST_FIRST


class AgentMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.info = Info(contract.M_AGENT_INFO, "Probe facts: versions, GPU arch, fingerprint", registry=r)
        self.capable = Gauge(
            contract.M_AGENT_CAPABLE, "1 when the probe found the node capable of the Gluon path", registry=r
        )
        self.import_crash = Gauge(
            contract.M_AGENT_IMPORT_CRASH,
            "1 when the aiter Gluon import raises a non-ImportError (SGLang would fail to start with the flag on)",
            registry=r,
        )
        self.result = Gauge(
            contract.M_AGENT_SELFTEST_RESULT,
            "1 for the current self-test result of each GPU and path",
            ["gpu", "path", "result"],
            registry=r,
        )
        self.case_error = Gauge(
            contract.M_AGENT_CASE_ERROR,
            "Relative L2 error against the fp32 reference per case",
            ["gpu", "path", "backend", "case"],
            registry=r,
        )
        self.kernel_seconds = Gauge(
            contract.M_AGENT_KERNEL_SECONDS,
            "Median kernel time per timed case",
            ["gpu", "path", "backend", "case"],
            registry=r,
        )
        self.bandwidth = Gauge(
            contract.M_AGENT_KERNEL_BANDWIDTH,
            "fp8 KV bytes read per second per timed case",
            ["gpu", "path", "backend", "case"],
            registry=r,
        )
        self.speedup = Gauge(
            contract.M_AGENT_SPEEDUP, "Fallback time / accelerated time per timed case", ["gpu", "case"], registry=r
        )
        self.last_run = Gauge(contract.M_AGENT_LAST_RUN, "When the last self-test finished (unix seconds)", registry=r)
        self.duration = Gauge(contract.M_AGENT_RUN_DURATION, "How long the last self-test took", registry=r)
        self.runs = Counter(contract.M_AGENT_RUNS, "Self-test runs by result", ["result"], registry=r)
        self.api_errors = Counter(contract.M_AGENT_API_ERRORS, "Kubernetes API errors by kind", ["kind"], registry=r)
        self.publish_seconds = Histogram(
            contract.M_AGENT_PUBLISH_SECONDS, "Time to publish labels and report on the node", registry=r
        )
        for result in WORST_FIRST:  # present at 0 from the start, so increase() sees the first run
            self.runs.labels(result)
        self.malformed = Counter(
            contract.M_AGENT_MALFORMED, "Malformed labels or annotations written by others, by key", ["key"], registry=r
        )

        self.delivery_containers = Gauge(
            contract.M_AGENT_DELIVERY_CONTAINERS,
            "Injected serving containers on this node by what their processes run against what their preflight "
            "wrote: match, mismatch, unknown (the flag file unreadable)",
            ["state"],
            registry=r,
        )
        self.delivery_observable = Gauge(
            contract.M_AGENT_DELIVERY_AVAILABLE,
            "1 while the agent can read its node's serving processes' flag (0: see the delivery annotation's problem)",
            registry=r,
        )
        self.delivery_unreadable = Gauge(
            contract.M_AGENT_DELIVERY_UNREADABLE,
            "Pod processes on this node whose environment the last observation could not read",
            registry=r,
        )

    def observe_delivery(self, report: Any, unreadable: int, counts: Mapping[str, int]) -> None:
        self.delivery_observable.set(1 if report.available else 0)
        self.delivery_unreadable.set(unreadable)
        for state, count in counts.items():
            self.delivery_containers.labels(state).set(count)

    def observe_probe(self, probe: Mapping[str, Any], fingerprint: str) -> None:
        gpus = probe.get("gpus", [])
        self.info.info(
            {
                "fingerprint": fingerprint,
                "arch": ",".join(sorted({g.get("arch") or "unknown" for g in gpus})) or "none",
                "gpus": str(len(gpus)),
                "aiter": str(probe.get("aiter_version")),
                "triton": str(probe.get("triton_version")),
                "torch": str(probe.get("torch_version")),
                "hip": str(probe.get("hip_version")),
                "driver": str(probe.get("driver_version")),
                "sglang": str((probe.get("sglang") or {}).get("version")),
            }
        )
        self.capable.set(1 if probe.get("capable") else 0)
        self.import_crash.set(1 if probe.get("import_crash") else 0)

    def observe_selftest(self, report: Mapping[str, Any]) -> None:
        for gauge in (self.result, self.case_error, self.kernel_seconds, self.bandwidth, self.speedup):
            gauge.clear()  # a GPU or case that is gone must not keep its old series
        for gpu in report.get("gpus", []):
            index = str(gpu["index"])
            for path, result in gpu["result"].items():
                for value in WORST_FIRST:
                    self.result.labels(index, path, value).set(1 if value == result else 0)
                child = gpu.get("paths", {}).get(path, {}).get("child") or {}
                for case in child.get("cases", []):
                    if case.get("rel_l2") is not None:
                        self.case_error.labels(index, path, case["backend"], case["case"]).set(case["rel_l2"])
                for t in child.get("timing", []):
                    self.kernel_seconds.labels(index, path, t["backend"], t["case"]).set(t["ms"] / 1e3)
                    self.bandwidth.labels(index, path, t["backend"], t["case"]).set(t["kv_tbps"] * 1e12)
            for case, value in gpu.get("speedup", {}).items():
                self.speedup.labels(index, case).set(value)
        self.runs.labels(report.get("result", "error")).inc()
        self.last_run.set(report.get("finished_at", 0))
        self.duration.set(report.get("seconds", 0))
