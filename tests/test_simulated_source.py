"""The SIMULATION source of the real-node agent image (localcluster/node/agent-simulation): the probe is the
agent's own, of what this process really sees; the self-test's outcome is simulated on each GPU it found."""

from __future__ import annotations

import json

from gluon_localcluster.fakes.simulated import SimulatedSource, simulated_node


def test_a_real_probe_and_a_simulated_outcome_on_each_gpu_it_found(tmp_path):
    path = tmp_path / "node.json"
    path.write_text(
        json.dumps({"probe": "real", "selftest": {"every_gpu": {"accelerated": "pass", "fallback": "fail"}}})
    )
    source = SimulatedSource(path)
    probed = source.probe()
    assert "simulated" not in probed and probed["gpus"] == []  # this machine has no AMD GPU, as the probe says
    found = dict(probed, gpus=[{"index": 0}, {"index": 3}])
    report = source.selftest(found)
    assert report["simulated"] is True and report["result"] == "fail"
    assert [g["index"] for g in report["gpus"]] == [0, 3]
    assert report["gpus"][1]["result"] == {"accelerated": "pass", "fallback": "fail"}


def test_a_simulated_probe_says_so(tmp_path):
    path = tmp_path / "node.json"
    path.write_text(json.dumps(simulated_node(gpus=2)))
    source = SimulatedSource(path)
    probed = source.probe()
    assert probed["simulated"] is True and len(probed["gpus"]) == 2
    assert [g["index"] for g in source.selftest(probed)["gpus"]] == [0, 1]
