"""The local-cluster harness shared by tests, benches and `make demo`: a real Kubernetes control plane
(controlplane.py), the chart installed into it with helm (install.py), the SIMULATION of what kubelets
and serving pods would do (kubelet_sim.py), and a fault-injecting proxy (faultproxy.py)."""

from __future__ import annotations

from typing import Any

__all__ = ["ControlPlane"]


def __getattr__(name: str) -> Any:
    """ControlPlane on first use: the self-test children import fakes.devices from here, and the control
    plane's imports (the Kubernetes client) would add most of a second to each of them."""
    if name == "ControlPlane":
        from .controlplane import ControlPlane

        return ControlPlane
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
