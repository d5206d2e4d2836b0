"""The one JSON reader (operator/gluon_operator/records.py) and the records read with it: hostile JSON from
agents, pods or the API makes one node or pod unreadable, naming why; it never raises past the reader,
and nothing the operator writes holds a non-finite number."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gluon_common import contract
from gluon_common.report import AgentReport
from gluon_operator import gating, records, world
from gluon_operator.records import (
    NodeRecord,
    PreflightVerdict,
    RollbackRecord,
    UnreadableJSON,
    loads,
    read_json,
)

ROOT = Path(__file__).resolve().parent.parent
DEEP = "[" * 2000 + "]" * 2000  # 4 KB nested 2000 deep: json.loads raises RecursionError


@pytest.mark.parametrize(
    "raw,why",
    [
        (DEEP, "nested deeper than 64 levels"),
        ('{"a": ' * 2000 + "1" + "}" * 2000, "nested deeper than 64 levels"),
        ("[" * 65 + "]" * 65, "nested deeper than 64 levels"),  # deep, but not deep enough to reach RecursionError
        ('{"at": NaN}', "holds NaN, which is not a finite number"),
        ('{"at": Infinity}', "holds Infinity"),
        ("[-Infinity]", "holds -Infinity"),
        ('{"at": 1e999}', "holds inf, which is not a finite number"),
        ("1e999", "holds inf"),
        ('{"n": ' + "9" * 400 + "}", "integer past the range of finite numbers"),
        ('{"n": ' + "9" * 5000 + "}", "not JSON"),  # past Python's digit limit
        ('{"a": "' + "x" * records.JSON_BYTES_LIMIT + '"}', f"more than the {records.JSON_BYTES_LIMIT} read"),
        ("{nope", "not JSON"),
        (b"\xff\xfe", "not JSON"),
    ],
)
def test_the_reader_refuses_with_a_reason_and_raises_nothing_else(raw, why):
    with pytest.raises(UnreadableJSON, match=why.replace("(", r"\(")):
        loads(raw)


def test_the_reader_reads_what_we_write():
    assert loads("[" * 64 + "]" * 64) is not None and loads('{"at": 1.5, "n": -3}') == {"at": 1.5, "n": -3}
    assert loads(b'{"items": []}', max_bytes=None) == {"items": []}


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet='[]{}":,0123456789.eE-+NaInfity ', max_size=300))
def test_the_reader_raises_only_unreadable_json(raw):
    try:
        value = loads(raw)
    except UnreadableJSON:
        return
    assert records.problem_in(value, records.JSON_DEPTH_LIMIT) is None


@pytest.mark.parametrize("model", [AgentReport, RollbackRecord, NodeRecord, PreflightVerdict])
@pytest.mark.parametrize("raw", [DEEP, '{"a": ' * 2000 + "1" + "}" * 2000])
def test_a_deeply_nested_record_is_unreadable_not_a_recursion_error(model, raw):
    record, why = read_json(model, raw, "the annotation")
    assert record is None and why == "the annotation is unreadable: it is nested deeper than 64 levels"


@pytest.mark.parametrize("field", ["NaN", "Infinity", '"NaN"', '"inf"', '"-Infinity"', "1e999"])
def test_a_record_with_a_non_finite_time_is_refused_naming_the_field(field):
    rollback, why = read_json(
        RollbackRecord, f'{{"fingerprint": "fp", "at": {field}}}', "the rollback record annotation"
    )
    assert rollback is None and why.startswith("the rollback record annotation"), why
    node, why = read_json(
        NodeRecord, f'{{"rollout": "a/b", "state": "Enabling", "changedAt": {field}}}', "the node record"
    )
    assert node is None and why.startswith("the node record"), why
    if field.startswith('"'):  # read as JSON it is a string: the record's own check names the field
        assert "changedAt" in why


def test_loose_fields_read_as_finite_numbers_or_nothing():
    for junk in ("x", "NaN", math.nan, math.inf, -math.inf, True, None, [1], 10**400):
        assert records.finite_number(junk) is None and records.whole_count(junk) == 0
    assert records.finite_number(3) == 3.0 and records.whole_count(2.0) == 2 and records.whole_count(-1) == 0


def test_values_the_operator_writes_are_finite():
    written = records.dumps({"at": math.nan, "numbers": {"effect": math.inf, "ci": [1.0, -math.inf], "n": 3}})
    assert loads(written) == {"at": None, "numbers": {"effect": None, "ci": [1.0, None], "n": 3}}
    assert records.finite({"a": (math.nan, 1.5)}) == {"a": [None, 1.5]}


def test_every_json_the_operator_reads_goes_through_the_one_reader():
    """json.loads only in records.py: no other module of the operator parses JSON by itself."""
    offenders = []
    for path in sorted((ROOT / "operator/gluon_operator").rglob("*.py")):
        if path.name == "records.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and node.attr in ("loads", "load")
                and getattr(node.value, "id", None) == "json"
            ):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert offenders == []


# ---------------------------------------------------------------- the readers that use it


def test_a_deep_preflight_message_is_one_unreadable_pod_not_a_dropped_one():
    status = {"initContainerStatuses": [{"name": "gluon-preflight", "state": {"terminated": {"message": DEEP}}}]}
    verdict, why = world.preflight_verdict(status)
    assert verdict is None and "nested deeper than 64 levels" in why
    pod = {
        "metadata": {"name": "p", "namespace": "x", "creationTimestamp": "2026-12-01T00:00:00Z"},
        "spec": {"nodeName": "n1"},
        "status": status,
    }
    view = world.pod_view(pod)
    assert view is not None and view.flag is None and view.injected and "nested deeper" in view.preflight_reason


def test_a_deep_or_non_finite_report_makes_its_node_ineligible():
    for raw in (DEEP, '{"fingerprint": "fp", "probe": {"capable": true}, "x": NaN}'):
        facts = gating.NodeFacts(
            "n1",
            {contract.LABEL_CAPABLE: "true", contract.LABEL_SELFTEST: "pass"},
            {contract.ANNOTATION_REPORT: raw},
            True,
        )
        el = gating.eligibility(facts, 1.0, None)
        assert not el.eligible and el.reason.startswith("the agent report annotation is unreadable: it "), el.reason
