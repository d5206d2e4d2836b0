"""The chart installed for real into a real kube-apiserver (localcluster): the API server itself calls the
operator's webhook, evaluates the agent's ValidatingAdmissionPolicy, enforces RBAC and the CRD's schema."""

from __future__ import annotations

import json
import time

import pytest
from kubernetes import client, config

from gluon_agent import contract
from gluon_localcluster import fleet
from gluon_localcluster.processes import operator as start_operator
from gluon_operator.spec import GROUP, PLURAL, VERSION
from tests.helpers import wait_for

MERGE = "application/merge-patch+json"
NODES = ("adm-a", "adm-b")


@pytest.fixture(scope="module")
def gpu_nodes(control_plane, installed):
    core = client.CoreV1Api(control_plane.admin_client())
    for index, name in enumerate(NODES, start=200):
        core.create_node(fleet.gpu_node(name, index))
    for name in NODES:
        installed.agent_pod(name)  # the DaemonSet controller put an agent pod there
    yield NODES
    for name in NODES:
        core.delete_node(name)


def api_for(kubeconfig) -> client.ApiClient:
    return config.new_client_from_config(config_file=str(kubeconfig))


def denial(call) -> str:
    with pytest.raises(client.ApiException) as info:
        call()
    assert info.value.status in (403, 422), info.value
    return json.loads(info.value.body)["message"]


# ---------------------------------------------------------------- install


def test_helm_install_creates_the_chart_objects(control_plane, installed, gpu_nodes):
    admin = control_plane.admin_client()
    ext = client.ApiextensionsV1Api(admin)
    assert ext.read_custom_resource_definition(f"{PLURAL}.{GROUP}").spec.names.kind == "GluonRollout"
    reg = client.AdmissionregistrationV1Api(admin)
    webhook = reg.read_mutating_webhook_configuration(installed.release).webhooks[0]
    assert webhook.client_config.url == f"https://127.0.0.1:{installed.webhook_port}/inject"
    assert webhook.failure_policy == "Ignore"
    assert reg.read_validating_admission_policy(f"{installed.agent_account}-own-node").spec.failure_policy == "Fail"
    assert client.PolicyV1Api(admin).read_namespaced_pod_disruption_budget(installed.operator_account, installed.namespace)
    version = control_plane.version()
    assert version["gitVersion"].startswith("v1.") and int(version["minor"].rstrip("+")) >= 36


# ---------------------------------------------------------------- the agent's admission policy


@pytest.fixture(scope="module")
def agent_core(installed, gpu_nodes):
    """The CoreV1Api of adm-a's agent: a token bound to its DaemonSet pod on adm-a."""
    return client.CoreV1Api(api_for(installed.agent_kubeconfig("adm-a")))


