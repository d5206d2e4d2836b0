"""The demo's output, without a cluster: the probe step's verdict, the progress lines' promise (a line at
least every 5 s from the first second) and the timeline's plan (colours, labels, marks over plain data)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gluon_localcluster import probe_step, timeline
from gluon_localcluster.progress import HEARTBEAT_SECONDS, Progress, longest_silence

# ---------------------------------------------------------------- the probe step

NO_GPU = {"capable": False, "gpus": [], "kfd_access": "absent", "missing_for_capable": ["GPU arch gfx950"]}


def test_a_machine_without_a_gpu_is_said_plainly_and_is_not_a_failure():
    sentence, code, report = probe_step.verdict(1, json.dumps(NO_GPU))
    assert code == 0 and report == NO_GPU
    assert "no AMD GPU" in sentence and "as expected" in sentence and "SIMULATION" in sentence


def test_a_gpu_that_is_not_capable_names_its_arch_and_what_is_missing():
    report = dict(NO_GPU, gpus=[{"index": 0, "arch": "gfx942"}], missing_for_capable=["GPU arch gfx950 (have gfx942)"])
    sentence, code, _ = probe_step.verdict(1, json.dumps(report))
    assert code == 0 and "gfx942" in sentence and "have gfx942" in sentence


def test_a_capable_machine():
    sentence, code, _ = probe_step.verdict(0, json.dumps(dict(NO_GPU, capable=True, gpus=[{"arch": "gfx950"}])))
    assert code == 0 and "capable" in sentence


@pytest.mark.parametrize(
    ("returncode", "stdout", "stderr"),
    [
        (134, "", "Fatal Python error: Aborted\nTraceback"),  # the probe crashed
        (2, "", "usage: gluon-agent"),  # refused its arguments
        (1, "Traceback (most recent call last):\n  KeyError: 'gpus'", ""),  # exit 1 but no report
        (0, json.dumps({"capable": True}), ""),  # a report without the fields the verdict needs
    ],
)
def test_a_probe_that_crashed_fails_the_step_and_says_so(returncode, stdout, stderr):
    sentence, code, report = probe_step.verdict(returncode, stdout, stderr)
    assert code != 0 and report is None
    assert "crashed" in sentence or "no readable report" in sentence


def test_the_real_probe_on_this_machine_exits_0_with_a_sentence(capsys):
    """This machine (no AMD GPU) through the real `gluon-agent probe`: the step that `make demo` runs."""
    assert probe_step.main() == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("=> this machine")


# ---------------------------------------------------------------- a line at least every 5 s


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_stages_are_printed_as_they_start_with_elapsed_seconds_and_long_stages_get_heartbeats():
    clock, lines = Clock(), []
    progress = Progress(lines.append, clock=clock)
    # a setup like the demo's: stages of 0.5 s, 12 s (the control plane), 0.25 s, 23 s (agents' self-tests)
    for name, seconds in (("a", 0.5), ("control plane", 12.0), ("b", 0.25), ("agents", 23.0)):
        progress.stage(name)
        for _ in range(int(seconds / 0.25)):  # the heartbeat thread's ticks
            clock.now += 0.25
            progress.tick()
    assert lines[0] == "[  0.0s] a"
    assert "[  0.5s] control plane" in lines
    assert any(line.endswith("still control plane (3 s in this stage)") for line in lines)
    times = [at for at, _ in progress.lines]
    assert times[0] < 1.0 and longest_silence(times, clock.now - progress.started) <= HEARTBEAT_SECONDS + 0.25


def test_the_heartbeat_thread_speaks_during_a_silent_stage():
    lines: list[str] = []
    with Progress(lines.append, every=0.3) as progress:
        progress.stage("quiet work")
        import time

        time.sleep(1.8)
    assert sum("still quiet work" in line for line in lines) >= 2


def test_longest_silence_counts_from_the_start_and_to_the_end():
    assert longest_silence([2.0, 3.0], until=4.0) == 2.0
    assert longest_silence([0.5, 6.0], until=7.0) == 5.5
    assert longest_silence([], until=3.0) == 3.0


# ---------------------------------------------------------------- the timeline's plan


def demo_like() -> list[timeline.NodeFacts]:
    n = timeline.NodeFacts
    return [
        n("gpu-01", "Promoted", effect="x2.289", flags=((33.2, "1"),), states=((10, "Eligible"), (32.5, "Enabling"))),
        n(
            "gpu-02",
            "RolledBack",
            effect="x0.860",
            flags=((46.3, "1"), (47.0, "0")),  # two switches 0.7 s apart: their labels must not overlap
            states=((10, "Eligible"), (45.9, "Enabling"), (47, "Analyzing"), (59.6, "RolledBack")),
        ),
        n("gpu-03", "Eligible", holdout=True, states=((10, "Eligible"),)),
        n("gpu-04", "Promoted", effect="x2.690", states=((10, "Eligible"), (45.9, "Enabling"), (58, "Promoted"))),
        n("gpu-05", "Promoted", effect="x2.098", states=((10, "Eligible"), (58.1, "Promoted"))),
        n("gpu-06", "Promoted", effect="x2.353", states=((10, "Eligible"), (58.2, "Promoted"))),
        n("gpu-07", "Ineligible", states=((8, "Ineligible"),)),
        n("gpu-08", "Ineligible"),  # no label history: the final state fills its lane
    ]


def test_node_colours_are_never_the_state_colours():
    styles = timeline.plan(demo_like(), created=31.0, end=80.0).styles
    states = (timeline.STATE_COLOURS["Promoted"], timeline.STATE_COLOURS["RolledBack"])
    for name, style in styles.items():
        assert all(timeline.hue_distance(style.colour, state) >= 45 for state in states), (name, style.colour)
    rollout_nodes = [styles[n].colour for n in ("gpu-01", "gpu-02", "gpu-04", "gpu-05", "gpu-06")]
    assert len(set(rollout_nodes)) == len(rollout_nodes)
    assert all(timeline.hue_distance(c, s) >= 45 for c in timeline.NODE_COLOURS for s in states)


def test_hue_distance():
    assert timeline.hue_distance("#ff0000", "#00ff00") == pytest.approx(120)
    assert timeline.hue_distance("#ff0000", "#ff00ff") == pytest.approx(60)
    assert timeline.hue_distance("#808080", "#ff0000") == 180  # a grey has no hue to confuse


def test_the_holdout_and_ineligible_nodes_are_marked():
    the_plan = timeline.plan(demo_like(), created=31.0, end=80.0)
    holdout, ineligible = the_plan.styles["gpu-03"], the_plan.styles["gpu-07"]
    assert "holdout" in holdout.label and "Eligible" not in holdout.label and holdout.linestyle == "--"
    assert ineligible.label == "gpu-07 ineligible" and ineligible.linestyle == ":"
    assert the_plan.styles["gpu-02"].label == "gpu-02 rolled back x0.860"
    assert all(span.hatch == ".." for span in the_plan.lanes["gpu-03"])
    assert [(s.state, s.hatch, s.start, s.end) for s in the_plan.lanes["gpu-08"]] == [("Ineligible", "//", 0.0, 80.0)]


def test_lanes_follow_the_state_label_history_in_state_colours():
    spans = timeline.plan(demo_like(), created=31.0, end=80.0).lanes["gpu-02"]
    assert [(s.state, s.start, s.end) for s in spans] == [
        ("Eligible", 10, 45.9),
        ("Enabling", 45.9, 47),
        ("Analyzing", 47, 59.6),
        ("RolledBack", 59.6, 80.0),
    ]
    assert spans[-1].colour == timeline.STATE_COLOURS["RolledBack"]


def test_the_rollouts_events_are_on_the_time_axis():
    approvals = [(40.0, "AfterCanary")]
    events = timeline.plan(demo_like(), created=31.0, end=80.0, canary_nodes=1, approvals=approvals).events
    texts = [(m.time, m.text) for m in events]
    assert texts[:3] == [
        (31.0, "rollout created"),
        (32.5, "canary gpu-01"),
        (40.0, "approved AfterCanary"),
    ]
    assert (59.6, "rolled back gpu-02") in texts
    assert {t for t in texts if t[1].startswith("promoted")} == {
        (58, "promoted gpu-04"),
        (58.1, "promoted gpu-05"),
        (58.2, "promoted gpu-06"),
    }
    colours = {m.text.split()[0]: m.colour for m in events}
    assert colours["promoted"] == timeline.STATE_COLOURS["Promoted"]
    assert colours["rolled"] == timeline.STATE_COLOURS["RolledBack"]


def overlapping(marks: list[timeline.Mark], char_seconds: float) -> list[tuple[str, str]]:
    """Pairs of labels on one level whose text spans (at `char_seconds` per character) intersect."""
    out = []
    for a in marks:
        for b in marks:
            if a is not b and a.level == b.level and a.time <= b.time < a.time + len(a.text) * char_seconds:
                out.append((a.text, b.text))
    return out


def test_labels_never_overlap_on_one_level():
    the_plan = timeline.plan(demo_like(), created=31.0, end=80.0)
    char = 80.0 / timeline.CHARS_ACROSS
    # three promotions within 0.2 s of each other, and gpu-02's two flag switches 0.7 s apart
    assert not overlapping(the_plan.events, char)
    assert len({m.level for m in the_plan.events if m.text.startswith("promoted")}) == 3
    assert not overlapping(the_plan.flags["gpu-02"], char)
    assert [m.level for m in the_plan.flags["gpu-02"]] == [0, 1]


def test_stack_reuses_a_level_once_its_label_has_ended():
    assert timeline.stack([(0, 5), (1, 5), (6, 5), (6.5, 1)]) == [0, 1, 0, 1]
    assert timeline.stack([(3, 1), (0, 5)]) == [1, 0]  # by time, whatever the input order


def test_spread_keeps_order_and_distance():
    heights = timeline.spread([30.0, 30.5, 29.8, 70.0], gap=2.0)
    assert sorted(range(4), key=lambda i: heights[i]) == [2, 0, 1, 3]
    assert all(abs(a - b) >= 2.0 - 1e-9 for i, a in enumerate(heights) for b in heights[i + 1 :])
    assert heights[3] == 70.0


def test_draw_writes_one_png(tmp_path: Path):
    speeds = {"gpu-01": [(20.0 + t, 30.0 + (40 if t > 15 else 0)) for t in range(50)], "gpu-02": []}
    out = tmp_path / "timeline.png"
    timeline.draw(timeline.plan(demo_like(), created=31.0, end=80.0), speeds, out, "title")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_flag_marker_sits_on_the_drawn_line():
    points = [(50.0, 30.0), (51.0, float("nan")), (56.0, 66.0)]  # a blank step, then the next sample
    assert timeline._value_at(points, 52.0) == pytest.approx(30.0 + 36.0 * 2 / 6)
    assert timeline._value_at(points, 40.0) == 30.0 and timeline._value_at(points, 60.0) == 66.0
    assert timeline._value_at([], 1.0) is None
