"""The Helm chart: lint, render with several value sets, validate every object against Kubernetes 1.30 and
1.37 schemas, least-privilege RBAC against an explicit list, the values schema, the alerts (promtool),
the agent's admission policy (its CEL evaluated), and the post-delete cleanup against the API emulator."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import cel
import kubernetes_validate
import pytest
import yaml

from gluon_common import contract
from gluon_operator import proving

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts/gluon-rollout"
HELM = shutil.which("helm") or str(ROOT / ".tools/bin/helm")
NAMESPACE = "gluon-system"
# No image is published, so the chart has none by default: every render names both (docs/using/images.md).
IMAGES = [
    "--set",
    "operator.image.repository=registry.example/gluon-rollout-operator",
    "--set",
    "agent.image.repository=registry.example/gluon-rollout-agent",
]
VALUE_SETS = {
    "defaults": [],
    "cert-manager": ["--set", "certManager.enabled=true"],
    "monitoring-off": ["--set", "monitoring.enabled=false"],
    "monitors-each-off": [
        "--set",
        "monitoring.serviceMonitor.enabled=false",
        "--set",
        "monitoring.podMonitor.enabled=false",
        "--set",
        "monitoring.servingPodMonitor.enabled=false",
        "--set",
        "monitoring.prometheusRule.enabled=false",
        "--set",
        "monitoring.dashboard.enabled=false",
    ],
    "gpu-resource": ["--set", "agent.gpuAccess=resource", "--set", "agent.gpuResourceCount=8"],
    "gpu-unprivileged": ["--set", "agent.privileged=false"],
    "webhook-opt-in": ["--set", "webhook.namespaceOptIn=true", "--set", "webhook.podOptIn=false"],
    "selftest-in-serving-image": ["--set", "selfTest.inServingImage=true"],
    "selftest-gpu-resource": ["--set", "selfTest.inServingImage=true", "--set", "agent.gpuAccess=resource"],
}
# The agent's GPU access modes (README "What each GPU access mode grants"): the value set of each.
GPU_MODES = {
    "privileged": VALUE_SETS["defaults"],
    "unprivileged": VALUE_SETS["gpu-unprivileged"],
    "resource": VALUE_SETS["gpu-resource"],
}
# Kinds from CRDs that the Kubernetes schemas do not hold (Prometheus Operator, cert-manager, kopf).
CUSTOM = {("monitoring.coreos.com/v1", k) for k in ("ServiceMonitor", "PodMonitor", "PrometheusRule")} | {
    ("cert-manager.io/v1", "Issuer"),
    ("cert-manager.io/v1", "Certificate"),
    ("kopf.dev/v1", "ClusterKopfPeering"),
}

EXPECTED_RBAC = {
    "t-gluon-rollout-operator": [
        ("", "nodes", "get list watch patch"),
        ("", "pods", "get list watch patch delete"),
        ("", "pods/eviction", "create"),
        ("", "events", "create patch"),
        ("gluonrollout.io", "gluonrollouts", "get list watch patch"),
        ("gluonrollout.io", "gluonrollouts/status", "get patch"),
        ("kopf.dev", "clusterkopfpeerings", "get list watch patch"),
        ("apiextensions.k8s.io", "customresourcedefinitions", "get list watch"),
        ("", "namespaces", "get list watch"),
    ],
    "t-gluon-rollout-agent": [("", "nodes", "get list watch patch")],
    "t-gluon-rollout-cleanup": [("", "nodes", "list patch"), ("gluonrollout.io", "gluonrollouts", "list patch")],
}
# Namespaced: apiserver.check's dry-run PodTemplate (whether the API server accepts fileKeyRef), in the release's
# namespace alone.
EXPECTED_ROLES = {"t-gluon-rollout-operator-filekeyref-check": [("", "podtemplates", "create")]}


def helm(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([HELM, *args], capture_output=True, text=True, timeout=120)


def render(extra: list[str], show_crds: bool = False) -> list[dict]:
    done = helm(
        "template",
        "t",
        str(CHART),
        "--namespace",
        NAMESPACE,
        *(["--include-crds"] if show_crds else []),
        *IMAGES,
        *extra,
    )
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def by_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def test_lint_strict():
    done = helm("lint", "--strict", str(CHART), *IMAGES)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("name", VALUE_SETS)
@pytest.mark.parametrize("version", ["1.30", "1.37"])
def test_every_object_validates(name, version):
    docs = render(VALUE_SETS[name], show_crds=True)
    for doc in docs:
        if (doc["apiVersion"], doc["kind"]) in CUSTOM:
            assert doc["metadata"]["name"] and doc.get("spec") is not None or doc["kind"] == "ClusterKopfPeering"
            continue
        kubernetes_validate.validate(doc, version, strict=True)


def rules_by_role(docs: list[dict], kind: str) -> dict[str, list[tuple[str, str, str]]]:
    """Each Role or ClusterRole's rules as (apiGroup, resource, verbs) rows."""
    return {
        r["metadata"]["name"]: [
            (g, res, " ".join(rule["verbs"]))
            for rule in r["rules"]
            for g in rule["apiGroups"]
            for res in rule["resources"]
        ]
        for r in by_kind(docs, kind)
    }


