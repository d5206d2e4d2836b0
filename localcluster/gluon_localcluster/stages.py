"""kwok's stage configuration: kwok's own default stages (copied from its module by build.sh, exactly
as kwokctl feeds them), with one change for pods that our webhook injected.

SIMULATION of the kubelet's part: kwok would mark an injected pod Running at once, with a preflight init
container that "completed" with no termination message. A real kubelet first runs the preflight, whose
verdict becomes the message. So kwok's pod-ready stage leaves injected pods alone until the kubelet
simulator (kubelet_sim.py) has run the real preflight and put its verdict in the pod annotation
PREFLIGHT_MESSAGE; a second stage then marks the pod ready with that verdict as the preflight's
termination message, in one status write, as a kubelet would report it.

kwok's pod-complete stage is left out: it would report a Job's pod Succeeded without running anything.
A Job (the chart's post-delete cleanup) runs on a real node (tests/test_realnode.py); on kwok's it waits.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from gluon_common import contract

from .binaries import ensure_built, stages_dir

PREFLIGHT_MESSAGE = "kubelet-sim.gluonrollout.io/preflight-message"  # SIMULATION only: never read by the product
PREFLIGHT_CONTAINER = contract.PREFLIGHT_CONTAINER
INJECTED_KEY = f'.metadata.annotations["{contract.ANNOTATION_POD_INJECTED}"]'
MESSAGE_KEY = f'.metadata.annotations["{PREFLIGHT_MESSAGE}"]'
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
        _load("pod-delete.yaml"),
    ]
    path.write_text(yaml.safe_dump_all(documents, sort_keys=False))
    return path
