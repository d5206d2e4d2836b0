"""The demo's timeline PNG, readable at a glance: one figure of three rows on one time axis.

- top: the rollout's events (start, canary, approvals, promotions, rollbacks, an abort), labels stacked so
  they never overlap;
- middle: each node's decode speed as the judge saw it, in the node's own colour (no red or green: those
  mean rolled back and promoted), the holdout dashed, ineligible nodes dotted grey, a triangle where its
  serving pods switched flag, its name, final state and effect at the line's end;
- bottom: one lane per node, filled with its state over time (the state colours), its flag switches
  written in the lane, holdout and ineligible named.

`plan()` decides every colour, label and position over plain data and is what the tests check; `draw()`
is a thin matplotlib shell over the plan.
"""

from __future__ import annotations

import colorsys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

# Node colours: hues far from red and green (state colours), told apart by hue and lightness.
NODE_COLOURS = ("#1f77b4", "#c000c0", "#17becf", "#000080", "#9467bd", "#0b5563", "#7f9fd6", "#6a3d9a")
HOLDOUT_COLOUR, INELIGIBLE_COLOUR = "#404040", "#a0a0a0"
STATE_COLOURS = {
    "Eligible": "#ececec",
    "Enabling": "#fff2a8",
    "Analyzing": "#ffd166",
    "Promoted": "#2ca02c",
    "RolledBack": "#d62728",
    "Ineligible": "#ffffff",
    "Disabled": "#c8c8c8",
}
STATE_WORDS = {
    "Eligible": "eligible",
    "Enabling": "enabling",
    "Analyzing": "analyzing",
    "Promoted": "promoted",
    "RolledBack": "rolled back",
    "Ineligible": "ineligible",
    "Disabled": "disabled",
}
EVENT_COLOURS = {"start": "#000000", "canary": "#000000", "approval": "#000000", "abort": "#d62728"}
EVENT_COLOURS |= {"promotion": STATE_COLOURS["Promoted"], "rollback": STATE_COLOURS["RolledBack"]}
CHARS_ACROSS = 150  # about how many 8-pt characters fit across the plot: a label's width in seconds


@dataclass(frozen=True)
class NodeFacts:
    """What the demo knows of one node, in seconds since the demo started."""

    name: str
    state: str  # the final state
    holdout: bool = False
    effect: str = ""  # "x2.29" as the status shows it, "" if never judged
    flags: tuple[tuple[float, str], ...] = ()  # (when, flag) each time its serving pods switched flag
    states: tuple[tuple[float, str], ...] = ()  # (when, state) from the node label's changes


@dataclass(frozen=True)
class Mark:
    time: float
    text: str
    colour: str
    level: int = 0  # stacked labels: 0 nearest the axis


@dataclass(frozen=True)
class Span:
    start: float
    end: float
    state: str
    colour: str
    hatch: str = ""


@dataclass(frozen=True)
class NodeStyle:
    colour: str
    linestyle: str
    label: str  # the node, its final state and effect, written at its line's end and on its lane


@dataclass
class TimelinePlan:
    start: float
    end: float
    styles: dict[str, NodeStyle]
    lanes: dict[str, list[Span]]
    flags: dict[str, list[Mark]]
    events: list[Mark]
    notes: list[str] = field(default_factory=list)


def hue_distance(a: str, b: str) -> float:
    """Degrees between two colours' hues (0..180); 180 when either is a grey (it has no hue to confuse)."""

    def hls(colour: str) -> tuple[float, float, float]:
        r, g, b = (int(colour[i : i + 2], 16) / 255 for i in (1, 3, 5))
        return colorsys.rgb_to_hls(r, g, b)

    (ha, _, sa), (hb, _, sb) = hls(a), hls(b)
    if sa < 0.15 or sb < 0.15:
        return 180.0
    degrees = abs(ha - hb) * 360
    return min(degrees, 360 - degrees)