def test_bound_token_carries_the_node(installed, gpu_nodes):
    review = client.AuthenticationV1Api(api_for(installed.agent_kubeconfig("adm-a"))).create_self_subject_review(
        {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
    assert review.status.user_info.username == f"system:serviceaccount:{installed.namespace}:{installed.agent_account}"
    assert review.status.user_info.extra["authentication.kubernetes.io/node-name"] == ["adm-a"]


def test_agent_may_patch_its_own_node_agent_keys(agent_core):
    agent_core.patch_node("adm-a", {"metadata": {"labels": {contract.LABEL_SELFTEST: "pending"},
                                                  "annotations": {contract.ANNOTATION_OWNED_KEYS: contract.LABEL_SELFTEST}}},
                          _content_type=MERGE)
    assert agent_core.read_node("adm-a").metadata.labels[contract.LABEL_SELFTEST] == "pending"


@pytest.mark.parametrize("name,patch,message", [
    ("adm-b", {"metadata": {"labels": {contract.LABEL_SELFTEST: "pass"}}}, "the agent may change only its own node"),
    ("adm-a", {"metadata": {"labels": {contract.LABEL_ENABLED: "true"}}}, "may not change the operator's keys"),
    ("adm-a", {"metadata": {"labels": {contract.LABEL_STATE: "Promoted"}}}, "may not change the operator's keys"),
    ("adm-a", {"metadata": {"annotations": {contract.ANNOTATION_ROLLBACK: "{}"}}}, "may not change the operator's keys"),
    ("adm-a", {"metadata": {"labels": {"example.com/other": "x"}}}, f"only {contract.PREFIX} labels and annotations"),
    ("adm-a", {"metadata": {"annotations": {"example.com/other": "x"}}}, f"only {contract.PREFIX} labels and annotations"),
    ("adm-a", {"spec": {"unschedulable": True}}, "may not change a node's spec"),
    ("adm-a", {"spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]}}, "may not change a node's spec"),
    ("adm-a", {"metadata": {"finalizers": ["example.com/keep"]}}, "ownerReferences or finalizers"),
    ("adm-a", {"metadata": {"ownerReferences": [{"apiVersion": "v1", "kind": "Namespace", "name": "default",
                                                  "uid": "00000000-0000-0000-0000-000000000000"}]}}, "ownerReferences or finalizers"),
])
def test_agent_policy_denies(agent_core, name, patch, message):
    text = denial(lambda: agent_core.patch_node(name, patch, _content_type=MERGE))
    assert message in text, text


def test_agent_policy_denies_node_status(agent_core):
    text = denial(lambda: agent_core.patch_node_status("adm-a", {"status": {"capacity": {"cpu": "1"}}}, _content_type=MERGE))
    assert "only update node metadata" in text or "forbidden" in text, text


def test_operator_node_writes_are_not_affected(installed, gpu_nodes):
    operator_core = client.CoreV1Api(api_for(installed.operator_kubeconfig()))
    operator_core.patch_node("adm-b", {"metadata": {"labels": {contract.LABEL_ENABLED: "false", contract.LABEL_STATE: "Eligible"}}},
                             _content_type=MERGE)
    assert operator_core.read_node("adm-b").metadata.labels[contract.LABEL_STATE] == "Eligible"


@pytest.mark.parametrize("patch,message", [
    ({"spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]}}, "may not change a node's or pod's spec"),
    ({"spec": {"unschedulable": True}}, "may not change a node's or pod's spec"),
    ({"metadata": {"labels": {contract.LABEL_SELFTEST: "fail"}}}, "may change only its own keys"),
    ({"metadata": {"annotations": {contract.ANNOTATION_REPORT: "{}"}}}, "may change only its own keys"),
    ({"metadata": {"labels": {"example.com/other": "x"}}}, "may change only its own keys"),
])
def test_operator_policy_confines_node_writes(installed, gpu_nodes, patch, message):
    operator_core = client.CoreV1Api(api_for(installed.operator_kubeconfig()))
    text = denial(lambda: operator_core.patch_node("adm-b", patch, _content_type=MERGE))
    assert message in text, text


def test_operator_policy_confines_pod_writes_to_the_flag_label(installed, namespace):
    admin_core = client.CoreV1Api(installed.cp.admin_client())
    admin_core.create_namespaced_pod(namespace, {"metadata": {"name": "p", "labels": {"app": "x"}},
                                                 "spec": {"containers": [{"name": "c", "image": "i"}]}})
    operator_core = client.CoreV1Api(api_for(installed.operator_kubeconfig()))
    operator_core.patch_namespaced_pod("p", namespace, {"metadata": {"labels": {contract.LABEL_POD_FLAG: "1"}}}, _content_type=MERGE)
    assert admin_core.read_namespaced_pod("p", namespace).metadata.labels[contract.LABEL_POD_FLAG] == "1"
    for patch in ({"metadata": {"labels": {"app": "y"}}}, {"metadata": {"annotations": {"example.com/a": "b"}}},
                  {"spec": {"activeDeadlineSeconds": 5}}):
        text = denial(lambda: operator_core.patch_namespaced_pod("p", namespace, patch, _content_type=MERGE))
        assert "the operator may" in text, text


# ---------------------------------------------------------------- RBAC, decided by the API server


def can(api: client.ApiClient, verb: str, resource: str, group: str = "", subresource: str = "", namespace: str = "") -> bool:
    review = client.AuthorizationV1Api(api).create_self_subject_access_review({
        "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": {"verb": verb, "resource": resource, "group": group, "subresource": subresource,
                                        "namespace": namespace}}})
    return review.status.allowed


def test_rbac_agent_least_privilege(installed, gpu_nodes):
    api = api_for(installed.agent_kubeconfig("adm-a"))
    assert all(can(api, verb, "nodes") for verb in ("get", "list", "watch", "patch"))
    for verb, resource, sub in [("get", "secrets", ""), ("list", "secrets", ""), ("patch", "pods", ""), ("delete", "pods", ""),
                                ("create", "pods", "eviction"), ("list", "pods", ""), ("delete", "nodes", ""),
                                ("update", "nodes", ""), ("patch", "nodes", "status"), ("create", "nodes", "")]:
        assert not can(api, verb, resource, subresource=sub, namespace="default"), (verb, resource, sub)


def test_rbac_operator_least_privilege(installed):
    api = api_for(installed.operator_kubeconfig())
    for verb, resource, group, sub in [("patch", "nodes", "", ""), ("watch", "pods", "", ""), ("create", "pods", "", "eviction"),
                                       ("patch", "gluonrollouts", GROUP, "status"), ("create", "events", "", "")]:
        assert can(api, verb, resource, group, sub, "default"), (verb, resource, sub)
    for verb, resource, group, sub in [("get", "secrets", "", ""), ("list", "secrets", "", ""), ("delete", "nodes", "", ""),
                                       ("update", "nodes", "", ""), ("patch", "nodes", "", "status"), ("create", "pods", "", ""),
                                       ("update", "pods", "", ""), ("create", "gluonrollouts", GROUP, ""),
                                       ("delete", "gluonrollouts", GROUP, ""), ("create", "deployments", "apps", "")]:
        assert not can(api, verb, resource, group, sub, "default"), (verb, resource, sub)


# ---------------------------------------------------------------- the CRD's schema


def test_crd_schema_rejects_an_invalid_spec_naming_the_field(control_plane, namespace):
    custom = client.CustomObjectsApi(control_plane.admin_client())
    body = fleet.rollout("bad", namespace, strategy={"maxParallel": 0})
    with pytest.raises(client.ApiException) as info:
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    assert info.value.status == 422
    assert "spec.strategy.maxParallel" in json.loads(info.value.body)["message"]
    # An unknown field is pruned silently by default, and refused under kubectl's default (Strict) validation.
    body = fleet.rollout("unknown", namespace, strategy={"canaryNodez": 1})
    with pytest.raises(client.ApiException) as info:
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body, field_validation="Strict")
    assert 'unknown field "spec.strategy.canaryNodez"' in json.loads(info.value.body)["message"]
    stored = custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    assert "canaryNodez" not in stored["spec"]["strategy"]


def test_status_reads_back_intact(installed, namespace):
    custom = client.CustomObjectsApi(installed.cp.admin_client())
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, fleet.rollout("kimi", namespace))
    status = {"phase": "Progressing", "counts": {"Promoted": 3}, "nodes": {"n1": {"state": "Promoted", "numbers": {
        "effect": 1.9, "ci_low": 1.8, "nested": {"deep": [1, 2, {"x": None}]}}}}}
    operator_custom = client.CustomObjectsApi(api_for(installed.operator_kubeconfig()))
    operator_custom.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, "kimi", {"status": status},
                                                         _content_type=MERGE)
    read = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "kimi")["status"]
    assert read["nodes"]["n1"]["numbers"]["nested"] == {"deep": [1, 2, {}]} or read["nodes"]["n1"]["numbers"]["nested"]["deep"][:2] == [1, 2]
    assert read["phase"] == "Progressing" and read["nodes"]["n1"]["numbers"]["effect"] == 1.9


def test_a_status_over_the_request_limit_is_refused(installed, namespace):
    """~750 bytes a node in status.nodes for 5000 nodes (the pre-1.0 design) is over etcd's request limit."""
    custom = client.CustomObjectsApi(installed.cp.admin_client())
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, fleet.rollout("big", namespace))
    record = {"state": "Promoted", "reason": "not worse than tolerance: " + "x" * 500, "since": time.time(),
              "numbers": {"effect": 1.9, "ci_low": 1.8, "ci_high": 2.0, "n_post": 10, "n_pre": 40, "p_worse": 0.5}}
    nodes = {f"gpu-{i:05d}": record for i in range(5000)}
    size = len(json.dumps(nodes))
    assert size > 3 * 1024 * 1024
    with pytest.raises(client.ApiException) as info:
        custom.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, "big", {"status": {"nodes": nodes}},
                                                     _content_type=MERGE)
    assert info.value.status in (413, 500, 422), info.value.status
    assert "too large" in info.value.body.lower() or info.value.status == 413, info.value.body[:300]


