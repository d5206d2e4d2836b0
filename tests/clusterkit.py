"""Test pieces on the test run's real control plane (conftest: control_plane, installed): a module's own kwok
GPU nodes, serving Deployments, the operator under kopf's KopfRunner with its own ServiceAccount's token,
the fault proxy, and a SIMULATION of the kubelet reporting the preflight's verdict for tests that need
only the verdict (PreflightReporter).

The cluster is shared by every test of the run: each module names its nodes with a prefix of its own and
labels them with GROUP_LABEL, and every rollout selects its nodes by that label, so no rollout sees
another module's nodes."""

from __future__ import annotations

import datetime
import json
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from kubernetes import client, config

from gluon_common import contract
from gluon_localcluster import fleet
from gluon_localcluster.background import Background
from gluon_localcluster.faultproxy import FaultProxy
from gluon_localcluster.install import Installed
from gluon_localcluster.processes import AGENT_IMAGE
from gluon_operator.spec import GROUP, PLURAL, VERSION
from gluon_operator.webhook import PREFLIGHT_CONTAINER
from tests.helpers import wait_for

GROUP_LABEL = "testing.local/group"  # not under the contract's prefix: nothing of ours reads or prunes it
MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"


def api_for(kubeconfig: Path) -> client.ApiClient:
    return config.new_client_from_config(config_file=str(kubeconfig))


def create_when_served(custom: client.CustomObjectsApi, body: dict) -> bool:
    """Creates a GluonRollout in namespace "apps"; False while the CRD is not served yet (404)."""
    try:
        custom.create_namespaced_custom_object(GROUP, VERSION, "apps", PLURAL, body)
    except client.ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


def iso_now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---------------------------------------------------------------- nodes


@dataclass
class Nodes:
    """kwok nodes of one test module (`group` prefixes their names and is their GROUP_LABEL value)."""

    installed: Installed
    group: str
    bodies: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> the node as created

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.installed.cp.admin_client())

    @property
    def selector(self) -> dict[str, Any]:
        return {"matchLabels": {GROUP_LABEL: self.group}}

    def name(self, short: str) -> str:
        return f"{self.group}-{short}"

    def create(self, short: str, index: int, agent: bool = True, published: dict[str, Any] | None = None) -> str:
        """`published`: the traits of the report its agent published (fleet.gpu_node), None for a bare node.
        `agent=False`: no GPU label, so the agent DaemonSet puts no pod there (a dead agent)."""
        name = self.name(short)
        body = fleet.gpu_node(name, index, **published) if published is not None else fleet.kwok_node(name, index)
        body["metadata"]["labels"][GROUP_LABEL] = self.group
        if not agent:
            for key in fleet.GPU_NODE_LABEL:
                del body["metadata"]["labels"][key]
        self.core.create_node(body)
        self.bodies[name] = body
        return name

    def wait_for_agents(self) -> None:
        for name, body in self.bodies.items():
            if all(body["metadata"]["labels"].get(k) == v for k, v in fleet.GPU_NODE_LABEL.items()):
                self.installed.agent_pod(name)

    def read(self, name: str) -> dict[str, Any]:
        return json.loads(self.core.read_node(name, _preload_content=False).data)

    def labels(self, name: str) -> dict[str, str]:
        return self.read(name)["metadata"].get("labels") or {}

    def annotations(self, name: str) -> dict[str, str]:
        return self.read(name)["metadata"].get("annotations") or {}

    def reset(self) -> None:
        """Each node's keys of ours back to what it was created with (what its agent published), with admin
        credentials: a person cleaning up between tests."""
        for name, body in self.bodies.items():
            meta = self.read(name)["metadata"]
            patch: dict[str, dict[str, Any]] = {"labels": {}, "annotations": {}}
            for kind in patch:
                wanted = {k: v for k, v in (body["metadata"].get(kind) or {}).items() if contract.is_ours(k)}
                patch[kind] = {
                    k: None for k in (meta.get(kind) or {}) if contract.is_ours(k) and k not in wanted
                } | wanted
            if any(patch.values()):
                self.core.patch_node(name, {"metadata": patch}, _content_type=MERGE)

    def delete(self) -> None:
        for name in self.bodies:
            try:
                self.core.delete_node(name)
            except client.ApiException as exc:
                if exc.status != 404:
                    raise


