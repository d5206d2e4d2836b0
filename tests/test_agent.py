"""The agent daemon on the real control plane: its own ServiceAccount's token bound to its DaemonSet pod on
its node (so the API server's admission policy holds it to its own node's keys), talking through the fault
proxy that counts its writes and injects faults. The self-test results come from a SIMULATION file (no
AMD GPU exists here). A real Prometheus scrapes real agents through the chart's PodMonitor in
tests/test_cluster_monitoring.py."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

import pytest
from kubernetes import client

from gluon_common import contract
from gluon_localcluster.fakes.simulated import agent_arguments, simulated_node
from gluon_localcluster.faultproxy import FaultProxy, Rule, path_is
from gluon_localcluster.install import Installed
from gluon_localcluster.processes import python_env
from tests.clusterkit import MERGE, Nodes, api_for, proxy_for
from tests.helpers import http_json, running_agent, wait_for

OTHER_LABEL = "kubernetes.io/hostname"
N1, N2 = "agt-n1", "agt-n2"


@pytest.fixture(scope="module")
def nodes(installed):
    made = Nodes(installed, "agt")
    try:
        for index, short in enumerate(("n1", "n2"), start=340):
            made.create(short, index)
        made.wait_for_agents()
        yield made
    finally:
        made.delete()


@dataclass
class Api:
    """The agent's side (`kubeconfig`: n1's agent through `proxy`) and what a person or the operator does."""

    nodes: Nodes
    proxy: FaultProxy
    installed: Installed

    @property
    def kubeconfig(self):
        return self.installed.agent_kubeconfig(N1, server=self.proxy.url)

    def node(self, name=N1):
        return self.nodes.read(name)

    def patch_as(self, api_client, name, labels=None, annotations=None):
        meta = {k: v for k, v in (("labels", labels), ("annotations", annotations)) if v}
        client.CoreV1Api(api_client).patch_node(name, {"metadata": meta}, _content_type=MERGE)

    def by_person(self, name=N1, **meta):
        self.patch_as(self.installed.cp.admin_client(), name, **meta)

    def by_operator(self, name=N1, **meta):
        self.patch_as(api_for(self.installed.operator_kubeconfig()), name, **meta)


@pytest.fixture
def api(nodes, installed):
    nodes.reset()  # no key of ours left from an earlier test
    with proxy_for(installed) as proxy:
        yield Api(nodes, proxy, installed)


def write_sim(path, **kwargs):
    path.write_text(json.dumps(simulated_node(**kwargs)))
    return path


@pytest.fixture
def sim(tmp_path):
    return write_sim(tmp_path / "sim.json")


def labels(api, name=N1):
    return api.node(name)["metadata"].get("labels", {})


def annotations(api, name=N1):
    return api.node(name)["metadata"].get("annotations", {})


def report(api, name=N1):
    return json.loads(annotations(api, name)[contract.ANNOTATION_REPORT])


def trigger(api, name=N1):
    return (report(api, name)["selftest"] or {}).get("trigger")


def runs(agent, result=None):
    samples = [s for m in agent.metrics.runs.collect() for s in m.samples if s.name.endswith("_total")]
    return sum(s.value for s in samples if result is None or s.labels["result"] == result)


def writes(api, name=None):
    """The agent's writes to nodes, as the proxy saw them."""
    return [
        r
        for r in api.proxy.seen
        if r.method in ("PATCH", "PUT", "POST", "DELETE")
        and r.path.startswith("/api/v1/nodes")
        and (name is None or r.path.split("/")[4] == name)
    ]


def test_first_publish_and_only_own_node(api, sim):
    with running_agent(api.kubeconfig, N1, sim) as agent:
        wait_for(lambda: labels(api).get(contract.LABEL_SELFTEST) == "pass", what="selftest=pass")
        got = labels(api)
        assert got[contract.LABEL_CAPABLE] == "true" and got[contract.LABEL_GPU_ARCH] == "gfx950"
        assert got[OTHER_LABEL] == N1  # a key that is not ours stays
        body = report(api)
        assert body["verdict"] == "pass" and body["fingerprint"] == agent.fingerprint
        assert body["selftest"]["trigger"] == "start" and body["selftest"]["simulated"] is True
        assert set(annotations(api)[contract.ANNOTATION_OWNED_KEYS].split(",")) == {
            contract.LABEL_CAPABLE,
            contract.LABEL_SELFTEST,
            contract.LABEL_GPU_ARCH,
            contract.ANNOTATION_REPORT,
            contract.ANNOTATION_DELIVERY,  # what it sees its node's serving processes run: none run here
        }
        delivery = json.loads(annotations(api)[contract.ANNOTATION_DELIVERY])
        assert delivery["available"] is True and delivery["containers"] == []
        assert http_json(agent.url + "/readyz")[0] == 200 and http_json(agent.url + "/healthz")[0] == 200
        time.sleep(0.5)  # a settled agent writes nothing more
        settled = len(writes(api))
        time.sleep(0.5)
        assert len(writes(api)) == settled
    assert writes(api) and all(r.path == f"/api/v1/nodes/{N1}" and r.status == 200 for r in writes(api)), (
        "the agent wrote another node"
    )
    other = api.node(N2)["metadata"]
    assert not [k for k in {**other.get("labels", {}), **other.get("annotations", {})} if contract.is_ours(k)]


