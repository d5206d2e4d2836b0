"""The pod mutation the admission webhook applies (pure; the kopf handler is in handlers.py).

For a pod matching a GluonRollout: an emptyDir, an init container in the agent image that installs the
stdlib-only preflight and writes the safe default flag ('0'), an init container in the serving
container's own image that decides the flag, and SGLANG_AITER_MLA_GLUON in every app container, read
from the flag file: `fileKeyRef` (Kubernetes >= 1.35) or, in `shell` mode, a shell wrapper that sources
the file before exec-ing the original command. Idempotent: mutating a mutated pod changes nothing.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Literal, Mapping

from gluon_agent import contract

VOLUME = "gluon-flag"
MOUNT = "/gluon"
INSTALL_CONTAINER = "gluon-install"
PREFLIGHT_CONTAINER = "gluon-preflight"
FLAG_FILE = "flag.env"
SMALL = {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"cpu": "1", "memory": "512Mi"}}


@dataclass(frozen=True)
class Injection:
    agent_image: str
    mode: Literal["fileKeyRef", "shell"] = "fileKeyRef"
    image_pull_policy: str = "IfNotPresent"


class NotInjectable(ValueError):
    """The pod cannot carry the flag safely (it keeps the value its template has)."""


def strip(pod_spec: dict[str, Any]) -> dict[str, Any]:
    """The spec without anything an earlier injection added (so re-injection is a no-op)."""
    spec = copy.deepcopy(pod_spec)
    spec["volumes"] = [v for v in spec.get("volumes", []) if v.get("name") != VOLUME]
    spec["initContainers"] = [c for c in spec.get("initContainers", []) if c.get("name") not in (INSTALL_CONTAINER, PREFLIGHT_CONTAINER)]
    for container in spec.get("containers", []):
        container["env"] = [e for e in container.get("env", []) if e.get("name") != contract.FLAG_ENV]
        container["volumeMounts"] = [m for m in container.get("volumeMounts", []) if m.get("name") != VOLUME]
        wrapped = container.pop("command", None)
        if wrapped and wrapped[:2] == ["/bin/sh", "-c"] and len(wrapped) > 3 and wrapped[2] == SHELL_WRAPPER:
            container["command"] = wrapped[4:]  # the original command after "$0" placeholder
        elif wrapped is not None:
            container["command"] = wrapped
    return spec


SHELL_WRAPPER = f'. {MOUNT}/{FLAG_FILE} && export {contract.FLAG_ENV} && exec "$@"'


def downward(name: str, field: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": field}}}


def init_containers(serving_image: str, config: Injection) -> list[dict[str, Any]]:
    security = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    mount = [{"name": VOLUME, "mountPath": MOUNT}]
    return [
        {
            "name": INSTALL_CONTAINER,
            "image": config.agent_image,
            "imagePullPolicy": config.image_pull_policy,
            "command": ["gluon-agent", "preflight", "--install", MOUNT],
            "volumeMounts": mount,
            "resources": SMALL,
            "securityContext": security,
        },
        {
            "name": PREFLIGHT_CONTAINER,
            "image": serving_image,
            "command": ["/bin/sh", "-c", f"PYTHONPATH={MOUNT}/lib python3 -m gluon_agent.preflight --flag-dir {MOUNT}; exit 0"],
            "env": [downward("HOST_IP", "status.hostIP"), downward("NODE_NAME", "spec.nodeName")],
            "volumeMounts": mount,
            "resources": SMALL,
            "terminationMessagePolicy": "File",
            "securityContext": security,
        },
    ]


def flag_env(config: Injection) -> dict[str, Any]:
    if config.mode == "fileKeyRef":
        ref = {"volumeName": VOLUME, "path": FLAG_FILE, "key": contract.FLAG_ENV, "optional": False}
        return {"name": contract.FLAG_ENV, "valueFrom": {"fileKeyRef": ref}}
    return {"name": contract.FLAG_ENV, "value": "0"}  # overwritten by the wrapper's `. flag.env`


def wire_container(container: dict[str, Any], config: Injection) -> None:
    container["env"] = container.get("env", []) + [flag_env(config)]
    if config.mode == "shell":
        command = container.get("command")
        if not command:
            raise NotInjectable(f"container {container.get('name')!r} has no command: shell mode needs it to wrap (use fileKeyRef)")
        container["command"] = ["/bin/sh", "-c", SHELL_WRAPPER, "sh"] + command
        container["volumeMounts"] = container.get("volumeMounts", []) + [{"name": VOLUME, "mountPath": MOUNT, "readOnly": True}]


def tidy(spec: dict[str, Any]) -> dict[str, Any]:
    """Drop the empty lists strip() may have left, so an untouched pod compares equal."""
    for key in ("volumes", "initContainers"):
        if not spec.get(key):
            spec.pop(key, None)
    for container in spec.get("containers", []):
        for key in ("env", "volumeMounts"):
            if not container.get(key):
                container.pop(key, None)
    return spec


def mutated_spec(pod: Mapping[str, Any], config: Injection) -> dict[str, Any]:
    spec = strip(pod.get("spec", {}))
    containers = spec.get("containers") or []
    if not containers:
        raise NotInjectable("the pod has no containers")
    spec["volumes"] = spec.get("volumes", []) + [{"name": VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}]
    spec["initContainers"] = spec.get("initContainers", []) + init_containers(containers[0]["image"], config)
    for container in containers:
        wire_container(container, config)
    return tidy(spec)


def mutation(pod: Mapping[str, Any], rollout: str, config: Injection) -> dict[str, Any] | None:
    """Top-level fields to replace on the pod, or None when it already carries exactly this injection."""
    spec = mutated_spec(pod, config)
    annotations = dict(pod.get("metadata", {}).get("annotations") or {})
    changes: dict[str, Any] = {}
    if spec != pod.get("spec", {}):
        changes["spec"] = {k: spec[k] for k in ("volumes", "initContainers", "containers") if spec.get(k) != pod.get("spec", {}).get(k)}
    if annotations.get(contract.ANNOTATION_POD_INJECTED) != rollout:
        changes["metadata"] = {"annotations": {contract.ANNOTATION_POD_INJECTED: rollout}}
    return changes or None


def selector_matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """Kubernetes label selector semantics (matchLabels AND matchExpressions); empty matches nothing here."""
    match_labels = selector.get("matchLabels") or {}
    expressions = selector.get("matchExpressions") or []
    if not match_labels and not expressions:
        return False
    if any(labels.get(k) != v for k, v in match_labels.items()):
        return False
    for expr in expressions:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True
