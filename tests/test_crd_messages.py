"""The CRD's CEL rules say what the operator says: each cross-field rule of spec.semantic_problems has a
CEL twin (x-kubernetes-validations) whose message is the same sentence, so `kubectl apply` refuses an invalid
spec in the operator's words. The CEL is evaluated here with the cel-python interpreter; the real API server
evaluates it in tests/test_cluster_crd_messages.py."""

from __future__ import annotations

from typing import Any

import cel
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gluon_operator.crd import crd
from gluon_operator.spec import HERE, GluonRolloutSpec, parse_spec, selector_problems

SCHEMA = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]


# The selectors' own rules are field-level (the schema's patterns, tests/test_spec.py) and use Kubernetes'
# string extensions (lastIndexOf), which the cel-python interpreter lacks: not walked here.
SELECTORS = ("podSelector", "nodeSelector")


def cel_messages(schema: dict[str, Any], value: Any, path: str = "spec") -> list[str]:
    """Every failing x-kubernetes-validations rule's message, walking the schema along the object as the
    API server does (a rule runs where its field is present)."""
    out = []
    for rule in schema.get("x-kubernetes-validations") or []:
        if not cel.evaluate(rule["rule"], {"self": value}):
            message = rule.get("message") or cel.evaluate(rule["messageExpression"], {"self": value})
            out.append(message)
    if isinstance(value, dict):
        for name, sub in (schema.get("properties") or {}).items():
            if name in value and name not in SELECTORS:
                out += cel_messages(sub, value[name], f"{path}.{name}")
    if isinstance(value, list) and "items" in schema:
        for item in value:
            out += cel_messages(schema["items"], item, path)
    return out


def cross_field_problems(raw: dict[str, Any]) -> list[str]:
    spec, problems = parse_spec(raw)
    assert spec is not None, problems
    field_level = selector_problems(spec.podSelector, "spec.podSelector") + selector_problems(
        spec.nodeSelector, "spec.nodeSelector"
    )
    return [p.split(HERE)[0] for p in problems if p not in field_level]  # the rule, without this spec's numbers


def as_stored(raw: dict[str, Any]) -> dict[str, Any]:
    """The spec as the API server validates it: the user's fields with the schema's defaults filled in."""
    return GluonRolloutSpec.model_validate(raw).model_dump(mode="json", exclude_none=True)


POD = {"podSelector": {"matchLabels": {"app": "sglang"}}}
PROM = {"prometheusUrl": "http://prometheus:9090"}

# One spec per cross-field rule of semantic_problems, each breaking that rule alone.
ONE_PER_RULE = {
    "window holds too few steps": {**POD, "analysis": {"windowSeconds": 60, "intervalSeconds": 30}},
    "baseline holds too few steps": {**POD, "analysis": {"baselineSeconds": 60}},
    "over Prometheus's points limit": {**POD, "analysis": {"stepSeconds": 1, "windowSeconds": 86_400}},
    "window shorter than the interval": {**POD, "analysis": {"intervalSeconds": 600}},
    "query without a Prometheus": {**POD, "analysis": {"query": "sum by (node) (x)"}},
    "query without by (node)": {**POD, "analysis": {**PROM, "query": "sum(rate(x[5m]))"}},
    "empty pod selector": {"podSelector": {}},
}


@pytest.mark.parametrize("raw", ONE_PER_RULE.values(), ids=ONE_PER_RULE.keys())
def test_each_cross_field_rule_has_a_cel_twin_with_the_same_words(raw):
    problems = cross_field_problems(raw)
    assert len(problems) >= 1
    assert sorted(cel_messages(SCHEMA, as_stored(raw))) == sorted(problems)


def test_the_rules_read_absent_fields_as_their_defaults():
    """The API server checks the default {} of analysis before it fills in the fields' defaults."""
    assert cel_messages(SCHEMA["properties"]["analysis"], {}) == []
    raw = {**POD, "analysis": {"intervalSeconds": 600}}
    assert cel_messages(SCHEMA, raw) == cross_field_problems(raw)


