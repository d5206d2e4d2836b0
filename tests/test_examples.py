"""examples/: the GluonRollout parses with the operator's own spec model and no semantic problem, the
serving Deployment validates against Kubernetes' schemas, the rollout selects its pods, the webhook's
injection applies to its template in both modes, the real API server accepts both (dry run), and the chart
renders with the values file (both images named, its serving PodMonitor selecting the Deployment's pods)."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from gluon_common import contract
from gluon_operator import webhook
from gluon_operator.spec import GROUP, KIND, VERSION, parse_spec, selector_matches

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
ROLLOUT = EXAMPLES / "kimi-k3-tp8-rollout.yaml"
DEPLOYMENT = EXAMPLES / "sglang-kimi-k3-deployment.yaml"
VALUES = EXAMPLES / "values.yaml"


def load(path: Path) -> dict:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    assert len(docs) == 1, f"{path.name}: one object expected"
    return docs[0]


def test_the_rollout_parses_without_problems():
    rollout = load(ROLLOUT)
    assert (rollout["apiVersion"], rollout["kind"]) == (f"{GROUP}/{VERSION}", KIND)
    spec, problems = parse_spec(rollout["spec"])
    assert spec is not None and problems == []
    assert spec.analysis.prometheusUrl and spec.strategy.holdoutNodes >= 1  # judged against a control group


def test_a_typo_in_the_rollout_would_be_caught():
    """The check above can fail: the spec model rejects unknown fields and bad values, naming them."""
    raw = load(ROLLOUT)["spec"]
    _, problems = parse_spec({**raw, "strategy": {**raw["strategy"], "maxParalel": 2}})
    assert any("spec.strategy.maxParalel" in p for p in problems)


@pytest.mark.parametrize("version", ["1.30", "1.37"])
def test_the_deployment_validates(version):
    kubernetes_validate.validate(load(DEPLOYMENT), version, strict=True)


def test_the_deployment_is_what_the_rollout_expects():
    rollout, deployment = load(ROLLOUT), load(DEPLOYMENT)
    template = deployment["spec"]["template"]
    assert deployment["metadata"]["namespace"] == rollout["metadata"]["namespace"]
    assert selector_matches(rollout["spec"]["podSelector"], template["metadata"]["labels"])
    serving = template["spec"]["containers"][0]
    assert {"name": contract.FLAG_ENV, "value": "0"} in serving["env"]  # the safe path without the webhook
    assert any(p.get("name") == "metrics" for p in serving["ports"])
    assert "--enable-metrics" in serving["command"] and "--tp=8" in serving["command"]


@pytest.mark.parametrize("mode", ["fileKeyRef", "shell"])
def test_the_webhook_injects_into_its_template(mode):
    template = load(DEPLOYMENT)["spec"]["template"]
    spec, warnings = webhook.mutated_spec({"spec": template["spec"]}, webhook.Injection("agent:test", mode), mode)
    assert warnings == []
    serving = spec["containers"][0]
    flags = [e for e in serving["env"] if e["name"] == contract.FLAG_ENV]
    assert len(flags) == 1  # the template's "0" is replaced, not duplicated
    if mode == "fileKeyRef":
        assert flags[0]["valueFrom"]["fileKeyRef"]["volumeName"] == webhook.VOLUME
    else:
        assert serving["command"][:3] == ["/bin/sh", "-c", webhook.SHELL_WRAPPER] and serving["command"][4:7] == [
            "python3",
            "-m",
            "sglang.launch_server",
        ]
    preflight = next(c for c in spec["initContainers"] if c["name"] == webhook.PREFLIGHT_CONTAINER)
    assert preflight["image"] == serving["image"]  # the preflight checks the serving image's own stack
    kubernetes_validate.validate(
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": spec}, "1.37", strict=True
    )


def test_both_apply_to_the_real_api_server(control_plane, installed, namespace):
    """Server-side dry runs against kube-apiserver with the chart's CRD: its schema, defaulting and the
    Deployment's validation, as `kubectl apply --dry-run=server` would check them."""
    from kubernetes import client

    from gluon_operator.spec import PLURAL

    admin = control_plane.admin_client()
    rollout, deployment = load(ROLLOUT), load(DEPLOYMENT)
    rollout["metadata"]["namespace"] = deployment["metadata"]["namespace"] = namespace
    created = client.CustomObjectsApi(admin).create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, rollout, dry_run="All"
    )
    assert (
        created["spec"]["strategy"]["approval"] == "AfterCanary" and created["spec"]["strategy"]["maxParallel"] == "10%"
    )
    apps = client.AppsV1Api(admin)
    made = apps.create_namespaced_deployment(namespace, deployment, dry_run="All")
    assert made.spec.template.spec.containers[0].env[0].value == "0"
    # The schema is really enforced: the same rollout with a typo is refused by the API server.
    broken = {**rollout, "spec": {**rollout["spec"], "strategy": {**rollout["spec"]["strategy"], "maxParallel": "ten"}}}
    with pytest.raises(client.ApiException) as refused:
        client.CustomObjectsApi(admin).create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, broken, dry_run="All"
        )
    assert refused.value.status == 422 and "maxParallel" in refused.value.body


def test_the_values_file_names_both_images_and_renders_the_chart():
    from tests.test_chart import CHART, CUSTOM, by_kind, helm

    values = yaml.safe_load(VALUES.read_text())
    assert values["operator"]["image"]["repository"] and values["agent"]["image"]["repository"]  # no default
    done = helm("template", "gluon-rollout", str(CHART), "--namespace", "gluon-system", "--values", str(VALUES))
    assert done.returncode == 0, done.stderr
    docs = [d for d in yaml.safe_load_all(done.stdout) if d]
    agent = by_kind(docs, "DaemonSet")[0]["spec"]["template"]["spec"]["containers"][0]
    assert agent["image"] == "registry.example/ml/gluon-rollout-agent:0.1.0-sglang-v0.5.19"
    assert agent["securityContext"]["privileged"] is True
    for doc in docs:
        if (doc["apiVersion"], doc["kind"]) not in CUSTOM:
            kubernetes_validate.validate(doc, "1.37", strict=True)
    serving = next(d for d in by_kind(docs, "PodMonitor") if d["metadata"]["name"].endswith("-serving"))
    deployment = load(DEPLOYMENT)
    assert deployment["metadata"]["namespace"] in serving["spec"]["namespaceSelector"]["matchNames"]
    assert selector_matches(serving["spec"]["selector"], deployment["spec"]["template"]["metadata"]["labels"])
    ports = {p["name"] for p in deployment["spec"]["template"]["spec"]["containers"][0]["ports"]}
    assert serving["spec"]["podMetricsEndpoints"][0]["port"] in ports
