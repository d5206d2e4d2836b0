"""The local-cluster harness shared by tests, benches and `make demo`: a real Kubernetes control plane
(controlplane.py), the chart installed into it with helm (install.py), the SIMULATION of what kubelets
and serving pods would do (kubelet_sim.py), and a fault-injecting proxy (faultproxy.py)."""

from .controlplane import ControlPlane

__all__ = ["ControlPlane"]
