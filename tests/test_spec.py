"""One source of truth for the GluonRollout schema: the pydantic model, the generated CRD, the chart's file."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from gluon_operator.crd import crd, crd_yaml
from gluon_operator.spec import parse_spec

ROOT = Path(__file__).resolve().parent.parent
CHART_CRD = ROOT / "charts/gluon-rollout/crds/gluonrollouts.gluonrollout.io.yaml"
MINIMAL = {"podSelector": {"matchLabels": {"app": "sglang"}}}


def test_chart_crd_is_the_generated_one():
    assert CHART_CRD.read_text() == crd_yaml(), "run: gluon-operator crd > " + str(CHART_CRD.relative_to(ROOT))


@pytest.mark.parametrize("version", ["1.30", "1.37"])
def test_crd_validates_against_kubernetes(version):
    kubernetes_validate.validate(yaml.safe_load(CHART_CRD.read_text()), version, strict=True)


def test_schema_carries_enums_minimums_defaults_required():
    spec = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    strategy = spec["properties"]["strategy"]
    assert spec["required"] == ["podSelector"]
    assert strategy["default"] == {} and strategy["properties"]["maxParallel"] == {
        "default": 1, "description": strategy["properties"]["maxParallel"]["description"], "minimum": 1, "pattern": "^(100|[1-9][0-9]?)%$",
        "x-kubernetes-int-or-string": True, "anyOf": [{"type": "integer"}, {"type": "string"}]}
    assert strategy["properties"]["restart"]["enum"] == ["Evict", "Delete", "None"]
    assert "default" not in strategy["properties"]["batches"]  # optional: the API server must not create an empty one
    tolerance = spec["properties"]["analysis"]["properties"]["tolerance"]
    assert tolerance["maximum"] == 1 and tolerance["exclusiveMaximum"] is True
    for field in ("intervalSeconds", "windowSeconds", "stepSeconds", "baselineSeconds", "warmupSeconds"):
        assert spec["properties"]["analysis"]["properties"][field]["maximum"] == 86_400
    assert spec["properties"]["analysis"]["properties"]["query"]["maxLength"] == 4096
    assert spec["properties"]["analysis"]["properties"]["prometheusUrl"]["pattern"].startswith("^https?://")
    assert spec["properties"]["dryRun"] == {"default": False, "description": spec["properties"]["dryRun"]["description"], "type": "boolean"}
    assert spec["properties"]["analysis"]["properties"]["prometheusUrl"]["nullable"] is True
    text = crd_yaml()
    assert "$ref" not in text and "additionalProperties: false" not in text and "&id" not in text
    assert text.count("anyOf") == text.count("x-kubernetes-int-or-string: true") == 3  # anyOf only as int-or-string allows


def test_defaults_and_valid_spec():
    spec, problems = parse_spec(MINIMAL)
    assert problems == [] and spec.strategy.canaryNodes == 1 and spec.analysis.onNoData == "hold"
    assert spec.strategy.approval == "Automatic" and spec.strategy.batches is None and spec.dryRun is False


def test_counts_and_percentages_parse():
    spec, problems = parse_spec({**MINIMAL, "strategy": {"canaryNodes": "10%", "maxParallel": "100%"}, "abort": {"maxFailedNodes": 0}})
    assert problems == [] and (spec.strategy.canaryNodes, spec.strategy.maxParallel, spec.abort.maxFailedNodes) == ("10%", "100%", 0)


@pytest.mark.parametrize("raw,message", [
    ({}, "spec.podSelector: Field required"),
    ({**MINIMAL, "strategy": {"maxParallel": 0}}, "spec.strategy.maxParallel: Value error, must be a count >= 1 or a percentage"),
    ({**MINIMAL, "strategy": {"maxParallel": "0%"}}, "spec.strategy.maxParallel: Value error, must be a count >= 1 or a percentage"),
    ({**MINIMAL, "strategy": {"canaryNodes": "ten"}}, "spec.strategy.canaryNodes: Value error, must be a count >= 0 or a percentage"),
    ({**MINIMAL, "strategy": {"canaryNodes": True}}, "spec.strategy.canaryNodes: Value error"),
    ({**MINIMAL, "abort": {"maxFailedNodes": "101%"}}, "spec.abort.maxFailedNodes: Value error"),
    ({**MINIMAL, "strategy": {"approval": "Sometimes"}}, "spec.strategy.approval: Input should be 'Automatic', 'AfterCanary' or 'EachBatch'"),
    ({**MINIMAL, "strategy": {"batches": {"nodeLabel": "zone", "order": []}}}, "spec.strategy.batches.order: List should have at least 1 item"),
    ({**MINIMAL, "analysis": {"tolerance": 1}}, "spec.analysis.tolerance: Input should be less than 1"),
    ({**MINIMAL, "analysis": {"intervalSeconds": 86_401}}, "spec.analysis.intervalSeconds: Input should be less than or equal to 86400"),
    ({**MINIMAL, "analysis": {"prometheusUrl": "file:///etc/passwd"}}, "spec.analysis.prometheusUrl: String should match pattern"),
    ({**MINIMAL, "analysis": {"prometheusUrl": "http://p:9090", "query": "x" * 5000}}, "spec.analysis.query: String should have at most 4096"),
    ({**MINIMAL, "paused": "true"}, "spec.paused: Input should be a valid boolean"),
    ({**MINIMAL, "dryRun": 1}, "spec.dryRun: Input should be a valid boolean"),
    ({**MINIMAL, "strategy": {"restart": "Reboot"}}, "spec.strategy.restart: Input should be 'Evict', 'Delete' or 'None'"),
    ({**MINIMAL, "surprise": 1}, "spec.surprise: Extra inputs are not permitted"),
    ({**MINIMAL, "analysis": {"intervalSeconds": 300, "windowSeconds": 60}},
     "spec.analysis.windowSeconds (60) must be >= spec.analysis.intervalSeconds (300)"),
    ({**MINIMAL, "analysis": {"query": "sum(rate(x[5m]))"}}, "spec.analysis.query needs spec.analysis.prometheusUrl"),
    ({"podSelector": {}}, "spec.podSelector must select something"),
])
def test_problems_name_the_field(raw, message):
    _, problems = parse_spec(raw)
    assert any(p.startswith(message) for p in problems), problems
