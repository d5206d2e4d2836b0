"""`kubectl gluon`: the pure parts (the status table, the explain record, the patches each control sends,
rollout selection, error wording, argument parsing) over objects as the agent and operator write them;
then every command end to end against the real API server (localcluster) with the real operator running."""

from __future__ import annotations

import json
import os
import re
import time
import tomllib
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gluon_common import contract
from gluon_operator.kubectl_plugin import cli, controls, views
from gluon_operator.kubectl_plugin.views import PluginError
from gluon_operator.spec import GROUP, PLURAL, VERSION
from tests.helpers import wait_for
from tests.objects import AGENT_LABELS, SERVING_NS, agent_pod, gpu_node, observed, rollout, serving_pod

ROOT = Path(__file__).resolve().parent.parent
NOW = 2_000_000_000.0


def with_status(body: dict, **status) -> dict:
    return {**body, "metadata": {**body["metadata"], "resourceVersion": "42"}, "status": status}


def record(state: str, reason: str = "", **numbers) -> dict:
    return {
        "state": state,
        "reason": reason,
        "since": NOW - 60,
        "fingerprint": "fp",
        "changedAt": NOW - 60,
        "holdout": False,
        "numbers": numbers,
    }


def labelled(pod: dict, flag: str | None) -> dict:
    if flag is not None:
        pod["metadata"]["labels"][contract.LABEL_POD_FLAG] = flag
    return pod


ROLLOUT = with_status(
    rollout(),
    phase="Progressing",
    counts={"Promoted": 1, "Analyzing": 1, "RolledBack": 1, "Eligible": 0},
    nodes={
        "gpu-02": record("RolledBack", "decode speed worse than tolerance", effect=0.858, ci_low=0.839, ci_high=0.9),
        "gpu-01": record("Promoted", "not worse than tolerance", effect=2.28),
        "gpu-03": dict(record("Eligible", "holdout: control group kept at flag 0"), holdout=True),
        "gpu-04": record("Analyzing", "2 serving pods run with flag 1"),
    },
)
PODS = [
    labelled(serving_pod("gpu-01", 0), "1"),
    labelled(serving_pod("gpu-01", 1), "1"),
    labelled(serving_pod("gpu-02", 0), "0"),
    labelled(serving_pod("gpu-04", 0), "1"),
    labelled(serving_pod("gpu-04", 1), "0"),
    serving_pod("gpu-04", 2),
]


# ---------------------------------------------------------------- status


def enabled(name: str, value: str | None) -> dict:
    node = gpu_node(name)
    if value is not None:
        node["metadata"]["labels"][contract.LABEL_ENABLED] = value
    return node


NODES = [enabled("gpu-01", "true"), enabled("gpu-02", "false"), enabled("gpu-03", "false"), enabled("gpu-04", "true")]


def test_status_rows_carry_state_flag_effect_reason_per_node():
    rows = {r["node"]: r for r in views.status_rows(ROLLOUT, NODES, PODS)}
    assert list(rows) == ["gpu-01", "gpu-02", "gpu-03", "gpu-04"]
    assert rows["gpu-01"] == {
        "node": "gpu-01",
        "state": "Promoted",
        "holdout": False,
        "flag": "1",
        "pods": "1",
        "effect": 2.28,
        "interval": None,
        "since": "2033-05-18T03:32:20Z",
        "sinceUnix": NOW - 60,
        "fingerprint": "fp",
        "reason": "not worse than tolerance",
        "summary": "not worse than tolerance",
    }
    assert rows["gpu-02"]["interval"] == [0.839, 0.9]
    assert rows["gpu-02"]["flag"] == "0" and rows["gpu-02"]["pods"] == "0" and rows["gpu-02"]["effect"] == 0.858
    assert rows["gpu-03"]["holdout"] and rows["gpu-03"]["pods"] == "-" and rows["gpu-03"]["effect"] is None
    assert (
        rows["gpu-04"]["flag"] == "1" and rows["gpu-04"]["pods"] == "1 x1, 0 x1, ? x1"
    )  # a mix with counts; unlabelled as ?
    assert views.status_rows(ROLLOUT, [], PODS)[0]["flag"] == "-"  # a node without the operator's label


def test_status_reads_node_records_beyond_the_status():
    """Past 500 nodes the status holds only nodes needing attention: each node's record is on the Node."""
    body = with_status(rollout(), phase="Complete", nodes={})
    mine, other, broken = gpu_node("gpu-10"), gpu_node("gpu-11"), gpu_node("gpu-12")
    mine["metadata"]["annotations"][contract.ANNOTATION_NODE_RECORD] = json.dumps(
        {"rollout": f"{SERVING_NS}/kimi", **record("Promoted", "not worse than tolerance", effect=2.1)}
    )
    other["metadata"]["annotations"][contract.ANNOTATION_NODE_RECORD] = json.dumps(
        {"rollout": "elsewhere/other", **record("Promoted", "theirs")}
    )
    broken["metadata"]["annotations"][contract.ANNOTATION_NODE_RECORD] = "{not json"
    rows = views.status_rows(body, [mine, other, broken], [])
    assert [(r["node"], r["state"], r["effect"]) for r in rows] == [("gpu-10", "Promoted", 2.1)]


def test_status_ignores_pods_of_other_namespaces_selectors_and_unscheduled():
    other_ns = labelled(serving_pod("gpu-03", 0), "1")
    other_ns["metadata"]["namespace"] = "elsewhere"
    other_app = labelled(serving_pod("gpu-03", 1), "1")
    other_app["metadata"]["labels"]["app"] = "vllm"
    pending = labelled(serving_pod("gpu-03", 2), "1")
    del pending["spec"]["nodeName"]
    rows = {r["node"]: r for r in views.status_rows(ROLLOUT, NODES, [other_ns, other_app, pending])}
    assert rows["gpu-03"]["pods"] == "-"


def test_status_text_has_a_header_and_aligned_columns():
    view = views.status_view(with_status(ROLLOUT, **ROLLOUT["status"], approval={"waitingFor": "canary"}), NODES, PODS)
    text = views.render_status(view, NOW)
    lines = text.splitlines()
    assert lines[0] == f"GluonRollout {SERVING_NS}/kimi: Progressing (1 Promoted, 1 Analyzing, 1 RolledBack)"
    assert "waiting for approval of 'canary'" in lines[1]
    header = next(line for line in lines if line.startswith("NODE"))
    body = lines[lines.index(header) + 1 :]
    reason_at = header.index("REASON")
    assert [line[:6] for line in body] == ["gpu-01", "gpu-02", "gpu-03", "gpu-04"]
    assert body[1][reason_at:] == "decode speed worse than tolerance" and "x0.858" in body[1]
    assert "Eligible (holdout)" in body[2]
    assert body[0][header.index("IN STATE") :].startswith("60s")  # time in state, as kubectl prints ages


