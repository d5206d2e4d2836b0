"""examples/: the GluonRollout parses with the operator's own spec model and no semantic problem, the
serving Deployment validates against Kubernetes' schemas, the rollout selects its pods, and the webhook's
injection applies to its template in both modes."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from gluon_agent import contract
from gluon_operator import webhook
from gluon_operator.spec import GROUP, KIND, VERSION, parse_spec

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
ROLLOUT = EXAMPLES / "kimi-k3-tp8-rollout.yaml"
DEPLOYMENT = EXAMPLES / "sglang-kimi-k3-deployment.yaml"


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
    assert webhook.selector_matches(rollout["spec"]["podSelector"], template["metadata"]["labels"])
    serving = template["spec"]["containers"][0]
    assert {"name": contract.FLAG_ENV, "value": "0"} in serving["env"]  # the safe path without the webhook
    assert any(p.get("name") == "metrics" for p in serving["ports"])
    assert "--enable-metrics" in serving["command"] and "--tp=8" in serving["command"]


@pytest.mark.parametrize("mode", ["fileKeyRef", "shell"])
def test_the_webhook_injects_into_its_template(mode):
    template = load(DEPLOYMENT)["spec"]["template"]
    spec = webhook.mutated_spec({"spec": template["spec"]}, webhook.Injection("agent:test", mode))
    serving = spec["containers"][0]
    flags = [e for e in serving["env"] if e["name"] == contract.FLAG_ENV]
    assert len(flags) == 1  # the template's "0" is replaced, not duplicated
    if mode == "fileKeyRef":
        assert flags[0]["valueFrom"]["fileKeyRef"]["volumeName"] == webhook.VOLUME
    else:
        assert serving["command"][:3] == ["/bin/sh", "-c", webhook.SHELL_WRAPPER] and serving["command"][4:7] == ["python3", "-m", "sglang.launch_server"]
    preflight = next(c for c in spec["initContainers"] if c["name"] == webhook.PREFLIGHT_CONTAINER)
    assert preflight["image"] == serving["image"]  # the preflight checks the serving image's own stack
    kubernetes_validate.validate({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": spec}, "1.37", strict=True)
