"""What the chart checks at install, against the real kube-apiserver with the real helm (localcluster): a
release namespace whose Pod Security level refuses the agent, and monitors switched on while the cluster has
no Prometheus Operator CRDs. `helm install` into a namespace enforcing baseline is refused with the fix, and
succeeds once the namespace is relabelled as the message says (README "What the install checks")."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from gluon_localcluster.install import CHART, LOCAL_VALUES, helm, merge

ENFORCE = "pod-security.kubernetes.io/enforce"
PROMETHEUS_OPERATOR_KINDS = ("ServiceMonitor", "PodMonitor", "PrometheusRule")
NOWHERE = {"testing.local/no-such-node": "true"}
# A second release on the test run's shared cluster that touches nothing of the other tests: no node runs its
# agents or operator, its webhook selects no pod, no post-delete Job strips the nodes' labels.
INERT: dict[str, Any] = merge(
    LOCAL_VALUES,
    {
        "operator": {"replicas": 1, "nodeSelector": NOWHERE},
        "agent": {"nodeSelector": NOWHERE},
        "webhook": {"objectSelector": {"matchLabels": NOWHERE}},
        "cleanup": {"enabled": False},
    },
)


def psa_refusal(namespace: str, level: str) -> str:
    return (
        f'namespace {namespace} enforces Pod Security level "{level}", which refuses the agent\'s hostPort and '
        f"hostPath in every GPU access mode: run `kubectl label namespace {namespace} "
        f"pod-security.kubernetes.io/enforce=privileged --overwrite` and install again."
    )


def crd_refusal(kinds: str) -> str:
    return (
        f"monitoring.enabled is true but this cluster has no Prometheus Operator CRD for {kinds} "
        "(monitoring.coreos.com/v1): install the Prometheus Operator (e.g. kube-prometheus-stack) first, or set "
        "monitoring.enabled=false and scrape the serving pods yourself."
    )


@pytest.fixture
def core(control_plane) -> client.CoreV1Api:
    return client.CoreV1Api(control_plane.admin_client())


@pytest.fixture
def labelled(core):
    """Makes namespaces enforcing a Pod Security level; deletes them afterwards."""
    made: list[str] = []

    def make(level: str | None) -> str:
        name = f"checks-{level or 'unlabelled'}-{uuid.uuid4().hex[:5]}"
        labels = {ENFORCE: level} if level else {}
        core.create_namespace({"metadata": {"name": name, "labels": labels}})
        made.append(name)
        return name

    yield make
    for name in made:
        core.delete_namespace(name, _preload_content=False)


def values_file(tmp_path: Path, extra: dict[str, Any] | None = None) -> str:
    path = tmp_path / f"values-{uuid.uuid4().hex[:5]}.json"
    path.write_text(json.dumps(merge(INERT, extra or {})))
    return str(path)


def render_on_cluster(cp, namespace: str, values: str, *extra: str) -> str:
    """`helm template --dry-run=server`: rendered with `lookup` and Capabilities from the real API server."""
    return helm(
        cp, "template", "t", str(CHART), "--namespace", namespace, "--values", values, "--dry-run=server", *extra
    )


def test_the_shared_cluster_has_no_prometheus_operator_crds(control_plane):
    """The premise of the CRD checks below (test_cluster_monitoring runs its Prometheus Operator on a cluster of
    its own)."""
    crds = client.ApiextensionsV1Api(control_plane.admin_client()).list_custom_resource_definition()
    assert not [c.metadata.name for c in crds.items if c.spec.group == "monitoring.coreos.com"]


@pytest.mark.parametrize("level", ["baseline", "restricted"])
def test_a_namespace_below_privileged_is_refused_with_the_label_to_set(control_plane, labelled, tmp_path, level):
    namespace = labelled(level)
    with pytest.raises(RuntimeError) as refused:
        render_on_cluster(control_plane, namespace, values_file(tmp_path))
    assert psa_refusal(namespace, level) in str(refused.value)


@pytest.mark.parametrize("level", ["privileged", None])
def test_a_privileged_unlabelled_or_missing_namespace_passes(control_plane, labelled, tmp_path, level):
    """Unlabelled: the cluster's default level (privileged here); missing: --create-namespace makes it later."""
    namespace = labelled(level)
    assert "kind: DaemonSet" in render_on_cluster(control_plane, namespace, values_file(tmp_path))
    missing = f"checks-missing-{uuid.uuid4().hex[:5]}"
    assert "kind: DaemonSet" in render_on_cluster(control_plane, missing, values_file(tmp_path))


@pytest.mark.parametrize(
    "monitors,absent",
    [
        ({}, "ServiceMonitor, PodMonitor, PrometheusRule"),
        ({"serviceMonitor": {"enabled": False}, "prometheusRule": {"enabled": False}}, "PodMonitor"),
        ({"podMonitor": {"enabled": False}, "servingPodMonitor": {"enabled": False}}, "ServiceMonitor, PrometheusRule"),
    ],
)
def test_monitors_without_the_prometheus_operator_crds_are_refused(control_plane, labelled, tmp_path, monitors, absent):
    namespace = labelled("privileged")
    values = values_file(tmp_path, {"monitoring": {"enabled": True, **monitors}})
    with pytest.raises(RuntimeError) as refused:
        render_on_cluster(control_plane, namespace, values)
    assert crd_refusal(absent) in str(refused.value)
    # where the CRDs are served (here: as if, through --api-versions) the same values render every monitor
    served = [f"--api-versions=monitoring.coreos.com/v1/{kind}" for kind in PROMETHEUS_OPERATOR_KINDS]
    rendered = render_on_cluster(control_plane, namespace, values, *served)
    assert "apiVersion: monitoring.coreos.com/v1" in rendered
    # and the one switch off needs none
    off = values_file(tmp_path, {"monitoring": {"enabled": False, **monitors}})
    assert "monitoring.coreos.com" not in render_on_cluster(control_plane, namespace, off)


def test_helm_install_into_a_baseline_namespace_is_refused_then_succeeds_after_relabelling(
    control_plane, core, labelled, tmp_path
):
    namespace = labelled("baseline")
    release = f"checks-{uuid.uuid4().hex[:5]}"
    install = ("install", release, str(CHART), "--namespace", namespace, "--values", values_file(tmp_path))
    with pytest.raises(RuntimeError) as refused:
        helm(control_plane, *install, "--wait=false")
    assert psa_refusal(namespace, "baseline") in str(refused.value)
    assert not json.loads(helm(control_plane, "list", "--namespace", namespace, "--all", "--output", "json"))

    core.patch_namespace(namespace, {"metadata": {"labels": {ENFORCE: "privileged"}}})  # what the message says
    try:
        helm(control_plane, *install, "--wait=false")
        listed = json.loads(helm(control_plane, "list", "--namespace", namespace, "--output", "json"))
        assert [(r["name"], r["status"]) for r in listed] == [(release, "deployed")]
        daemonset = client.AppsV1Api(control_plane.admin_client()).read_namespaced_daemon_set(
            f"{release}-gluon-rollout-agent", namespace
        )
        assert daemonset.spec.template.spec.containers[0].security_context.privileged is True  # the default mode
    finally:
        helm(control_plane, "uninstall", release, "--namespace", namespace, "--wait", "--timeout", "120s")
