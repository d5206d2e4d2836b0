"""The chart's monitoring as kube-prometheus-stack users run it: the Prometheus Operator (built from its Go
module by localcluster/promop/build.sh) against the real API server, its CRDs, a `Prometheus` object that
selects the chart's monitors and rules by their `release` label, and Prometheus running the configuration
the operator generated. That Prometheus is built by the same script, at the version the operator's module
requires, with Kubernetes service discovery: Debian bookworm's prometheus (2.42.0+ds) is built without
kubernetes_sd_configs and refuses every job the operator generates.

Prometheus runs as a local process, not as the StatefulSet's pod: there is no kubelet or container runtime
here (kwok's nodes only report pods), so the StatefulSet's pod is kept Pending by a node selector no node
matches. The harness does what the pod's config-reloader sidecar would: it reads the Secret the operator
writes (prometheus.yaml.gz) and the rule ConfigMaps, adapts the in-cluster paths (the service-account
token and CA become a kubeconfig of the `prometheus` ServiceAccount's own token; the rule files a local
folder), writes them and POSTs /-/reload whenever they change. Everything else (every scrape job, every
relabeling, Kubernetes service discovery, the rules) is the operator's.

    with MonitoringStack(cp, release="gluon-local").start() as mon:   # CRDs in, operator running
        install(cp, values=monitoring_values("gluon-local"))            # the chart's monitors, accepted
        prom = mon.prometheus()                                         # Prometheus on the generated config
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from .binaries import ROOT, bin_dir
from .controlplane import Component, ControlPlane, _clean_env, free_port, write_kubeconfig
from .prometheus import Prometheus

PROMOP_BUILD = ROOT / "localcluster" / "promop" / "build.sh"
NAMESPACE = "monitoring"
NAME = "gluon"  # the Prometheus object: the operator names its Secret and StatefulSet prometheus-<NAME>
SERVICE_ACCOUNT = "prometheus"
CONFIG_KEY = "prometheus.yaml.gz"
RULES_MOUNT = "/etc/prometheus/rules/"  # where the StatefulSet mounts the rule ConfigMaps
POD_NAME = f"prometheus-{NAME}-0"
# No node has this label: the StatefulSet's pod stays Pending, the local process stands in for it.
LOCAL_PROCESS_SELECTOR = {"localcluster.gluonrollout.io/prometheus": "local-process"}
SCRAPE_INTERVAL = "1s"
GROUP = "monitoring.coreos.com"
# The Prometheus controller's kinds: the operator runs it once `prometheuses` exists and lists the four
# kinds a Prometheus object selects. The other five CRDs of the module (alertmanagers, alertmanagerconfigs,
# prometheusagents, scrapeconfigs, thanosrulers: 3.4 of its 4.4 MB) are left out: the operator skips their
# controllers ("not installed in the cluster"), and applying them took seconds of every cluster's start.
CRDS = ("prometheuses", "servicemonitors", "podmonitors", "probes", "prometheusrules")


def ensure_promop() -> Path:
    """Runs localcluster/promop/build.sh (a no-op while its stamp matches) and returns the binaries' folder."""
    result = subprocess.run(["bash", str(PROMOP_BUILD)], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"building the Prometheus Operator failed ({PROMOP_BUILD}):\n{result.stderr[-3000:]}")
    for name in ("prometheus-operator", "prometheus"):
        if not (bin_dir() / name).is_file():
            raise RuntimeError(f"{bin_dir() / name} is missing after {PROMOP_BUILD}: run `make cluster`")
    return bin_dir()


def crd_dir() -> Path:
    return bin_dir().parent / "promop-crds"


def built_versions() -> dict[str, str]:
    """{"prometheus-operator": "v0.93.1", "prometheus": "v3.13.1"}, as build.sh recorded them."""
    built = json.loads((bin_dir().parent / "promop-build.json").read_text())
    return {name: built[name] for name in ("prometheus-operator", "prometheus")}


def prometheus_version() -> str:
    """The built Prometheus's version (`prometheus --version`), so the operator generates config for it."""
    out = subprocess.run([str(bin_dir() / "prometheus"), "--version"], capture_output=True, text=True, check=True)
    found = re.search(r"version (\d+\.\d+\.\d+)", out.stdout + out.stderr)
    if not found:
        raise RuntimeError(f"cannot read Prometheus's version from: {out.stdout[:200]}")
    return "v" + found.group(1)