def node_styles(nodes: Sequence[NodeFacts]) -> dict[str, NodeStyle]:
    """Rollout nodes in NODE_COLOURS (solid); the holdout dark grey dashed; ineligible nodes light grey dotted."""
    styles, colours = {}, iter(NODE_COLOURS * (1 + len(nodes) // len(NODE_COLOURS)))
    for node in sorted(nodes, key=lambda n: n.name):
        words = STATE_WORDS.get(node.state, node.state)
        if node.state == "Ineligible":
            styles[node.name] = NodeStyle(INELIGIBLE_COLOUR, ":", f"{node.name} ineligible")
        elif node.holdout:
            styles[node.name] = NodeStyle(HOLDOUT_COLOUR, "--", f"{node.name} holdout (control, flag 0)")
        else:
            effect = f" {node.effect}" if node.effect else ""
            styles[node.name] = NodeStyle(next(colours), "-", f"{node.name} {words}{effect}")
    return styles


def lane(node: NodeFacts, end: float) -> list[Span]:
    """The node's states over time as spans; the final state fills the lane from its first sight if the
    label's history is empty. Ineligible is hatched (nothing happens there), the holdout dotted."""
    history = list(node.states) or [(0.0, node.state)]
    spans = []
    for (start, state), (stop, _) in zip(history, [*history[1:], (end, "")]):
        if stop > start:
            hatch = "//" if state == "Ineligible" else ".." if node.holdout else ""
            spans.append(Span(start, stop, state, STATE_COLOURS.get(state, "#ffffff"), hatch))
    return spans


def stack(times_and_widths: Sequence[tuple[float, float]]) -> list[int]:
    """A level per label (0 first) so that labels starting at `time`, `width` wide, never overlap on one
    level: each goes on the lowest level whose last label has ended before it starts."""
    order = sorted(range(len(times_and_widths)), key=lambda i: times_and_widths[i][0])
    ends: list[float] = []
    levels = [0] * len(times_and_widths)
    for i in order:
        start, width = times_and_widths[i]
        level = next((k for k, last in enumerate(ends) if last <= start), len(ends))
        if level == len(ends):
            ends.append(0.0)
        ends[level] = start + width
        levels[i] = level
    return levels


def rollout_events(
    nodes: Sequence[NodeFacts], created: float, canary_nodes: int, approvals: Sequence[tuple[float, str]] = ()
) -> list[tuple[float, str, str]]:
    """(when, kind, text) of the rollout's own story: its start, the canary nodes' enabling, approvals,
    each node's promotion and rollback (first time reached), an abort."""
    events = [(created, "start", "rollout created")]
    enabled = sorted((t, n.name) for n in nodes for t, s in n.states if s == "Enabling")
    first_enable: dict[str, float] = {}
    for when, name in enabled:
        first_enable.setdefault(name, when)
    canaries = sorted(first_enable.items(), key=lambda item: item[1])[:canary_nodes]
    events += [(when, "canary", f"canary {name}") for name, when in canaries]
    events += [(when, "approval", f"approved {gate}") for when, gate in approvals]
    for node in nodes:
        for state, kind, words in (("Promoted", "promotion", "promoted"), ("RolledBack", "rollback", "rolled back")):
            reached = [t for t, s in node.states if s == state]
            if reached:
                events.append((reached[0], kind, f"{words} {node.name}"))
    return sorted(events)


def plan(
    nodes: Sequence[NodeFacts],
    created: float,
    end: float,
    canary_nodes: int = 1,
    approvals: Sequence[tuple[float, str]] = (),
    start: float = 0.0,
) -> TimelinePlan:
    """Every colour, label and position of the figure, from plain facts (seconds since the demo started)."""
    char = (end - start) / CHARS_ACROSS
    found = rollout_events(nodes, created, canary_nodes, approvals)
    levels = stack([(when, (len(text) + 2) * char) for when, _, text in found])
    events = [Mark(when, text, EVENT_COLOURS[kind], level) for (when, kind, text), level in zip(found, levels)]
    flags = {}
    for node in nodes:
        texts = [(when, f"flag {flag}") for when, flag in node.flags]
        flag_levels = stack([(when, (len(text) + 1) * char) for when, text in texts])
        flags[node.name] = [Mark(when, text, "#000000", level) for (when, text), level in zip(texts, flag_levels)]
    return TimelinePlan(
        start=start,
        end=end,
        styles=node_styles(nodes),
        lanes={node.name: lane(node, end) for node in nodes},
        flags=flags,
        events=events,
    )


def spread(values: Sequence[float], gap: float) -> list[float]:
    """Label heights moved apart as little as needed so that no two are closer than `gap`, order kept."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    placed = [float(values[i]) for i in order]
    for k in range(1, len(placed)):
        placed[k] = max(placed[k], placed[k - 1] + gap)
    out = [0.0] * len(values)
    for k, i in enumerate(order):
        out[i] = placed[k]
    return out


# ---------------------------------------------------------------- the thin shell


def draw(the_plan: TimelinePlan, speeds: dict[str, Sequence[tuple[float, float]]], path: Path, title: str) -> None:
    """The figure for a plan; `speeds`: {node: [(seconds, tokens/s)]} as the judge's query gave them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    names = sorted(the_plan.styles)
    fig, (top, mid, low) = plt.subplots(
        3, 1, figsize=(13, 9.5), sharex=True, gridspec_kw={"height_ratios": [1.1, 4, 2.4], "hspace": 0.06}
    )
    _events_row(top, the_plan)
    _speed_panel(mid, the_plan, speeds, names)
    _lanes(low, the_plan, names)
    low.set_xlim(the_plan.start, the_plan.end + (the_plan.end - the_plan.start) * 0.25)
    low.set_xlabel("seconds since the demo started")
    handles = [Patch(facecolor=STATE_COLOURS[s], edgecolor="#808080", label=STATE_WORDS[s]) for s in STATE_COLOURS]
    low.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.28), ncol=len(handles), fontsize=8)
    top.set_title(title, fontsize=10)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def _events_row(ax, the_plan: TimelinePlan) -> None:
    """Each event a short tick at its time on its own level, its label after it: no line crosses a label."""
    levels = 1 + max((m.level for m in the_plan.events), default=0)
    for mark in the_plan.events:
        ax.plot([mark.time, mark.time], [mark.level + 0.15, mark.level + 0.85], color=mark.colour, linewidth=2)
        ax.text(mark.time, mark.level + 0.5, f" {mark.text}", color=mark.colour, fontsize=8, va="center")
    ax.set_ylim(levels, 0)
    ax.set_yticks([])
    ax.set_ylabel("rollout\nevents", fontsize=8)