# ---------------------------------------------------------------- serving workloads


def serve(admin: client.ApiClient, namespace: str, nodes: list[str], replicas: int = 2, timeout: float = 60) -> None:
    """One Deployment pinned to each node; returns once every pod runs and is ready (kwok marks them)."""
    apps = client.AppsV1Api(admin)
    for node in nodes:
        apps.create_namespaced_deployment(
            namespace, fleet.serving_deployment(f"sglang-{node}", node=node, replicas=replicas)
        )
    wait_for(
        lambda: sum(ready(p) for p in pods(admin, namespace)) == replicas * len(nodes),
        timeout=timeout,
        interval=0.3,
        what=f"{replicas * len(nodes)} serving pods ready",
    )


def pods(admin: client.ApiClient, namespace: str, node: str | None = None) -> list[dict[str, Any]]:
    listing = client.CoreV1Api(admin).list_namespaced_pod(namespace, _preload_content=False)
    items = json.loads(listing.data)["items"]
    return [p for p in items if node is None or p["spec"].get("nodeName") == node]


def ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return not pod["metadata"].get("deletionTimestamp") and any(
        c["type"] == "Ready" and c["status"] == "True" for c in conditions
    )


# ---------------------------------------------------------------- rollouts


def create_rollout(admin: client.ApiClient, body: dict[str, Any]) -> dict[str, Any]:
    return client.CustomObjectsApi(admin).create_namespaced_custom_object(
        GROUP, VERSION, body["metadata"]["namespace"], PLURAL, body
    )


def rollout_status(admin: client.ApiClient, namespace: str, name: str = "kimi") -> dict[str, Any]:
    try:
        obj = client.CustomObjectsApi(admin).get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    except client.ApiException as exc:
        if exc.status == 404:
            return {}
        raise
    return obj.get("status") or {}


def delete_rollouts(admin: client.ApiClient, namespace: str, timeout: float = 45) -> None:
    """Deleted while the operator still runs, so its finalizer goes and the namespace can go too. If the
    operator does not remove its finalizer in time, a person does (so no later test meets the rollout) and
    the test fails."""
    custom = client.CustomObjectsApi(admin)

    def left() -> list[dict[str, Any]]:
        return custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"]

    for item in left():
        custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, item["metadata"]["name"])
    try:
        wait_for(
            lambda: not left(),
            timeout=timeout,
            interval=0.2,
            what="the rollouts deleted (the operator's finalizer removed)",
        )
    except AssertionError:
        for item in left():
            custom.patch_namespaced_custom_object(
                GROUP,
                VERSION,
                namespace,
                PLURAL,
                item["metadata"]["name"],
                {"metadata": {"finalizers": None}},
                _content_type=MERGE,
            )
        raise


def events(admin: client.ApiClient, namespace: str) -> list[str]:
    listing = json.loads(client.CoreV1Api(admin).list_namespaced_event(namespace, _preload_content=False).data)
    return [e.get("message") or "" for e in listing["items"]]


# ---------------------------------------------------------------- the operator and the proxy


def proxy_for(installed: Installed) -> FaultProxy:
    cp = installed.cp
    return FaultProxy(cp.url, str(cp.pki.ca.cert))  # `with` starts and stops it


def evictions(proxy: FaultProxy) -> list[Any]:
    return proxy.requests("POST", r"^/api/v1/namespaces/[^/]+/pods/[^/]+/eviction$")


