"""The operator's Prometheus metrics (names from the contract)."""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from gluon_common import contract

from . import webhook

ROLLBACK_REASONS = ("analysis", "preflight")
VERDICT_RESULTS = ("pass", "fail", "inconclusive")
# analysis_errors kinds: Prometheus's own (bad_data, ...) plus these, created at 0
ANALYSIS_ERROR_KINDS = ("unreachable", "server", "bad_response", "missing_label", "tls", "deadline", "internal")
CPU_PHASES = ("watch", "plan", "write")  # the judge's own CPU is M_ROLLOUT_JUDGE_SECONDS
RECONCILE_OUTCOMES = ("planned", "waiting")


class OperatorMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.nodes = Gauge(
            contract.M_ROLLOUT_NODES, "Nodes per state of each rollout", ["namespace", "rollout", "state"], registry=r
        )
        self.transitions = Counter(
            contract.M_ROLLOUT_TRANSITIONS, "Node state transitions", ["from_state", "to_state"], registry=r
        )
        self.verdicts = Counter(
            contract.M_ROLLOUT_VERDICTS, "Analysis verdicts by result", ["namespace", "rollout", "result"], registry=r
        )
        self.rollbacks = Counter(contract.M_ROLLOUT_ROLLBACKS, "Node rollbacks by reason", ["reason"], registry=r)
        self.effect = Gauge(
            contract.M_ROLLOUT_EFFECT,
            "Estimated throughput ratio flag=1 vs control per node",
            ["namespace", "rollout", "node"],
            registry=r,
        )
        node = ["namespace", "rollout", "node"]
        self.effect_lower = Gauge(
            contract.M_ROLLOUT_EFFECT_LOWER,
            "Lower end of the anytime-valid interval of the effect ratio",
            node,
            registry=r,
        )
        self.effect_upper = Gauge(
            contract.M_ROLLOUT_EFFECT_UPPER,
            "Upper end of the anytime-valid interval of the effect ratio",
            node,
            registry=r,
        )
        self.effective_samples = Gauge(
            contract.M_ROLLOUT_EFFECTIVE_SAMPLES, "Post-flip samples worth of independent ones", node, registry=r
        )
        self.load_adjustment = Gauge(
            contract.M_ROLLOUT_LOAD_ADJUSTMENT,
            "Ratio the load-gauge adjustment applied to the effect",
            node,
            registry=r,
        )
        self.sequential_p = Gauge(
            contract.M_ROLLOUT_SEQUENTIAL_P,
            "Always-valid p-value of the sequential test",
            node + ["hypothesis"],
            registry=r,
        )
        self.looks = Gauge(
            contract.M_ROLLOUT_ANALYSIS_LOOKS, "Evaluations of the node since its flag flipped", node, registry=r
        )
        self.delivery_pods = Gauge(
            contract.M_ROLLOUT_DELIVERY_PODS,
            "A rollout's serving pods by the flag their processes were seen to run: verified (what their preflight "
            "chose), mismatch (another), unobserved (not seen yet), held (at their preflight: fileKeyRef ignored)",
            ["namespace", "rollout", "state"],
            registry=r,
        )
        self.delivery_mode = Gauge(
            contract.M_ROLLOUT_DELIVERY_MODE,
            "1 for the way the flag reaches a rollout's pods now (mode) under the chart's setting (configured)",
            ["namespace", "rollout", "mode", "configured"],
            registry=r,
        )
        self.lost_agents = Gauge(
            contract.M_ROLLOUT_LOST_AGENTS,
            "A rollout's flag-on nodes whose agents are not running and ready (kept for agentLossGraceSeconds)",
            ["namespace", "rollout"],
            registry=r,
        )
        self.selftest_pods = Gauge(
            contract.M_ROLLOUT_SELFTEST_PODS,
            "Self-test pods in the serving images: running (no verdict read yet) and waiting (due, left for a "
            "later wave)",
            ["state"],
            registry=r,
        )
        self.proofs = Counter(
            contract.M_ROLLOUT_PROOFS,
            "Proofs recorded on nodes from self-test pods in the serving images, by result (pass, fail, error)",
            ["result"],
            registry=r,
        )
        self.disabling_paused = Gauge(
            contract.M_ROLLOUT_DISABLING_PAUSED,
            "1 while so many flag-on nodes lost their agents at once that none is disabled for it",
            ["namespace", "rollout"],
            registry=r,
        )
        self.no_safe_rollback = Gauge(
            contract.M_ROLLOUT_NO_SAFE_ROLLBACK,
            "Nodes where flag 0 has no working route for the "
            "rollout's serving configuration (never enabled: no safe rollback)",
            ["namespace", "rollout"],
            registry=r,
        )
        self.judge_seconds = Histogram(
            contract.M_ROLLOUT_JUDGE_SECONDS,
            "CPU seconds of one rollout's judgement (every node)",
            registry=r,
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10),
        )
        self.analysis_errors = Counter(
            contract.M_ROLLOUT_ANALYSIS_ERRORS, "Analysis errors by kind", ["kind"], registry=r
        )
        self.query_seconds = Histogram(contract.M_ROLLOUT_QUERY_SECONDS, "Prometheus query latency", registry=r)
        self.api_errors = Counter(contract.M_ROLLOUT_API_ERRORS, "Kubernetes API errors by kind", ["kind"], registry=r)
        self.restarts = Counter(contract.M_ROLLOUT_RESTARTS, "Serving pod restarts by outcome", ["outcome"], registry=r)
        self.operator_cpu = Counter(
            contract.M_ROLLOUT_OPERATOR_CPU, "CPU seconds of the operator's own work, by phase", ["phase"], registry=r
        )
        self.reconciles = Counter(contract.M_ROLLOUT_RECONCILES, "Reconciles by outcome", ["outcome"], registry=r)
        for phase in CPU_PHASES:
            self.operator_cpu.labels(phase)
        for outcome in RECONCILE_OUTCOMES:
            self.reconciles.labels(outcome)
        # ---- the admission webhook: every review it answered, by outcome (all are allowed)
        self.webhook_reviews = Counter(
            contract.M_ROLLOUT_WEBHOOK_REVIEWS, "Admission reviews answered, by outcome", ["outcome"], registry=r
        )
        for outcome in webhook.OUTCOMES:
            self.webhook_reviews.labels(outcome)
        self._server_started = False
        # Labelled counters exist at 0 from the start, so increase() sees their first event (a series that
        # appears at 1 hides it: the usual Prometheus pitfall with lazily created children).
        for reason in ROLLBACK_REASONS:
            self.rollbacks.labels(reason)
        for kind in ANALYSIS_ERROR_KINDS:
            self.analysis_errors.labels(kind)

    @contextmanager
    def cpu(self, phase: str) -> Iterator[None]:
        """Counts the calling thread's CPU time in the block under `phase` (thread time: the event loop and
        the informer and API threads run side by side, and process time would count them all)."""
        began = time.thread_time()
        try:
            yield
        finally:
            self.operator_cpu.labels(phase).inc(time.thread_time() - began)

    def observe_judgement(self, namespace: str, rollout: str, node: str, judgement: Any) -> None:
        """The judge's numbers for one node (an analysis.Judgement), where it has them."""
        labels = (namespace, rollout, node)
        for gauge, value in (
            (self.effect, judgement.effect),
            (self.effect_lower, judgement.ci_low),
            (self.effect_upper, judgement.ci_high),
            (self.effective_samples, judgement.n_eff),
            (self.load_adjustment, judgement.adjustment),
        ):
            if value is not None:
                gauge.labels(*labels).set(value)
        for hypothesis, value in (("worse", judgement.p_worse), ("not_worse", judgement.p_not_worse)):
            if value is not None:
                self.sequential_p.labels(*labels, hypothesis).set(value)
        if judgement.looks:
            self.looks.labels(*labels).set(judgement.looks)

    def observe_rollout(
        self,
        namespace: str,
        rollout: str,
        statuses: Mapping[str, object],
        no_safe_rollback: int = 0,
        delivery: Mapping[str, int] | None = None,
        mode: tuple[str, str] | None = None,
        lost_agents: tuple[int, bool] = (0, False),
    ) -> None:
        self.lost_agents.labels(namespace, rollout).set(lost_agents[0])
        self.disabling_paused.labels(namespace, rollout).set(1 if lost_agents[1] else 0)
        self.no_safe_rollback.labels(namespace, rollout).set(no_safe_rollback)
        for state in ("verified", "mismatch", "unobserved", "held"):
            self.delivery_pods.labels(namespace, rollout, state).set((delivery or {}).get(state, 0))
        if mode is not None:
            for known in contract.INJECTION_MODES[1:]:
                self.delivery_mode.labels(namespace, rollout, known, mode[1]).set(1 if known == mode[0] else 0)
        for result in VERDICT_RESULTS:
            self.verdicts.labels(namespace, rollout, result)
        counts = {state: 0 for state in contract.NODE_STATES}
        for status in statuses.values():
            counts[status.state] += 1  # type: ignore[attr-defined]
        for state, count in counts.items():
            self.nodes.labels(namespace, rollout, state).set(count)

    def serve(self, addr: str, port: int) -> None:
        if not self._server_started:
            start_http_server(port, addr=addr, registry=self.registry)
            self._server_started = True


# The operator process's one registry of metrics (kopf handlers and the analysis shell share it).
METRICS = OperatorMetrics()