def test_rbac_is_exactly_the_listed_rules():
    docs = render([])
    assert rules_by_role(docs, "ClusterRole") == EXPECTED_RBAC
    assert rules_by_role(docs, "Role") == EXPECTED_ROLES
    assert all(r["metadata"]["namespace"] == NAMESPACE for r in by_kind(docs, "Role"))
    assert all(b["roleRef"]["kind"] == "ClusterRole" for b in by_kind(docs, "ClusterRoleBinding"))
    assert [(b["roleRef"]["kind"], b["roleRef"]["name"]) for b in by_kind(docs, "RoleBinding")] == [
        ("Role", "t-gluon-rollout-operator-filekeyref-check")
    ]


@pytest.mark.parametrize(
    "bad,complaint",
    [
        (["--set", "operator.replicas=0"], "replicas"),
        (["--set", "agent.gpuAccess=gpu"], "gpuAccess"),
        (["--set", "surprise=1"], "surprise"),
        (["--set", "operator.metricsPort=notaport"], "metricsPort"),
        (["--set", "webhook.failurePolicy=Sometimes"], "failurePolicy"),
        (["--set", "monitoring.podMonitor.interval=often"], "interval"),
        (["--set", "agent.extraArgs={source=x}"], "extraArgs"),
    ],
)
def test_values_schema_rejects(bad, complaint):
    done = helm("template", "t", str(CHART), *IMAGES, *bad)
    assert done.returncode != 0 and complaint in done.stderr


def agent_pod_spec(values: list[str]) -> dict:
    return by_kind(render(values), "DaemonSet")[0]["spec"]["template"]["spec"]


LEAST = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}}


@pytest.mark.parametrize("mode", GPU_MODES)
def test_agent_gpu_access_modes(mode):
    pod = agent_pod_spec(GPU_MODES[mode])
    container = pod["containers"][0]
    # every mode: non-root, seccomp RuntimeDefault, the device nodes' groups, CPU and memory limits
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 65532
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["securityContext"]["supplementalGroups"] == [44, 109]
    assert {"cpu", "memory"} <= set(container["resources"]["limits"])
    assert pod["priorityClassName"] == "system-node-critical"
    assert pod["nodeSelector"] == {"feature.node.kubernetes.io/amd-gpu": "true"}
    assert {e["name"] for e in container["env"]} >= {"NODE_NAME", "HOST_IP"}
    assert container["ports"][0]["hostPort"] == contract.AGENT_PORT  # the preflight calls HOST_IP:9477
    host_paths = {v["name"]: (v["hostPath"]["path"], v["hostPath"]["type"]) for v in pod["volumes"] if "hostPath" in v}
    assert host_paths.pop("host-proc") == ("/proc", "Directory")  # the observer's alone (test_the_observer_...)
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    ours = {"/tmp", "/run/gluon-observer", "/var/run/secrets/kubernetes.io/serviceaccount"}
    if mode == "resource":
        assert container["securityContext"] == LEAST
        assert container["resources"]["limits"]["amd.com/gpu"] == 8
        assert host_paths == {} and mounts == ours
    else:
        # the GPUs alone, never /dev or /sys
        assert host_paths == {"kfd": ("/dev/kfd", "CharDevice"), "dri": ("/dev/dri", "Directory")}
        assert mounts == ours | {"/dev/kfd", "/dev/dri"}
        assert "amd.com/gpu" not in container["resources"]["limits"]
        if mode == "unprivileged":  # the knowing opt-in
            assert container["securityContext"] == LEAST
        else:  # the default: what containerd and CRI-O need before a container may open the hostPath /dev/kfd
            assert container["securityContext"] == {"privileged": True, "readOnlyRootFilesystem": True}