def test_stale_owned_keys_removed_and_others_kept(api, sim, installed):
    old = contract.PREFIX + "retired-key"
    # An earlier agent version published `old` (with its own token); the operator enabled the node.
    api.patch_as(
        api_for(installed.agent_kubeconfig(N1)),
        N1,
        labels={old: "x"},
        annotations={contract.ANNOTATION_OWNED_KEYS: ",".join([old, contract.LABEL_CAPABLE, contract.LABEL_ENABLED])},
    )
    api.by_operator(labels={contract.LABEL_ENABLED: "true"})
    with running_agent(api.kubeconfig, N1, sim):
        wait_for(lambda: old not in labels(api), what="stale key removed")
        assert labels(api)[contract.LABEL_ENABLED] == "true"  # the operator's key is never the agent's to remove
        assert labels(api)[OTHER_LABEL] == N1


def test_self_heals_a_label_a_person_changed(api, sim):
    with running_agent(api.kubeconfig, N1, sim):
        wait_for(lambda: labels(api).get(contract.LABEL_SELFTEST) == "pass")
        api.by_person(labels={contract.LABEL_SELFTEST: "hacked"})
        wait_for(lambda: labels(api).get(contract.LABEL_SELFTEST) == "pass", what="label restored")


def test_retest_triggers(api, tmp_path):
    sim = write_sim(tmp_path / "sim.json")
    with running_agent(api.kubeconfig, N1, sim, probe_interval=0.2, period=3600) as agent:
        wait_for(lambda: runs(agent) == 1 and labels(api).get(contract.LABEL_SELFTEST) == "pass")
        first = report(api)["fingerprint"]

        write_sim(sim, driver="6.99.0")  # a driver update changes the fingerprint
        wait_for(
            lambda: report(api)["fingerprint"] != first and trigger(api) == "fingerprint changed",
            what="re-test on fingerprint change",
        )
        assert runs(agent) == 2

        api.by_person(annotations={contract.ANNOTATION_SELFTEST_REQUEST: "2026-11-29T10.00.00Z"})
        wait_for(lambda: trigger(api) == "requested", what="re-test on request")
        assert runs(agent) == 3

        api.by_person(
            annotations={contract.ANNOTATION_SELFTEST_REQUEST: "please run it now!"}
        )  # malformed: logged, counted, ignored
        wait_for(lambda: agent.metrics.malformed.labels(contract.ANNOTATION_SELFTEST_REQUEST)._value.get() == 1)
        time.sleep(0.5)
        assert runs(agent) == 3


def test_periodic_retest(api, sim):
    with running_agent(api.kubeconfig, N1, sim, period=0.4, jitter=0.0) as agent:
        wait_for(lambda: runs(agent) >= 3, timeout=10, what="periodic runs")
        assert trigger(api) == "periodic"


def test_deferral_keeps_the_verdict_and_backs_off(api, tmp_path):
    sim = write_sim(tmp_path / "sim.json")
    with running_agent(api.kubeconfig, N1, sim, retry_base=0.2) as agent:
        wait_for(lambda: labels(api).get(contract.LABEL_SELFTEST) == "pass")
        spec = simulated_node()
        spec["selftest"]["result"] = "deferred"
        sim.write_text(json.dumps(spec))
        api.by_person(annotations={contract.ANNOTATION_SELFTEST_REQUEST: "t1"})
        wait_for(lambda: runs(agent, "deferred") >= 3, timeout=10, what="deferred retries")
        assert labels(api)[contract.LABEL_SELFTEST] == "pass"  # never replaced by 'deferred'
        assert report(api)["last_attempt"]["result"] == "deferred"
        assert agent.schedule.deferrals >= 3


