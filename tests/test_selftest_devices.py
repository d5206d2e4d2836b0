"""The self-test runner across many GPUs, with fake devices on the CPU: every device's children run at
once, a crash or a hang of one device's child leaves the other devices' results standing, the report
says which GPU failed and why, and a device another process keeps busy is `deferred`. The crash, the
hang and the busy device come from the harness's fake devices (gluon_localcluster.fakes.devices), which
the worker reaches through its device hooks."""

from __future__ import annotations

import pytest
import torch

from gluon_agent import isolation
from gluon_agent.selftest import cases, runner, worker
from gluon_common import contract
from gluon_localcluster.fakes import devices
from gluon_localcluster.fakes.stacks import AITER_STACK, child_env

CAPABLE = {
    "capable": True,
    "gpus": [],
    "torch_version": "t",
    "triton_version": "x",
    "sglang": {"version": "0.5.19", "flag0_route": "persistent", "mtp_through_gluon": False},
}
DEVICES = 8
TIMEOUT = 45.0


@pytest.fixture(scope="module")
def eight_gpus(clean_env_module):
    env = child_env(clean_env_module, AITER_STACK)
    env.update(devices.environment(fault="1:crash:accelerated,2:hang:fallback", free_gib="3:1.5"))
    report = runner.run_selftest(
        CAPABLE, cpu_interpret=True, cpu_devices=DEVICES, timeout=TIMEOUT, env=env, seed=21, mtp_q_lens=()
    )
    assert not isolation._live_groups  # the hung child was killed with its group
    return report


@pytest.fixture(scope="module")
def clean_env_module():
    import os

    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SGLANG_AITER_MLA_GLUON")}


def test_the_other_gpus_results_stand(eight_gpus):
    results = [g["result"] for g in eight_gpus["gpus"]]
    assert [g["index"] for g in eight_gpus["gpus"]] == list(range(DEVICES))
    assert results[1] == {"accelerated": "error", "fallback": "pass"}  # the other path still ran
    assert results[2] == {"accelerated": "pass", "fallback": "error"}
    assert results[3] == {"accelerated": "deferred", "fallback": "deferred"}
    assert all(r == {"accelerated": "pass", "fallback": "pass"} for i, r in enumerate(results) if i not in (1, 2, 3))
    assert eight_gpus["result"] == "error"


def test_the_report_says_which_gpu_failed_and_why(eight_gpus):
    failures = {(f["gpu"], f["path"]): f for f in eight_gpus["failures"]}
    assert set(failures) == {(1, "accelerated"), (2, "fallback"), (3, "accelerated"), (3, "fallback")}
    assert failures[(1, "accelerated")]["reason"].startswith(
        "child killed by SIGABRT during case single-token (aiter-gluon)"
    )
    assert failures[(2, "fallback")]["reason"].startswith(
        f"child timed out after {TIMEOUT:g} s (killed) during case single-token"
    )
    assert failures[(3, "fallback")]["reason"] == "cpu: 1.5 GiB free of 192.0 GiB, the self-test needs 4.0 GiB"
    table = runner.format_table(eight_gpus)
    assert (
        "GPU 1 (cpu) accelerated error: child killed by SIGABRT" in table and "GPU 3 (cpu) fallback deferred" in table
    )


def test_devices_run_at_once(eight_gpus):
    """The hang holds only its own device: the others finished long before its time limit, and the whole
    run took about one hang, not one per device."""
    hung = eight_gpus["gpus"][2]["paths"]["fallback"]["child_seconds"]
    assert hung >= TIMEOUT
    others = [
        g["paths"][p]["child_seconds"] for g in eight_gpus["gpus"] if g["index"] in (0, 4, 5, 6, 7) for p in g["paths"]
    ]
    assert max(others) < TIMEOUT
    assert eight_gpus["seconds"] < hung + TIMEOUT  # serial devices would add every device's time


def test_a_busy_fake_device_defers_like_a_busy_gpu(monkeypatch):
    """The same check and wording as a GPU's mem_get_info, for a fake device a test gives 2 GiB."""
    for name, value in devices.environment(free_gib="5:2,6:100").items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv(contract.ENV_SELFTEST_DEVICE_INDEX, "5")
    assert (
        worker.prepare_device(torch.device("cpu"), cases.MEMORY_LIMIT_BYTES)
        == "cpu: 2.0 GiB free of 192.0 GiB, the self-test needs 4.0 GiB"
    )
    monkeypatch.setenv(contract.ENV_SELFTEST_DEVICE_INDEX, "6")
    assert worker.prepare_device(torch.device("cpu"), cases.MEMORY_LIMIT_BYTES) is None
    monkeypatch.delenv(contract.ENV_SELFTEST_DEVICE_HOOKS)
    assert worker.prepare_device(torch.device("cpu"), cases.MEMORY_LIMIT_BYTES) is None  # a plain CPU run


def test_fault_switches_never_touch_a_real_gpu(monkeypatch):
    for name, value in devices.environment(fault="0:crash").items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv(contract.ENV_SELFTEST_DEVICE_INDEX, "0")
    worker.before_first_case(torch.device("cuda:0"), "accelerated")  # returns: the hooks are for fake devices only
    assert devices.device_rule(devices.ENV_FAULT, "fallback") == "crash"
    monkeypatch.setenv(devices.ENV_FAULT, "0:hang:fallback")
    assert devices.device_rule(devices.ENV_FAULT, "accelerated") is None


def test_without_hooks_a_cpu_device_is_a_plain_cpu(monkeypatch):
    """The product reaches fake devices only through the hooks the harness names: the fault switches alone
    do nothing (a stray variable in a deployment changes nothing)."""
    monkeypatch.delenv(contract.ENV_SELFTEST_DEVICE_HOOKS, raising=False)
    monkeypatch.setenv(contract.ENV_SELFTEST_DEVICE_INDEX, "0")
    monkeypatch.setenv(devices.ENV_FAULT, "0:crash")
    monkeypatch.setenv(devices.ENV_FREE_GIB, "0:1")
    assert worker.device_hooks() is None and worker.memory_info(torch.device("cpu")) is None
    worker.before_first_case(torch.device("cpu"), "accelerated")  # returns: no hooks, no fault


def test_gpu_failures_lists_every_path_that_did_not_pass():
    gpus = [
        {
            "index": 0,
            "device": "cuda:0",
            "result": {"accelerated": "pass", "fallback": "fail"},
            "paths": {"accelerated": {"reasons": []}, "fallback": {"reasons": ["a", "b"]}},
        },
        {
            "index": 1,
            "device": "cuda:1",
            "result": {"accelerated": "deferred", "fallback": "pass"},
            "paths": {"accelerated": {"reasons": []}, "fallback": {"reasons": []}},
        },
    ]
    assert cases.gpu_failures(gpus) == [
        {"gpu": 0, "device": "cuda:0", "path": "fallback", "result": "fail", "reason": "a"},
        {"gpu": 1, "device": "cuda:1", "path": "accelerated", "result": "deferred", "reason": ""},
    ]
