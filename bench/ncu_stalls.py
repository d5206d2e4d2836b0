"""Summarize where a kernel's warps stall, from Nsight Compute's per-instruction source page. Prints JSON.

    ncu -i split.ncu-rep --page source --csv --print-source sass > split.csv
    python3 bench/ncu_stalls.py split.csv

Shares are of all stall samples (ncu's smsp__pcsamp sampling, "selected" = issuing): overall, by SASS
opcode of the sampled instruction, and the instructions with the most samples.
"""

from __future__ import annotations

import argparse
import collections
import csv
import json
import re

TOP = 15


def opcode(sass: str) -> str:
    return re.sub(r"^@!?U?P\w+\s+", "", sass.strip()).split(" ")[0].split(".")[0]


def summarize(rows: list[dict[str, str]]) -> dict:
    reasons = [k for k in rows[0] if k.startswith("stall_") and "Not Issued" not in k]
    total: collections.Counter = collections.Counter()
    by_op: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    per_instruction = []
    for row in rows:
        counts = {r[len("stall_") :]: int(row[r] or 0) for r in reasons}
        total.update(counts)
        by_op[opcode(row["Source"])].update(counts)
        per_instruction.append((sum(counts.values()), row["Source"].strip(), counts))
    samples = sum(total.values())

    def shares(counter: collections.Counter, n: int = 4) -> dict[str, float]:
        return {k: round(v / samples, 4) for k, v in counter.most_common(n) if v}

    ops = sorted(by_op.items(), key=lambda kv: -sum(kv[1].values()))
    return {
        "samples": samples,
        "reasons": shares(total, len(total)),
        "by_opcode": {op: {"share": round(sum(c.values()) / samples, 4), "reasons": shares(c)} for op, c in ops[:TOP]},
        "top_instructions": [
            {"sass": s, "share": round(n / samples, 4), "reasons": shares(collections.Counter(c), 2)}
            for n, s, c in sorted(per_instruction, key=lambda t: -t[0])[:TOP]
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("csv", help="ncu --page source --csv --print-source sass output")
    path = parser.parse_args().csv
    with open(path, newline="") as f:
        lines = list(csv.reader(f))
    header_at = next(i for i, line in enumerate(lines) if line and line[0] == "Address")
    header = lines[header_at]
    rows = [dict(zip(header, line)) for line in lines[header_at + 1 :] if len(line) == len(header)]
    print(json.dumps(summarize(rows), indent=2))


if __name__ == "__main__":
    main()