def test_status_before_the_first_reconcile_says_so():
    text = views.render_status(views.status_view(rollout(), [], []))
    assert "no status yet" in text and "no nodes recorded yet" in text


def test_status_json_names_paused_and_aborted():
    body = rollout(paused=True)
    body["metadata"]["annotations"] = {contract.ANNOTATION_ROLLOUT_ABORT: "bad driver"}
    view = views.status_view(body, [], [])
    assert view["paused"] is True and view["aborted"] == "bad driver"
    text = views.render_status(view)
    assert "paused" in text and "aborted: bad driver" in text
    assert "dry run" in views.render_status(views.status_view(rollout(dryRun=True), [], []))
    json.dumps(view)  # JSON-able for --json


@given(st.lists(st.lists(st.text(alphabet="abc xyz-.0123", max_size=12), min_size=3, max_size=3), max_size=8))
def test_table_columns_start_at_the_same_offset(rows):
    text = views.table(("A", "BB", "C"), rows)
    lines = text.split("\n")[:-1]
    assert len(lines) == len(rows) + 1
    widths = [max(len(str(r[i])) for r in [["A", "BB", "C"], *rows]) for i in range(3)]
    for line, row in zip(lines[1:], rows):
        padded = line.ljust(sum(widths) + 6)  # trailing blanks are trimmed, as kubectl does
        assert padded[: len(row[0])] == row[0]
        assert padded[widths[0] + 3 : widths[0] + 3 + len(row[1])] == row[1]
        assert padded[widths[0] + widths[1] + 6 :].rstrip() == row[2].rstrip()


# ---------------------------------------------------------------- explain


def explained(node: dict, agents: list | None = None, body: dict = ROLLOUT, pods: list = PODS) -> dict:
    return views.explain(body, node, pods, [agent_pod(node["metadata"]["name"])] if agents is None else agents, NOW)


def test_explain_an_eligible_node_gives_every_gpu_and_path():
    node = gpu_node("gpu-01")
    rec = explained(node)
    assert rec["eligibility"]["eligible"] and rec["eligibility"]["agentAlive"]
    assert rec["decision"]["state"] == "Promoted" and rec["analysis"] == {"effect": 2.28}
    gpus = rec["selftest"]["gpus"]
    report = json.loads(node["metadata"]["annotations"][contract.ANNOTATION_REPORT])
    assert len(gpus) == 2 * len(report["selftest"]["gpus"]) and {g["path"] for g in gpus} == {"accelerated", "fallback"}
    assert all(g["result"] == "pass" for g in gpus)
    speedups = [g["speedup"] for g in gpus if g["path"] == "accelerated"]
    assert speedups == [gpu["speedup"] for gpu in report["selftest"]["gpus"]] and speedups[0]
    text = views.render_explain(rec)
    every = [v for s in speedups for v in s.values()]
    assert f"accelerated over fallback x{min(every):.2f} to x{max(every):.2f}" in text
    assert views.rfc3339(report["selftest"]["tested_at"]) in text
    assert not rec["selftest"]["simulated"] and "SIMULATION" not in views.render_explain(rec)
    report["selftest"]["simulated"] = True  # the demo's agents say so, and so does explain
    node["metadata"]["annotations"][contract.ANNOTATION_REPORT] = json.dumps(report)
    assert "(SIMULATION)" in views.render_explain(explained(node))
    assert [p["flag"] for p in rec["pods"]] == ["1", "1"]
    json.dumps(rec)


def test_explain_and_status_say_what_the_serving_processes_run():
    """Per pod: what its preflight chose, what the agent saw its processes run; the rollout's delivery line."""
    node = gpu_node("gpu-01")
    pods = [serving_pod("gpu-01", i, flag="0") for i in range(2)]
    hostile = pods[1]["metadata"]["name"]
    node["metadata"]["annotations"][contract.ANNOTATION_DELIVERY] = observed("gpu-01", pods, runs={hostile: "1"})
    rec = explained(node, pods=pods)
    delivered = {p["name"]: (p["chose"], p["runs"], p["state"]) for p in rec["delivery"]["pods"]}
    assert delivered == {pods[0]["metadata"]["name"]: ("0", "0", "verified"), hostile: ("0", "1", "mismatch")}
    text = views.render_explain(rec)
    assert f"{hostile}: preflight chose 0, its processes run 1 (mismatch: container sglang" in text
    node["metadata"]["annotations"][contract.ANNOTATION_DELIVERY] = observed("gpu-01", pods, available=False)
    blind = explained(node, pods=pods)
    assert not blind["delivery"]["observable"] and "cannot observe" in views.render_explain(blind)
    view = {
        "namespace": SERVING_NS,
        "rollout": "kimi",
        "phase": "Progressing",
        "counts": {},
        "nodes": [],
        "delivery": {
            "mode": "shell",
            "reason": "auto: shell, as 1 of the rollout's nodes run a kubelet older than 1.35",
            "mismatched": [f"gpu-01/{hostile}: container sglang runs 1"],
            "mismatchedCount": 1,
        },
    }
    head = views.render_status(view, wide=True)
    assert "flag delivery: shell: auto: shell, as 1 of the rollout's nodes run a kubelet older than 1.35" in head
    assert f"flag delivery MISMATCH on 1 pod(s): gpu-01/{hostile}" in head


def test_explain_says_why_a_node_is_ineligible():
    failing = explained(gpu_node("gpu-08", fallback="fail"))
    assert not failing["eligibility"]["eligible"] and "fallback fail" in failing["eligibility"]["reason"]
    assert {g["result"] for g in failing["selftest"]["gpus"] if g["path"] == "fallback"} == {"fail"}
    assert any(g["reasons"] for g in failing["selftest"]["gpus"] if g["path"] == "fallback")
    no_agent = explained(gpu_node("gpu-05"), agents=[])
    assert not no_agent["eligibility"]["agentAlive"] and "no running, ready agent" in no_agent["eligibility"]["reason"]
    other_node_agent = explained(gpu_node("gpu-05"), agents=[agent_pod("gpu-06")])
    assert not other_node_agent["eligibility"]["agentAlive"]
    incapable = explained(gpu_node("gpu-07", capable=False))
    assert incapable["probe"]["capable"] is False and incapable["probe"]["missingForCapable"]
    assert "not capable" in views.render_explain(incapable)