@pytest.mark.parametrize("mode", GPU_MODES)
def test_the_observer_is_the_only_root_and_has_only_sys_ptrace_and_the_host_proc_read_only(mode):
    """Reading another user's /proc/PID/environ needs CAP_SYS_PTRACE: one small container of the agent's pod has
    it, as root, and nothing else (no token, no port, no other capability); the agent keeps UID 65532."""
    pod = agent_pod_spec(GPU_MODES[mode])
    agent, observer = pod["containers"]
    assert observer["name"] == "observer" and observer["args"][0] == "observe"
    assert observer["securityContext"] == {
        "runAsUser": 0,
        "runAsGroup": 0,
        "runAsNonRoot": False,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"], "add": ["SYS_PTRACE"]},
    }
    assert {m["name"]: m.get("readOnly", False) for m in observer["volumeMounts"]} == {
        "host-proc": True,
        "observed": False,
    }
    assert "ports" not in observer and "env" not in observer
    # no API token for the observer: the pod automounts none, the agent container mounts its own projected one
    assert pod["automountServiceAccountToken"] is False
    token = next(v for v in pod["volumes"] if v["name"] == "api-token")["projected"]["sources"]
    assert token[0] == {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}}
    assert "--delivery-file=/run/gluon-observer/delivery.json" in agent["args"]
    assert {m["name"]: m.get("readOnly", False) for m in agent["volumeMounts"]}["observed"] is True
    assert pod["securityContext"]["runAsUser"] == 65532 and "hostPID" not in pod


def test_agent_is_privileged_by_default_in_host_devices_mode_only():
    """The default is what a standard runtime needs (README "Why privileged is the default"); the resource
    mode never runs privileged, whatever agent.privileged says, and the unprivileged mode is asked for."""
    assert yaml.safe_load((CHART / "values.yaml").read_text())["agent"]["privileged"] is True
    for values in (VALUE_SETS["gpu-resource"], VALUE_SETS["gpu-resource"] + ["--set", "agent.privileged=true"]):
        assert agent_pod_spec(values)["containers"][0]["securityContext"] == LEAST
    unconfined = agent_pod_spec(["--set", "agent.seccompProfile.type=Unconfined"])
    assert unconfined["securityContext"]["seccompProfile"] == {"type": "Unconfined"}


