"""The chart, installed for real with `helm install` into a local control plane, and credentials for
the operator and agents that run as local processes (there is no container runtime here).

Each process gets a token of its own ServiceAccount from the TokenRequest API; an agent's token is bound
to its DaemonSet pod on its node, so the API server puts `authentication.kubernetes.io/node-name` into
its user info as on a real node. Nothing the operator or an agent does uses admin credentials.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .binaries import ROOT
from .controlplane import ControlPlane
from .images import AGENT_IMAGE, OPERATOR_IMAGE
from .pki import KeyPair

CHART = ROOT / "charts" / "gluon-rollout"
RELEASE = "gluon-rollout"
NAMESPACE = "gluon-system"


def image_values(name: str) -> dict[str, str]:
    """repository:tag as the chart's image values."""
    repository, tag = name.rsplit(":", 1)
    return {"repository": repository, "tag": tag}


# The chart has no default image (none is published): the harness names the ones it builds from the
# Dockerfile's targets (images.py), which a real node runs and kwok's nodes never pull. Local processes cannot
# use what needs a Prometheus Operator (monitors, rules): monitoring.py turns them on with its own.
LOCAL_VALUES: dict[str, Any] = {
    "operator": {"image": image_values(OPERATOR_IMAGE)},
    "agent": {"image": image_values(AGENT_IMAGE)},
    "monitoring": {"enabled": False},
}


def helm_binary() -> str:
    found = shutil.which("helm") or str(ROOT / ".tools" / "bin" / "helm")
    if not Path(found).is_file():
        raise RuntimeError("helm is not installed: `make test` installs it (.ci/install-tools)")
    return found


def kubectl_binary() -> str:
    for found in (
        shutil.which("kubectl"),
        str(ROOT / ".tools" / "bin" / "kubectl"),
        str(ROOT / ".cluster" / "bin" / "kubectl"),
    ):
        if found and Path(found).is_file():
            return found
    raise RuntimeError("kubectl is not installed: `make test` installs it (.ci/install-tools)")


def helm(cp: ControlPlane, *args: str, timeout: float = 180) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HELM_")}
    env.update(
        HELM_CACHE_HOME=str(cp.dir / "helm" / "cache"),
        HELM_CONFIG_HOME=str(cp.dir / "helm" / "config"),
        HELM_DATA_HOME=str(cp.dir / "helm" / "data"),
    )
    result = subprocess.run(
        [helm_binary(), "--kubeconfig", str(cp.kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    if result.returncode != 0:
        raise RuntimeError(f"helm {' '.join(args[:2])} failed:\n{result.stderr[-3000:]}")
    return result.stdout


def merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


@dataclass
class Installed:
    cp: ControlPlane
    namespace: str
    release: str
    webhook_tls: KeyPair
    webhook_port: int

    @property
    def operator_account(self) -> str:
        return f"{self.release}-operator"

    @property
    def agent_account(self) -> str:
        return f"{self.release}-agent"

    def operator_kubeconfig(self, server: str | None = None) -> Path:
        """The operator's ServiceAccount token (`server`: e.g. the fault proxy's URL)."""
        token = self.cp.token_for(self.namespace, self.operator_account)
        return self.cp.kubeconfig_for_token(token, "operator" if server is None else "operator-proxied", server)

    def agent_pod(self, node: str, timeout: float = 60) -> dict[str, Any]:
        """The agent DaemonSet's pod on `node` (made by the real DaemonSet controller, scheduled there)."""
        from kubernetes import client

        core = client.CoreV1Api(self.cp.admin_client())
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pods = core.list_namespaced_pod(
                self.namespace,
                label_selector="app.kubernetes.io/name=gluon-rollout-agent",
                field_selector=f"spec.nodeName={node}",
                _preload_content=False,
            )
            items = [p for p in json.loads(pods.data)["items"] if not p["metadata"].get("deletionTimestamp")]
            if items:
                return items[0]
            time.sleep(0.2)
        raise TimeoutError(f"no agent pod on node {node} after {timeout} s (is it labelled for the DaemonSet?)")

    def agent_kubeconfig(self, node: str, server: str | None = None) -> Path:
        pod = self.agent_pod(node)["metadata"]["name"]
        token = self.cp.token_for(self.namespace, self.agent_account, pod=pod)
        return self.cp.kubeconfig_for_token(token, f"agent-{node}" + ("" if server is None else "-proxied"), server)

    def uninstall(self) -> str:
        return helm(self.cp, "uninstall", self.release, "--namespace", self.namespace, "--wait", "--timeout", "120s")

    def apply_crds(self, chart: Path = CHART) -> str:
        """The documented step before `helm upgrade` (Helm never upgrades crds/): a server-side apply."""
        result = subprocess.run(
            [kubectl_binary(), "--kubeconfig", str(self.cp.kubeconfig), "apply", "--server-side"]
            + ["--force-conflicts", "-f", str(chart / "crds")],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if result.returncode != 0:
            raise RuntimeError(f"kubectl apply --server-side -f {chart / 'crds'} failed:\n{result.stderr[-3000:]}")
        return result.stdout

    def upgrade(self, chart: Path = CHART, values: dict[str, Any] | None = None) -> str:
        """`helm upgrade` with the values of the install over the new chart's defaults (--reset-then-reuse-values),
        and `values` over those."""
        extra: list[str] = []
        if values:
            values_file = self.cp.dir / f"values-{self.release}-upgrade-{time.monotonic_ns()}.json"
            values_file.write_text(json.dumps(values))
            extra = ["--values", str(values_file)]
        return helm(
            self.cp,
            "upgrade",
            self.release,
            str(chart),
            "--namespace",
            self.namespace,
            "--reset-then-reuse-values",
            "--wait=false",
            *extra,
        )


def install(
    cp: ControlPlane,
    values: dict[str, Any] | None = None,
    namespace: str = NAMESPACE,
    release: str = RELEASE,
    webhook_port: int | None = None,
    chart: Path = CHART,
) -> Installed:
    """`helm install` of the chart, with the webhook pointed at https://127.0.0.1:<webhook_port>/inject
    (signed by the control plane's CA: the operator process serves it with `webhook_tls`)."""
    from .controlplane import free_port

    port = webhook_port or free_port()
    tls = cp.pki.issue("webhook", "/CN=127.0.0.1", ("IP:127.0.0.1",))
    ca = base64.b64encode(cp.pki.ca.cert.read_bytes()).decode()
    chosen = merge(
        merge(LOCAL_VALUES, {"webhook": {"url": f"https://127.0.0.1:{port}/inject", "caBundle": ca}}), values or {}
    )
    values_file = cp.dir / f"values-{release}.json"
    values_file.write_text(json.dumps(chosen))
    helm(
        cp,
        "install",
        release,
        str(chart),
        "--namespace",
        namespace,
        "--create-namespace",
        "--values",
        str(values_file),
        "--wait=false",
    )
    return Installed(cp, namespace, release, tls, port)
