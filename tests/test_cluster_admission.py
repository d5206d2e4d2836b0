"""The chart installed for real into a real kube-apiserver (localcluster): the API server itself calls the
operator's webhook, evaluates the agent's ValidatingAdmissionPolicy, enforces RBAC and the CRD's schema."""

from __future__ import annotations

import http.server
import json
import ssl
import threading
import time
import uuid
from contextlib import contextmanager

import pytest
from kubernetes import client, config

from gluon_common import contract
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
    assert client.PolicyV1Api(admin).read_namespaced_pod_disruption_budget(
        installed.operator_account, installed.namespace
    )
    version = control_plane.version()
    assert version["gitVersion"].startswith("v1.") and int(version["minor"].rstrip("+")) >= 36


# ---------------------------------------------------------------- the agent's admission policy


@pytest.fixture(scope="module")
def agent_core(installed, gpu_nodes):
    """The CoreV1Api of adm-a's agent: a token bound to its DaemonSet pod on adm-a."""
    return client.CoreV1Api(api_for(installed.agent_kubeconfig("adm-a")))


def test_bound_token_carries_the_node(installed, gpu_nodes):
    review = client.AuthenticationV1Api(api_for(installed.agent_kubeconfig("adm-a"))).create_self_subject_review(
        {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    )
    assert review.status.user_info.username == f"system:serviceaccount:{installed.namespace}:{installed.agent_account}"
    assert review.status.user_info.extra["authentication.kubernetes.io/node-name"] == ["adm-a"]


def test_agent_may_patch_its_own_node_agent_keys(agent_core):
    agent_core.patch_node(
        "adm-a",
        {
            "metadata": {
                "labels": {contract.LABEL_SELFTEST: "pending"},
                "annotations": {
                    contract.ANNOTATION_OWNED_KEYS: contract.LABEL_SELFTEST,
                    contract.ANNOTATION_DELIVERY: '{"available": true}',
                },
            }
        },
        _content_type=MERGE,
    )
    assert agent_core.read_node("adm-a").metadata.labels[contract.LABEL_SELFTEST] == "pending"


@pytest.mark.parametrize(
    "name,patch,message",
    [
        (
            "adm-b",
            {"metadata": {"labels": {contract.LABEL_SELFTEST: "pass"}}},
            "the agent may change only its own node",
        ),
        (  # what the agent observed of its serving processes: on its own node only
            "adm-b",
            {"metadata": {"annotations": {contract.ANNOTATION_DELIVERY: '{"available": true}'}}},
            "the agent may change only its own node",
        ),
        ("adm-a", {"metadata": {"labels": {contract.LABEL_ENABLED: "true"}}}, "may not change the operator's keys"),
        ("adm-a", {"metadata": {"labels": {contract.LABEL_STATE: "Promoted"}}}, "may not change the operator's keys"),
        (
            "adm-a",
            {"metadata": {"annotations": {contract.ANNOTATION_ROLLBACK: "{}"}}},
            "may not change the operator's keys",
        ),
        (
            "adm-a",
            {"metadata": {"labels": {"example.com/other": "x"}}},
            f"only {contract.PREFIX} labels and annotations",
        ),
        (
            "adm-a",
            {"metadata": {"annotations": {"example.com/other": "x"}}},
            f"only {contract.PREFIX} labels and annotations",
        ),
        ("adm-a", {"spec": {"unschedulable": True}}, "may not change a node's spec"),
        ("adm-a", {"spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]}}, "may not change a node's spec"),
        ("adm-a", {"metadata": {"finalizers": ["example.com/keep"]}}, "ownerReferences or finalizers"),
        (
            "adm-a",
            {
                "metadata": {
                    "ownerReferences": [
                        {
                            "apiVersion": "v1",
                            "kind": "Namespace",
                            "name": "default",
                            "uid": "00000000-0000-0000-0000-000000000000",
                        }
                    ]
                }
            },
            "ownerReferences or finalizers",
        ),
    ],
)
def test_agent_policy_denies(agent_core, name, patch, message):
    text = denial(lambda: agent_core.patch_node(name, patch, _content_type=MERGE))
    assert message in text, text


def test_agent_policy_denies_node_status(agent_core):
    text = denial(
        lambda: agent_core.patch_node_status("adm-a", {"status": {"capacity": {"cpu": "1"}}}, _content_type=MERGE)
    )
    assert "only update node metadata" in text or "forbidden" in text, text


def test_operator_node_writes_are_not_affected(installed, gpu_nodes):
    operator_core = client.CoreV1Api(api_for(installed.operator_kubeconfig()))
    operator_core.patch_node(
        "adm-b",
        {"metadata": {"labels": {contract.LABEL_ENABLED: "false", contract.LABEL_STATE: "Eligible"}}},
        _content_type=MERGE,
    )
    assert operator_core.read_node("adm-b").metadata.labels[contract.LABEL_STATE] == "Eligible"


@pytest.mark.parametrize(
    "patch,message",
    [
        ({"spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]}}, "may not change a node's or pod's spec"),
        ({"spec": {"unschedulable": True}}, "may not change a node's or pod's spec"),
        ({"metadata": {"labels": {contract.LABEL_SELFTEST: "fail"}}}, "may change only its own keys"),
        ({"metadata": {"annotations": {contract.ANNOTATION_REPORT: "{}"}}}, "may change only its own keys"),
        ({"metadata": {"labels": {"example.com/other": "x"}}}, "may change only its own keys"),
    ],
)
def test_operator_policy_confines_node_writes(installed, gpu_nodes, patch, message):
    operator_core = client.CoreV1Api(api_for(installed.operator_kubeconfig()))
    text = denial(lambda: operator_core.patch_node("adm-b", patch, _content_type=MERGE))
    assert message in text, text


def test_operator_policy_confines_pod_writes_to_the_flag_label(installed, namespace):
    admin_core = client.CoreV1Api(installed.cp.admin_client())
    admin_core.create_namespaced_pod(
        namespace,
        {"metadata": {"name": "p", "labels": {"app": "x"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}},
    )
    operator_core = client.CoreV1Api(api_for(installed.operator_kubeconfig()))
    operator_core.patch_namespaced_pod(
        "p", namespace, {"metadata": {"labels": {contract.LABEL_POD_FLAG: "1"}}}, _content_type=MERGE
    )
    assert admin_core.read_namespaced_pod("p", namespace).metadata.labels[contract.LABEL_POD_FLAG] == "1"
    for patch in (
        {"metadata": {"labels": {"app": "y"}}},
        {"metadata": {"annotations": {"example.com/a": "b"}}},
        {"spec": {"activeDeadlineSeconds": 5}},
    ):
        text = denial(lambda: operator_core.patch_namespaced_pod("p", namespace, patch, _content_type=MERGE))
        assert "the operator may" in text, text


# ---------------------------------------------------------------- RBAC, decided by the API server


def can(
    api: client.ApiClient, verb: str, resource: str, group: str = "", subresource: str = "", namespace: str = ""
) -> bool:
    review = client.AuthorizationV1Api(api).create_self_subject_access_review(
        {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {
                "resourceAttributes": {
                    "verb": verb,
                    "resource": resource,
                    "group": group,
                    "subresource": subresource,
                    "namespace": namespace,
                }
            },
        }
    )
    return review.status.allowed


def test_rbac_agent_least_privilege(installed, gpu_nodes):
    api = api_for(installed.agent_kubeconfig("adm-a"))
    assert all(can(api, verb, "nodes") for verb in ("get", "list", "watch", "patch"))
    for verb, resource, sub in [
        ("get", "secrets", ""),
        ("list", "secrets", ""),
        ("patch", "pods", ""),
        ("delete", "pods", ""),
        ("create", "pods", "eviction"),
        ("list", "pods", ""),
        ("delete", "nodes", ""),
        ("update", "nodes", ""),
        ("patch", "nodes", "status"),
        ("create", "nodes", ""),
    ]:
        assert not can(api, verb, resource, subresource=sub, namespace="default"), (verb, resource, sub)


def test_rbac_operator_least_privilege(installed):
    api = api_for(installed.operator_kubeconfig())
    for verb, resource, group, sub in [
        ("patch", "nodes", "", ""),
        ("watch", "pods", "", ""),
        ("create", "pods", "", "eviction"),
        ("patch", "gluonrollouts", GROUP, "status"),
        ("create", "events", "", ""),
    ]:
        assert can(api, verb, resource, group, sub, "default"), (verb, resource, sub)
    for verb, resource, group, sub in [
        ("get", "secrets", "", ""),
        ("list", "secrets", "", ""),
        ("delete", "nodes", "", ""),
        ("update", "nodes", "", ""),
        ("patch", "nodes", "", "status"),
        ("create", "pods", "", ""),
        ("update", "pods", "", ""),
        ("create", "gluonrollouts", GROUP, ""),
        ("delete", "gluonrollouts", GROUP, ""),
        ("create", "deployments", "apps", ""),
    ]:
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


# Refused by the CRD's schema and by parse_spec alike (issue 34): a pod selector the API server would refuse
# as a labelSelector query, and an analysis whose queries pass Prometheus's points limit.
REFUSED_BY_BOTH = [
    ({"podSelector": {"matchLabels": {"app": "x" * 4096}}}, "spec.podSelector.matchLabels.app"),
    ({"podSelector": {"matchLabels": {"app": "sgl\u00e4ng"}}}, "spec.podSelector.matchLabels.app"),
    ({"podSelector": {"matchLabels": {"a b": "x"}}}, "every key must be a valid label key"),
    ({"podSelector": {"matchLabels": {"Example.com/app": "x"}}}, "every key must be a valid label key"),
    ({"podSelector": {"matchLabels": {"p" * 254 + "/app": "x"}}}, "every key must be a valid label key"),
    (
        {"podSelector": {"matchExpressions": [{"key": "a" * 64, "operator": "Exists"}]}},
        "spec.podSelector.matchExpressions[0].key",
    ),
    (
        {"podSelector": {"matchExpressions": [{"key": "app", "operator": "In"}]}},
        "values must be given with operator In or NotIn",
    ),
    (
        {"podSelector": {"matchExpressions": [{"key": "app", "operator": "Exists", "values": ["x"]}]}},
        "values must be given",
    ),
    (
        {"podSelector": {"matchExpressions": [{"key": "app", "operator": "In", "values": ["a,b"]}]}},
        "matchExpressions[0].values[0]",
    ),
    ({"analysis": {"stepSeconds": 1, "windowSeconds": 86_400}}, "Prometheus's limit of points per series"),
]


@pytest.mark.parametrize("change,message", REFUSED_BY_BOTH)
def test_crd_schema_refuses_selectors_and_windows_the_operator_refuses(installed, namespace, change, message):
    from gluon_operator.spec import parse_spec

    body = fleet.rollout("bad", namespace)
    body["spec"] = {**body["spec"], **change}
    assert parse_spec(body["spec"])[1], "parse_spec accepts what the CRD refuses"
    with pytest.raises(client.ApiException) as info:
        client.CustomObjectsApi(installed.cp.admin_client()).create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, body, dry_run="All"
        )
    assert info.value.status == 422 and message in json.loads(info.value.body)["message"], info.value.body


def test_status_reads_back_intact(installed, namespace):
    custom = client.CustomObjectsApi(installed.cp.admin_client())
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, fleet.rollout("kimi", namespace))
    status = {
        "phase": "Progressing",
        "counts": {"Promoted": 3},
        "nodes": {
            "n1": {
                "state": "Promoted",
                "numbers": {"effect": 1.9, "ci_low": 1.8, "nested": {"deep": [1, 2, {"x": None}]}},
            }
        },
    }
    operator_custom = client.CustomObjectsApi(api_for(installed.operator_kubeconfig()))
    operator_custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, "kimi", {"status": status}, _content_type=MERGE
    )
    read = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "kimi")["status"]
    assert read["nodes"]["n1"]["numbers"]["nested"] == {"deep": [1, 2, {}]} or read["nodes"]["n1"]["numbers"]["nested"][
        "deep"
    ][:2] == [1, 2]
    assert read["phase"] == "Progressing" and read["nodes"]["n1"]["numbers"]["effect"] == 1.9


def test_a_status_over_the_request_limit_is_refused(installed, namespace):
    """~750 bytes a node in status.nodes for 5000 nodes (the pre-1.0 design) is over etcd's request limit."""
    custom = client.CustomObjectsApi(installed.cp.admin_client())
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, fleet.rollout("big", namespace))
    record = {
        "state": "Promoted",
        "reason": "not worse than tolerance: " + "x" * 500,
        "since": time.time(),
        "numbers": {"effect": 1.9, "ci_low": 1.8, "ci_high": 2.0, "n_post": 10, "n_pre": 40, "p_worse": 0.5},
    }
    nodes = {f"gpu-{i:05d}": record for i in range(5000)}
    size = len(json.dumps(nodes))
    assert size > 3 * 1024 * 1024
    with pytest.raises(client.ApiException) as info:
        custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, PLURAL, "big", {"status": {"nodes": nodes}}, _content_type=MERGE
        )
    assert info.value.status in (413, 500, 422), info.value.status
    assert "too large" in info.value.body.lower() or info.value.status == 413, info.value.body[:300]