def monitoring_values(release: str, interval: str = SCRAPE_INTERVAL, serving_labels: dict | None = None) -> dict:
    """Chart values with every monitor, the rules and the dashboard on, scraped every `interval`."""
    return {
        "monitoring": {
            "enabled": True,
            "release": release,
            "serviceMonitor": {"enabled": True, "interval": interval},
            "podMonitor": {"enabled": True, "interval": interval},
            "servingPodMonitor": {
                "enabled": True,
                "interval": interval,
                "selector": {"matchLabels": dict(serving_labels or {})},
            },
            "prometheusRule": {"enabled": True},
            "dashboard": {"enabled": True},
        }
    }


def prometheus_object(release: str, version: str) -> dict[str, Any]:
    """What a kube-prometheus-stack install makes: monitors and rules of any namespace, by `release`."""
    by_release = {"matchLabels": {"release": release}}
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "Prometheus",
        "metadata": {"name": NAME, "namespace": NAMESPACE},
        "spec": {
            "version": version,
            "replicas": 1,
            "serviceAccountName": SERVICE_ACCOUNT,
            "serviceMonitorSelector": by_release,
            "serviceMonitorNamespaceSelector": {},
            "podMonitorSelector": by_release,
            "podMonitorNamespaceSelector": {},
            "ruleSelector": by_release,
            "ruleNamespaceSelector": {},
            "scrapeInterval": SCRAPE_INTERVAL,
            "evaluationInterval": SCRAPE_INTERVAL,
            "nodeSelector": LOCAL_PROCESS_SELECTOR,
        },
    }


# ---------------------------------------------------------------- the config-reloader's job (pure)

ENV_REFERENCE = re.compile(r"\$\((\w+)\)")


def expand_env(text: str, env: dict[str, str]) -> str:
    """The config-reloader's $(VAR) expansion; a variable it would not know is an error naming it."""

    def value(match: re.Match) -> str:
        if match.group(1) not in env:
            raise ValueError(f"the generated config refers to $({match.group(1)}), which the pod does not set")
        return env[match.group(1)]

    return ENV_REFERENCE.sub(value, text)


def localize(config: dict[str, Any], kubeconfig: Path, rules_dir: Path) -> dict[str, Any]:
    """The generated config, run outside its pod: in-cluster service discovery gets the kubeconfig of the
    ServiceAccount's token, rule files their local folder. Any other in-pod path is an error naming where."""
    out = json.loads(json.dumps(config))
    for job in out.get("scrape_configs") or []:
        for sd in job.get("kubernetes_sd_configs") or []:
            if "api_server" not in sd and "kubeconfig_file" not in sd:
                sd["kubeconfig_file"] = str(kubeconfig)
    out["rule_files"] = [
        str(rules_dir / f[len(RULES_MOUNT) :]) if f.startswith(RULES_MOUNT) else f for f in out.get("rule_files") or []
    ]
    for where, value in _strings(out):
        if value.startswith(("/etc/prometheus/", "/var/run/secrets/")):
            raise ValueError(f"the generated config's {where} is a path inside the pod ({value}): not supported here")
    return out


def _strings(node: Any, where: str = "") -> list[tuple[str, str]]:
    if isinstance(node, dict):
        return [s for k, v in node.items() for s in _strings(v, f"{where}.{k}" if where else str(k))]
    if isinstance(node, list):
        return [s for i, v in enumerate(node) for s in _strings(v, f"{where}[{i}]")]
    return [(where, node)] if isinstance(node, str) else []


# ---------------------------------------------------------------- the stack


