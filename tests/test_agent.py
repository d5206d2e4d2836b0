"""The agent daemon against the API emulator over real HTTP with the real Kubernetes client, and a real
Prometheus scraping it. The self-test results come from a SIMULATION file (no AMD GPU exists here)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from gluon_agent import contract
from gluon_agent.sources import simulated_node
from tests.apiserver import ApiServerThread
from tests.helpers import NODES, http_json, http_text, prometheus, running_agent, wait_for

OTHER_LABEL = "kubernetes.io/hostname"


@pytest.fixture
def api():
    with ApiServerThread() as server:
        for name in ("n1", "n2"):
            server.call(lambda name=name: server.server.put_object(NODES, {"metadata": {"name": name, "labels": {OTHER_LABEL: name}}}))
        yield server


def write_sim(path, **kwargs):
    path.write_text(json.dumps(simulated_node(**kwargs)))
    return path


@pytest.fixture
def sim(tmp_path):
    return write_sim(tmp_path / "sim.json")


def node(api, name="n1"):
    return api.call(lambda: api.server.get_object(NODES, None, name))


def labels(api, name="n1"):
    return node(api, name)["metadata"].get("labels", {})


def annotations(api, name="n1"):
    return node(api, name)["metadata"].get("annotations", {})


def report(api, name="n1"):
    return json.loads(annotations(api, name)[contract.ANNOTATION_REPORT])


def trigger(api, name="n1"):
    return (report(api, name)["selftest"] or {}).get("trigger")


def annotate(api, key, value, name="n1"):
    def apply():
        obj = api.server.get_object(NODES, None, name)
        obj["metadata"].setdefault("annotations", {})[key] = value
        api.server._replace(NODES, (NODES, None, name), obj, None, None)
    api.call(apply)


def set_labels(api, values, name="n1"):
    def apply():
        obj = api.server.get_object(NODES, None, name)
        obj["metadata"].setdefault("labels", {}).update(values)
        api.server._replace(NODES, (NODES, None, name), obj, None, None)
    api.call(apply)


def runs(agent, result=None):
    samples = [s for m in agent.metrics.runs.collect() for s in m.samples if s.name.endswith("_total")]
    return sum(s.value for s in samples if result is None or s.labels["result"] == result)


def writes(api, name=None):
    return [r for r in api.server.requests_for(NODES) if r.method.value in ("PATCH", "PUT", "POST", "DELETE")
            and (name is None or r.name == name)]


def test_first_publish_and_only_own_node(api, sim):
    with running_agent(api.url, "n1", sim) as agent:
        wait_for(lambda: labels(api).get(contract.LABEL_SELFTEST) == "pass", what="selftest=pass")
        got = labels(api)
        assert got[contract.LABEL_CAPABLE] == "true" and got[contract.LABEL_GPU_ARCH] == "gfx950"
        assert got[OTHER_LABEL] == "n1"  # a key that is not ours stays
        body = report(api)
        assert body["verdict"] == "pass" and body["fingerprint"] == agent.fingerprint
        assert body["selftest"]["trigger"] == "start" and body["selftest"]["simulated"] is True
        assert set(annotations(api)[contract.ANNOTATION_OWNED_KEYS].split(",")) == {
            contract.LABEL_CAPABLE, contract.LABEL_SELFTEST, contract.LABEL_GPU_ARCH, contract.ANNOTATION_REPORT}
        assert http_json(agent.url + "/readyz")[0] == 200 and http_json(agent.url + "/healthz")[0] == 200
        time.sleep(0.5)  # a settled agent writes nothing more
        settled = len(writes(api))
        time.sleep(0.5)
        assert len(writes(api)) == settled
    assert writes(api) and all(r.name == "n1" for r in writes(api)), "the agent wrote another node"
    assert node(api, "n2")["metadata"].get("annotations") is None


def test_stale_owned_keys_removed_and_others_kept(api, sim):
    old = contract.PREFIX + "retired-key"
    set_labels(api, {old: "x", contract.LABEL_ENABLED: "true"})
    annotate(api, contract.ANNOTATION_OWNED_KEYS, ",".join([old, contract.LABEL_CAPABLE, contract.LABEL_ENABLED]))
    with running_agent(api.url, "n1", sim):
        wait_for(lambda: old not in labels(api), what="stale key removed")
        assert labels(api)[contract.LABEL_ENABLED] == "true"  # the operator's key is never the agent's to remove
        assert labels(api)[OTHER_LABEL] == "n1"


def test_self_heals_a_label_a_person_changed(api, sim):
    with running_agent(api.url, "n1", sim):
        wait_for(lambda: labels(api).get(contract.LABEL_SELFTEST) == "pass")
        set_labels(api, {contract.LABEL_SELFTEST: "hacked"})
        wait_for(lambda: labels(api).get(contract.LABEL_SELFTEST) == "pass", what="label restored")


def test_retest_triggers(api, tmp_path):
    sim = write_sim(tmp_path / "sim.json")
    with running_agent(api.url, "n1", sim, probe_interval=0.2, period=3600) as agent:
        wait_for(lambda: runs(agent) == 1 and labels(api).get(contract.LABEL_SELFTEST) == "pass")
        first = report(api)["fingerprint"]

        write_sim(sim, driver="6.99.0")  # a driver update changes the fingerprint
        wait_for(lambda: report(api)["fingerprint"] != first and trigger(api) == "fingerprint changed",
                 what="re-test on fingerprint change")
        assert runs(agent) == 2

        annotate(api, contract.ANNOTATION_SELFTEST_REQUEST, "2026-11-29T10.00.00Z")
        wait_for(lambda: trigger(api) == "requested", what="re-test on request")
        assert runs(agent) == 3

        annotate(api, contract.ANNOTATION_SELFTEST_REQUEST, "please run it now!")  # malformed: logged, counted, ignored
        wait_for(lambda: agent.metrics.malformed.labels(contract.ANNOTATION_SELFTEST_REQUEST)._value.get() == 1)
        time.sleep(0.5)
        assert runs(agent) == 3


def test_periodic_retest(api, sim):
    with running_agent(api.url, "n1", sim, period=0.4, jitter=0.0) as agent:
        wait_for(lambda: runs(agent) >= 3, timeout=10, what="periodic runs")
        assert trigger(api) == "periodic"


def test_deferral_keeps_the_verdict_and_backs_off(api, tmp_path):
    sim = write_sim(tmp_path / "sim.json")
    with running_agent(api.url, "n1", sim, retry_base=0.2) as agent:
        wait_for(lambda: labels(api).get(contract.LABEL_SELFTEST) == "pass")
        spec = simulated_node()
        spec["selftest"]["result"] = "deferred"
        sim.write_text(json.dumps(spec))
        annotate(api, contract.ANNOTATION_SELFTEST_REQUEST, "t1")
        wait_for(lambda: runs(agent, "deferred") >= 3, timeout=10, what="deferred retries")
        assert labels(api)[contract.LABEL_SELFTEST] == "pass"  # never replaced by 'deferred'
        assert report(api)["last_attempt"]["result"] == "deferred"
        assert agent.schedule.deferrals >= 3


def test_first_verdict_deferred_is_published_as_deferred(api, tmp_path):
    spec = simulated_node()
    spec["selftest"]["result"] = "deferred"
    sim = tmp_path / "sim.json"
    sim.write_text(json.dumps(spec))
    with running_agent(api.url, "n1", sim, retry_base=5):
        wait_for(lambda: labels(api).get(contract.LABEL_SELFTEST) == "deferred")


def test_decision_endpoint(api, sim):
    with running_agent(api.url, "n1", sim) as agent:
        wait_for(lambda: labels(api).get(contract.LABEL_SELFTEST) == "pass")
        status, answer = wait_for(lambda: (r := http_json(agent.url + contract.DECISION_PATH)) and r[0] == 200 and r, what="current view")
        assert answer["flag"] == "0" and "has not enabled" in answer["reason"]

        set_labels(api, {contract.LABEL_ENABLED: "true", contract.LABEL_STATE: "Enabling"})
        status, answer = wait_for(lambda: (r := http_json(agent.url + contract.DECISION_PATH))[1]["flag"] == "1" and r)
        assert status == 200 and answer["state"] == "Enabling" and answer["enabled"] is True

        set_labels(api, {contract.LABEL_ENABLED: "false", contract.LABEL_STATE: "Disabled"})
        wait_for(lambda: http_json(agent.url + contract.DECISION_PATH)[1]["flag"] == "0")

        started = time.monotonic()
        http_json(agent.url + contract.DECISION_PATH)
        assert time.monotonic() - started < 1.0


def test_decision_without_a_current_view(api, sim):
    api.server.faults.append(lambda r: 503 if r.resource is not None and r.resource.plural == "nodes" and r.method.value == "GET" else None)
    with running_agent(api.url, "n1", sim, max_view_age=0.5) as agent:
        status, answer = http_json(agent.url + contract.DECISION_PATH)
        assert status == 503 and answer["flag"] == "0" and answer["current"] is False
        assert "no current view" in answer["reason"]
        wait_for(lambda: agent.metrics.api_errors.labels("server")._value.get() >= 1)


def test_conflicts_and_server_errors_are_retried(api, sim):
    plan = iter([409, 409, 500, 502])

    def flaky(request):
        if request.method.value == "PATCH" and request.resource is not None and request.resource.plural == "nodes":
            return next(plan, None)
        return None

    api.server.faults.append(flaky)
    with running_agent(api.url, "n1", sim) as agent:
        wait_for(lambda: labels(api).get(contract.LABEL_SELFTEST) == "pass", what="publish despite faults")
        assert agent.metrics.api_errors.labels("conflict")._value.get() == 2
        assert agent.metrics.api_errors.labels("server")._value.get() == 2


def test_sigterm_exits_cleanly(api, sim):
    env = dict(os.environ, NODE_NAME="n1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gluon_agent", "run", "--api-url", api.url, "--simulate", str(sim),
         "--host", "127.0.0.1", "--port", "0", "--tick", "0.1"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        wait_for(lambda: labels(api).get(contract.LABEL_SELFTEST) == "pass", what="subprocess agent published")
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=10)
    finally:
        proc.kill()
    assert proc.returncode == 0, out
    assert "signal SIGTERM: stopping" in out and "agent stopped" in out


def test_run_needs_a_node_name():
    env = {k: v for k, v in os.environ.items() if k != "NODE_NAME"}
    done = subprocess.run([sys.executable, "-m", "gluon_agent", "run"], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and "no node name" in done.stderr


def test_prometheus_scrapes_the_agent(api, sim):
    with running_agent(api.url, "n1", sim) as agent:
        wait_for(lambda: labels(api).get(contract.LABEL_SELFTEST) == "pass")
        text = http_text(agent.url + "/metrics")
        assert contract.M_AGENT_CAPABLE in text
        target = agent.url.removeprefix("http://")
        with prometheus({"gluon-agent": [target]}) as prom:
            capable = wait_for(lambda: prom.query(contract.M_AGENT_CAPABLE), timeout=30, what="scraped series")
            assert capable[0]["value"][1] == "1"
            results = prom.query(f'{contract.M_AGENT_SELFTEST_RESULT}{{result="pass"}} == 1')
            assert {(r["metric"]["gpu"], r["metric"]["path"]) for r in results} == {
                (str(i), p) for i in range(8) for p in ("accelerated", "fallback")}
            speedup = prom.query(f'{contract.M_AGENT_SPEEDUP}{{gpu="0",case="long-b1-128k"}}')
            assert float(speedup[0]["value"][1]) == pytest.approx(2.3)
            info = prom.query(f'{contract.M_AGENT_INFO}_info')
            assert info[0]["metric"]["arch"] == "gfx950" and info[0]["metric"]["fingerprint"] == agent.fingerprint
            assert prom.query(f'{contract.M_AGENT_RUNS}_total{{result="pass"}}')[0]["value"][1] == "1"
