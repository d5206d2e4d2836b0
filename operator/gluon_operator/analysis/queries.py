"""The queries: PromQL templates, their rendering, and Prometheus answers read into per-node series."""

from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

import numpy as np

from gluon_common import contract

Series = Sequence[tuple[float, float]]  # (unix seconds, value)


# Decode speed each request sees, tokens/s per sequence: 1 / (mean seconds per output token).
# Load-aware: it does not move with the number of requests the way gen_throughput does, and it is the
# decode step time the attention kernel changes. Weighted by tokens across the node's pods.
# The name is matched as sglang[:_]...: prometheus_client (SGLang's exporter) rewrites ':' to '_' in
# sample names when Prometheus negotiates OpenMetrics (client_python issue #1177; seen with Prometheus
# 2.42 and prometheus-client 0.26), so depending on versions the series is stored under either name.
# Split by the flag the pods really ran (the PodMonitor's `flag` label): a node's samples from pods still
# at flag 0 after its label flipped are never counted as flag 1 (split_by_flag, judge).
_POD_MATCHERS = 'namespace="{{namespace}}"{{selector}}'  # filled in by render()
_WINDOW = "[{{window}}]"
_BY_NODE_AND_FLAG = f"sum by (node, {contract.METRIC_LABEL_FLAG})"


def _sglang(metric: str) -> str:
    """The series of SGLang's `metric` under either spelling of its prefix, from the rollout's serving pods."""
    return f'{{__name__=~"sglang[:_]{metric}",{_POD_MATCHERS}}}'


DEFAULT_QUERY = (
    f"{_BY_NODE_AND_FLAG} (rate({_sglang('inter_token_latency_seconds_count')}{_WINDOW}))"
    " / "
    f"{_BY_NODE_AND_FLAG} (rate({_sglang('inter_token_latency_seconds_sum')}{_WINDOW}))"
)


# The node's own load, from SGLang's gauges, templated and name-matched like DEFAULT_QUERY: running
# requests summed over the node's pods, KV-cache usage (0..1) averaged over them. One query each per
# rollout per interval, whatever the fleet size.
COVARIATE_QUERIES: Mapping[str, str] = {
    "running": f"sum by (node) (avg_over_time({_sglang('num_running_reqs')}{_WINDOW}))",
    "usage": f"avg by (node) (avg_over_time({_sglang('token_usage')}{_WINDOW}))",
}


COVARIATES = tuple(COVARIATE_QUERIES)


LABEL_NAME = re.compile(r"[^a-zA-Z0-9_]")


class MalformedAnswer(ValueError):
    """A Prometheus answer that is not the documented matrix/vector shape."""


class MissingLabel(ValueError):
    """Series that all lack a label the judge groups by: the scrape's relabeling that sets it is missing."""


def require_label(result: Any, label: str, what: str) -> None:
    """Series came back but none carries `label` (e.g. a PodMonitor without the chart's relabeling to
    `node`): an error naming the label, where series_by_node would silently find no node at all."""
    if not isinstance(result, list) or not result:
        return
    if not any(isinstance(item, dict) and (item.get("metric") or {}).get(label) for item in result):
        raise MissingLabel(
            f"the {what} query's {len(result)} series carry no '{label}' label: the scrape config does not set it "
            f"(the chart's PodMonitor relabels __meta_kubernetes_pod_node_name to '{label}')"
        )


def promql_selector(match_labels: Mapping[str, str]) -> str:
    """Extra matchers for the serving pods' labels (the chart's PodMonitor maps pod labels to metric
    labels, '.', '/' and '-' becoming '_'), each prefixed with a comma to follow namespace=..."""
    parts = [f',{LABEL_NAME.sub("_", k)}="{v}"' for k, v in sorted(match_labels.items())]
    return "".join(parts)


def render(template: str, namespace: str, match_labels: Mapping[str, str], step_seconds: int, node: str = ".*") -> str:
    """{{window}} is the rate window of one sample (the step), so samples do not overlap."""
    return (
        template.replace("{{namespace}}", namespace)
        .replace("{{selector}}", promql_selector(match_labels))
        .replace("{{window}}", f"{step_seconds}s")
        .replace("{{node}}", node)
    )


