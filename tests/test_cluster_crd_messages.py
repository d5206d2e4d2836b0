"""The CRD's CEL rules on a real kube-apiserver (localcluster): it accepts the CRD (within CEL's cost
budget), refuses each invalid spec at create with the operator's own words (spec.semantic_problems), says the
real bound of a misleading one, and shows status.message in `kubectl get`'s MESSAGE column."""

from __future__ import annotations

import json
import time

import pytest
from kubernetes import client

from gluon_localcluster import fleet
from gluon_operator.crd import crd
from gluon_operator.spec import GROUP, PLURAL, VERSION
from tests.test_crd_messages import ONE_PER_RULE, cross_field_problems


@pytest.fixture(scope="module")
def custom(control_plane):
    """The chart's CRD (the generated one) applied and established."""
    admin = control_plane.admin_client()
    ext = client.ApiextensionsV1Api(admin)
    body = crd()
    try:
        ext.create_custom_resource_definition(body)
    except client.ApiException as exc:
        if exc.status != 409:
            raise
        body["metadata"]["resourceVersion"] = ext.read_custom_resource_definition(
            body["metadata"]["name"]
        ).metadata.resource_version
        ext.replace_custom_resource_definition(body["metadata"]["name"], body)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        conditions = ext.read_custom_resource_definition(body["metadata"]["name"]).status.conditions or []
        if any(c.type == "Established" and c.status == "True" for c in conditions):
            break
        time.sleep(0.5)
    else:
        pytest.fail("the CRD did not become Established")
    return client.CustomObjectsApi(admin)


def refusal(custom, namespace: str, spec: dict) -> str:
    body = fleet.rollout("bad", namespace)
    body["spec"] = spec
    with pytest.raises(client.ApiException) as info:
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body, dry_run="All")
    assert info.value.status == 422, info.value.body
    return json.loads(info.value.body)["message"]


@pytest.mark.parametrize("raw", ONE_PER_RULE.values(), ids=ONE_PER_RULE.keys())
def test_each_invalid_spec_is_refused_with_the_operators_words(custom, namespace, raw):
    message = refusal(custom, namespace, raw)
    for problem in cross_field_problems(raw):
        assert problem in message, message


@pytest.mark.parametrize(
    "change,where,words",
    [
        ({"analysis": {"confidence": 95}}, "spec.analysis.confidence", "must be from 0.5 to 0.9999"),
        ({"strategy": {"canaryNodes": "one"}}, "spec.strategy.canaryNodes", "must be a count >= 0 or a percentage"),
        ({"strategy": {"canaryNodes": -1}}, "spec.strategy.canaryNodes", "must be a count >= 0 or a percentage"),
        ({"strategy": {"maxParallel": "0%"}}, "spec.strategy.maxParallel", "must be a count >= 1 or a percentage"),
    ],
)
def test_misleading_bounds_say_the_real_bound(custom, namespace, change, where, words):
    message = refusal(custom, namespace, {"podSelector": {"matchLabels": {"app": "x"}}, **change})
    assert where in message and words in message, message
    assert "less than or equal to 0" not in message and "should match" not in message


def test_a_fractional_count_is_one_type_error(custom, namespace):
    message = refusal(
        custom, namespace, {"podSelector": {"matchLabels": {"app": "x"}}, "strategy": {"canaryNodes": 2.5}}
    )
    assert "spec.strategy.canaryNodes" in message and "must be of type integer,string" in message, message
    assert "anyOf" not in message and "default format" not in message


def test_a_valid_spec_passes_and_the_message_column_shows_status_message(custom, namespace, control_plane):
    body = fleet.rollout("good", namespace)
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, "good", {"status": {"phase": "Aborted", "message": "aborted: 3 rolled back"}}
    )
    api = control_plane.admin_client()
    response = api.call_api(
        "GET",
        f"{api.configuration.host}/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/good",
        header_params={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"},
    )
    response.read()
    table = json.loads(response.data)
    names = [c["name"] for c in table["columnDefinitions"]]
    assert table["rows"][0]["cells"][names.index("Message")] == "aborted: 3 rolled back"
