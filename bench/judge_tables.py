"""The Markdown tables of docs/how-it-decides/judge-quality.md, from a bench/judge.py --json record.

    python bench/judge_tables.py docs/benchmarks/judge.json

Prints the false-rollback table, the power at the anchors' defaults, the power at an equal
false-rollback rate (the 1% target and ours' own rate, each way of counting) and the summary, so the
page's numbers are the record's.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

ANCHORS = ("flagger_style", "argo_style", "kayenta_style")
HEADER = [
    "| regression scenario | ours | Flagger-style | Argo-style | Kayenta-style |",
    "| --- | --- | --- | --- | --- |",
]


def pct(value: float) -> str:
    return f"{value * 100:.1f}%"


def median(cell: dict) -> str:
    value = cell["median_intervals_to_rollback"]
    return "-" if value is None else f"{value:g}"


def false_rollbacks(record: dict, harmless: list[str]) -> list[str]:
    ours = record["ours"]["by_scenario"]
    rows = [
        "False rollbacks (harmless scenarios; over the horizon / over the horizon and 6 h of guard mode):",
        "",
        "| scenario | ours | Flagger-style | Argo-style | Kayenta-style |",
        "| --- | --- | --- | --- | --- |",
    ]
    for key in harmless:
        cells = [f"{pct(ours[key]['rollback_rate_horizon'])} / **{pct(ours[key]['rollback_rate_with_6h_guard'])}**"]
        cells += [
            f"{pct(c['rollback_rate_horizon'])} / {pct(c['rollback_rate_with_6h_guard'])}"
            for c in (record[a]["by_scenario"][key] for a in ANCHORS)
        ]
        rows.append(f"| {key} | " + " | ".join(cells) + " |")
    return rows


def power_at_defaults(record: dict, regressions: list[str]) -> list[str]:
    ours = record["ours"]["by_scenario"]
    rows = [
        "Power at the anchors' defaults "
        "(regressions: share rolled back within 10 intervals, median intervals to the rollback):",
        "",
        *HEADER,
    ]
    for key in regressions:
        cells = [f"**{pct(ours[key]['within_10_intervals'])} ({median(ours[key])})**"]
        cells += [
            f"{pct(c['within_10_intervals'])} ({median(c)})" for c in (record[a]["by_scenario"][key] for a in ANCHORS)
        ]
        rows.append(f"| {key} | " + " | ".join(cells) + " |")
    return rows


SECTIONS = {  # the record's comparisons at an equal false-rollback rate: the limit each holds the anchors to
    "anchors_at_equal_false_rollback_rate": "at most 1% false rollbacks",
    "anchors_at_ours_false_rollback_rate": "no more false rollbacks than ours",
}


def tuned_cell(best: dict | None, ours: dict) -> str:
    if not best:
        return "no setting kept"
    text = f"{pct(best['within_10_intervals'])} / {pct(best['rollback_rate_horizon'])}"
    higher = (
        best["within_10_intervals"] > ours["within_10_intervals"]
        or best["rollback_rate_horizon"] > ours["rollback_rate_horizon"]
    )
    return f"**{text}** (higher)" if higher else text


def power_at_equal_rate(record: dict, regressions: list[str], section: str, limit: str) -> list[str]:
    ours = record["ours"]["by_scenario"]
    rows: list[str] = []
    for counting, anchors in record[section].items():
        kept = ", ".join(f"{a} {anchors[a]['settings_meeting_target']} of {anchors[a]['settings']}" for a in ANCHORS)
        rows += [
            "",
            f"At an equal false-rollback rate, anchors counted over {counting}: the most power any setting with "
            f"{limit} on every harmless scenario has (within 10 intervals / over the horizon); settings kept: {kept}",
            "",
            *HEADER,
        ]
        for key in regressions:
            cells = [f"{pct(ours[key]['within_10_intervals'])} / {pct(ours[key]['rollback_rate_horizon'])}"]
            cells += [tuned_cell(anchors[a]["best_power_by_regression"].get(key), ours[key]) for a in ANCHORS]
            rows.append(f"| {key} | " + " | ".join(cells) + " |")
    return rows


def summary(record: dict, harmless: list[str]) -> list[str]:
    rows = [
        "Summary:",
        "",
        "| judge | worst harmless (horizon) | all harmless: horizon / + 6 h guard | power: 10% at 5% noise within 10 "
        "intervals | median intervals |",
        "| --- | --- | --- | --- | --- |",
    ]
    ours = record["ours"]["by_scenario"]
    for name in ("ours", *ANCHORS):
        judge: dict[str, Any] = record[name]
        if name == "ours":  # its all-harmless rate is already counted with guard mode
            both = (
                f"{pct(sum(ours[k]['rollback_rate_horizon'] for k in harmless) / len(harmless))} / "
                f"{pct(judge['false_rollback_rate_all_harmless'])}"
            )
        else:
            both = (
                f"{pct(judge['false_rollback_rate_all_harmless'])} / "
                f"{pct(judge['false_rollback_rate_all_harmless_with_6h_guard'])}"
            )
        rows.append(
            f"| {name} | {pct(judge['false_rollback_rate_worst_harmless'])} | {both} | "
            f"{pct(judge['power_10pct_5pct_noise_within_10'])} | "
            f"{judge['median_intervals_to_detect_10pct_5pct_noise']} |"
        )
    return rows


def tables(record: dict) -> str:
    scenarios = record["ours"]["by_scenario"]
    harmless = [k for k, v in scenarios.items() if v["harmless"]]
    regressions = [k for k, v in scenarios.items() if not v["harmless"]]
    rows = false_rollbacks(record, harmless) + [""] + power_at_defaults(record, regressions)
    for section, limit in SECTIONS.items():
        rows += power_at_equal_rate(record, regressions, section, limit) if section in record else []
    return "\n".join(rows + [""] + summary(record, harmless)) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("record", help="a bench/judge.py --json output")
    with open(parser.parse_args().record) as f:
        print(tables(json.load(f)), end="")


if __name__ == "__main__":
    main()