def test_explain_shows_the_rollback_record_and_node_conditions():
    node = gpu_node("gpu-02")
    fp = json.loads(node["metadata"]["annotations"][contract.ANNOTATION_REPORT])["fingerprint"]
    node["metadata"]["annotations"][contract.ANNOTATION_ROLLBACK] = json.dumps(
        {"fingerprint": fp, "at": NOW - 30, "reason": "effect x0.858 below x0.95", "numbers": {"effect": 0.858}}
    )
    rec = explained(node)
    assert rec["rollback"]["reason"] == "effect x0.858 below x0.95" and rec["rollbackProblem"] is None
    assert not rec["eligibility"]["eligible"] and "rolled back for fingerprint" in rec["eligibility"]["reason"]
    node["metadata"]["labels"][contract.LABEL_SKIP] = "true"
    node["spec"] = {"unschedulable": True}
    node["status"] = {"conditions": [{"type": "Ready", "status": "False", "reason": "KubeletNotReady"}]}
    rec = explained(node)
    assert rec["eligibility"]["cordoned"] and rec["eligibility"]["ready"] is False and rec["eligibility"]["skip"]
    assert "cordoned" in rec["eligibility"]["held"]
    assert "skip" in rec["eligibility"]["reason"]  # a person's skip label comes first
    text = views.render_explain(rec)
    assert "cordoned" in text and "NotReady" in text and "skip label set" in text and "kubectl gluon retry" in text
    node["metadata"]["annotations"][contract.ANNOTATION_ROLLBACK] = "[]"
    assert "the rollback record annotation" in views.render_explain(explained(node))  # a bad record says so
    assert "x0.858: decode speed 14.2% below that of its controls, 95% interval x0.839 to x0.900" in text
    assert views.rfc3339(NOW) == "2033-05-18T03:33:20Z" and views.rfc3339(None) is None
    assert not re.search(r"\b1[0-9]{9}(\.[0-9]+)?\b", text)  # no epoch numbers


def test_explain_a_node_without_report_or_record():
    bare = {"metadata": {"name": "cpu-01", "labels": {}, "annotations": {}}}
    rec = explained(bare)
    assert rec["decision"] is None and rec["selftest"] is None and rec["probe"] is None
    assert rec["reportProblem"] == "the agent has published no report on this node"
    text = views.render_explain(rec)
    assert "none yet: the rollout has no record of this node" in text and "no report" in text


def test_agent_alive_needs_running_ready_and_not_deleting():
    assert views.agent_alive("n", [agent_pod("n")])
    assert not views.agent_alive("n", [agent_pod("n", ready=False)])
    deleting = agent_pod("n")
    deleting["metadata"]["deletionTimestamp"] = "2026-12-01T10:00:00Z"
    assert not views.agent_alive("n", [deleting])


# ---------------------------------------------------------------- controls


def test_pause_and_resume_patches():
    assert controls.pause(ROLLOUT) == {"spec": {"paused": True}}
    assert controls.resume(ROLLOUT) == {"spec": {"paused": False}}
    aborted = rollout()
    aborted["metadata"]["annotations"] = {contract.ANNOTATION_ROLLOUT_ABORT: "why"}
    assert controls.resume(aborted) == {
        "spec": {"paused": False},
        "metadata": {"annotations": {contract.ANNOTATION_ROLLOUT_ABORT: None}},
    }


def test_promote_grants_exactly_the_waiting_gate_at_the_version_read():
    waiting = with_status(rollout(), phase="Progressing", approval={"waitingFor": "batch zone-b"})
    assert controls.promote(waiting) == {
        "metadata": {"resourceVersion": "42", "annotations": {contract.ANNOTATION_ROLLOUT_APPROVE: "batch zone-b"}}
    }


@pytest.mark.parametrize(
    "status", [{}, {"phase": "Complete"}, {"phase": "Progressing", "approval": {"waitingFor": None}}]
)
def test_promote_with_nothing_waiting_names_the_rollout(status):
    with pytest.raises(
        PluginError, match=f"GluonRollout 'kimi' in namespace '{SERVING_NS}' is not waiting for approval"
    ):
        controls.promote(with_status(rollout(), **status))


def test_abort_records_a_reason():
    assert controls.abort(ROLLOUT, "driver 6.12 hangs") == {
        "metadata": {"annotations": {contract.ANNOTATION_ROLLOUT_ABORT: "driver 6.12 hangs"}}
    }
    assert (
        controls.abort(ROLLOUT, "  ")["metadata"]["annotations"][contract.ANNOTATION_ROLLOUT_ABORT]
        == controls.DEFAULT_ABORT_REASON
    )


def test_retry_clears_the_rollback_record_and_refuses_without_one():
    node = gpu_node("gpu-02")
    with pytest.raises(
        PluginError, match="node 'gpu-02' has no rollback record.*its state in GluonRollout 'kimi'.* is RolledBack"
    ):
        controls.retry(ROLLOUT, node)
    with pytest.raises(PluginError, match="node 'gpu-02' has no rollback record"):
        controls.retry(None, node)
    node["metadata"]["annotations"][contract.ANNOTATION_ROLLBACK] = json.dumps({"reason": "slow"})
    assert controls.retry(ROLLOUT, node) == {"metadata": {"annotations": {contract.ANNOTATION_ROLLBACK: None}}}
    assert controls.rollback_summary(node) == "slow"


# ---------------------------------------------------------------- the shell's pure parts


def test_rollout_selection_by_count():
    with pytest.raises(PluginError, match="no GluonRollout in namespace 'ml'"):
        cli.only_rollout([], "ml")
    with pytest.raises(PluginError, match=r"namespace 'ml' has 2 GluonRollouts \(a, b\): name one"):
        cli.only_rollout([rollout("b"), rollout("a")], "ml")
    assert cli.only_rollout([rollout("a")], "ml")["metadata"]["name"] == "a"