@pytest.mark.parametrize("port", [None, 9555])
def test_the_agent_port_reaches_the_agent_and_the_preflight(port):
    """issue 34: agent.port moved the agent but not the preflight, which asked HOST_IP:9477 regardless."""
    docs = render(["--set", f"agent.port={port}"] if port else [])
    want = port or contract.AGENT_PORT
    agent = by_kind(docs, "DaemonSet")[0]["spec"]["template"]["spec"]["containers"][0]
    assert f"--port={want}" in agent["args"] and agent["ports"][0]["hostPort"] == want
    operator = [d for d in by_kind(docs, "Deployment") if "operator" in d["metadata"]["name"]][0]
    env = {e["name"]: e.get("value") for e in operator["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["GLUON_AGENT_PORT"] == str(want)  # the operator injects it into every preflight (webhook.Injection)


def test_the_agents_extra_args_follow_the_charts_own():
    args = agent_pod_spec(["--set", "agent.extraArgs={--tick=0.5,--source-arg=/a b}"])["containers"][0]["args"]
    assert args[0] == "run" and args[-2:] == ["--tick=0.5", "--source-arg=/a b"]
    assert agent_pod_spec([])["containers"][0]["args"][-1].startswith("--observe-interval=")


def test_the_cleanup_job_lands_where_the_operator_may():
    values = ["--set", "operator.nodeSelector.pool=system", "--set", "operator.tolerations[0].operator=Exists"]
    job = by_kind(render(values), "Job")[0]["spec"]["template"]["spec"]
    assert job["nodeSelector"] == {"pool": "system"} and job["tolerations"] == [{"operator": "Exists"}]
    assert "nodeSelector" not in by_kind(render([]), "Job")[0]["spec"]["template"]["spec"]


def test_operator_is_hardened_and_highly_available():
    docs = render([])
    spec = by_kind(docs, "Deployment")[0]["spec"]
    pod = spec["template"]["spec"]
    container = pod["containers"][0]
    assert spec["replicas"] == 2 and "--peering" in container["args"]
    assert (
        pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    )
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz" and "readinessProbe" in container
    assert by_kind(docs, "PodDisruptionBudget")[0]["spec"]["maxUnavailable"] == 1


def test_webhook_configuration():
    docs = render([])
    hook = by_kind(docs, "MutatingWebhookConfiguration")[0]["webhooks"][0]
    assert hook["failurePolicy"] == "Ignore" and hook["clientConfig"]["service"]["path"] == "/inject"  # kopf handler id
    assert hook["rules"][0]["operations"] == ["CREATE"] and hook["clientConfig"]["caBundle"]
    secret = [s for s in by_kind(docs, "Secret") if s["type"] == "kubernetes.io/tls"][0]
    assert secret["data"]["ca.crt"] == hook["clientConfig"]["caBundle"]
    managed = render(VALUE_SETS["cert-manager"])
    annotated = by_kind(managed, "MutatingWebhookConfiguration")[0]
    assert (
        annotated["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == f"{NAMESPACE}/t-gluon-rollout-webhook"
    )
    assert by_kind(managed, "Certificate") and not [
        s for s in by_kind(managed, "Secret") if s.get("type") == "kubernetes.io/tls"
    ]


def test_helm_template_renders_a_new_ca_each_time_unless_cert_manager_issues_it():
    """docs/operating/upgrades.md: lookup is empty under `helm template`, so each render of the self-made
    certificate differs (GitOps tools that render would show drift); with cert-manager two renders are equal."""

    def secrets(values: list[str]) -> list:
        return [d.get("data") for d in by_kind(render(values), "Secret")]

    assert secrets([]) != secrets([])
    managed = VALUE_SETS["cert-manager"]
    assert render(managed) == render(managed) and secrets(managed) == []
    done = helm("template", "t", str(CHART), *IMAGES, "--set", "webhook.certificate.renewBeforeDays=365")
    assert done.returncode != 0 and "renewBeforeDays (365) must be less than" in done.stderr
    secret = by_kind(render([]), "Secret")[0]
    assert secret["metadata"]["annotations"]["gluon-rollout/cert-not-after"]


def webhook_of(values: list[str]) -> dict:
    return by_kind(render(values), "MutatingWebhookConfiguration")[0]["webhooks"][0]


ALWAYS_OUT = [
    {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": [NAMESPACE, "kube-system"]},
    {"key": contract.LABEL_INJECT, "operator": "NotIn", "values": ["false"]},
]


def test_webhook_selectors_default_to_opted_in_pods():
    hook = webhook_of([])
    assert hook["objectSelector"] == {"matchLabels": {contract.LABEL_INJECT: "true"}}
    assert hook["namespaceSelector"] == {"matchExpressions": ALWAYS_OUT}


def test_webhook_selectors_keep_the_exclusions_whatever_the_user_sets():
    hook = webhook_of(
        [
            "--set",
            "webhook.namespaceSelector.matchLabels.team=ml",
            "--set",
            "webhook.namespaceSelector.matchExpressions[0].key=tier",
            "--set",
            "webhook.namespaceSelector.matchExpressions[0].operator=Exists",
            "--set",
            "webhook.objectSelector.matchLabels.app=sglang",
        ]
    )
    assert hook["namespaceSelector"] == {
        "matchLabels": {"team": "ml"},
        "matchExpressions": ALWAYS_OUT + [{"key": "tier", "operator": "Exists"}],
    }
    assert hook["objectSelector"] == {"matchLabels": {"app": "sglang", contract.LABEL_INJECT: "true"}}
    opted = webhook_of(VALUE_SETS["webhook-opt-in"])
    assert opted["namespaceSelector"] == {
        "matchLabels": {contract.LABEL_INJECT: "true"},
        "matchExpressions": ALWAYS_OUT,
    }
    assert "objectSelector" not in opted  # podOptIn false and no labels: every pod of the selected namespaces


def test_monitoring_toggles_and_release_label():
    docs = render(["--set", "monitoring.release=prom"])
    monitors = by_kind(docs, "ServiceMonitor") + by_kind(docs, "PodMonitor") + by_kind(docs, "PrometheusRule")
    assert len(monitors) == 4 and all(m["metadata"]["labels"]["release"] == "prom" for m in monitors)
    serving = [m for m in by_kind(docs, "PodMonitor") if m["metadata"]["name"].endswith("-serving")][0]
    relabel = serving["spec"]["podMetricsEndpoints"][0]["relabelings"]
    assert {"sourceLabels": ["__meta_kubernetes_pod_label_gluonrollout_io_flag"], "targetLabel": "flag"} in relabel
    dashboard = [c for c in by_kind(docs, "ConfigMap") if c["metadata"]["labels"].get("grafana_dashboard") == "1"][0]
    assert json.loads(dashboard["data"]["gluon-rollout.json"])["uid"] == "gluon-rollout"
    off = render(VALUE_SETS["monitors-each-off"])
    assert not any(by_kind(off, k) for k in ("ServiceMonitor", "PodMonitor", "PrometheusRule")) and not by_kind(
        off, "ConfigMap"
    )


def prometheus_operator_objects(docs: list[dict]) -> list[str]:
    return [
        f"{d['kind']}/{d['metadata']['name']}" for d in docs if d["apiVersion"].startswith("monitoring.coreos.com/")
    ]


def test_monitoring_enabled_false_turns_every_prometheus_operator_object_off():
    """One switch, whatever the per-object switches say; the dashboard (a ConfigMap, no CRD) keeps its own."""
    each_on = [f"monitoring.{k}.enabled=true" for k in ("serviceMonitor", "podMonitor", "servingPodMonitor")]
    on = render([])
    assert len(prometheus_operator_objects(on)) == 4
    off = render(["--set", "monitoring.enabled=false", "--set", ",".join(each_on)])
    assert prometheus_operator_objects(off) == []
    assert [c for c in by_kind(off, "ConfigMap") if c["metadata"]["name"] == "t-gluon-rollout-dashboard"]
    # under the switch, one object at a time
    serving_and_rules = render(["--set", "monitoring.serviceMonitor.enabled=false,monitoring.podMonitor.enabled=false"])
    assert prometheus_operator_objects(serving_and_rules) == [
        "PodMonitor/t-gluon-rollout-serving",
        "PrometheusRule/t-gluon-rollout",
    ]


OPERATOR_MISSING = (
    "operator.image.repository is not set: build the operator image (docker build --target operator -t "
    "<registry>/gluon-rollout-operator:<tag> .), push it and set operator.image.repository and "
    "operator.image.tag (docs/using/images.md)."
)
AGENT_MISSING = (
    "agent.image.repository is not set: build the agent FROM your serving image (docker build --target agent "
    "--build-arg BASE_IMAGE=<your SGLang image> -t <registry>/gluon-rollout-agent:<tag> .), push it and set "
    "agent.image.repository and agent.image.tag (docs/using/images.md)."
)


@pytest.mark.parametrize(
    "given,expected",
    [
        ([], [OPERATOR_MISSING, AGENT_MISSING]),
        (IMAGES[:2], [AGENT_MISSING]),
        (IMAGES[2:], [OPERATOR_MISSING]),
        (IMAGES[2:] + ["--set", "operator.image.repository="], [OPERATOR_MISSING]),
    ],
)
def test_no_default_image_a_render_without_one_says_how_to_build_it(given, expected):
    """No public image exists, so none is a default: each missing one is named with its Dockerfile target."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["operator"]["image"]["repository"] == values["agent"]["image"]["repository"] == ""
    done = helm("template", "t", str(CHART), *given)
    assert done.returncode != 0
    message = done.stderr.split("): ", 1)[1].splitlines()[0]  # the one line after Helm's "at (file:line)"
    assert message == " ".join(expected)


def test_the_images_reach_the_operator_the_agents_and_the_cleanup_job():
    docs = render(["--set", "agent.image.tag=0.1.0-sglang-v0.5.19"])
    operator = [d for d in by_kind(docs, "Deployment") if "operator" in d["metadata"]["name"]][0]
    container = operator["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "registry.example/gluon-rollout-operator:0.1.0"  # the appVersion by default
    agent_image = "registry.example/gluon-rollout-agent:0.1.0-sglang-v0.5.19"
    assert {"name": "GLUON_AGENT_IMAGE", "value": agent_image} in container["env"]  # the webhook's install step
    assert by_kind(docs, "DaemonSet")[0]["spec"]["template"]["spec"]["containers"][0]["image"] == agent_image
    job = by_kind(docs, "Job")[0]["spec"]["template"]["spec"]["containers"][0]
    assert job["image"] == "registry.example/gluon-rollout-operator:0.1.0"


def test_offline_renders_skip_the_cluster_checks():
    """`helm template` cannot look up the namespace nor see the cluster's CRDs: the Pod Security and
    Prometheus Operator checks pass silently (README "What the install checks"); on the real API server
    they refuse (tests/test_install_checks_cluster.py)."""
    done = helm("template", "t", str(CHART), "--namespace", "baseline-ns", *IMAGES)
    assert done.returncode == 0, done.stderr
    assert len(prometheus_operator_objects([d for d in yaml.safe_load_all(done.stdout) if d])) == 4


def test_promtool_checks_and_unit_tests_the_alerts():
    check = subprocess.run(
        ["promtool", "check", "rules", str(CHART / "files/alerts.yaml")], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr
    unit = subprocess.run(
        ["promtool", "test", "rules", "alerts_test.yaml"], cwd=ROOT / "tests/promtool", capture_output=True, text=True
    )
    assert unit.returncode == 0, unit.stdout + unit.stderr
    tested = set(re.findall(r"alertname: (\w+)", (ROOT / "tests/promtool/alerts_test.yaml").read_text()))
    defined = {
        r["alert"] for g in yaml.safe_load((CHART / "files/alerts.yaml").read_text())["groups"] for r in g["rules"]
    }
    assert tested == defined  # a case per alert


def chart_metric_names() -> set[str]:
    text = (CHART / "files/alerts.yaml").read_text() + (CHART / "files/dashboard.json").read_text()
    return set(re.findall(r"\bgluon_(?:agent|rollout)_[a-z_]+", text))


def test_chart_metric_names_come_from_the_contract():
    known = {v for k, v in contract.as_dict().items() if k.startswith("M_")}
    suffixes = ("_total", "_info", "_bucket", "_sum", "_count")
    for name in chart_metric_names():
        base = next((name[: -len(s)] for s in suffixes if name.endswith(s) and name[: -len(s)] in known), name)
        assert base in known, f"{name} is not a contract metric"


def test_readme_lists_every_value():
    def keys(tree, prefix=""):
        for key, value in tree.items():
            path = f"{prefix}{key}"
            yield path
            if (
                isinstance(value, dict)
                and value
                and key not in ("resources", "nodeSelector", "selector", "namespaceSelector", "requests", "limits")
            ):
                yield from keys(value, path + ".")

    readme = (CHART / "README.md").read_text()
    missing = [k for k in keys(yaml.safe_load((CHART / "values.yaml").read_text())) if f"`{k}`" not in readme]
    assert missing == []


# ---------------------------------------------------------------- the agent's admission policy, evaluated


def policy(suffix: str = "-agent-own-node", values: list[str] | None = None) -> dict:
    return [
        d
        for d in render(values or [])
        if d["kind"] == "ValidatingAdmissionPolicy" and d["metadata"]["name"].endswith(suffix)
    ][0]["spec"]


def admit(
    request: dict, old: dict | None, new: dict | None, spec: dict | None = None, namespace: dict | None = None
) -> list[str]:
    """Evaluate the policy's CEL as the API server would; returns the messages of failed validations."""
    spec = spec or policy()
    context = {"request": request, "object": new, "oldObject": old, "namespaceObject": namespace}
    if not all(cel.evaluate(m["expression"], context) for m in spec["matchConditions"]):
        return []
    variables = {}
    for v in spec.get("variables") or []:
        variables[v["name"]] = cel.evaluate(v["expression"], {**context, "variables": variables})
    return [
        v["message"]
        for v in spec["validations"]
        if not cel.evaluate(v["expression"], {**context, "variables": variables})
    ]


AGENT_USER = f"system:serviceaccount:{NAMESPACE}:t-gluon-rollout-agent"


def node(name: str, labels: dict, annotations: dict | None = None) -> dict:
    return {
        "metadata": {"name": name, "labels": labels, "annotations": annotations or {}},
        "spec": {"podCIDR": "10.0.0.0/24"},
    }


def request(user=AGENT_USER, node_name="n1"):
    return {
        "operation": "UPDATE",
        "userInfo": {"username": user, "extra": {"authentication.kubernetes.io/node-name": [node_name]}},
    }


def test_policy_lets_the_agent_write_its_own_keys_on_its_own_node():
    old = node("n1", {"kubernetes.io/hostname": "n1", contract.LABEL_ENABLED: "true"})
    new = node(
        "n1",
        {"kubernetes.io/hostname": "n1", contract.LABEL_ENABLED: "true", contract.LABEL_SELFTEST: "pass"},
        {contract.ANNOTATION_REPORT: "{}"},
    )
    assert admit(request(), old, new) == []


@pytest.mark.parametrize(
    "case,expected",
    [
        ("other node", "the agent may change only its own node"),
        ("foreign label", f"the agent may change only {contract.PREFIX} labels and annotations"),
        (
            "operator key",
            "the agent may not change the operator's keys (enabled, state, rollback, record, serving-config, proofs)",
        ),
        ("spec", "the agent may not change a node's spec"),
    ],
)
def test_policy_denies(case, expected):
    old = node("n1", {"kubernetes.io/hostname": "n1", contract.LABEL_ENABLED: "false"})
    new = json.loads(json.dumps(old))
    req = request()
    if case == "other node":
        req = request(node_name="n2")
    elif case == "foreign label":
        new["metadata"]["labels"]["kubernetes.io/hostname"] = "evil"
    elif case == "operator key":
        new["metadata"]["labels"][contract.LABEL_ENABLED] = "true"
    else:
        new["spec"]["unschedulable"] = True
    assert expected in admit(req, old, new)


def test_policy_ignores_everyone_else():
    old, new = node("n1", {"a": "1"}), node("n1", {"a": "2"})
    assert admit(request(user="system:serviceaccount:gluon-system:t-gluon-rollout-operator"), old, new) == []


# ---------------------------------------------------------------- the operator's restart policy, evaluated

OPERATOR_USER = f"system:serviceaccount:{NAMESPACE}:t-gluon-rollout-operator"
RESTARTS = "-operator-restarts"


def namespace_object(name: str, labels: dict | None = None) -> dict:
    return {"metadata": {"name": name, "labels": {"kubernetes.io/metadata.name": name, **(labels or {})}}}


def serving_pod(labels: dict, annotations: dict | None = None) -> dict:
    return {
        "metadata": {"name": "p", "namespace": "inference", "labels": labels, "annotations": annotations or {}},
        "spec": {},
    }


def restart(spec: dict, how: str, namespace: dict, pod: dict | None = None, user: str = OPERATOR_USER) -> list[str]:
    if how == "evict":  # admission sees the Eviction, never the pod (oldObject null)
        request = {
            "operation": "CREATE",
            "subResource": "eviction",
            "namespace": namespace["metadata"]["name"],
            "userInfo": {"username": user},
        }
        return admit(request, None, {"metadata": {"name": "p"}}, spec, namespace)
    request = {
        "operation": "DELETE",
        "namespace": namespace["metadata"]["name"],
        "userInfo": {"username": user},
    }  # no subResource key
    return admit(request, pod, None, spec, namespace)


OPTED_IN = {"app": "sglang", contract.LABEL_INJECT: "true"}
NOT_HERE = "the operator may delete or evict pods only in the namespaces its webhook selects"
NOT_THIS_POD = "the operator may delete only pods its webhook selects or injected"


@pytest.mark.parametrize("how", ["delete", "evict"])
@pytest.mark.parametrize("where", ["kube-system", NAMESPACE, "opted-out"])
def test_restart_policy_keeps_the_operator_out_of_excluded_namespaces(how, where):
    spec = policy(RESTARTS)
    namespace = namespace_object(where, {contract.LABEL_INJECT: "false"} if where == "opted-out" else {})
    assert NOT_HERE in restart(spec, how, namespace, serving_pod(OPTED_IN))


def test_restart_policy_by_default():
    spec = policy(RESTARTS)
    inference = namespace_object("inference")
    assert restart(spec, "delete", inference, serving_pod(OPTED_IN)) == []
    assert restart(spec, "evict", inference) == []
    assert (
        restart(spec, "delete", inference, serving_pod({"app": "sglang"}, {contract.ANNOTATION_POD_INJECTED: "kimi"}))
        == []
    )
    assert restart(spec, "delete", inference, serving_pod({"app": "sglang"})) == [NOT_THIS_POD]
    assert restart(spec, "delete", inference, serving_pod({"app": "sglang", contract.LABEL_INJECT: "false"})) == [
        NOT_THIS_POD
    ]
    assert (
        restart(spec, "delete", namespace_object("kube-system"), serving_pod({}), user="system:admin") == []
    )  # others: untouched


def test_restart_policy_follows_the_webhook_selectors():
    spec = policy(
        RESTARTS,
        VALUE_SETS["webhook-opt-in"]
        + [
            "--set",
            "webhook.objectSelector.matchExpressions[0].key=tier",
            "--set",
            "webhook.objectSelector.matchExpressions[0].operator=In",
            "--set",
            "webhook.objectSelector.matchExpressions[0].values[0]=serving",
        ],
    )
    opted = namespace_object("inference", {contract.LABEL_INJECT: "true"})
    assert restart(spec, "evict", namespace_object("inference")) == [NOT_HERE]  # namespaceOptIn: unlabelled is out
    assert restart(spec, "evict", opted) == []
    assert restart(spec, "delete", opted, serving_pod({"tier": "serving"})) == []
    assert restart(spec, "delete", opted, serving_pod({"tier": "batch", contract.LABEL_INJECT: "true"})) == [
        NOT_THIS_POD
    ]


# ---------------------------------------------------------------- the post-delete hook's command


# ---------------------------------------------------------------- self-tests in the serving images

IN_SERVING_IMAGE = VALUE_SETS["selftest-in-serving-image"]
SELFTESTS = "-operator-selftests"


def selftest_settings(values: list[str]) -> tuple[proving.PodSettings, proving.Limits]:
    """The operator's settings as the chart renders them into its env."""
    deployment = [d for d in by_kind(render(values), "Deployment") if d["metadata"]["name"].endswith("-operator")][0]
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    settings = proving.settings_from_env(env)
    assert settings is not None
    return settings


def test_selftest_pods_are_off_by_default_and_add_only_their_rules_when_on():
    assert (
        proving.settings_from_env(
            {
                e["name"]: e.get("value")
                for e in by_kind(render([]), "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["env"]
            }
        )
        is None
    )
    docs = render(IN_SERVING_IMAGE)
    expected = {
        **EXPECTED_RBAC,
        "t-gluon-rollout-agent": [*EXPECTED_RBAC["t-gluon-rollout-agent"], ("", "pods", "get")],
    }
    assert rules_by_role(docs, "ClusterRole") == expected
    assert rules_by_role(docs, "Role") == {
        **EXPECTED_ROLES,
        "t-gluon-rollout-operator-selftests": [("", "pods", "create")],
    }
    (priority,) = by_kind(docs, "PriorityClass")
    assert (priority["value"], priority["preemptionPolicy"]) == (-10, "Never")
    (account,) = [a for a in by_kind(docs, "ServiceAccount") if a["metadata"]["name"] == "t-gluon-rollout-selftest"]
    assert account["automountServiceAccountToken"] is False
    agent = by_kind(docs, "DaemonSet")[0]["spec"]["template"]["spec"]["containers"][0]
    assert "--image-proofs" in agent["args"]


@pytest.mark.parametrize("values", ["selftest-in-serving-image", "selftest-gpu-resource"])
def test_selftest_pods_get_the_agents_gpu_access_and_the_policy_admits_them(values):
    settings, limits = selftest_settings(VALUE_SETS[values])
    demand = proving.Demand("gpu-7", proving.Stack("sha256:" + "a" * 64, "r/sglang@sha256:" + "a" * 64, "c", "{}"))
    pod = proving.selftest_pod(demand, settings)
    kubernetes_validate.validate(pod, "1.30", strict=True)
    container = pod["spec"]["containers"][0]
    if values == "selftest-gpu-resource":
        assert container["resources"]["limits"]["amd.com/gpu"] == 1 and "privileged" not in container["securityContext"]
        assert [v["name"] for v in pod["spec"]["volumes"]] == ["tmp", "gluon-selftest"]
    else:
        assert container["securityContext"]["privileged"] is True
        assert {"name": "kfd", "mountPath": "/dev/kfd"} in container["volumeMounts"]
    assert pod["spec"]["tolerations"] == [{"key": "amd.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert limits.run_seconds > settings.deadline_seconds + 120  # the kubelet's deadline ends it first
    create = {"operation": "CREATE", "namespace": NAMESPACE, "userInfo": {"username": OPERATOR_USER}}
    spec = policy(SELFTESTS, VALUE_SETS[values])
    assert admit(create, None, pod, spec) == []
    assert admit({**create, "userInfo": {"username": "system:admin"}}, None, {"metadata": {}, "spec": {}}, spec) == []


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda p: p["metadata"]["labels"].clear(), "may create only self-test pods"),
        (lambda p: p["spec"].update(automountServiceAccountToken=True), "without an API token"),
        (lambda p: p["spec"].update(serviceAccountName="default"), "without an API token"),
        (lambda p: p["spec"].update(priorityClassName="system-node-critical"), "priority class"),
        (lambda p: p["spec"].update(hostPID=True), "shares no host namespace"),
        (lambda p: p["spec"]["volumes"].append({"name": "root", "hostPath": {"path": "/"}}), "mounts only emptyDirs"),
        (lambda p: p["spec"]["initContainers"][0].update(image="evil/image"), "install step in the agent image"),
        (lambda p: p["spec"]["containers"].append({"name": "x", "image": "y"}), "one self-test container"),
    ],
)
def test_selftest_policy_denies_any_other_pod_from_the_operator(change, message):
    settings, _ = selftest_settings(IN_SERVING_IMAGE)
    demand = proving.Demand("n1", proving.Stack("sha256:" + "a" * 64, "r/s@sha256:" + "a" * 64, "c", "{}"))
    pod = proving.selftest_pod(demand, settings)
    change(pod)
    create = {"operation": "CREATE", "namespace": NAMESPACE, "userInfo": {"username": OPERATOR_USER}}
    assert any(message in m for m in admit(create, None, pod, policy(SELFTESTS, IN_SERVING_IMAGE)))


def test_the_operator_may_delete_its_own_selftest_pods_in_its_namespace_and_nothing_else_there():
    spec = policy(RESTARTS, IN_SERVING_IMAGE)
    own = namespace_object(NAMESPACE)
    selftest = serving_pod({contract.LABEL_SELFTEST_POD: "true"})
    assert restart(spec, "delete", own, selftest) == []
    assert NOT_HERE in restart(spec, "delete", own, serving_pod({"app": "agent"}))
    assert NOT_HERE in restart(spec, "evict", own)


def test_the_operator_may_write_the_proofs_on_nodes():
    spec = policy("-operator-reach", IN_SERVING_IMAGE)
    old = node("n1", {}, {})
    new = node("n1", {}, {contract.ANNOTATION_PROOFS: "{}"})
    update = {"operation": "UPDATE", "resource": {"resource": "nodes"}, "userInfo": {"username": OPERATOR_USER}}
    assert admit(update, old, new, spec) == []
