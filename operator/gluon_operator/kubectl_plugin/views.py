"""What `kubectl gluon` shows, from raw API objects (dicts as the API server lists them): the status
table's rows, the decision record of one node, and their text rendering. Pure: no API calls."""

from __future__ import annotations

import datetime
import json
from typing import Any, Iterable, Mapping, Sequence

from gluon_agent import contract
from gluon_agent.sglang_routes import ServingConfig

from .. import gating, plan, records, serving, spec, world

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


# ---------------------------------------------------------------- status


STATUS_COLUMNS = ("NODE", "STATE", "FLAG", "PODS", "EFFECT", "REASON")


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
        rows.append(
            {
                "node": node,
                "state": record.get("state") or NONE,
                "holdout": bool(record.get("holdout")),
                "flag": node_flag(by_name.get(node)),
                "pods": flag_in_use(pods_on(node, serving)),
                "effect": numbers.get("effect"),
                "reason": record.get("reason") or "",
            }
        )
    return rows


def status_view(
    rollout: Mapping[str, Any], nodes: Sequence[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]]
) -> dict[str, Any]:
    """`kubectl gluon status --json`: the rollout's phase, approval and counts, and the node rows."""
    status = rollout.get("status") or {}
    return {
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
        "nodes": status_rows(rollout, nodes, pods),
    }


def render_status(view: Mapping[str, Any]) -> str:
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
    waiting = (view.get("approval") or {}).get("waitingFor")
    if waiting:
        head.append(f"waiting for approval of {waiting!r} (`kubectl gluon promote` grants it)")
    rows = [
        [
            r["node"],
            r["state"] + (" (holdout)" if r["holdout"] else ""),
            r["flag"],
            r["pods"],
            effect_text({"effect": r["effect"]}),
            r["reason"],
        ]
        for r in view["nodes"]
    ]
    if not rows:
        return "\n".join(head + ["no nodes recorded yet (the operator has not reconciled this rollout)"]) + "\n"
    return "\n".join(head) + "\n" + table(STATUS_COLUMNS, rows)


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


def speedup_text(speedup: Mapping[str, Any]) -> str:
    return (
        ", ".join(f"{case} x{value:.2f}" for case, value in sorted(speedup.items()) if isinstance(value, (int, float)))
        or NONE
    )


def when(timestamp: Any) -> str:
    if not isinstance(timestamp, (int, float)):
        return str(timestamp) if timestamp else NONE
    return datetime.datetime.fromtimestamp(timestamp, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


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
    return {
        "node": name,
        "rollout": {"name": meta(rollout).get("name"), "namespace": meta(rollout).get("namespace")},
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
        "analysis": dict((record or {}).get("numbers") or {}),
        "rollback": rollback.model_dump() if rollback else None,
        "rollbackProblem": rollback_problem,
        "pods": [
            {
                "name": meta(p).get("name"),
                "flag": labels(p).get(contract.LABEL_POD_FLAG),
                "phase": (p.get("status") or {}).get("phase"),
            }
            for p in pods_on(name, serving_pods(rollout, pods))
        ],
    }


def render_explain(record: Mapping[str, Any]) -> str:
    ro = record["rollout"]
    out = [f"Node {record['node']} in GluonRollout {ro['namespace']}/{ro['name']}"]
    decision = record.get("decision")
    if decision:
        out.append(
            f"  state:       {decision.get('state')}{' (holdout)' if decision.get('holdout') else ''}: "
            f"{decision.get('reason')}"
        )
    else:
        out.append("  state:       no record in the rollout's status yet")
    el = record["eligibility"]
    out.append(f"  eligible:    {'yes' if el['eligible'] else 'no'}: {el['reason']}")
    out.append(
        f"  node:        agent {'alive' if el['agentAlive'] else 'not running or not ready'}, "
        f"{'cordoned' if el['cordoned'] else 'schedulable'}, "
        f"{'Ready' if el['ready'] else 'NotReady' if el['ready'] is False else 'Ready unknown'}"
        + (", skip label set" if el["skip"] else "")
        + f", flag {el['flag']}"
    )
    if el.get("held"):
        out.append(f"  held:        {el['held']}")
    out.append(f"  fingerprint: {el['fingerprint'] or NONE}")
    if record.get("reportProblem"):
        out.append(f"  report:      {record['reportProblem']}")
    served = record.get("serving") or {}
    if served.get("digest"):
        proved = served["proved"] or NONE
        out.append(
            f"  serving:     rollout serves config {served['digest']} ({served['described']}); "
            f"the self-test proved {proved}"
            + ("" if proved == served["digest"] else " (re-test requested by the operator's annotation)")
        )
    elif served.get("problem"):
        out.append(f"  serving:     unresolved: {served['problem']}")
    if served.get("flag0NoRoute"):
        out.append(
            f"  flag 0:      no working route ({served['flag0NoRoute'][0]}): no safe rollback, so never enabled; "
            f"a template with {contract.FLAG_ENV}=0 would crash serving here"
        )
    if served.get("flag1NoRoute"):
        out.append(
            f"  flag 1:      no working route ({served['flag1NoRoute'][0]}): the accelerated path fails its self-test"
        )
    probe = record.get("probe")
    if probe:
        out.append(
            f"  probe:       capable={probe['capable']} ready={probe['ready']}"
            + (f" missing: {'; '.join(probe['missingForCapable'])}" if probe["missingForCapable"] else "")
            + (" (SIMULATION)" if probe["simulated"] else "")
        )
    selftest = record.get("selftest")
    if selftest:
        out.append(
            f"  self-test:   {selftest['verdict']} for fingerprint {selftest['fingerprint']}, "
            f"tested at {when(selftest['testedAt'])}" + (" (SIMULATION)" if selftest["simulated"] else "")
        )
        rows = [
            [
                g["gpu"],
                g["path"],
                g["result"],
                NONE if g["maxRelL2"] is None else f"{g['maxRelL2']:.2e}",
                speedup_text(g["speedup"]) if g["path"] == "accelerated" else "",
                "; ".join(g["reasons"]),
            ]
            for g in selftest["gpus"]
        ]
        if rows:
            out.append(indent(table(("GPU", "PATH", "RESULT", "MAX REL L2", "SPEEDUP", "REASONS"), rows)))
    if record.get("analysis"):
        out.append("  analysis:")
        out.extend(f"    {k}: {number_text(k, v)}" for k, v in sorted(record["analysis"].items()))
    rollback = record.get("rollback")
    out.append(
        f"  rollback:    {rollback.get('reason') if rollback else record.get('rollbackProblem') or 'none recorded'}"
    )
    if rollback:
        out.append(
            f"    fingerprint {rollback.get('fingerprint')}, at {when(rollback.get('at'))}; "
            "`kubectl gluon retry NODE` clears it"
        )
    pods = record.get("pods") or []
    out.append(
        f"  pods:        {len(pods)}"
        + "".join(f"\n    {p['name']}: flag {p['flag'] or '?'} ({p['phase']})" for p in pods)
    )
    return "\n".join(out).rstrip("\n") + "\n"


TIME_KEYS = ("at", "inconclusiveSince", "since", "changedAt", gating.JUDGED_AT)


def number_text(key: str, value: Any) -> str:
    if value is None:
        return NONE
    if key in TIME_KEYS and isinstance(value, (int, float)):
        return when(value)
    return value if isinstance(value, str) else json.dumps(value, default=str)


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
