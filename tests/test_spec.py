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
        "default": 1, "description": strategy["properties"]["maxParallel"]["description"], "minimum": 1, "type": "integer"}
    assert strategy["properties"]["restart"]["enum"] == ["Evict", "Delete", "None"]
    assert spec["properties"]["analysis"]["properties"]["tolerance"]["maximum"] == 1
    assert spec["properties"]["analysis"]["properties"]["prometheusUrl"]["nullable"] is True
    text = crd_yaml()
    assert "$ref" not in text and "anyOf" not in text and "additionalProperties: false" not in text and "&id" not in text


def test_defaults_and_valid_spec():
    spec, problems = parse_spec(MINIMAL)
    assert problems == [] and spec.strategy.canaryNodes == 1 and spec.analysis.onNoData == "hold"


@pytest.mark.parametrize("raw,message", [
    ({}, "spec.podSelector: Field required"),
    ({**MINIMAL, "strategy": {"maxParallel": 0}}, "spec.strategy.maxParallel: Input should be greater than or equal to 1"),
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