# ---------------------------------------------------------------- the webhook, called by the API server


def test_api_server_calls_the_webhook_and_fails_open(installed, namespace):
    custom = client.CustomObjectsApi(installed.cp.admin_client())
    core = client.CoreV1Api(installed.cp.admin_client())
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, fleet.rollout("kimi", namespace))
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "sglang-", "labels": dict(fleet.SERVING_POD_LABELS)},
        "spec": {
            "containers": [
                {
                    "name": "sglang",
                    "image": "lmsysorg/sglang:rocm",
                    "command": ["python3", "-m", "sglang.launch_server"],
                    "env": [{"name": contract.FLAG_ENV, "value": "0"}],
                }
            ]
        },
    }
    operator = start_operator(installed)
    try:

        def injected():
            created = core.create_namespaced_pod(namespace, pod)
            if contract.ANNOTATION_POD_INJECTED in (created.metadata.annotations or {}):
                return created
            core.delete_namespaced_pod(created.metadata.name, namespace, grace_period_seconds=0)
            return None

        created = wait_for(
            injected, timeout=60, interval=1.0, what=f"an injected pod (operator log:\n{operator.tail()})"
        )
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


# ---------------------------------------------------------------- what reaches the webhook (its selectors)


@contextmanager
def recording_webhook(installed):
    """At the chart's webhook URL, in place of the operator: an HTTPS server (the certificate the chart's
    caBundle trusts) that admits every review unchanged and records the name of each pod it was sent."""
    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's name)
            review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append(review["request"]["object"]["metadata"].get("name", ""))
            body = json.dumps(
                {
                    "apiVersion": "admission.k8s.io/v1",
                    "kind": "AdmissionReview",
                    "response": {"uid": review["request"]["uid"], "allowed": True},
                }
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", installed.webhook_port), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(installed.webhook_tls.cert), str(installed.webhook_tls.key))
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        server.shutdown()
        server.server_close()


def plain_pod(name: str, labels: dict[str, str], annotations: dict[str, str] | None = None) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels, "annotations": annotations or {}},
        "spec": {
            "containers": [
                {"name": "sglang", "image": "lmsysorg/sglang:rocm", "env": [{"name": contract.FLAG_ENV, "value": "0"}]}
            ],
            "terminationGracePeriodSeconds": 0,
        },
    }