def series_by_node(result: Any) -> dict[str, np.ndarray]:
    """Prometheus matrix (or vector) result -> {node: (n, 2) array of [t, v]}. Series without a node
    label are ignored; anything not of the documented shape raises MalformedAnswer naming the item."""
    if not isinstance(result, list):
        raise MalformedAnswer(f"result is {type(result).__name__}, not a list of series")
    out: dict[str, np.ndarray] = {}
    for index, item in enumerate(result):
        if not isinstance(item, dict) or not isinstance(item.get("metric", {}), dict):
            raise MalformedAnswer(f"result[{index}] is not an object with a metric object")
        node = (item.get("metric") or {}).get("node")
        if not node:
            continue
        values = item.get("values") if "values" in item else ([item["value"]] if item.get("value") is not None else [])
        if not isinstance(values, list):
            raise MalformedAnswer(f"result[{index}].values is {type(values).__name__}, not a list")
        points = _points(values, f"result[{index}] (node {node})")
        out[str(node)] = np.vstack([out[str(node)], points]) if str(node) in out else points
    return out


def _points(values: list, where: str) -> np.ndarray:
    """[[t, "v"], ...] -> (n, 2) floats; numpy parses the whole list at once (Prometheus sends values
    as strings, NaN and +Inf included), and only a failure is looked at pair by pair, to name it."""
    try:
        points = np.array(values, dtype=float)
        parsed = points.ndim == 2 and points.shape[1] == 2
        # numpy reads None as NaN: a NaN is only a value when Prometheus sent the string "NaN"
        if parsed and not (
            np.isnan(points).any() and any(None in pair for pair in values if isinstance(pair, (list, tuple)))
        ):
            if np.isnan(points[:, 0]).any():
                raise MalformedAnswer(f"{where} has a sample time that is not a number")
            return points
        if not values:
            return np.empty((0, 2))
    except (TypeError, ValueError):
        pass
    for pair in values:
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise MalformedAnswer(f"{where} has a sample {pair!r}, not [time, value]")
        try:
            float(pair[0]), float(pair[1])
        except (TypeError, ValueError):
            raise MalformedAnswer(f"{where} has a non-numeric sample {pair!r}") from None
    raise MalformedAnswer(f"{where} has samples that are not [time, value] pairs")


# What a node's sample at one step came from (split_by_flag): pods at flag 0, at flag 1, both at once
# (no single flag: never a treatment or control sample), or pods without the flag label (admitted without
# the webhook: their flag is unknown, so not 1). NaN: no sample, or a query not split by the flag at all.
FLAG_OFF, FLAG_ON, FLAG_MIXED, FLAG_UNLABELLED = 0.0, 1.0, 0.5, -1.0


def split_by_flag(result: Any) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """A speed answer split `by (node, flag)` -> ({node: (n, 2) [t, value]}, {node: (n, 2) [t, flag code]}).
    At a step where one flag's pods served (a usable value: finite, > 0) that value and its flag; where
    pods of two flags (or unlabelled ones) both served, NaN and FLAG_MIXED: the sum over both cannot be
    recovered from two ratios, and such a node has not switched. An answer with no flag label anywhere
    (a custom query not split by it) gives no flag codes: every sample's flag is unknown."""
    labelled = isinstance(result, list) and any(
        isinstance(item, dict) and isinstance(item.get("metric"), dict) and contract.METRIC_LABEL_FLAG in item["metric"]
        for item in result
    )
    if not labelled:
        return series_by_node(result), {}
    parts: dict[str, dict[float, np.ndarray]] = {}
    for index, item in enumerate(result):
        flag = str(item.get("metric", {}).get(contract.METRIC_LABEL_FLAG, "")) if isinstance(item, dict) else ""
        code = {"0": FLAG_OFF, "1": FLAG_ON}.get(flag, FLAG_UNLABELLED)
        for node, points in series_by_node([item]).items():
            known = parts.setdefault(node, {})
            known[code] = np.vstack([known[code], points]) if code in known else points
    speed, flags = {}, {}
    for node, by_code in parts.items():
        stamps = np.unique(np.round(np.concatenate([p[:, 0] for p in by_code.values()]), 3))
        value, code, served = np.full(len(stamps), np.nan), np.full(len(stamps), np.nan), np.zeros(len(stamps), int)
        for flag_code, points in by_code.items():
            at = np.searchsorted(stamps, np.round(points[:, 0], 3))
            usable = np.isfinite(points[:, 1]) & (points[:, 1] > 0)
            first = (
                ~np.isfinite(value[at]) & ~usable & ~np.isfinite(code[at])
            )  # a sample without traffic still says the step
            value[at[first]], code[at[first]] = points[first, 1], flag_code
            value[at[usable]], code[at[usable]] = points[usable, 1], flag_code
            np.add.at(served, at[usable], 1)
        both = served > 1
        value[both], code[both] = np.nan, FLAG_MIXED
        speed[node], flags[node] = np.column_stack([stamps, value]), np.column_stack([stamps, code])
    return speed, flags
