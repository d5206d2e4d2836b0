"""The analysis shell: one Prometheus query per rollout per interval, a judgement and a decision for
every node in Analyzing or Promoted (guard mode). The statistics are analysis.py's (pure)."""

from __future__ import annotations

import logging
import os
from typing import Any, Mapping

from . import analysis, gating
from .metrics import METRICS
from .promclient import PrometheusClient, PrometheusError
from .spec import GluonRolloutSpec


def control_nodes(statuses: Mapping[str, gating.NodeStatus]) -> list[str]:
    """Flag-0 nodes of this rollout to compare with: the holdout group when there is one, else every
    eligible node not enabled yet (never ineligible nodes: other hardware or software)."""
    eligible = [n for n, s in statuses.items() if s.state == gating.ELIGIBLE]
    holdouts = [n for n in eligible if statuses[n].holdout]
    return sorted(holdouts or eligible)


def analysis_due(spec: GluonRolloutSpec, status: Mapping[str, Any], now: float) -> bool:
    if not spec.analysis.prometheusUrl:
        return False
    last = float((status.get("analysis") or {}).get("lastRun") or 0)
    return now - last >= spec.analysis.intervalSeconds


async def analyse(namespace: str, rollout: str, spec: GluonRolloutSpec, statuses: Mapping[str, gating.NodeStatus],
                  now: float, logger: logging.Logger) -> tuple[dict[str, gating.Verdict], dict[str, Any]]:
    """One query for the whole rollout; a verdict for every node in Analyzing or Promoted (guard mode)."""
    a = spec.analysis
    judged = [n for n, s in statuses.items() if s.state in (gating.ANALYZING, gating.PROMOTED)]
    summary: dict[str, Any] = {"lastRun": now, "nodes": len(judged)}
    if not judged:
        return {}, summary
    query = analysis.render(a.query or analysis.DEFAULT_QUERY, namespace, spec.podSelector.matchLabels, a.stepSeconds)
    earliest = min((statuses[n].changed_at or now) for n in judged)
    # Enough for every judged node's baseline, but bounded: long-promoted nodes in guard mode fall back
    # to the comparison with controls alone rather than making every query reach back forever.
    start = max(now - a.baselineSeconds - a.warmupSeconds - 4 * a.windowSeconds, min(now - a.windowSeconds, earliest - a.baselineSeconds))
    step = a.stepSeconds
    client = PrometheusClient(a.prometheusUrl, token=os.environ.get("GLUON_PROMETHEUS_TOKEN"), ca_file=os.environ.get("GLUON_PROMETHEUS_CA"))
    cfg = analysis.JudgeConfig(a.direction, a.tolerance, a.confidence, a.minSamples, a.minTraffic)
    try:
        with METRICS.query_seconds.time():
            series = analysis.series_by_node(await client.query_range(query, start, now, step))
        error = None
    except PrometheusError as exc:
        METRICS.analysis_errors.labels(exc.kind.split()[0]).inc()
        logger.warning("analysis: %s", exc)
        series, error = {}, str(exc)
    controls = [series[n] for n in control_nodes(statuses) if n in series]
    verdicts = {}
    for node in judged:
        status = statuses[node]
        judgement = (analysis.Judgement("inconclusive", f"Prometheus error: {error}") if error else
                     analysis.judge(series.get(node, []), controls, status.changed_at or now, a.warmupSeconds, now, a.windowSeconds,
                                    a.baselineSeconds, cfg))
        decision = analysis.decide(judgement, int(status.numbers.get("failStreak", 0)), status.numbers.get("inconclusiveSince"),
                                   now, a.consecutiveFailures, a.onNoData, a.noDataDeadlineSeconds)
        METRICS.verdicts.labels(namespace, rollout, judgement.result).inc()
        if judgement.effect is not None:
            METRICS.effect.labels(namespace, rollout, node).set(judgement.effect)
        numbers = judgement.to_dict() | {"failStreak": decision.streak, "inconclusiveSince": decision.inconclusive_since, "at": now}
        verdicts[node] = gating.Verdict(decision.verdict or "inconclusive", decision.reason, numbers)
    summary.update(query=query, error=error, controls=len(controls))
    return verdicts, summary