@pytest.mark.parametrize(
    "status,body,wording",
    [
        (
            404,
            json.dumps({"message": 'gluonrollouts.gluonrollout.io "x" not found'}),
            "GluonRollout 'x' in namespace 'ml' not found",
        ),
        (
            403,
            json.dumps({"message": "user cannot get"}),
            "forbidden: GluonRollout 'x' in namespace 'ml': user cannot get",
        ),
        (409, json.dumps({"message": "the object has been modified"}), "run the command again"),
        (500, "boom", "the API server answered 500: boom"),
    ],
)
def test_api_errors_name_the_object(status, body, wording):
    assert wording in cli.api_problem("GluonRollout 'x' in namespace 'ml'", status, body)


def test_flags_before_and_after_the_command():
    parser = cli.build_parser()
    before = parser.parse_args(["-n", "ml", "--json", "status", "kimi"])
    after = parser.parse_args(["status", "kimi", "-n", "ml", "--context", "prod"])
    assert (before.namespace, before.output, before.rollout) == ("ml", "json", "kimi")
    assert (after.namespace, after.context, after.output) == ("ml", "prod", None)
    watch = parser.parse_args(["status", "-w", "-A", "-o", "wide"])
    assert (watch.watch, watch.all_namespaces, watch.output) == (True, True, "wide")
    assert parser.parse_args(["-o", "yaml", "explain", "gpu-01"]).output == "yaml"
    retry = parser.parse_args(["retry", "gpu-02", "-r", "kimi"])
    assert (retry.node, retry.rollout, retry.agent_selector) == ("gpu-02", "kimi", cli.DEFAULT_AGENT_SELECTOR)
    assert parser.parse_args(["abort", "--reason", "hang"]).reason == "hang"
    assert cli.DEFAULT_AGENT_SELECTOR == ",".join(f"{k}={v}" for k, v in AGENT_LABELS.items())


def test_usage_errors_exit_2_and_config_errors_exit_1(tmp_path, capsys):
    with pytest.raises(SystemExit) as usage:
        cli.main(["explain"])  # NODE missing
    assert usage.value.code == 2
    assert cli.main(["--kubeconfig", str(tmp_path / "absent"), "status"]) == 1
    assert "cannot load the kubeconfig" in capsys.readouterr().err


def test_context_namespace_as_kubectl(tmp_path):
    config = tmp_path / "config"
    config.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "a",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [
                    {"name": "a", "context": {"cluster": "c", "user": "u", "namespace": "ml"}},
                    {"name": "b", "context": {"cluster": "c", "user": "u"}},
                ],
            }
        )
    )
    assert cli.context_namespace(str(config), None) == "ml"
    assert cli.context_namespace(str(config), "b") == "default"
    with pytest.raises(PluginError, match="context 'nope' is not in the kubeconfig"):
        cli.context_namespace(str(config), "nope")


def test_installed_as_the_kubectl_plugin_console_script():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, attr = scripts["kubectl-gluon"].partition(":")
    assert module == "gluon_operator.kubectl_plugin.cli" and attr == "main"


HEAVY = ("scipy", "statsmodels", "numpy", "kopf", "aiohttp")


def test_the_plugin_imports_no_statistics_stack_kopf_or_aiohttp():
    """What `kubectl-gluon` imports before it runs a command (its entry module, and the views, controls and
    plan preview its commands use), in a fresh interpreter: none of the heavy modules the operator uses."""
    import subprocess
    import sys

    probe = (
        "import sys, gluon_operator.kubectl_plugin.cli, gluon_operator.kubectl_plugin.views, "
        "gluon_operator.kubectl_plugin.controls, gluon_operator.plan; "
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r})))"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(ROOT / p) for p in ("agent", "operator", "localcluster"))}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


# ---------------------------------------------------------------- as kubectl users expect


EIGHT_FAIL = "self-test not passed: " + "; ".join(f"GPU {i} fallback fail (simulated fail)" for i in range(8))


@pytest.mark.parametrize(
    "reason,folded",
    [
        (EIGHT_FAIL, "self-test not passed: GPUs 0-7 fallback fail (simulated fail)"),
        (
            EIGHT_FAIL + " (self-test proved serving config ab; this rollout serves cd; re-test requested)",
            "self-test not passed: GPUs 0-7 fallback fail (simulated fail) (self-test proved serving config ab; "
            "this rollout serves cd; re-test requested)",
        ),
        (
            "self-test not passed: GPU 0 accelerated fail (nan); GPU 1 fallback fail; GPU 2 accelerated fail (nan); "
            "GPU 3 accelerated fail (nan)",
            "self-test not passed: GPUs 0, 2-3 accelerated fail (nan); GPU 1 fallback fail",
        ),
        ("not worse than tolerance", "not worse than tolerance"),
        ("GPU arch gfx950 (have gfx942)", "GPU arch gfx950 (have gfx942)"),  # not the per-GPU list: as is
    ],
)
def test_reasons_fold_repeated_gpus(reason, folded):
    assert views.fold_reason(reason) == folded


def test_rows_fit_a_terminal_and_wide_keeps_the_whole_reason():
    long = EIGHT_FAIL + " (self-test proved serving config " + "d" * 200 + ")"
    body = with_status(
        ROLLOUT, **{**ROLLOUT["status"], "nodes": {**ROLLOUT["status"]["nodes"], "gpu-05": record("Ineligible", long)}}
    )
    view = views.status_view(body, NODES, PODS)
    text = views.render_status(view, NOW)
    assert max(len(line) for line in text.splitlines()) <= views.TERMINAL_WIDTH
    row = next(line for line in text.splitlines() if line.startswith("gpu-05"))
    assert "GPUs 0-7 fallback fail (simulated fail)" in row and row.endswith("...") and "GPU 1 " not in row
    invalid = views.render_status({**view, "invalid": "spec.analysis: " + "x" * 400}, NOW)
    assert max(len(line) for line in invalid.splitlines()) <= views.TERMINAL_WIDTH
    wide = views.render_status(view, NOW, wide=True)
    assert long in wide and "x0.839..x0.900" in wide and "2033-05-18T03:32:20Z" in wide
    assert "FINGERPRINT" in wide.splitlines()[1]


@pytest.mark.parametrize("seconds,text", [(5, "5s"), (130, "2m10s"), (700, "11m"), (4000, "1h6m"), (200_000, "2d7h")])
def test_time_in_state_reads_like_kubectls_ages(seconds, text):
    assert views.duration(seconds) == text


