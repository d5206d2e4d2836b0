"""What `kubectl gluon` shows, from raw API objects (dicts as the API server lists them): the status
table's rows, the decision record of one node, and their text rendering. Pure: no API calls."""

from __future__ import annotations

import datetime
import json
import re
from typing import Any, Iterable, Mapping, Sequence

from gluon_common import contract
from gluon_common.sglang_routes import ServingConfig

from .. import delivery, gating, plan, proving, records, serving, spec, world

NONE = "-"
FLAG_ORDER = ("1", "0", "?")


class PluginError(Exception):
    """A problem the user can act on; the message names the rollout, namespace or node."""


def rollout_ref(rollout: Mapping[str, Any]) -> str:
    meta = rollout.get("metadata") or {}
    return f"GluonRollout {meta.get('name')!r} in namespace {meta.get('namespace')!r}"


def meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def labels(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return meta(obj).get("labels") or {}


def annotations(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return meta(obj).get("annotations") or {}


# ---------------------------------------------------------------- selecting objects


def node_records(rollout: Mapping[str, Any], nodes: Iterable[Mapping[str, Any]] = ()) -> dict[str, dict[str, Any]]:
    """Each node's durable record as the operator last wrote it: this rollout's record annotation on the
    Node (always there, contract.ANNOTATION_NODE_RECORD), else the rollout's status.nodes (which past 500
    nodes holds only those needing attention). Its numbers are the status's while that lists the node in the
    same state: the Node's record is rewritten only when a deciding field changes, the status at every look,
    so status and explain show the judge's recorded effect of the latest look, as the demo does."""
    out = {name: dict(record or {}) for name, record in ((rollout.get("status") or {}).get("nodes") or {}).items()}
    view = plan.rollout_view(rollout)
    for node in nodes:
        status, _ = plan.recorded_status(view, world.node_view(node))
        if status is not None:
            name, entry = meta(node)["name"], status.to_dict()
            listed = out.get(name) or {}
            if listed.get("state") == entry["state"] and isinstance(listed.get("numbers"), Mapping):
                entry["numbers"] = dict(listed["numbers"])
            if listed.get("state") == entry["state"] and isinstance(listed.get("reason"), str):
                entry["reason"] = listed["reason"]  # with what is happening now (gating.with_now)
            out[name] = entry
    return out


def node_flag(node: Mapping[str, Any] | None) -> str:
    """The flag the operator set on the node (contract.LABEL_ENABLED): "1", "0", or "-" when unset."""
    enabled = labels(node or {}).get(contract.LABEL_ENABLED)
    return {"true": "1", "false": "0"}.get(enabled or "", NONE)


def serving_pods(rollout: Mapping[str, Any], pods: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The rollout's serving pods: its namespace, its podSelector, scheduled on a node."""
    namespace, selector = meta(rollout).get("namespace"), (rollout.get("spec") or {}).get("podSelector") or {}
    return [
        p
        for p in pods
        if meta(p).get("namespace") == namespace
        and (p.get("spec") or {}).get("nodeName")
        and spec.selector_matches(selector, labels(p))
    ]


def pods_on(node: str, pods: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [p for p in pods if (p.get("spec") or {}).get("nodeName") == node]


def flag_in_use(pods: Sequence[Mapping[str, Any]]) -> str:
    """The flag the node's serving pods really run with (the operator's pod label): "1", "0", a mix with
    counts such as "1 x3, 0 x1", "?" for pods not yet labelled, "-" without pods."""
    if not pods:
        return NONE
    values = [labels(p).get(contract.LABEL_POD_FLAG) for p in pods]
    values = [v if v in FLAG_ORDER else "?" for v in values]
    distinct = sorted(set(values), key=FLAG_ORDER.index)
    if len(distinct) == 1:
        return distinct[0]
    return ", ".join(f"{v} x{values.count(v)}" for v in distinct)


def effect_text(numbers: Mapping[str, Any]) -> str:
    return gating.effect_text(numbers, NONE)


# ---------------------------------------------------------------- reasons and times, for a person


# One GPU's self-test result as gating.failing_paths words it: "GPU 3 fallback fail (why)", then, on the last
# one, whatever the reason says after the list.
GPU_ITEM = re.compile(r"GPU (\d+) (\S+ \S+(?: \([^()]*\))?)(.*)$", re.DOTALL)


def index_ranges(indices: Sequence[int]) -> str:
    """[0, 1, 2, 3, 5] -> "0-3, 5"."""
    runs: list[list[int]] = []
    for i in sorted(set(indices)):
        if runs and runs[-1][1] == i - 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def fold_reason(text: str) -> str:
    """A reason with its per-GPU repeats folded: "GPU 0 fallback fail (x); GPU 1 fallback fail (x); ..." reads
    "GPUs 0-7 fallback fail (x)". Everything else is kept as written, in order."""
    head, sep, rest = text.partition("GPU ")
    if not sep:
        return text
    items = re.split(r"; (?=GPU \d+ )", sep + rest)
    groups: dict[str, list[int]] = {}
    tail = ""
    for position, item in enumerate(items):
        match = GPU_ITEM.match(item)
        if not match or (match.group(3) and position != len(items) - 1):
            return text  # not the list gating writes: leave it be
        groups.setdefault(match.group(2), []).append(int(match.group(1)))
        tail = match.group(3)
    folded = [f"GPU{'s' if len(gpus) > 1 else ''} {index_ranges(gpus)} {result}" for result, gpus in groups.items()]
    return head + "; ".join(folded) + tail


def clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 3, 0)] + "..."


def duration(seconds: float | None) -> str:
    """Time in a state as kubectl prints ages: 45s, 5m3s, 2h10m, 3d4h."""
    if seconds is None:
        return NONE
    s = max(int(seconds), 0)
    if s < 120:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60}s" if s < 600 else f"{s // 60}m"
    if s < 86_400:
        return f"{s // 3600}h{(s % 3600) // 60}m" if s < 8 * 3600 else f"{s // 3600}h"
    return f"{s // 86_400}d{(s % 86_400) // 3600}h"


def rfc3339(timestamp: Any) -> str | None:
    """A unix time as RFC 3339 (UTC, whole seconds); a string as given; None for anything else."""
    if isinstance(timestamp, (int, float)) and not isinstance(timestamp, bool) and timestamp > 0:
        return datetime.datetime.fromtimestamp(timestamp, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return timestamp if isinstance(timestamp, str) and timestamp else None


# ---------------------------------------------------------------- status


STATUS_COLUMNS = ("NODE", "STATE", "FLAG", "PODS", "EFFECT", "IN STATE", "REASON")
WIDE_COLUMNS = ("NODE", "STATE", "FLAG", "PODS", "EFFECT", "INTERVAL", "IN STATE", "SINCE", "FINGERPRINT", "REASON")
TERMINAL_WIDTH = 160  # normal output fits this; -o wide and -o json|yaml carry the full text
REASON_MIN = 40


def status_rows(
    rollout: Mapping[str, Any], nodes: Sequence[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """One row per node the rollout has a record of, sorted by name: its state, the flag the operator set
    on it, the flag its serving pods really run with, the measured effect and the reason."""
    serving = serving_pods(rollout, pods)
    by_name = {meta(n).get("name"): n for n in nodes}
    rows = []
    for node, record in sorted(node_records(rollout, nodes).items()):
        numbers = record.get("numbers") or {}
        since = record.get("since")
        rows.append(
            {
                "node": node,
                "state": record.get("state") or NONE,
                "holdout": bool(record.get("holdout")),
                "flag": node_flag(by_name.get(node)),
                "pods": flag_in_use(pods_on(node, serving)),
                "effect": numbers.get("effect"),
                "interval": [numbers.get("ci_low"), numbers.get("ci_high")]
                if numbers.get("ci_low") is not None
                else None,
                "since": rfc3339(since),
                "sinceUnix": since if isinstance(since, (int, float)) and since > 0 else None,
                "fingerprint": record.get("fingerprint"),
                "reason": record.get("reason") or "",
                "summary": fold_reason(record.get("reason") or ""),
            }
        )
    return rows


def status_view(
    rollout: Mapping[str, Any], nodes: Sequence[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]]
) -> dict[str, Any]:
    """`kubectl gluon status -o json`: the rollout's phase, approval and counts, and the node rows."""
    status = rollout.get("status") or {}
    return {
        "message": status.get("message"),
        "rollout": meta(rollout).get("name"),
        "namespace": meta(rollout).get("namespace"),
        "phase": status.get("phase"),
        "paused": bool((rollout.get("spec") or {}).get("paused")),
        "dryRun": bool((rollout.get("spec") or {}).get("dryRun")),
        "aborted": status.get("aborted") or annotations(rollout).get(contract.ANNOTATION_ROLLOUT_ABORT),
        "approval": status.get("approval"),
        "counts": status.get("counts") or {},
        "invalid": status.get("invalid"),
        "nodesOmitted": status.get("nodesOmitted"),
        "delivery": status.get("delivery"),
        "nodes": status_rows(rollout, nodes, pods),
    }


def delivery_lines(found: Mapping[str, Any] | None) -> list[str]:
    """How the flag reaches the rollout's pods (status.delivery), and any pod seen running another flag."""
    if not found:
        return []
    lines = [f"flag delivery: {found.get('mode')}: {found.get('undeliverable') or found.get('reason')}"]
    mismatched = found.get("mismatched") or []
    if mismatched:
        count = found.get("mismatchedCount") or len(mismatched)
        lines.append(f"flag delivery MISMATCH on {count} pod(s): {'; '.join(mismatched[:3])}")
    return lines


def render_status(
    view: Mapping[str, Any], now: float | None = None, wide: bool = False, width: int = TERMINAL_WIDTH
) -> str:
    """The rollout's header lines and its node table. Normal output folds each reason's repeats and clips it
    so a row fits `width` columns; wide adds the interval, the state's start and the fingerprint, and keeps
    the whole reason."""
    counts = ", ".join(f"{n} {state}" for state, n in (view.get("counts") or {}).items() if n)
    head = [
        f"GluonRollout {view['namespace']}/{view['rollout']}: {view.get('phase') or 'no status yet'}"
        + (f" ({counts})" if counts else "")
    ]
    if view.get("invalid"):
        head.append(f"invalid spec: {view['invalid']}")
    if view.get("dryRun"):
        head.append(
            "dry run: spec.dryRun is true, the operator changes no node or pod "
            "(`kubectl gluon plan` shows what it would do)"
        )
    if view.get("paused"):
        head.append("paused: spec.paused is true (`kubectl gluon resume` resumes)")
    if view.get("aborted"):
        head.append(f"aborted: {describe(view['aborted'])}")
    head += delivery_lines(view.get("delivery"))
    waiting = (view.get("approval") or {}).get("waitingFor")
    if waiting:
        head.append(f"waiting for approval of {waiting!r} (`kubectl gluon promote` grants it)")
    if not wide:
        head = [clip(line, width) for line in head]
    if not view["nodes"]:
        return "\n".join(head + ["no nodes recorded yet (the operator has not reconciled this rollout)"]) + "\n"

    def in_state(row: Mapping[str, Any]) -> str:
        return duration(now - row["sinceUnix"]) if now is not None and row.get("sinceUnix") else NONE

    def cells(row: Mapping[str, Any]) -> list[str]:
        state = row["state"] + (" (holdout)" if row["holdout"] else "")
        effect = effect_text({"effect": row["effect"]})
        if wide:
            low, high = row.get("interval") or (None, None)
            interval = f"x{low:.3f}..x{high:.3f}" if low is not None and high is not None else NONE
            return [
                row["node"],
                state,
                row["flag"],
                row["pods"],
                effect,
                interval,
                in_state(row),
                row.get("since") or NONE,
                row.get("fingerprint") or NONE,
                row["reason"],
            ]
        return [row["node"], state, row["flag"], row["pods"], effect, in_state(row), row["summary"]]

    rows = [cells(r) for r in view["nodes"]]
    if not wide:  # the reason gets what the other columns leave of the width
        others = sum(max(len(c) for c in column) for column in list(zip(*([list(STATUS_COLUMNS)] + rows)))[:-1])
        room = max(width - others - 3 * (len(STATUS_COLUMNS) - 1), REASON_MIN)
        rows = [row[:-1] + [clip(row[-1], room)] for row in rows]
    return "\n".join(head) + "\n" + table(WIDE_COLUMNS if wide else STATUS_COLUMNS, rows)


def describe(value: Any) -> str:
    if isinstance(value, Mapping):
        return value.get("reason") or json.dumps(value, sort_keys=True)
    return str(value)


def table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """kubectl's layout: upper-case headers, columns padded to the widest cell, three spaces apart."""
    cells = [list(columns)] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    lines = ["   ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- explain


def agent_alive(node_name: str, agent_pods: Iterable[Mapping[str, Any]]) -> bool:
    """A running, ready, not-deleting agent pod on the node, read as the operator reads it."""
    return any((world.agent_entry(pod) or {}).get(node_name) for pod in agent_pods)


def raw_json(annotation: str | None) -> dict[str, Any] | None:
    """An annotation's JSON object for display (the operator's typed reading says what is wrong with it)."""
    try:
        value = records.loads(annotation) if annotation else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def selftest_rows(report: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """One row per GPU and path from the agent's report annotation; `speedup` (accelerated over fallback,
    per timed case) is the GPU's, on its accelerated row."""
    rows = []
    for gpu in ((report or {}).get("selftest") or {}).get("gpus") or []:
        results = gpu.get("result") or {}
        for path in sorted(results):
            rows.append(
                {
                    "gpu": gpu.get("index"),
                    "path": path,
                    "result": results[path],
                    "speedup": dict(gpu.get("speedup") or {}) if path == "accelerated" else {},
                    "maxRelL2": (gpu.get("max_rel_l2") or {}).get(path),
                    "reasons": list((gpu.get("reasons") or {}).get(path) or []),
                }
            )
    return rows


def rollout_serving(rollout: Mapping[str, Any]) -> ServingConfig | str | None:
    """The serving configuration the operator resolved for the rollout (status.serving), why it has none,
    or None before the operator has said."""
    status = (rollout.get("status") or {}).get("serving") or {}
    if status.get("config"):
        try:
            return ServingConfig.from_dict(status["config"], "status.serving.config")
        except ValueError as exc:
            return str(exc)
    return status.get("problem") or None


def serving_view(expected: ServingConfig | str | None, report: Mapping[str, Any] | None) -> dict[str, Any]:
    """The rollout's serving configuration, the one the node's self-test proved, and whether flag 0 has a route."""
    proved = (((report or {}).get("selftest") or {}).get("serving") or {}).get("digest")
    sglang = ((report or {}).get("probe") or {}).get("sglang")
    config = expected if isinstance(expected, ServingConfig) else None
    return {
        "digest": config.digest if config else None,
        "described": serving.describe(config) if config else None,
        "problem": expected if isinstance(expected, str) else None,
        "proved": proved,
        "flag0NoRoute": serving.flag0_no_route(sglang if isinstance(sglang, Mapping) else None, config)
        if config
        else [],
        "flag1NoRoute": serving.flag1_no_route(sglang if isinstance(sglang, Mapping) else None, config)
        if config
        else [],
    }


def explain(
    rollout: Mapping[str, Any],
    node: Mapping[str, Any],
    pods: Iterable[Mapping[str, Any]],
    agent_pods: Iterable[Mapping[str, Any]],
    now: float,
) -> dict[str, Any]:
    """The whole decision record of one node: what the operator recorded, why it is (in)eligible now,
    each GPU's and path's self-test, the analysis numbers and the rollback record."""
    name = meta(node).get("name")
    record = node_records(rollout, [node]).get(name)
    _, report_problem = gating.parse_report(annotations(node))
    report = raw_json(annotations(node).get(contract.ANNOTATION_REPORT))
    retry_after = ((rollout.get("spec") or {}).get("analysis") or {}).get("retryAfterSeconds")
    alive = agent_alive(name, agent_pods)
    expected = rollout_serving(rollout)
    el = gating.eligibility(gating.NodeFacts(name, labels(node), annotations(node), alive), now, retry_after, expected)
    rollback, rollback_problem = gating.parse_rollback(annotations(node))
    probe = (report or {}).get("probe") or {}
    selftest = (report or {}).get("selftest") or {}
    node_labels = labels(node)
    view = world.node_view(node)
    analysis_spec = (rollout.get("spec") or {}).get("analysis") or {}
    return {
        "node": name,
        "rollout": {"name": meta(rollout).get("name"), "namespace": meta(rollout).get("namespace")},
        "now": rfc3339(now),
        "nowUnix": now,
        "confidence": analysis_spec.get("confidence", 0.95),
        "direction": analysis_spec.get("direction", "higher"),
        "decision": record,
        "eligibility": {
            "eligible": el.eligible,
            "reason": el.reason,
            "fingerprint": el.fingerprint,
            "agentAlive": alive,
            "skip": node_labels.get(contract.LABEL_SKIP) == "true",
            "cordoned": view.unschedulable,
            "ready": view.ready,
            "held": plan.held_reason(view),
            "flag": node_flag(node),
            "labels": {k: v for k, v in sorted(node_labels.items()) if contract.is_ours(k)},
        },
        "probe": {
            "capable": probe.get("capable"),
            "ready": probe.get("ready"),
            "missingForCapable": probe.get("missing_for_capable") or [],
            "summary": probe.get("summary"),
            "simulated": bool(probe.get("simulated")),
        }
        if report
        else None,
        "reportProblem": report_problem,
        "serving": serving_view(expected, report),
        "selftest": {
            "verdict": (report or {}).get("verdict"),
            "fingerprint": selftest.get("fingerprint"),
            "testedAt": selftest.get("tested_at"),
            "mode": selftest.get("mode"),
            "simulated": bool(selftest.get("simulated")),
            "problems": selftest.get("problems") or [],
            "gpus": selftest_rows(report),
        }
        if report
        else None,
        "proofs": proofs_view(node, pods_on(name, serving_pods(rollout, pods))),
        "analysis": dict((record or {}).get("numbers") or {}),
        "rollback": rollback.model_dump() if rollback else None,
        "rollbackProblem": rollback_problem,
        "delivery": delivery_view(node, pods_on(name, serving_pods(rollout, pods))),
        "pods": [
            {
                "name": meta(p).get("name"),
                "flag": labels(p).get(contract.LABEL_POD_FLAG),
                "phase": (p.get("status") or {}).get("phase"),
            }
            for p in pods_on(name, serving_pods(rollout, pods))
        ],
    }


def proofs_view(node: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """What self-tests in the serving images proved on this node (contract.ANNOTATION_PROOFS), newest first,
    and which of them the node's serving pods run."""
    held, problem = proving.read_proofs(annotations(node).get(contract.ANNOTATION_PROOFS))
    running = {digest for digest in (world.serving_image(p)[0] for p in pods) if digest}
    return {
        "problem": problem,
        "running": sorted(running),
        "proofs": [p.model_dump(exclude_none=True) | {"served": p.digest in running} for p in held.proofs],
    }


def delivery_view(node: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """What the node's agent saw each serving pod's processes run, beside what its preflight chose
    (operator/gluon_operator/delivery.py reads it the same way), and whether it can see at all."""
    report = plan.delivery_report(world.node_view(node))
    views = [v for v in map(world.pod_view, pods) if v is not None]
    found = delivery.node_delivery(views, report)
    seen = {c.pod_uid: c for c in (report.containers if report else [])}
    return {
        "observable": found.unavailable is None,
        "problem": found.unavailable,
        "pods": [
            {
                "name": v.name,
                "chose": v.flag,
                "runs": found.pods[v.name].flag,
                "state": found.pods[v.name].state,
                "detail": found.pods[v.name].detail,
                "observedSince": seen[v.uid].since if v.uid in seen else None,
            }
            for v in views
            if v.name in found.pods
        ],
    }


def ago(record: Mapping[str, Any], timestamp: Any) -> str:
    """RFC 3339, and how long ago when the time is a unix one."""
    text = rfc3339(timestamp) or NONE
    now = record.get("nowUnix")
    if isinstance(timestamp, (int, float)) and isinstance(now, (int, float)) and timestamp > 0:
        text += f" ({duration(now - timestamp)} ago)"
    return text


def effect_words(record: Mapping[str, Any], numbers: Mapping[str, Any]) -> str | None:
    """The judged effect, its interval and the bar it had to clear, in words."""
    effect = gating.recorded_effect(numbers)
    if effect is None:
        return None
    metric = "decode speed" if record.get("direction", "higher") == "higher" else "the metric"
    change = (effect - 1) * 100
    side = "above" if change >= 0 else "below"
    text = f"{gating.effect_text(numbers)}: {metric} {abs(change):.1f}% {side} that of its controls"
    low, high = numbers.get("ci_low"), numbers.get("ci_high")
    if isinstance(low, (int, float)) and isinstance(high, (int, float)):
        text += f", {record.get('confidence', 0.95) * 100:g}% interval x{low:.3f} to x{high:.3f}"
    threshold = numbers.get("threshold")
    if isinstance(threshold, (int, float)):
        text += f"; it fails below x{threshold:.3f}"
    return text


def evidence_words(record: Mapping[str, Any], numbers: Mapping[str, Any]) -> str | None:
    """The few numbers behind the effect: when, against how many controls, on how many samples."""
    parts = []
    if numbers.get("at"):
        parts.append(f"judged at {ago(record, numbers['at'])}")
    controls = numbers.get("n_controls")
    if isinstance(controls, int):
        flag = numbers.get("control_flag")
        parts.append(
            f"against {controls} control node{'s' if controls != 1 else ''}"
            + (f" at flag {flag}" if flag is not None else "")
        )
    post, pre = numbers.get("n_post"), numbers.get("n_pre")
    if isinstance(post, int) and isinstance(pre, int):
        parts.append(f"{post} samples since its flag flipped, {pre} before")
    if isinstance(numbers.get("looks"), int) and numbers["looks"]:
        parts.append(f"{numbers['looks']} look{'s' if numbers['looks'] != 1 else ''}")
    p_worse = numbers.get("p_worse")
    if isinstance(p_worse, (int, float)):
        parts.append(f"p(worse than tolerance) {p_worse:.3g}")
    if numbers.get("inconclusiveSince"):
        parts.append(f"inconclusive since {rfc3339(numbers['inconclusiveSince'])}")
    return ", ".join(parts) or None


def selftest_words(selftest: Mapping[str, Any]) -> list[str]:
    """The self-test in one line, then its failing paths folded; speedups as a range over the GPUs."""
    gpus = selftest.get("gpus") or []
    indices = sorted({g["gpu"] for g in gpus if isinstance(g.get("gpu"), int)})
    tested = rfc3339(selftest.get("testedAt")) or NONE
    line = f"{selftest.get('verdict')} for fingerprint {selftest.get('fingerprint')}, tested at {tested}"
    if indices:
        line += f"; {len(indices)} GPU{'s' if len(indices) != 1 else ''}"
    speeds = [v for g in gpus for v in (g.get("speedup") or {}).values() if isinstance(v, (int, float))]
    if speeds:
        line += f", accelerated over fallback x{min(speeds):.2f} to x{max(speeds):.2f}"
    line += " (SIMULATION)" if selftest.get("simulated") else ""
    failing = "; ".join(
        f"GPU {g['gpu']} {g['path']} {g['result']}" + (f" ({g['reasons'][0]})" if g.get("reasons") else "")
        for g in gpus
        if g.get("result") != "pass"
    )
    problems = list(dict.fromkeys(selftest.get("problems") or []))
    return [line] + ([f"failing: {fold_reason(failing)}"] if failing else []) + problems


def render_explain(record: Mapping[str, Any]) -> str:
    """`kubectl gluon explain`, for a person: the verdict, the effect with its interval and the few numbers
    behind it, then why the node is (in)eligible and what its agent found. Times in RFC 3339; every number
    is in -o json."""
    ro = record["rollout"]
    out = [f"Node {record['node']} in GluonRollout {ro['namespace']}/{ro['name']}"]

    def line(label: str, text: str) -> None:
        out.append(f"  {label + ':':<11} {text}")

    decision = record.get("decision")
    el = record["eligibility"]
    if decision:
        line(
            "verdict",
            f"{decision.get('state')}{' (holdout)' if decision.get('holdout') else ''} since "
            f"{ago(record, decision.get('since'))}: {fold_reason(decision.get('reason') or '')}",
        )
    else:
        line("verdict", "none yet: the rollout has no record of this node")
    numbers = record.get("analysis") or {}
    effect = effect_words(record, numbers)
    if effect:
        line("effect", effect)
    evidence = evidence_words(record, numbers)
    if evidence:
        line("evidence", evidence)
    reason = fold_reason(el["reason"])
    if not (decision and reason == fold_reason(decision.get("reason") or "")):  # no reason said twice
        line("eligible", f"{'yes' if el['eligible'] else 'no'}: {reason}")
    else:
        line("eligible", "yes" if el["eligible"] else "no")
    line(
        "node",
        f"agent {'alive' if el['agentAlive'] else 'not running or not ready'}, "
        f"{'cordoned' if el['cordoned'] else 'schedulable'}, "
        f"{'Ready' if el['ready'] else 'NotReady' if el['ready'] is False else 'Ready unknown'}"
        + (", skip label set" if el["skip"] else "")
        + f", flag {el['flag']}",
    )
    if el.get("held"):
        line("held", el["held"])
    if record.get("reportProblem"):
        line("report", record["reportProblem"])
    served = record.get("serving") or {}
    if served.get("digest"):
        proved = served["proved"] or NONE
        line(
            "serving",
            f"config {served['digest']} ({served['described']}); the self-test proved {proved}"
            + ("" if proved == served["digest"] else " (re-test requested by the operator's annotation)"),
        )
    elif served.get("problem"):
        line("serving", f"unresolved: {served['problem']}")
    if served.get("flag0NoRoute"):
        line(
            "flag 0",
            f"no working route ({served['flag0NoRoute'][0]}): no safe rollback, so never enabled; "
            f"a template with {contract.FLAG_ENV}=0 would crash serving here",
        )
    if served.get("flag1NoRoute"):
        line("flag 1", f"no working route ({served['flag1NoRoute'][0]}): the accelerated path fails its self-test")
    probe = record.get("probe")
    if probe:
        capable = "capable" if probe["capable"] else "not capable"
        line(
            "probe",
            f"{capable}, {'ready' if probe['ready'] else 'not ready'}"
            + (f"; missing: {'; '.join(probe['missingForCapable'])}" if probe["missingForCapable"] else "")
            + (" (SIMULATION)" if probe["simulated"] else ""),
        )
    selftest = record.get("selftest")
    if selftest:
        first, *rest = selftest_words(selftest)
        line("self-test", first)
        out.extend(f"{'':13} {text}" for text in rest)
    for text in proof_lines(record.get("proofs") or {}):
        line("proved", text)
    rollback = record.get("rollback")
    line("rollback", rollback.get("reason") if rollback else record.get("rollbackProblem") or "none recorded")
    if rollback:
        out.append(
            f"{'':13} for fingerprint {rollback.get('fingerprint')}, at {ago(record, rollback.get('at'))}; "
            "`kubectl gluon retry NODE` clears it"
        )
    observed = record.get("delivery") or {}
    if observed.get("problem"):
        line("delivery", observed["problem"])
    for pod in observed.get("pods") or []:
        line(
            "delivery",
            f"{pod['name']}: preflight chose {pod['chose'] or '?'}, its processes run {pod['runs'] or '?'} "
            f"({pod['state']}: {pod['detail']})",
        )
    pods = record.get("pods") or []
    line(
        "pods",
        f"{len(pods)}"
        + (": " if pods else "")
        + ", ".join(f"{p['name']} (flag {p['flag'] or '?'}, {p['phase']})" for p in pods),
    )
    out.append("  (every number: kubectl gluon explain NODE -o json)")
    return "\n".join(out) + "\n"


def proof_lines(proofs: Mapping[str, Any]) -> list[str]:
    """One line per image a self-test pod proved on the node: which, for what configuration, and the verdict."""
    lines = [f"unreadable: {proofs['problem']}"] if proofs.get("problem") else []
    for p in proofs.get("proofs") or []:
        lines.append(
            f"{p['digest'][:19]} config {p['serving']}: {p['result']} ({p.get('reason') or 'no reason'})"
            + (", served here" if p.get("served") else "")
        )
    unproved = sorted(set(proofs.get("running") or []) - {p["digest"] for p in proofs.get("proofs") or []})
    lines += [f"{digest[:19]}: served here, not proved yet" for digest in unproved]
    return lines


def indent(text: str, by: str = "    ") -> str:
    return "\n".join(by + line for line in text.rstrip("\n").split("\n"))


# ---------------------------------------------------------------- plan


def preview(rollout: dict, nodes: list[dict], pods: list[dict], now: float) -> dict:
    """The next reconcile's plan, from raw API objects (a GluonRollout, Nodes, Pods: agent pods and serving
    pods, as `kubectl get -o json` lists them), without running the analysis (no verdicts). JSON-able:
    {"dryRun", "nodeWrites": [{node, labels, annotations}], "restarts": [{namespace, node, pods, why}],
    "podLabels", "events": [{type, reason, message}], "transitions": [{node, old, new, rollback}], "status"}.

    Where to read a node's facts (for `kubectl gluon status/explain`):
    - state and reason: the rollout's status.nodes[NODE] {state, reason, since, changedAt, fingerprint,
      holdout, numbers} while the rollout has at most 500 nodes (beyond, only nodes needing attention are
      there, status.nodesOmitted counts the rest); always on the Node itself, in the JSON annotation
      contract.ANNOTATION_NODE_RECORD (the same fields plus "rollout": "namespace/name"), and the label
      contract.LABEL_STATE.
    - flag: the Node label contract.LABEL_ENABLED ("true" | "false"); each serving pod's real flag is its
      label contract.LABEL_POD_FLAG.
    - effect and the analysis numbers: `numbers` of the node record (effect, ci, p_worse, threshold,
      failStreak, ...); a rolled-back node's numbers also in contract.ANNOTATION_ROLLBACK.
    - eligibility and self-test: the agent report contract.ANNOTATION_REPORT and labels contract.LABEL_CAPABLE,
      contract.LABEL_SELFTEST; the record's reason says why a node is not eligible.
    The preview sees only this rollout: overlaps with other rollouts (the Conflict condition) are not checked.
    """
    view = plan.rollout_view(rollout)
    # the Pod and Node readings the caches use, so the preview decides as the operator does
    seen = world.world_from_objects(nodes, pods, [plan.claim_of(view)])
    return plan.plan(view, seen, {}, None, now).to_dict()


def short(value: Any, width: int = 60) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= width else text[:width] + f"... ({len(text)} chars)"


def changes_text(changes: Mapping[str, Any]) -> str:
    """Merge-patch keys as kubectl label/annotate spells them: key=value, key- for a removal."""
    return ", ".join(f"{key}-" if value is None else f"{key}={short(value)}" for key, value in sorted(changes.items()))


def render_plan(plan: Mapping[str, Any]) -> str:
    """`kubectl gluon plan`: the next reconcile's plan (preview), in the order the
    operator would execute it: status, node writes, restarts, pod labels, events."""
    out = ["The next reconcile's plan (a preview: nothing has been written)"]
    if plan.get("dryRun"):
        out.append("spec.dryRun is true: the operator records this plan in status and Events and writes nothing else")
    transitions = [
        [t.get("node"), t.get("old") or NONE, t.get("new"), t.get("rollback") or ""]
        for t in plan.get("transitions") or []
    ]
    status = plan.get("status") or {}
    writes = [
        [w.get("node"), changes_text(w.get("labels") or {}), changes_text(w.get("annotations") or {})]
        for w in plan.get("nodeWrites") or []
    ]
    restarts = [[r.get("node"), r.get("why"), ", ".join(r.get("pods") or [])] for r in plan.get("restarts") or []]
    labels_ = [[p.get("name"), p.get("flag")] for p in plan.get("podLabels") or []]
    events = [[e.get("type"), e.get("reason"), e.get("message")] for e in plan.get("events") or []]
    if not (transitions or status or writes or restarts or labels_ or events):
        return "\n".join(out + ["nothing to do: the next reconcile changes nothing"]) + "\n"
    sections = [
        ("node transitions", ("NODE", "FROM", "TO", "ROLLBACK"), transitions),
        (
            "status keys written",
            ("KEY", "VALUE"),
            [[k, "(removed)" if v is None else short(v)] for k, v in sorted(status.items())],
        ),
        ("node writes, in order", ("NODE", "LABELS", "ANNOTATIONS"), writes),
        ("pod restarts, in order", ("NODE", "WHY", "PODS"), restarts),
        ("pod flag labels", ("POD", "FLAG"), labels_),
        ("events", ("TYPE", "REASON", "MESSAGE"), events),
    ]
    for title, columns, rows in sections:
        if rows:
            out.append(f"{title}:")
            out.append(indent(table(columns, rows), "  "))
    return "\n".join(out) + "\n"