class MonitoringStack:
    """The Prometheus Operator, its CRDs, the Prometheus object and (prometheus()) the local Prometheus."""

    def __init__(self, cp: ControlPlane, release: str) -> None:
        self.cp, self.release = cp, release
        self.dir = cp.dir / "monitoring"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.operator: Component | None = None
        self.server: Prometheus | None = None
        self.api_relay: Any = None
        self.reloads = 0
        self.applied: str | None = None  # hash of what Prometheus runs
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "MonitoringStack":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> "MonitoringStack":
        binary = ensure_promop() / "prometheus-operator"
        self.install_crds()
        pair = self.cp.pki.issue("prometheus-operator", "/CN=prometheus-operator/O=system:masters", client=True)
        kubeconfig = write_kubeconfig(
            self.dir / "operator.kubeconfig",
            self.cp.url,
            self.cp.pki.ca.cert,
            {"client-certificate": str(pair.cert), "client-key": str(pair.key)},
        )
        self.operator_port = free_port()
        self.operator = Component(
            "prometheus-operator",
            [str(binary), f"--web.listen-address=127.0.0.1:{self.operator_port}", "--log-level=info"],
            self.dir / "prometheus-operator.log",
        )
        self.operator.start(env={**_clean_env(), "KUBECONFIG": str(kubeconfig)})
        self.cp.components.append(self.operator)  # stopped with the control plane at the latest
        self._prometheus_account()
        self._apply(prometheus_object(self.release, prometheus_version()))
        return self

    def _kubectl(self, *args: str, stdin: str | None = None) -> str:
        result = subprocess.run(
            [str(bin_dir() / "kubectl"), "--kubeconfig", str(self.cp.kubeconfig), *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if result.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args[:2])} failed: {result.stderr[-2000:]}")
        return result.stdout

    def install_crds(self, timeout: float = 60) -> None:
        """The CRDs of what runs here (CRDS), server-side: the Prometheus CRD is too large for client-side
        apply's last-applied annotation. Then until each is Established (polled: `kubectl wait` fails on a CRD
        whose status has no conditions yet, as one just created may not)."""
        from kubernetes import client

        files = [str(crd_dir() / f"{GROUP}_{plural}.yaml") for plural in CRDS]
        self._kubectl("apply", "--server-side", "--field-manager=localcluster", *(f"--filename={f}" for f in files))
        api = client.ApiextensionsV1Api(self.cp.admin_client())
        waiting = {f"{plural}.{GROUP}" for plural in CRDS}
        deadline = time.monotonic() + timeout
        while waiting:
            for name in sorted(waiting):
                crd = json.loads(api.read_custom_resource_definition(name, _preload_content=False).data)
                conditions = (crd.get("status") or {}).get("conditions") or []
                if any(c["type"] == "Established" and c["status"] == "True" for c in conditions):
                    waiting.discard(name)
            if waiting and time.monotonic() > deadline:
                raise TimeoutError(f"CRDs not Established within {timeout} s: {sorted(waiting)}")
            if waiting:
                time.sleep(0.1)

    def _apply(self, obj: dict[str, Any]) -> None:
        self._kubectl("apply", "--server-side", "--field-manager=localcluster", "-f", "-", stdin=json.dumps(obj))

    def _prometheus_account(self) -> None:
        """What kube-prometheus-stack gives Prometheus: read access to what service discovery lists."""
        rules = [
            {
                "apiGroups": [""],
                "resources": ["nodes", "services", "endpoints", "pods"],
                "verbs": ["get", "list", "watch"],
            },
            {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]},
            {"nonResourceURLs": ["/metrics"], "verbs": ["get"]},
        ]
        subject = {"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": NAMESPACE}
        role = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "localcluster-prometheus"}
        for obj in (
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": SERVICE_ACCOUNT, "namespace": NAMESPACE},
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {"name": role["name"]},
                "rules": rules,
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": role["name"]},
                "roleRef": role,
                "subjects": [subject],
            },
        ):
            self._apply(obj)

    # ------------------------------------------------------------ what the operator generated

    def generated(self) -> tuple[str | None, dict[str, dict[str, str]]]:
        """(the gunzipped config or None, {rule ConfigMap: {file: text}}) as the operator wrote them."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        core = client.CoreV1Api(self.cp.admin_client())
        try:
            secret = core.read_namespaced_secret(f"prometheus-{NAME}", NAMESPACE)
            import base64

            config = gzip.decompress(base64.b64decode(secret.data[CONFIG_KEY])).decode()
        except (ApiException, KeyError, TypeError):
            config = None
        maps = core.list_namespaced_config_map(NAMESPACE, label_selector=f"prometheus-name={NAME}").items
        rules = {
            m.metadata.name: dict(m.data or {})
            for m in maps
            if m.metadata.name.startswith(f"prometheus-{NAME}-rulefiles")
        }
        return config, rules

    def wait_generated(self, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            config, _ = self.generated()
            if config and "scrape_configs" in config:
                return config
            time.sleep(0.5)
        tail = self.operator.tail() if self.operator else ""
        raise TimeoutError(f"the Prometheus Operator wrote no config with scrape jobs in {timeout} s:\n{tail}")

    def _write(self, config: str, rules: dict[str, dict[str, str]]) -> str:
        """Writes what the reloader would; returns the hash of it."""
        rules_dir = self.dir / "rules"
        for folder in rules_dir.glob("*"):
            for f in folder.glob("*"):
                f.unlink()
        for name, files in rules.items():
            (rules_dir / name).mkdir(parents=True, exist_ok=True)
            for file, text in files.items():
                (rules_dir / name / file).write_text(text)
        expanded = expand_env(config, {"POD_NAME": POD_NAME, "SHARD": "0"})
        local = localize(yaml.safe_load(expanded), self.kubeconfig, rules_dir)
        (self.dir / "prometheus.yaml").write_text(yaml.safe_dump(local, sort_keys=False))
        return hashlib.sha256((config + json.dumps(rules, sort_keys=True)).encode()).hexdigest()

    def prometheus(self, timeout: float = 90, netns: Any = None) -> Prometheus:
        """Prometheus on the generated config (waits for the operator to write one with scrape jobs), kept
        up to date by a reloader thread. `netns`: the pods' network namespace (podnet.NetNamespace) to run
        in, the API server relayed into it on its own address."""
        if netns is not None:
            from .podnet import Forwarder

            self.api_relay = Forwarder(("127.0.0.1", self.cp.port), ("127.0.0.1", self.cp.port), listen_ns=netns)
        token = self.cp.token_for(NAMESPACE, SERVICE_ACCOUNT, seconds=24 * 3600)
        self.kubeconfig = self.cp.kubeconfig_for_token(token, "prometheus")
        config = self.wait_generated(timeout)
        self.applied = self._write(config, self.generated()[1])
        self.server = Prometheus(
            config_file=self.dir / "prometheus.yaml",
            directory=self.dir / "server",
            binary=str(bin_dir() / "prometheus"),
            netns=netns,
        )
        self._thread = threading.Thread(target=self._reload_loop, daemon=True, name="prometheus-reloader")
        self._thread.start()
        return self.server

    def _reload_loop(self) -> None:
        while not self._stop.wait(0.5):
            try:
                self.sync()
            except Exception as error:  # the API server may be halted by a fault test; keep the last config
                self.errors.append(repr(error))

    def sync(self) -> bool:
        """Rewrite and reload when the operator's output changed; True if it did."""
        config, rules = self.generated()
        if config is None or self.server is None:
            return False
        digest = hashlib.sha256((config + json.dumps(rules, sort_keys=True)).encode()).hexdigest()
        if digest == self.applied:
            return False
        self._write(config, rules)
        self.server.reload()
        self.applied, self.reloads = digest, self.reloads + 1
        return True

    def wait_rule(self, alert: str, timeout: float = 60) -> None:
        """Until Prometheus has loaded a rule of that name."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.server is not None and alert in self.server.rule_names():
                return
            time.sleep(0.5)
        raise TimeoutError(
            f"Prometheus did not load the rule {alert} within {timeout} s (reloader: {self.errors[-3:]})"
        )

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        if self.server is not None:
            self.server.stop()
        if self.api_relay is not None:
            self.api_relay.stop()
        if self.operator is not None:
            self.operator.stop()


def dashboard_queries(dashboard: dict[str, Any], variables: dict[str, str]) -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target of every panel, with the dashboard's variables ($namespace)
    replaced as Grafana would for that selection; a variable left unreplaced is an error naming it."""
    out = []
    for panel in dashboard.get("panels") or []:
        for target in panel.get("targets") or []:
            expr = target["expr"]
            for name, value in variables.items():
                expr = expr.replace(f"${name}", value)
            if "$" in expr:
                raise ValueError(f"panel {panel.get('title')!r}: a variable is not replaced in {expr!r}")
            out.append((panel.get("title", "?"), expr))
    return out