def _speed_panel(ax, the_plan: TimelinePlan, speeds: dict, names: list[str]) -> None:
    ends: dict[str, tuple[float, float]] = {}
    for name in names:
        style, points = the_plan.styles[name], list(speeds.get(name) or [])
        if not points:
            continue
        xs, ys = [t for t, _ in points], [v for _, v in points]
        ax.plot(xs, ys, color=style.colour, linestyle=style.linestyle, linewidth=1.6)
        for mark in the_plan.flags.get(name, []):
            y = _value_at(points, mark.time)
            if y is not None:
                marker = "^" if mark.text.endswith("1") else "v"
                ax.plot([mark.time], [y], marker=marker, color=style.colour, markeredgecolor="black", markersize=8)
        finite = [(t, v) for t, v in points if v == v]
        if finite:
            ends[name] = finite[-1]
    for mark in the_plan.events:
        ax.axvline(mark.time, color=mark.colour, linewidth=0.8, alpha=0.35)
    low, high = ax.get_ylim()
    heights = spread([v for _, v in ends.values()], (high - low) * 0.045)
    for (name, (t, _)), y in zip(ends.items(), heights):
        ax.text(
            the_plan.end,
            y,
            f" {the_plan.styles[name].label}",
            color=the_plan.styles[name].colour,
            fontsize=8,
            va="center",
        )
    ax.set_ylabel("decode tokens/s per sequence\n(the judge's query, Prometheus)")
    ax.text(
        0.005,
        0.98,
        "▲ flag 1   ▼ flag 0 (the node's serving pods switched)",
        transform=ax.transAxes,
        fontsize=8,
        va="top",
    )
    ax.grid(alpha=0.25)


def _lanes(ax, the_plan: TimelinePlan, names: list[str]) -> None:
    for row, name in enumerate(names):
        for span in the_plan.lanes.get(name, []):
            ax.barh(
                row,
                span.end - span.start,
                left=span.start,
                height=0.8,
                color=span.colour,
                hatch=span.hatch,
                edgecolor="#b0b0b0",
                linewidth=0.5,
            )
        for mark in the_plan.flags.get(name, []):
            ax.text(mark.time, row - 0.2 + 0.4 * (mark.level % 2), f"▶{mark.text}", fontsize=7, va="center")
        style = the_plan.styles[name]
        ax.text(the_plan.end, row, f" {style.label}", color=style.colour, fontsize=8, va="center")
    ax.set_yticks(range(len(names)), names, fontsize=8)
    for tick, name in zip(ax.get_yticklabels(), names):
        tick.set_color(the_plan.styles[name].colour)
    ax.set_ylim(len(names) - 0.5, -0.5)
    ax.set_ylabel("state and flag per node", fontsize=8)


def _value_at(points: Sequence[tuple[float, float]], when: float) -> float | None:
    """The drawn line's height at `when` (linear between the finite samples around it), so a marker sits on it."""
    finite = [(t, v) for t, v in points if v == v]
    before = [(t, v) for t, v in finite if t <= when]
    after = [(t, v) for t, v in finite if t >= when]
    if not before or not after:
        return (after or before or [(when, None)])[0 if after else -1][1]
    (t0, v0), (t1, v1) = before[-1], after[0]
    return v0 if t1 == t0 else v0 + (v1 - v0) * (when - t0) / (t1 - t0)