def test_every_rule_of_semantic_problems_is_covered():
    """Every distinct sentence semantic_problems can say (apart from the selectors' own, which the schema's
    patterns refuse) is reached by ONE_PER_RULE: a new rule without a twin fails here."""
    import inspect

    from gluon_operator import spec as spec_module

    source = inspect.getsource(spec_module.semantic_problems)
    appended = source.count("problems.append(")
    covered = {p for raw in ONE_PER_RULE.values() for p in cross_field_problems(raw)}
    assert len(ONE_PER_RULE) == appended and len(covered) >= appended


@settings(max_examples=300, deadline=None)
@given(
    interval=st.integers(1, 86_400),
    step=st.integers(1, 86_400),
    window=st.integers(10, 86_400),
    baseline=st.integers(10, 86_400),
    warmup=st.integers(0, 86_400),
    samples=st.integers(1, 50),
    url=st.sampled_from([None, "http://p:9090"]),
    query=st.sampled_from([None, "x", "sum by (node) (x)", "sum by(node) (x)", "x{node='{{node}}'}", "by (node)"]),
    selector=st.sampled_from(
        [{}, {"matchLabels": {"a": "b"}}, {"matchExpressions": [{"key": "a", "operator": "Exists"}]}]
    ),
)
def test_cel_and_semantic_problems_agree_on_any_spec(
    interval, step, window, baseline, warmup, samples, url, query, selector
):
    analysis = {
        "intervalSeconds": interval,
        "stepSeconds": step,
        "windowSeconds": window,
        "baselineSeconds": baseline,
        "warmupSeconds": warmup,
        "minSamples": samples,
    }
    analysis.update({k: v for k, v in (("prometheusUrl", url), ("query", query)) if v is not None})
    raw = {"podSelector": selector, "analysis": analysis}
    assert sorted(cel_messages(SCHEMA, as_stored(raw))) == sorted(cross_field_problems(raw))


@pytest.mark.parametrize(
    "path,good,bad",
    [
        (("analysis", "confidence"), [0.5, 0.95, 0.9999], [95, 0.4, 1.0]),
        (("strategy", "canaryNodes"), [0, 3, "0%", "100%"], ["one", -1, "101%", "5"]),
        (("strategy", "maxParallel"), [1, "1%"], [0, "0%"]),
        (("abort", "maxFailedNodes"), [0, "50%"], ["x", -2]),
    ],
)
def test_bounds_that_misled_are_one_rule_with_the_real_bound(path, good, bad):
    field = SCHEMA["properties"][path[0]]["properties"][path[1]]
    assert not {"minimum", "maximum", "pattern", "anyOf"} & field.keys()  # the API server's own words misled
    for value in good:
        assert cel_messages(field, value) == [], value
        assert parse_spec({**POD, path[0]: {path[1]: value}})[0] is not None, value
    for value in bad:
        assert cel_messages(field, value) == [field["x-kubernetes-validations"][0]["message"]], value
        assert parse_spec({**POD, path[0]: {path[1]: value}})[0] is None, value
    if path[1] == "confidence":
        assert "0.9999" in field["x-kubernetes-validations"][0]["message"]


def test_the_message_column_shows_why_the_rollout_is_where_it_is():
    from gluon_operator.gating import rollout_message

    columns = crd()["spec"]["versions"][0]["additionalPrinterColumns"]
    assert {"name": "Message", "type": "string", "jsonPath": ".status.message"} in columns
    assert rollout_message({"phase": "Invalid", "invalid": "spec.podSelector must select something"}) == (
        "spec.podSelector must select something"
    )
    assert rollout_message({"aborted": {"reason": "3 nodes rolled back > maxFailedNodes 2"}}) == (
        "aborted: 3 nodes rolled back > maxFailedNodes 2"
    )
    assert "'canary'" in rollout_message({"approval": {"waitingFor": "canary"}, "counts": {"Promoted": 1}})
    assert rollout_message({"phase": "Progressing", "counts": {"Promoted": 2, "Analyzing": 1, "Eligible": 0}}) == (
        "1 Analyzing, 2 Promoted"
    )
    assert len(rollout_message({"invalid": "x" * 5000})) == 300