@pytest.fixture
def opted_out(control_plane):
    """A namespace labelled out of the webhook (contract.LABEL_INJECT=false), deleted afterwards."""
    core = client.CoreV1Api(control_plane.admin_client())
    name = f"opted-out-{uuid.uuid4().hex[:5]}"
    core.create_namespace({"metadata": {"name": name, "labels": {contract.LABEL_INJECT: "false"}}})
    yield name
    core.delete_namespace(name, _preload_content=False)


def test_only_opted_in_pods_of_selected_namespaces_reach_the_webhook(installed, namespace, opted_out):
    """The API server itself applies the chart's default selectors: an opted-in pod of an ordinary namespace is
    sent to the webhook; a pod without the opt-in label, and opted-in pods in kube-system, the release's own
    namespace or an opted-out namespace, are never sent at all."""
    core = client.CoreV1Api(installed.cp.admin_client())
    tag = uuid.uuid4().hex[:5]
    sent_for = {f"in-{tag}": (namespace, fleet.SERVING_POD_LABELS)}
    never = {
        f"no-label-{tag}": (namespace, {"app": "sglang"}),
        f"kube-system-{tag}": ("kube-system", fleet.SERVING_POD_LABELS),
        f"own-{tag}": (installed.namespace, fleet.SERVING_POD_LABELS),
        f"opted-out-{tag}": (opted_out, fleet.SERVING_POD_LABELS),
    }
    with recording_webhook(installed) as seen:

        def create(name: str) -> None:
            where, labels = {**sent_for, **never}[name]
            core.create_namespaced_pod(where, plain_pod(name, dict(labels)), dry_run="All")

        create(f"in-{tag}")
        wait_for(
            lambda: f"in-{tag}" in seen or create(f"in-{tag}"),
            timeout=20,
            interval=0.5,
            what="the recording webhook called",
        )
        for name in never:
            create(name)
        create(f"in-{tag}")  # after the others: any call for them would have come before this one's
        wait_for(lambda: seen.count(f"in-{tag}") >= 2, timeout=10, what="the second call")
    assert {name for name in seen if name.endswith(tag)} == set(sent_for)