# ---------------------------------------------------------------- the webhook, called by the API server


def test_api_server_calls_the_webhook_and_fails_open(installed, namespace):
    custom = client.CustomObjectsApi(installed.cp.admin_client())
    core = client.CoreV1Api(installed.cp.admin_client())
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, fleet.rollout("kimi", namespace))
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "sglang-", "labels": dict(fleet.SERVING_LABELS)},
           "spec": {"containers": [{"name": "sglang", "image": "lmsysorg/sglang:rocm", "command": ["python3", "-m", "sglang.launch_server"],
                                    "env": [{"name": contract.FLAG_ENV, "value": "0"}]}]}}
    operator = start_operator(installed)
    try:
        def injected():
            created = core.create_namespaced_pod(namespace, pod)
            if contract.ANNOTATION_POD_INJECTED in (created.metadata.annotations or {}):
                return created
            core.delete_namespaced_pod(created.metadata.name, namespace, grace_period_seconds=0)
            return None
        created = wait_for(injected, timeout=60, interval=1.0, what=f"an injected pod (operator log:\n{operator.tail()})")
    finally:
        operator.stop()
    names = [c.name for c in created.spec.init_containers]
    assert names == ["gluon-install", "gluon-preflight"]
    assert any(v.name == "gluon-flag" for v in created.spec.volumes)
    env = {e.name: e for e in created.spec.containers[0].env}
    assert env[contract.FLAG_ENV].value_from.file_key_ref.path == "flag.env"
    assert created.metadata.annotations[contract.ANNOTATION_POD_INJECTED] == "kimi"
    # the operator is gone: failurePolicy Ignore admits the pod unmodified, on its template's flag
    plain = core.create_namespaced_pod(namespace, pod)
    assert not plain.spec.init_containers and contract.ANNOTATION_POD_INJECTED not in (plain.metadata.annotations or {})
    assert {e.name: e.value for e in plain.spec.containers[0].env}[contract.FLAG_ENV] == "0"