class FakeCluster:
    """The Cluster's reads over fixed objects, for the shell's own logic (the real API: the e2e tests)."""

    namespace = SERVING_NS

    def __init__(self, rollouts, nodes=NODES, pods=PODS, events=()):
        self.rollouts, self._nodes, self.pods, self.events = rollouts, nodes, pods, list(events)
        self.reads = 0

    def rollout(self, name, namespace=None):
        for r in self.rollouts:
            if r["metadata"]["name"] == name and r["metadata"]["namespace"] == (namespace or self.namespace):
                return r
        raise PluginError(f"GluonRollout {name!r} in namespace {namespace or self.namespace!r} not found")

    def all_rollouts(self):
        return self.rollouts

    def nodes(self):
        self.reads += 1
        return self._nodes

    def node(self, name):
        return next(n for n in self._nodes if n["metadata"]["name"] == name)

    def serving_pods(self, namespace=None):
        return self.pods

    def agent_pods(self, selector):
        return [agent_pod(n["metadata"]["name"]) for n in self._nodes]

    def watch_rollouts(self, name, all_namespaces):
        yield "LIST", {"items": self.rollouts}
        yield from self.events
        time.sleep(60)  # a watch that has nothing more to say


def args_for(*argv):
    args = cli.build_parser().parse_args(list(argv))
    args.watch = getattr(args, "watch", False)
    args.all_namespaces = getattr(args, "all_namespaces", False)
    return args


def test_all_namespaces_and_yaml(capsys):
    other = with_status(rollout("other"), phase="Complete", counts={"Promoted": 4})
    other["metadata"]["namespace"] = "ml"
    cluster = FakeCluster([ROLLOUT, other])
    assert cli.cmd_status(args_for("status", "-A"), cluster) == 0
    text = capsys.readouterr().out
    assert f"GluonRollout {SERVING_NS}/kimi: Progressing" in text and "GluonRollout ml/other: Complete" in text
    assert cli.cmd_status(args_for("status", "-A", "-o", "yaml"), cluster) == 0
    import yaml

    shown = yaml.safe_load(capsys.readouterr().out)
    assert [v["rollout"] for v in shown] == ["kimi", "other"] and shown[0]["nodes"][0]["node"] == "gpu-01"
    assert cli.cmd_status(args_for("status", "kimi", "-o", "json"), cluster) == 0
    assert json.loads(capsys.readouterr().out)["rollout"] == "kimi"


class Screen:
    """A terminal: stdout as a tty."""

    def __init__(self):
        self.frames: list[str] = []

    def isatty(self):
        return True

    def write(self, text):
        if text.startswith(cli.CLEAR):
            self.frames.append(text[len(cli.CLEAR) :])
        elif self.frames:
            self.frames[-1] += text

    def flush(self):
        pass


def test_watch_redraws_in_place_on_each_change_and_counts_time_in_state(monkeypatch):
    monkeypatch.setattr(cli, "TICK", 0.01)
    promoted = with_status(ROLLOUT, **{**ROLLOUT["status"], "nodes": {"gpu-04": record("Promoted", "not worse")}})
    cluster = FakeCluster([ROLLOUT], events=[("MODIFIED", promoted)])
    clock = iter(NOW + i for i in range(100))
    screen = Screen()
    assert cli.watch_status(args_for("status", "-w"), cluster, screen, lambda: next(clock), frames=4) == 0
    assert len(screen.frames) == 4 and all(f.startswith(f"GluonRollout {SERVING_NS}/kimi") for f in screen.frames)
    assert "gpu-04   Analyzing" in screen.frames[0] and "Promoted" in screen.frames[1].split("gpu-04")[1]
    assert cluster.reads == 2  # nodes re-read on each event, not on each tick
    in_state = [re.search(r"gpu-04 .*?(\d+s) ", f).group(1) for f in screen.frames[1:]]
    assert in_state == ["61s", "62s", "63s"]  # ticks redraw with the clock


def test_watch_ends_cleanly_on_ctrl_c(monkeypatch):
    monkeypatch.setattr(cli, "TICK", 0.01)
    calls = []

    def clock():
        calls.append(1)
        if len(calls) > 2:
            raise KeyboardInterrupt
        return NOW

    screen = Screen()
    assert cli.watch_status(args_for("status", "-w"), FakeCluster([ROLLOUT]), screen, clock) == 0
    assert len(screen.frames) == 2


def test_watch_of_a_missing_rollout_names_it():
    with pytest.raises(PluginError, match="GluonRollout 'nope' in namespace .* not found"):
        cli.watch_status(args_for("status", "nope", "-w"), FakeCluster([]), Screen(), frames=1)


def test_explain_finds_the_rollout_its_node_record_names(capsys):
    """From any namespace: the node's record names "namespace/name" of its rollout."""
    node = gpu_node("gpu-01")
    promoted = record(
        "Promoted",
        "not worse than tolerance",
        effect=2.28,
        ci_low=2.1,
        ci_high=2.4,
        threshold=0.95,
        n_controls=3,
        control_flag=0,
        n_post=40,
        n_pre=38,
        looks=7,
        at=NOW - 30,
    )
    node["metadata"]["annotations"][contract.ANNOTATION_NODE_RECORD] = json.dumps(
        {**promoted, "rollout": f"{SERVING_NS}/kimi"}
    )
    # the status lists the node in the same state: its numbers are the ones shown (one number per node)
    listed = {**ROLLOUT, "status": {**ROLLOUT["status"], "nodes": {**ROLLOUT["status"]["nodes"], "gpu-01": promoted}}}
    cluster = FakeCluster([listed], nodes=[node])
    cluster.namespace = "default"
    assert cli.cmd_explain(args_for("explain", "gpu-01"), cluster) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"Node gpu-01 in GluonRollout {SERVING_NS}/kimi")
    assert "verdict:    Promoted since 2033-05-18T03:32:20Z" in text
    assert (
        "x2.280: decode speed 128.0% above that of its controls, 95% interval x2.100 to x2.400; it fails below x0.950"
        in text
    )
    assert "against 3 control nodes at flag 0, 40 samples since its flag flipped, 38 before, 7 looks" in text
    assert not re.search(r"\b1[0-9]{9}\.[0-9]", text)  # no epoch floats
    assert text.count("not worse than tolerance") == 1  # no reason said twice
    assert cli.cmd_explain(args_for("explain", "gpu-01", "-o", "json"), cluster) == 0
    assert json.loads(capsys.readouterr().out)["analysis"]["n_pre"] == 38  # -o json keeps every number