def operator_env(
    installed: Installed, server: str | None = None, webhook: bool = False, **extra: str
) -> dict[str, str]:
    """The operator's environment: its own ServiceAccount's kubeconfig (`server`: e.g. the fault proxy),
    and with `webhook` its TLS admission webhook where the chart's webhook configuration points."""
    env = {
        "KUBECONFIG": str(installed.operator_kubeconfig(server)),
        "GLUON_SCANNING": "off",
        "GLUON_METRICS_PORT": "0",
        "GLUON_WATCH_TIMEOUT": "20",
        "GLUON_AGENT_IMAGE": AGENT_IMAGE,
        "GLUON_NAMESPACE": installed.namespace,  # where the chart lets it ask about fileKeyRef (apiserver.py)
    }
    if webhook:
        env.update(
            GLUON_WEBHOOK_CERT=str(installed.webhook_tls.cert),
            GLUON_WEBHOOK_KEY=str(installed.webhook_tls.key),
            GLUON_WEBHOOK_ADDR="127.0.0.1",
            GLUON_WEBHOOK_PORT=str(installed.webhook_port),
        )
    return env | extra


@contextmanager
def kopf_operator(
    monkeypatch: Any,
    installed: Installed,
    namespace: str,
    server: str | None = None,
    webhook: bool = False,
    timeout: float = 120,
    **extra: str,
) -> Iterator[Any]:
    """The operator's handlers under KopfRunner, watching `namespace`'s rollouts; rollouts are deleted before
    it stops (see delete_rollouts)."""
    from kopf.testing import KopfRunner
    from kubernetes.config import kube_config

    env = operator_env(installed, server, webhook, **extra)
    monkeypatch.delenv("GLUON_API_URL", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    # The kubernetes client reads KUBECONFIG once, when it is imported: point its default there too.
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", env["KUBECONFIG"])
    with KopfRunner(
        ["run", "-m", "gluon_operator.handlers", "--standalone", "--namespace", namespace], timeout=timeout
    ) as runner:
        try:
            yield runner
        finally:
            delete_rollouts(installed.cp.admin_client(), namespace)
    assert runner.exception is None, runner.output[-3000:]


# ---------------------------------------------------------------- the kubelet's report of the preflight (SIMULATION)


class PreflightReporter(Background):
    """SIMULATION of a kubelet running the injected init containers, for tests that need only the
    preflight's verdict: for each pod the webhook injected, once it is bound to a node, it writes through
    pods/status (admin credentials: the kubelet's write, not the operator's nor an agent's) what a kubelet
    reports when the init containers completed and the serving container runs, with the preflight's
    termination message. The verdict is what the node's agent answers (flag 1 when the operator enabled the
    node and its self-test passed, as decisions.decide), unless `refuse` names the node: then the serving
    image's own stack says 0 with that reason, as the real preflight does. It also stands in for the nodes'
    agents' observers (SIMULATION): each node with reported pods gets the delivery annotation its agent would
    publish when every injected serving process runs the flag its preflight chose (tests.objects.observed),
    unless `runs` names the pod: then its process runs that raw value."""

    def __init__(self, admin: client.ApiClient, namespace: str, interval: float = 0.2) -> None:
        super().__init__(("preflight-reporter", self._run))
        self.core = client.CoreV1Api(admin)
        self.namespace, self.interval = namespace, interval
        self.refuse: dict[str, str] = {}
        self.flags: dict[str, str] = {}  # node -> the flag its latest reported pod got
        self.reported: set[str] = set()
        self.errors: list[str] = []
        self.runs: dict[str, str] = {}  # pod name -> the raw value its serving process runs instead
        self.observed: dict[str, str] = {}  # node -> the delivery annotation last written

    def agent_answer(self, node: dict[str, Any]) -> dict[str, Any]:
        labels = node["metadata"].get("labels") or {}
        enabled = labels.get(contract.LABEL_ENABLED) == "true"
        on = enabled and labels.get(contract.LABEL_SELFTEST) == "pass"
        return {
            "flag": "1" if on else "0",
            "current": True,
            "enabled": enabled,
            "reason": "enabled by the operator and the self-test passed"
            if on
            else "the operator has not enabled this node",
        }

    def verdict(self, node: dict[str, Any]) -> dict[str, Any]:
        answer = self.agent_answer(node)
        refusal = self.refuse.get(node["metadata"]["name"])
        if refusal is not None:
            return {"flag": "0", "reason": refusal, "agent": answer}
        reason = "this image is capable" if answer["flag"] == "1" else f"agent says 0: {answer['reason']}"
        return {"flag": answer["flag"], "reason": reason, "agent": answer}

    def _run(self) -> None:
        while not self.stop_event.is_set():
            try:
                pods = json.loads(self.core.list_namespaced_pod(self.namespace, _preload_content=False).data)["items"]
                for pod in pods:
                    self._consider(pod)
                self._observe()
            except Exception as exc:  # a pod deleted meanwhile: reported, the next tick goes on
                self.errors.append(repr(exc))
            self.stop_event.wait(self.interval)

    def _observe(self) -> None:
        """Each node's delivery annotation, as its agent would publish it for the pods reported there."""
        from tests.objects import observed

        pods = json.loads(self.core.list_namespaced_pod(self.namespace, _preload_content=False).data)["items"]
        running = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
        for node in sorted({p["spec"].get("nodeName") for p in running} - {None}):
            value = observed(node, running, self.runs)
            if self.observed.get(node) != value:
                body = {"metadata": {"annotations": {contract.ANNOTATION_DELIVERY: value}}}
                self.core.patch_node(node, body, _content_type=MERGE, _preload_content=False)
                self.observed[node] = value

    def _consider(self, pod: dict[str, Any]) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        if (
            contract.ANNOTATION_POD_INJECTED not in (meta.get("annotations") or {})
            or not spec.get("nodeName")
            or meta.get("deletionTimestamp")
            or meta["uid"] in self.reported
        ):
            return
        node = json.loads(self.core.read_node(spec["nodeName"], _preload_content=False).data)
        verdict = self.verdict(node)
        self.core.patch_namespaced_pod_status(
            meta["name"],
            self.namespace,
            {"status": self.status(pod, node, json.dumps(verdict))},
            _content_type=STRATEGIC,
            _preload_content=False,
        )
        self.reported.add(meta["uid"])
        self.flags[spec["nodeName"]] = verdict["flag"]

    @staticmethod
    def status(pod: dict[str, Any], node: dict[str, Any], message: str) -> dict[str, Any]:
        """As kwok's pod-ready stage reports a started pod, with the preflight's termination message."""
        now = iso_now()
        host = next(
            (a["address"] for a in node["status"].get("addresses") or [] if a["type"] == "InternalIP"), "127.0.0.1"
        )
        init = [
            {
                "name": c["name"],
                "image": c["image"],
                "imageID": "",
                "ready": True,
                "restartCount": 0,
                "state": {
                    "terminated": {
                        "exitCode": 0,
                        "reason": "Completed",
                        "startedAt": now,
                        "finishedAt": now,
                        **({"message": message} if c["name"] == PREFLIGHT_CONTAINER else {}),
                    }
                },
            }
            for c in pod["spec"].get("initContainers") or []
        ]
        containers = [
            {
                "name": c["name"],
                "image": c["image"],
                "imageID": "",
                "ready": True,
                "restartCount": 0,
                "started": True,
                "state": {"running": {"startedAt": now}},
            }
            for c in pod["spec"]["containers"]
        ]
        return {
            "phase": "Running",
            "startTime": now,
            "hostIP": host,
            "hostIPs": [{"ip": host}],
            "conditions": [
                {"type": t, "status": "True", "lastTransitionTime": now}
                for t in ("Initialized", "Ready", "ContainersReady")
            ],
            "initContainerStatuses": init,
            "containerStatuses": containers,
        }


def finish(core: Any, custom: Any, namespace: str, name: str = "kimi") -> None:
    """Remove a test's rollout while its operator still runs (it takes its finalizer off), then its namespace."""
    custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    wait_for(
        lambda: not custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"],
        timeout=60,
        what="the rollout gone",
    )
    core.delete_namespace(namespace)