# ---------------------------------------------------------------- the operator's restarts (delete, evict)


def evict(core: client.CoreV1Api, name: str, namespace: str, dry_run: str | None = None):
    body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": namespace}}
    return core.create_namespaced_pod_eviction(name, namespace, body, **({"dry_run": dry_run} if dry_run else {}))


NOT_HERE = "the operator may delete or evict pods only in the namespaces its webhook selects"
NOT_THIS_POD = "the operator may delete only pods its webhook selects or injected"


def test_operator_restarts_only_pods_within_the_webhooks_reach(installed, namespace, opted_out):
    admin_core = client.CoreV1Api(installed.cp.admin_client())
    operator_core = client.CoreV1Api(api_for(installed.operator_kubeconfig()))
    tag = uuid.uuid4().hex[:5]
    pods = {
        "serving": (namespace, fleet.SERVING_POD_LABELS, None),
        "injected": (namespace, {"app": "sglang"}, {contract.ANNOTATION_POD_INJECTED: "kimi"}),
        "unrelated": (namespace, {"app": "x"}, None),
        "kube-system": ("kube-system", fleet.SERVING_POD_LABELS, None),
        "own": (installed.namespace, fleet.SERVING_POD_LABELS, None),
        "opted-out": (opted_out, fleet.SERVING_POD_LABELS, None),
    }
    for key, (where, labels, extra) in pods.items():
        admin_core.create_namespaced_pod(where, plain_pod(f"{key}-{tag}", dict(labels), extra))
    try:
        name = {key: f"{key}-{tag}" for key in pods}

        def refused_delete() -> str | None:  # a dry run: nothing is deleted while the policy is not yet in force
            try:
                operator_core.delete_namespaced_pod(name["unrelated"], namespace, dry_run="All")
            except client.ApiException as exc:
                return json.loads(exc.body)["message"] if exc.status in (403, 422) else None
            return None

        wait_for(refused_delete, timeout=20, interval=0.5, what="the restart policy in force")
        # a pod outside the webhook's selector: its delete is denied (admission sees the pod: oldObject)
        text = denial(lambda: operator_core.delete_namespaced_pod(name["unrelated"], namespace))
        assert NOT_THIS_POD in text, text
        # namespaces the webhook never selects: delete and eviction both denied (an eviction shows its namespace)
        for key in ("kube-system", "own", "opted-out"):
            where = pods[key][0]
            assert NOT_HERE in denial(lambda: operator_core.delete_namespaced_pod(name[key], where)), key
            assert NOT_HERE in denial(lambda: evict(operator_core, name[key], where)), key
        # a rollout's serving pods (opted in, or injected): allowed, by delete and by eviction (both restart strategies)
        operator_core.delete_namespaced_pod(name["injected"], namespace, dry_run="All")
        operator_core.delete_namespaced_pod(name["serving"], namespace, dry_run="All")
        evict(operator_core, name["serving"], namespace)
        wait_for(
            lambda: name["serving"] not in {p.metadata.name for p in admin_core.list_namespaced_pod(namespace).items},
            timeout=20,
            what="the evicted serving pod gone",
        )
        # The documented limit: an eviction's admission sees the Eviction, not the pod (eviction.go), so within a
        # selected namespace an unrelated pod's eviction is judged by its namespace alone (namespaceOptIn narrows it).
        evict(operator_core, name["unrelated"], namespace, dry_run="All")
        for key in pods:  # everything but the eviction above is still there
            if key != "serving":
                assert admin_core.read_namespaced_pod(name[key], pods[key][0]).metadata.deletion_timestamp is None, key
    finally:
        for key, (where, _, _) in pods.items():
            try:
                admin_core.delete_namespaced_pod(f"{key}-{tag}", where, grace_period_seconds=0)
            except client.ApiException as exc:
                if exc.status != 404:
                    raise