def krew_build():
    import importlib.util

    spec = importlib.util.spec_from_file_location("krew_build", ROOT / "examples/krew/build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_krew_manifest_names_this_archive_for_every_platform():
    import hashlib

    import yaml

    build = krew_build()
    text = (ROOT / "examples/krew/gluon.yaml").read_text()
    manifest = yaml.safe_load(text)
    assert manifest["apiVersion"] == "krew.googlecontainertools.github.com/v1alpha2" and manifest["kind"] == "Plugin"
    assert manifest["metadata"]["name"] == "gluon" and manifest["spec"]["version"] == build.version() == "v0.1.0"
    platforms = manifest["spec"]["platforms"]
    assert {(p["selector"]["matchLabels"]["os"], p["selector"]["matchLabels"]["arch"]) for p in platforms} == {
        (os_, arch) for os_ in ("linux", "darwin") for arch in ("amd64", "arm64")
    }
    data = build.archive_bytes()
    assert data == build.archive_bytes()  # reproducible, so the sha256 below can be checked at all
    assert {p["sha256"] for p in platforms} == {hashlib.sha256(data).hexdigest()}
    assert {p["bin"] for p in platforms} == {"kubectl-gluon"}
    assert all(p["uri"].endswith(f"/{build.version()}/kubectl-gluon-{build.version()}.tar.gz") for p in platforms)
    assert not re.search(r"<[A-Za-z_ -]+>|TODO|XXX|REPLACE|example\.com", text)  # no placeholders


def test_the_krew_launcher_runs_the_plugin_or_says_how_to_install_it(tmp_path):
    import io
    import subprocess
    import sys
    import tarfile

    with tarfile.open(fileobj=io.BytesIO(krew_build().archive_bytes())) as tar:
        tar.extractall(tmp_path, filter="data")
    launcher = tmp_path / "kubectl-gluon"
    assert launcher.stat().st_mode & 0o111
    paths = os.pathsep.join(str(ROOT / p) for p in ("agent", "operator", "localcluster"))
    env = {**os.environ, "KUBECTL_GLUON_PYTHON": sys.executable, "PYTHONPATH": paths}
    done = subprocess.run([launcher, "--version"], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "kubectl-gluon 0.1.0", done.stderr
    bare = tmp_path / "python-without-packages"
    bare.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')  # no site-packages: no gluon-rollout
    bare.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"KUBECTL_GLUON_PYTHON": str(bare)}
    done = subprocess.run([launcher, "status"], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 1 and '-m pip install "gluon-rollout @ git+https://github.com/' in done.stderr


# ---------------------------------------------------------------- plan


def test_plan_text_lists_each_part_in_execution_order():
    record = json.dumps({"state": "Enabling", "reason": "chosen by the rollout strategy", "numbers": {}, "x": "y" * 80})
    plan = {
        "dryRun": False,
        "transitions": [
            {"node": "gpu-01", "old": "Eligible", "new": "Enabling", "rollback": None},
            {"node": "gpu-02", "old": "Analyzing", "new": "RolledBack", "rollback": "analysis"},
        ],
        "status": {"phase": "Progressing", "aborted": None},
        "nodeWrites": [
            {
                "node": "gpu-01",
                "labels": {contract.LABEL_ENABLED: "true", contract.LABEL_STATE: "Enabling"},
                "annotations": {contract.ANNOTATION_ROLLBACK: None, "record": record},
            }
        ],
        "restarts": [{"namespace": SERVING_NS, "node": "gpu-02", "pods": ["sglang-a", "sglang-b"], "why": "old"}],
        "podLabels": [{"namespace": SERVING_NS, "name": "sglang-c", "flag": "1"}],
        "events": [{"type": "Warning", "reason": "RolledBack", "message": "gpu-02: effect x0.858"}],
    }
    text = views.render_plan(plan)
    order = [
        "node transitions:",
        "status keys written:",
        "node writes, in order:",
        "pod restarts, in order:",
        "pod flag labels:",
        "events:",
    ]
    assert [text.index(title) for title in order] == sorted(text.index(title) for title in order)
    assert "nothing has been written" in text.splitlines()[0]
    assert f"{contract.LABEL_ENABLED}=true" in text and f"{contract.ANNOTATION_ROLLBACK}-" in text
    assert f"({len(record)} chars)" in text  # long annotation values are cut, with their length
    assert "sglang-a, sglang-b" in text and "aborted   (removed)" in text and "analysis" in text
    assert "spec.dryRun" not in text
    assert "spec.dryRun is true" in views.render_plan({**plan, "dryRun": True})


def test_an_empty_plan_says_nothing_changes():
    empty = {
        "dryRun": False,
        "transitions": [],
        "status": {},
        "nodeWrites": [],
        "restarts": [],
        "podLabels": [],
        "events": [],
    }
    assert "nothing to do" in views.render_plan(empty)


# ---------------------------------------------------------------- end to end, on the real API server


E2E_NODES = {"plug-a": {}, "plug-b": {}, "plug-c": {"fallback": "fail"}}


@pytest.fixture(scope="module")
def live(control_plane, installed):
    """Three kwok GPU nodes with agent reports (plug-c fails its fallback self-test), their agent pods from
    the real DaemonSet, a namespace, and the real operator process; a rollout is created per test."""
    from kubernetes import client

    from gluon_localcluster import fleet
    from gluon_localcluster.processes import operator as start_operator

    core = client.CoreV1Api(control_plane.admin_client())
    namespace = f"plugin-{uuid.uuid4().hex[:6]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    for index, (name, traits) in enumerate(E2E_NODES.items(), start=310):
        node = fleet.gpu_node(name, index, **traits)
        node["metadata"]["labels"]["gluon-plugin-e2e"] = namespace
        core.create_node(node)
    for name in E2E_NODES:
        installed.agent_pod(name)
    operator = start_operator(installed, reconcile_seconds=0.5)
    try:
        yield SimpleNamespace(
            cp=control_plane,
            core=core,
            custom=client.CustomObjectsApi(control_plane.admin_client()),
            namespace=namespace,
            operator=operator,
            kubeconfig=str(control_plane.kubeconfig),
        )
    finally:
        operator.stop()
        for name in E2E_NODES:
            core.delete_node(name)
        core.delete_namespace(namespace, _preload_content=False)


def gluon(live, capsys, *args: str) -> tuple[int, str, str]:
    """`kubectl gluon ARGS` with the admin kubeconfig, in the live namespace."""
    capsys.readouterr()
    rc = cli.main(["--kubeconfig", live.kubeconfig, "-n", live.namespace, *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def gluon_json(live, capsys, *args: str):
    rc, out, err = gluon(live, capsys, *args, "--json")
    assert rc == 0, err
    return json.loads(out)


@pytest.fixture
def create_rollout(live):
    """create_rollout(name, **spec) makes a GluonRollout over the three nodes; each one made is
    deleted when the test ends, passed or not (a rollout left behind would claim the nodes of the next)."""
    from kubernetes.client.exceptions import ApiException

    from gluon_localcluster import fleet

    made: list[str] = []

    def create(name: str, **spec) -> dict:
        body = fleet.rollout(
            name, live.namespace, nodeSelector={"matchLabels": {"gluon-plugin-e2e": live.namespace}}, **spec
        )
        created = live.custom.create_namespaced_custom_object(GROUP, VERSION, live.namespace, PLURAL, body)
        made.append(name)
        return created

    yield create
    for name in made:
        try:
            live.custom.delete_namespaced_custom_object(GROUP, VERSION, live.namespace, PLURAL, name)
        except ApiException as exc:
            if exc.status != 404:
                raise


def read_rollout(live, name: str) -> dict:
    return live.custom.get_namespaced_custom_object(GROUP, VERSION, live.namespace, PLURAL, name)


def until(live, capsys, name: str, check, what: str, timeout: float = 60):
    """Polls `kubectl gluon status NAME --json` until check(view) holds."""
    last = {}

    def seen():
        last["view"] = gluon_json(live, capsys, "status", name)
        return last["view"] if check(last["view"]) else None

    try:
        return wait_for(seen, timeout=timeout, interval=0.5, what=what)
    except AssertionError as exc:
        raise AssertionError(
            f"{exc}; last status: {json.dumps(last.get('view'))[:3000]}\noperator log:\n{live.operator.tail()}"
        ) from None


def states(view) -> dict[str, str]:
    return {r["node"]: r["state"] for r in view["nodes"]}


def test_e2e_missing_rollout_and_node_are_named(live, capsys, create_rollout):
    rc, _, err = gluon(live, capsys, "status", "nope")
    assert rc == 1 and f"GluonRollout 'nope' in namespace '{live.namespace}' not found" in err
    rc, _, err = gluon(live, capsys, "status")
    assert rc == 1 and f"no GluonRollout in namespace '{live.namespace}'" in err
    create_rollout("only", paused=True)
    rc, _, err = gluon(live, capsys, "explain", "no-such-node", "-r", "only")
    assert rc == 1 and "node 'no-such-node' not found" in err
    rc, _, err = gluon(live, capsys, "retry", "plug-c")
    assert rc == 1 and "node 'plug-c' has no rollback record" in err


def test_e2e_every_command_against_the_operator(live, capsys, create_rollout):
    create_rollout("kimi", strategy={"canaryNodes": 0, "maxParallel": 2, "approval": "AfterCanary"})
    # status: the operator judged every node; two are eligible and wait for a person at the canary gate
    view = until(
        live,
        capsys,
        "kimi",
        lambda v: (
            (v.get("approval") or {}).get("waitingFor") == "canary"
            and states(v) == {"plug-a": "Eligible", "plug-b": "Eligible", "plug-c": "Ineligible"}
        ),
        "the canary gate",
    )
    failing = next(r for r in view["nodes"] if r["node"] == "plug-c")
    assert "fallback fail" in failing["reason"] and failing["flag"] == "0"
    rc, text, _ = gluon(live, capsys, "status")  # the only rollout in the namespace
    assert rc == 0 and "waiting for approval of 'canary'" in text and text.count("plug-") == 3

    # explain: the whole record of the failing node, from the real Node and agent pod
    record = gluon_json(live, capsys, "explain", "plug-c")
    assert record["eligibility"]["agentAlive"] and not record["eligibility"]["eligible"]
    assert record["decision"]["state"] == "Ineligible"
    assert {g["result"] for g in record["selftest"]["gpus"] if g["path"] == "fallback"} == {"fail"}
    rc, text, _ = gluon(live, capsys, "explain", "plug-c")
    assert rc == 0 and re.search(r"GPUs? [-, 0-9]+ fallback fail \(simulated fail\)", text)
    # from another namespace: the node's record names its rollout
    capsys.readouterr()
    assert cli.main(["--kubeconfig", live.kubeconfig, "-n", "default", "explain", "plug-c"]) == 0
    assert capsys.readouterr().out.startswith(f"Node plug-c in GluonRollout {live.namespace}/kimi")
    # -A: every namespace's rollouts, -o yaml
    every = gluon_json(live, capsys, "status", "-A")
    assert any(v["rollout"] == "kimi" and v["namespace"] == live.namespace for v in every)

    # plan: a preview that writes nothing
    versions = {n: live.core.read_node(n).metadata.resource_version for n in E2E_NODES}
    before = read_rollout(live, "kimi")["metadata"]["resourceVersion"]
    preview = gluon_json(live, capsys, "plan")
    assert preview["status"].get("approval", {}).get("waitingFor", "canary") == "canary" and not preview["restarts"]
    assert {n: live.core.read_node(n).metadata.resource_version for n in E2E_NODES} == versions
    assert read_rollout(live, "kimi")["metadata"]["resourceVersion"] == before
    rc, text, _ = gluon(live, capsys, "plan", "kimi")
    assert rc == 0 and "nothing has been written" in text

    # promote: grants the gate; the operator enables both eligible nodes
    rc, text, _ = gluon(live, capsys, "promote")
    assert rc == 0 and "promoted" in text
    assert read_rollout(live, "kimi")["metadata"]["annotations"][contract.ANNOTATION_ROLLOUT_APPROVE] == "canary"
    # the node rows come from the Nodes, written before the rollout's status that records the grant
    view = until(
        live,
        capsys,
        "kimi",
        lambda v: (
            {states(v)["plug-a"], states(v)["plug-b"]} <= {"Enabling", "Analyzing"}
            and all(r["flag"] == "1" for r in v["nodes"] if r["node"] != "plug-c")
            and (v.get("approval") or {}).get("granted")
        ),
        "the canary enabled and its grant recorded",
    )
    assert [g["gate"] for g in view["approval"]["granted"]] == ["canary"]
    assert live.core.read_node("plug-a").metadata.labels[contract.LABEL_ENABLED] == "true"
    rc, _, err = gluon(live, capsys, "promote")
    assert rc == 1 and "is not waiting for approval" in err

    # pause and resume
    assert gluon(live, capsys, "pause")[0] == 0
    assert read_rollout(live, "kimi")["spec"]["paused"] is True
    until(live, capsys, "kimi", lambda v: v["phase"] == "Paused", "phase Paused")
    assert gluon(live, capsys, "resume")[0] == 0
    until(live, capsys, "kimi", lambda v: v["phase"] != "Paused" and not v["paused"], "resumed")

    # abort: flag-on nodes are disabled; resume lifts it
    rc, _, _ = gluon(live, capsys, "abort", "--reason", "plugin e2e")
    assert (
        rc == 0
        and read_rollout(live, "kimi")["metadata"]["annotations"][contract.ANNOTATION_ROLLOUT_ABORT] == "plugin e2e"
    )
    # (without serving pods a Disabled node has nothing to restart and is Eligible again at once)
    view = until(
        live,
        capsys,
        "kimi",
        lambda v: (
            v["phase"] == "Aborted"
            and all(
                r["flag"] == "0" and r["state"] in ("Disabled", "Eligible") for r in v["nodes"] if r["node"] != "plug-c"
            )
        ),
        "aborted",
    )
    assert f"aborted: {contract.ANNOTATION_ROLLOUT_ABORT}: plugin e2e" in views.render_status(view)
    assert live.core.read_node("plug-a").metadata.labels[contract.LABEL_ENABLED] == "false"
    assert gluon(live, capsys, "resume")[0] == 0
    assert contract.ANNOTATION_ROLLOUT_ABORT not in (read_rollout(live, "kimi")["metadata"].get("annotations") or {})
    until(live, capsys, "kimi", lambda v: v["phase"] != "Aborted", "abort lifted")


def test_e2e_retry_clears_a_rollback_so_the_node_is_judged_again(live, capsys, create_rollout):
    create_rollout("retry", strategy={"canaryNodes": 0, "maxParallel": 2})
    until(live, capsys, "retry", lambda v: states(v).get("plug-a") in ("Enabling", "Analyzing"), "plug-a enabled")
    # The operator's rollback record for plug-a's fingerprint, as its executor writes one
    report = json.loads(live.core.read_node("plug-a").metadata.annotations[contract.ANNOTATION_REPORT])
    record = {
        "rollout": "retry",
        "fingerprint": report["fingerprint"],
        "at": time.time(),
        "reason": "effect x0.80 below x0.95",
        "numbers": {"effect": 0.8},
    }
    live.core.patch_node("plug-a", {"metadata": {"annotations": {contract.ANNOTATION_ROLLBACK: json.dumps(record)}}})
    until(live, capsys, "retry", lambda v: states(v)["plug-a"] == "RolledBack", "plug-a rolled back")
    explained_now = gluon_json(live, capsys, "explain", "plug-a", "-r", "retry")
    assert (
        explained_now["rollback"]["reason"] == "effect x0.80 below x0.95"
        and not explained_now["eligibility"]["eligible"]
    )
    rc, text, _ = gluon(live, capsys, "retry", "plug-a", "-r", "retry")
    assert rc == 0 and "rollback record cleared (was: effect x0.80 below x0.95)" in text
    assert contract.ANNOTATION_ROLLBACK not in (live.core.read_node("plug-a").metadata.annotations or {})
    until(live, capsys, "retry", lambda v: states(v)["plug-a"] != "RolledBack", "plug-a judged again")


def test_e2e_kubectl_finds_the_plugin_and_passes_its_arguments(live, capsys, tmp_path, create_rollout):
    """kubectl's own plugin lookup: an executable `kubectl-gluon` on PATH is `kubectl gluon` (the console
    script pip installs is such an executable; here a shim runs this checkout's module)."""
    import subprocess
    import sys

    from gluon_localcluster.binaries import binary

    create_rollout("viakubectl", paused=True)
    shim = tmp_path / "kubectl-gluon"
    shim.write_text(f'#!/bin/sh\nexec {sys.executable} -m gluon_operator.kubectl_plugin "$@"\n')
    shim.chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": os.pathsep.join(str(ROOT / p) for p in ("common", "agent", "operator", "localcluster")),
    }
    kubectl = binary("kubectl")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        command = [kubectl, "gluon", *args, "--kubeconfig", live.kubeconfig, "-n", live.namespace]
        return subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)

    shown = run("status", "viakubectl")
    assert shown.returncode == 0, shown.stderr
    assert f"GluonRollout {live.namespace}/viakubectl" in shown.stdout and "paused" in shown.stdout
    missing = run("explain", "no-such-node", "-r", "viakubectl")
    assert missing.returncode == 1 and "node 'no-such-node' not found" in missing.stderr


def test_e2e_status_watch_redraws_on_a_change_and_ends_on_ctrl_c(live, create_rollout):
    """`kubectl gluon status -w` as a separate process (stdout a pipe: one frame per change): pausing the
    rollout brings a new frame; SIGINT ends it with exit code 0 and no traceback."""
    import queue
    import signal
    import subprocess
    import sys
    import threading

    create_rollout("watched", strategy={"canaryNodes": 0})
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(ROOT / p) for p in ("agent", "operator", "localcluster"))}
    argv = [sys.executable, "-m", "gluon_operator.kubectl_plugin", "status", "watched", "-w"]
    proc = subprocess.Popen(
        [*argv, "--kubeconfig", live.kubeconfig, "-n", live.namespace],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()

    def until_line(check, what: str) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if check(lines.get(timeout=1)):
                    return
            except queue.Empty:
                assert proc.poll() is None, proc.stderr.read()
        pytest.fail(f"no frame with {what}")

    try:
        until_line(lambda line: line.startswith(f"GluonRollout {live.namespace}/watched"), "the rollout")
        live.custom.patch_namespaced_custom_object(
            GROUP, VERSION, live.namespace, PLURAL, "watched", {"spec": {"paused": True}}
        )
        until_line(lambda line: line.startswith("paused: spec.paused is true"), "the pause")
    finally:
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=30)
    assert rc == 0 and "Traceback" not in proc.stderr.read()
