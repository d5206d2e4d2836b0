"""Faults on the simulated cluster (the harness of bench/faults.py, smaller): the operator SIGKILLed and
restarted while the API injects 500s, 409s and dropped watches; self-tests whose kernel aborts or hangs."""

from __future__ import annotations

import pytest

from gluon_localcluster import faultsim

# What the demo fleet must end in (tests/test_e2e.py checks the same fleet without faults).
EXPECTED = {
    "gpu-01": ("Promoted", "true"),
    "gpu-02": ("RolledBack", "false"),
    "gpu-03": ("Eligible", "false"),
    "gpu-04": ("Promoted", "true"),
    "gpu-05": ("Promoted", "true"),
    "gpu-06": ("Promoted", "true"),
    "gpu-07": ("Ineligible", "false"),
    "gpu-08": ("Ineligible", "false"),
}


def test_operator_kills_under_api_faults_converge_to_the_same_result(tmp_path):
    outcome = faultsim.run_rollout("combined", tmp_path, seed=7, timeout=240, kills=5, inject_api_faults=True)
    assert outcome["settled"], outcome
    assert {n: (s["state"], s["enabled"]) for n, s in outcome["final"].items()} == EXPECTED
    assert outcome["kills"] == 5 and outcome["operator_starts"] == 6
    assert outcome["injected"]["500"] > 0 and outcome["injected"]["409"] > 0
    assert outcome["double_restarts"] == []
    assert outcome["max_in_flight"] <= faultsim.MAX_IN_FLIGHT
    # 5 enables and 1 rollback; more only for pods a lagging agent view refused (restarted, not rolled back)
    assert outcome["evictions"] >= 6


def test_kernel_abort_and_hang_leave_the_agent_up_and_the_node_ineligible(tmp_path):
    outcome = faultsim.run_kernel_faults(tmp_path, timeout=120)
    invariants = faultsim.check({"kernel_faults": outcome})
    assert all(invariants.values()), outcome
    assert "SIGABRT" in outcome["gpu-abort"]["reason"] and "timed out" in outcome["gpu-hang"]["reason"]


@pytest.mark.timeout(600)  # the scenario's own bound is 300 s for the rollout, after a cluster's start
def test_the_operator_writes_again_within_15_s_of_an_api_server_outage(tmp_path):
    """issue 34: kube-apiserver stopped for 20 s mid-rollout and started again (its RBAC caches cold). The
    operator's first write landed 46-60 s after the API server was back (the caches' 30 s back-off, then
    30 s waiting for the watch to show its own status write); the bound is 15 s. Nothing is lost or
    restarted twice, and the in-progress bound holds through it."""
    outcome = faultsim.run_rollout(
        "apiserver_outage", tmp_path, seed=3, timeout=300, control_plane_outage="kube-apiserver"
    )
    assert outcome["settled"], outcome
    assert outcome["outage_seconds"] >= faultsim.CONTROL_PLANE_OUTAGE_SECONDS
    first = outcome["first_write_seconds"]
    assert first is not None and first <= faultsim.RECOVERY_BOUND_SECONDS, outcome
    assert outcome["double_restarts"] == [] and outcome["max_in_flight"] <= faultsim.MAX_IN_FLIGHT
    # issue 33: the regressing node's pods stay on flag 0 while their restart waits for the cluster's
    # recovery; the judge reads only flag-1 samples, so it is rolled back, never promoted on them.
    assert outcome["regressing_promoted"] == [], outcome["regressing_promoted"][:3]
    assert {n: (s["state"], s["enabled"]) for n, s in outcome["final"].items()} == EXPECTED
