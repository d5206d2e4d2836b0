"""The contract module is the single place that spells label, annotation and metric names."""

from __future__ import annotations

import re
from pathlib import Path

from gluon_common import contract

ROOT = Path(__file__).resolve().parent.parent
# Built by concatenation so this file does not match itself.
SPELLINGS = re.compile("gluon" + r"rollout\.io/|['\"]gluon_(?:agent|rollout)_[a-z]")


def python_sources():
    for folder in ("common", "agent", "operator", "bench", "tests"):
        yield from (ROOT / folder).rglob("*.py")


def test_no_module_but_the_contract_spells_names():
    offenders = []
    for path in python_sources():
        if path == ROOT / "common/gluon_common/contract.py":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if SPELLINGS.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert offenders == []


def test_contract_names_are_well_formed():
    names = contract.as_dict()
    for key, value in names.items():
        if key.startswith(("LABEL_", "ANNOTATION_")):
            assert value.startswith(contract.PREFIX), key
            name = value[len(contract.PREFIX) :]
            assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name) and len(name) <= 63, key
        if key.startswith("M_AGENT_"):
            assert value.startswith(contract.AGENT_METRIC_PREFIX) and re.fullmatch(r"[a-z_]+", value), key
        if key.startswith("M_ROLLOUT_"):
            assert value.startswith(contract.ROLLOUT_METRIC_PREFIX) and re.fullmatch(r"[a-z_]+", value), key
    values = [v for k, v in names.items() if k.startswith(("LABEL_", "ANNOTATION_", "M_"))]
    assert len(values) == len(set(values)), "two constants spell the same name"
    assert contract.is_ours(contract.LABEL_CAPABLE) and not contract.is_ours("kubernetes.io/hostname")
