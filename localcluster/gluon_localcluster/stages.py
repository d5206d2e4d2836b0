"""kwok's stage configuration: kwok's own default stages (copied from its module by build.sh, exactly
as kwokctl feeds them), with one change for pods that our webhook injected.

SIMULATION of the kubelet's part: kwok would mark an injected pod Running at once, with a preflight init
container that "completed" with no termination message. A real kubelet first runs the preflight, whose
verdict becomes the message. So kwok's pod-ready stage leaves injected pods alone until the kubelet
simulator (kubelet_sim.py) has run the real preflight and put its verdict in the pod annotation
PREFLIGHT_MESSAGE; a second stage then marks the pod ready with that verdict as the preflight's
termination message, in one status write, as a kubelet would report it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from gluon_common import contract

from .binaries import ensure_built, stages_dir

PREFLIGHT_MESSAGE = "kubelet-sim.gluonrollout.io/preflight-message"  # SIMULATION only: never read by the product
EXIT_CODE = "kubelet-sim.gluonrollout.io/exit-code"  # a simulated Job pod's exit code (kubelet_sim runs it)
PREFLIGHT_CONTAINER = "gluon-preflight"
INJECTED_KEY = f'.metadata.annotations["{contract.ANNOTATION_POD_INJECTED}"]'
MESSAGE_KEY = f'.metadata.annotations["{PREFLIGHT_MESSAGE}"]'
EXIT_KEY = f'.metadata.annotations["{EXIT_CODE}"]'
TERMINATED = "reason: Completed\n"


def _load(name: str) -> dict[str, Any]:
    path = stages_dir() / name
    if not path.is_file():
        raise RuntimeError(f"{path} is missing: localcluster/k8s/build.sh copies kwok's stages there")
    return yaml.safe_load(path.read_text())


def preflight_variant(pod_ready: dict[str, Any]) -> dict[str, Any]:
    """pod-ready for injected pods whose preflight has run: the verdict becomes the termination message."""
    template = pod_ready["spec"]["next"]["statusTemplate"]
    init = template.index("initContainerStatuses:")
    end = template.index(TERMINATED, init) + len(TERMINATED)
    line_start = template.rindex("\n", 0, end - len(TERMINATED)) + 1
    indent = template[line_start : end - len(TERMINATED)]
    message = (
        f'{indent}{{{{ if eq .name "{PREFLIGHT_CONTAINER}" }}}}\n'
        f'{indent}message: {{{{ index $.metadata.annotations "{PREFLIGHT_MESSAGE}" | Quote }}}}\n'
        f"{indent}{{{{ end }}}}\n"
    )
    variant = yaml.safe_load(yaml.safe_dump(pod_ready))
    variant["metadata"]["name"] = "pod-ready-after-preflight"
    variant["spec"]["next"]["statusTemplate"] = template[:end] + message + template[end:]
    variant["spec"]["selector"]["matchExpressions"] += [
        {"key": INJECTED_KEY, "operator": "Exists"},
        {"key": MESSAGE_KEY, "operator": "Exists"},
    ]
    return variant


def job_stages(pod_complete: dict[str, Any]) -> list[dict[str, Any]]:
    """kwok completes a Job's pod at once; here only after kubelet_sim ran it: Succeeded on exit code 0,
    Failed otherwise (what a kubelet reports of the container's real exit)."""
    succeeded = yaml.safe_load(yaml.safe_dump(pod_complete))
    succeeded["spec"]["selector"]["matchExpressions"].append({"key": EXIT_KEY, "operator": "In", "values": ["0"]})
    failed = yaml.safe_load(yaml.safe_dump(pod_complete))
    failed["metadata"]["name"] = "pod-failed-after-run"
    failed["spec"]["selector"]["matchExpressions"] += [
        {"key": EXIT_KEY, "operator": "Exists"},
        {"key": EXIT_KEY, "operator": "NotIn", "values": ["0"]},
    ]
    template = failed["spec"]["next"]["statusTemplate"]
    failed["spec"]["next"]["statusTemplate"] = (
        template.replace("exitCode: 0", f'exitCode: {{{{ index $root.metadata.annotations "{EXIT_CODE}" }}}}')
        .replace("reason: Completed", "reason: Error")
        .replace("phase: Succeeded", "phase: Failed")
    )
    return [succeeded, failed]


def write_config(path: Path) -> Path:
    ensure_built()
    pod_ready = _load("pod-ready.yaml")
    plain = yaml.safe_load(yaml.safe_dump(pod_ready))
    plain["spec"]["selector"]["matchExpressions"].append({"key": INJECTED_KEY, "operator": "DoesNotExist"})
    documents = [
        _load("node-initialize.yaml"),
        _load("node-heartbeat-with-lease.yaml"),
        plain,
        preflight_variant(pod_ready),
        *job_stages(_load("pod-complete.yaml")),
        _load("pod-delete.yaml"),
    ]
    path.write_text(yaml.safe_dump_all(documents, sort_keys=False))
    return path
