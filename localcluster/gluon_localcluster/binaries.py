"""Where the control plane's binaries are: built once by localcluster/k8s/build.sh into .cluster/bin
(ignored by git), rebuilt only when the pins change. Nothing is downloaded at run time."""

from __future__ import annotations

import os
import subprocess
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "localcluster" / "k8s" / "build.sh"
PINS = ROOT / "localcluster" / "k8s" / "pins.env"
NAMES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "kwok", "kwokctl")


def bin_dir() -> Path:
    return Path(os.environ.get("CLUSTER_BIN") or ROOT / ".cluster" / "bin")


@lru_cache(maxsize=1)
def pins() -> dict[str, str]:
    """The pinned versions (pins.env: KEY=value lines, as build.sh sources them)."""
    lines = (line.strip() for line in PINS.read_text().splitlines())
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#") and "=" in line)


def kubernetes_version() -> str:
    """The pinned Kubernetes version, e.g. v1.36.3: the control plane's and the real nodes' kubelet's."""
    return pins()["KUBERNETES_VERSION"]


def stages_dir() -> Path:
    return bin_dir().parent / "kwok-stages"


@lru_cache(maxsize=1)
def ensure_built() -> Path:
    """Runs build.sh (a no-op when the stamp of the pins matches) and returns the binaries' folder."""
    result = subprocess.run(["bash", str(BUILD)], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(
            f"building the test control plane failed ({BUILD}):\n{result.stdout[-2000:]}{result.stderr[-3000:]}"
        )
    return bin_dir()


def binary(name: str) -> str:
    if name not in NAMES:
        raise ValueError(f"unknown control-plane binary {name!r}; one of {', '.join(NAMES)}")
    path = ensure_built() / name
    if not path.is_file():
        raise RuntimeError(f"{path} is missing after build.sh: delete {bin_dir()} and run `make cluster` again")
    return str(path)
