"""Which Pod Security level each of the agent's GPU access modes passes, decided by the real API server's
PodSecurity admission (localcluster's kube-apiserver): the DaemonSet's pod, as `helm template` renders it for
each mode, created (dry run) in namespaces enforcing baseline, restricted and privileged. The README's table
("What each GPU access mode grants") states the same verdicts."""

from __future__ import annotations

import json
import re
import uuid

import pytest
from kubernetes import client

from tests.helpers import wait_for
from tests.test_chart import GPU_MODES, by_kind, render

LEVELS = ("privileged", "baseline", "restricted")
# The PodSecurity checks each mode fails, by level (the names the API server gives them in its denial).
# Every mode fails baseline on the hostPort the preflight needs, and on the observer container: the host's
# /proc (a hostPath) and CAP_SYS_PTRACE (a non-default capability), as root; the default adds "privileged".
OBSERVER = {
    "baseline": {"hostPath volumes", "non-default capabilities"},
    "restricted": {"restricted volume types", "runAsNonRoot != true", "runAsUser=0", "unrestricted capabilities"},
}
VIOLATIONS = {
    "unprivileged": {
        "baseline": {"hostPort", "hostPath volumes"} | OBSERVER["baseline"],
        "restricted": {"hostPort", "restricted volume types"} | OBSERVER["restricted"],
    },
    "privileged": {
        "baseline": {"privileged", "hostPort", "hostPath volumes"} | OBSERVER["baseline"],
        "restricted": {
            "privileged",
            "hostPort",
            "restricted volume types",
            "allowPrivilegeEscalation != false",
            "unrestricted capabilities",
        }
        | OBSERVER["restricted"],
    },
    "resource": {"baseline": {"hostPort"} | OBSERVER["baseline"], "restricted": {"hostPort"} | OBSERVER["restricted"]},
}


@pytest.fixture(scope="module")
def levels(control_plane):
    core = client.CoreV1Api(control_plane.admin_client())
    names = {}
    for level in LEVELS:
        name = f"psa-{level}-{uuid.uuid4().hex[:5]}"
        core.create_namespace(
            {
                "metadata": {
                    "name": name,
                    "labels": {
                        "pod-security.kubernetes.io/enforce": level,
                        "pod-security.kubernetes.io/enforce-version": "latest",
                    },
                }
            }
        )
        names[level] = name
    for name in names.values():  # the controller-manager makes it; a pod's admission looks it up first
        wait_for(
            lambda name=name: [
                a for a in core.list_namespaced_service_account(name).items if a.metadata.name == "default"
            ],
            timeout=30,
            what=f"the default service account of {name}",
        )
    yield names
    for name in names.values():
        core.delete_namespace(name, _preload_content=False)


def agent_pod(mode: str) -> dict:
    template = by_kind(render(GPU_MODES[mode]), "DaemonSet")[0]["spec"]["template"]
    spec = {**template["spec"], "nodeName": "psa-no-such-node"}
    spec.pop("serviceAccountName")  # the chart's account lives in the release namespace; this is about the pod
    for container in spec["containers"]:  # quantities as strings, as the client's model wants them
        container["resources"] = {k: {r: str(q) for r, q in v.items()} for k, v in container["resources"].items()}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "agent-", "labels": template["metadata"]["labels"]},
        "spec": spec,
    }


def verdict(core: client.CoreV1Api, namespace: str, pod: dict) -> set[str]:
    """The PodSecurity checks the pod fails in `namespace` (empty: admitted)."""
    try:
        core.create_namespaced_pod(namespace, pod, dry_run="All")
        return set()
    except client.ApiException as exc:
        message = json.loads(exc.body)["message"]
        assert exc.status == 403 and "violates PodSecurity" in message, message
        listed = message.split('": ', 1)[1]
        return {m.strip() for m in re.findall(r"(?:^|\), )([^(]+?) \(", listed)}


@pytest.mark.parametrize("mode", GPU_MODES)
def test_each_mode_passes_the_documented_pod_security_level(control_plane, levels, mode):
    core = client.CoreV1Api(control_plane.admin_client())
    pod = agent_pod(mode)
    got = {level: verdict(core, levels[level], pod) for level in LEVELS}
    assert got == {"privileged": set(), **VIOLATIONS[mode]}
