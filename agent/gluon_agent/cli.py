"""`gluon-agent`: the node agent's command line. Exit codes: 0 success/capable, 1 not, 2 usage."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

from . import __version__
from .probe import DEFAULT_TIMEOUT_S, format_table, probe
from .selftest import runner


def positive_float(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def cmd_probe(args: argparse.Namespace) -> int:
    report = probe(python=args.python, timeout=args.timeout)
    print(json.dumps(report, indent=2, sort_keys=True) if args.json else format_table(report))
    return 0 if report["capable"] else 1


def cmd_selftest(args: argparse.Namespace) -> int:
    report = probe()
    result = runner.run_selftest(
        report,
        backend_set=args.backends,
        cpu_interpret=args.cpu_interpret,
        timeout=args.timeout,
        timing=not args.no_timing,
    )
    print(json.dumps(result, indent=2, sort_keys=True) if args.json else runner.format_table(result))
    return 0 if result["result"] == "pass" else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gluon-agent", description=__doc__)
    parser.add_argument("--version", action="version", version=f"gluon-agent {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("probe", help="capability probe of the aiter MLA Gluon decode path")
    p.add_argument("--python", help="interpreter to probe (default: this one)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--timeout", type=positive_float, default=DEFAULT_TIMEOUT_S, help="seconds per check child")
    p.set_defaults(func=cmd_probe)

    s = sub.add_parser("selftest", help="on-GPU correctness, graph and speed test of the accelerated and fallback paths")
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.add_argument("--backends", choices=("auto", "aiter", "triton"), default="auto",
                   help="auto: aiter on a capable gfx950 stack, else the portable Triton kernel")
    s.add_argument("--cpu-interpret", action="store_true",
                   help="run the portable kernel under TRITON_INTERPRET=1 on tiny CPU shapes (no GPU needed)")
    s.add_argument("--no-timing", action="store_true", help="skip the timing and copy-ceiling steps")
    s.add_argument("--timeout", type=positive_float, default=runner.DEFAULT_TIMEOUT_S, help="seconds per child")
    s.set_defaults(func=cmd_selftest)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