def test_first_verdict_deferred_is_published_as_deferred(api, tmp_path):
    spec = simulated_node()
    spec["selftest"]["result"] = "deferred"
    sim = tmp_path / "sim.json"
    sim.write_text(json.dumps(spec))
    with running_agent(api.kubeconfig, N1, sim, retry_base=5):
        wait_for(lambda: labels(api).get(contract.LABEL_SELFTEST) == "deferred")


def test_decision_endpoint(api, sim):
    with running_agent(api.kubeconfig, N1, sim) as agent:
        wait_for(lambda: labels(api).get(contract.LABEL_SELFTEST) == "pass")
        status, answer = wait_for(
            lambda: (r := http_json(agent.url + contract.DECISION_PATH)) and r[0] == 200 and r, what="current view"
        )
        assert answer["flag"] == "0" and "has not enabled" in answer["reason"]

        api.by_operator(labels={contract.LABEL_ENABLED: "true", contract.LABEL_STATE: "Enabling"})
        status, answer = wait_for(lambda: (r := http_json(agent.url + contract.DECISION_PATH))[1]["flag"] == "1" and r)
        assert status == 200 and answer["state"] == "Enabling" and answer["enabled"] is True

        api.by_operator(labels={contract.LABEL_ENABLED: "false", contract.LABEL_STATE: "Disabled"})
        wait_for(lambda: http_json(agent.url + contract.DECISION_PATH)[1]["flag"] == "0")

        started = time.monotonic()
        http_json(agent.url + contract.DECISION_PATH)
        assert time.monotonic() - started < 1.0


def test_decision_without_a_current_view(api, sim):
    api.proxy.rules.append(Rule(path_is(r"^/api/v1/nodes", method="GET"), status=503))
    with running_agent(api.kubeconfig, N1, sim, max_view_age=0.5) as agent:
        status, answer = http_json(agent.url + contract.DECISION_PATH)
        assert status == 503 and answer["flag"] == "0" and answer["current"] is False
        assert "no current view" in answer["reason"]
        wait_for(lambda: agent.metrics.api_errors.labels("server")._value.get() >= 1)
    assert api.proxy.requests("GET", r"^/api/v1/nodes") and all(
        r.status == 503 for r in api.proxy.requests("GET", r"^/api/v1/nodes")
    )


def planned_faults(statuses: list[int], method: str, pattern: str) -> list[Rule]:
    """Rules answering the matching requests with `statuses`, in order, once each; then the API server answers."""
    plan, regex = list(statuses), re.compile(pattern)

    def next_is(status: int):
        def match(m: str, path: str, _query: str) -> bool:
            if m == method and regex.search(path) and plan and plan[0] == status:
                plan.pop(0)
                return True
            return False

        return match

    return [Rule(next_is(status), status=status) for status in sorted(set(statuses))]


def test_conflicts_and_server_errors_are_retried(api, sim):
    api.proxy.rules.extend(planned_faults([409, 409, 500, 502], "PATCH", r"^/api/v1/nodes/"))
    with running_agent(api.kubeconfig, N1, sim) as agent:
        wait_for(lambda: labels(api).get(contract.LABEL_SELFTEST) == "pass", what="publish despite faults")
        assert agent.metrics.api_errors.labels("conflict")._value.get() == 2
        assert agent.metrics.api_errors.labels("server")._value.get() == 2
    assert [r.status for r in writes(api)][:5] == [409, 409, 500, 502, 200]


def test_sigterm_exits_cleanly(api, sim, installed):
    env = python_env(NODE_NAME=N1)  # this checkout's packages: the simulated source is the harness's
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gluon_agent",
            "run",
            "--kubeconfig",
            str(installed.agent_kubeconfig(N1)),
            *agent_arguments(sim),
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--tick",
            "0.1",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for(
            lambda: labels(api).get(contract.LABEL_SELFTEST) == "pass", timeout=30, what="subprocess agent published"
        )
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=10)
    finally:
        proc.kill()
    assert proc.returncode == 0, out
    assert "signal SIGTERM: stopping" in out and "agent stopped" in out


def test_run_needs_a_node_name():
    env = {k: v for k, v in os.environ.items() if k != "NODE_NAME"}
    done = subprocess.run(
        [sys.executable, "-m", "gluon_agent", "run"], env=env, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 2 and "no node name" in done.stderr
