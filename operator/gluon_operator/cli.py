"""`gluon-operator`: the operator's command line."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

from gluon_agent import contract

from . import __version__


def cmd_contract(args: argparse.Namespace) -> int:
    print(json.dumps(contract.as_dict(), indent=2, sort_keys=True))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gluon-operator", description=__doc__)
    parser.add_argument("--version", action="version", version=f"gluon-operator {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("contract", help="print every label, annotation and metric name as JSON")
    p.set_defaults(func=cmd_contract)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
