"""The kernel-analysis tools under bench/: ablation variants still match the kernel and compute what they
claim (under the interpreter), earlier configs and split rules differ from today's, the gather-ceiling
kernel reads every byte, reports carry their provenance, and the ncu stall summary adds up."""

from __future__ import annotations

import json
import re
import sys

import numpy as np
import pytest
import torch

from gluon_agent.selftest.problem import make_problem
from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import gather_ceiling
import mla_ablation
import mla_decode
import ncu_stalls


def rel_l2_of_variant(name: str, tmp_path) -> float:
    with mla_ablation.using_kernel(mla_ablation.variant_kernel(name, tmp_path)):
        return mla_ablation.rel_l2(make_problem([37, 130], seed=1), mla_ablation.kernel_mode("native-12", None))


@pytest.mark.parametrize(
    "name, correct",
    [
        ("kernel", True),
        ("byte_value_tile", True),
        ("one_qk_chain", True),
        ("pair_value_tile", True),
        ("split_value_tile", True),
        ("one_word_group", True),
        ("words_after_softmax", True),
        ("row_sums_per_tile", True),
        ("no_value_product", False),
        ("no_latent_qk", False),
    ],
)
def test_ablation_variants_match_the_kernel_and_do_what_they_say(name, correct, tmp_path):
    assert (rel_l2_of_variant(name, tmp_path) < 1e-2) is correct


def test_previous_configs_and_split_rules_each_differ_from_today(monkeypatch):
    triton_mla = mla_ablation.triton_mla
    monkeypatch.setattr(triton_mla, "multiprocessors", lambda device: 132)  # an H200
    cpu, today = torch.device("cpu"), triton_mla.DEFAULT_CONFIG
    assert mla_ablation.v9_split_count(32, 65536, cpu, today) == 33  # 8 waves of programs
    assert mla_ablation.v9_split_count(1, 131072, cpu, today) == 264  # 2 waves below batch 8
    assert triton_mla.split_count(32, 65536, cpu, today) == 8
    assert all(prev.config != today or prev.split_count is not triton_mla.split_count for prev in mla_ablation.PREVIOUS)


def test_an_ablation_that_no_longer_matches_names_its_text(tmp_path, monkeypatch):
    monkeypatch.setitem(mla_ablation.VARIANTS, "stale", [("no such line in the kernel\n", "")])
    with pytest.raises(SystemExit, match="'stale' no longer matches triton_mla.py: 'no such line"):
        mla_ablation.variant_kernel("stale", tmp_path)


@pytest.mark.parametrize(
    "config",
    [
        gather_ceiling.GatherConfig(16, 1, 1, 0, waves=1.0),
        gather_ceiling.GatherConfig(32, 1, 1, 1),
        gather_ceiling.GatherConfig(16, 1, 1, 3),
    ],
)
def test_gather_ceiling_kernel_reads_every_byte_of_every_listed_row(config):
    """Its timing means something only if no row or byte is skipped: the XOR of all words must match."""
    p = make_problem([37, 130], seed=2)
    rows = p.kv.view(torch.uint8)[p.kv_indices.long()].contiguous().view(torch.int32).numpy()
    expected = int(np.bitwise_xor.reduce(rows.ravel())) & 0xFFFFFFFF
    assert gather_ceiling.fold_xor(gather_ceiling.gather_xor(p.kv, p.kv_indices, config)) == expected
    p.kv_indices[5] = (p.kv_indices[5] + 1) % p.kv.shape[0]  # one other row: another answer
    assert gather_ceiling.fold_xor(gather_ceiling.gather_xor(p.kv, p.kv_indices, config)) != expected


@pytest.mark.parametrize(
    "config",
    [
        gather_ceiling.SplitFloorConfig(16, 1, 1, 1.0, "float32"),
        gather_ceiling.SplitFloorConfig(16, 1, 1, 4.0, "float16"),
    ],
)
def test_split_floor_reads_every_row_once_and_runs_the_kernels_reduce(config):
    """The design floor times the split kernel's reads and writes: each split's XOR folds to the XOR of
    every listed row, and the real reduce turns the partials into an output (no NaN poison left)."""
    p = make_problem([37, 130], seed=3)
    call = gather_ceiling.SplitFloorCall.build(p, config)
    assert call.splits == (
        4 if config.waves == 1.0 else 8
    )  # 8 resident programs on the CPU stand-in / batch 2; <= 130 // 16
    call()
    rows = p.kv.view(torch.uint8)[p.kv_indices.long()].contiguous().view(torch.int32).numpy()
    assert gather_ceiling.fold_xor(call.folded) == int(np.bitwise_xor.reduce(rows.ravel())) & 0xFFFFFFFF
    assert torch.isfinite(call.out.float()).all()
    assert (call.part_lse[0, 3:, : p.heads] == float("-inf")).all()  # 37 tokens fill three 16-token splits


def test_gpu_bench_reports_say_which_bench_where_and_how(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["bench/gather_ceiling.py", "--json"])
    monkeypatch.setattr(mla_decode, "machine", lambda device: {"gpu": "NVIDIA H200"})
    report = json.loads(mla_decode.report_json("gather_ceiling", torch.device("cpu"), {"shapes": [1]}))
    assert report == {
        "bench": "gather_ceiling",
        "machine": {"gpu": "NVIDIA H200"},
        "command": "python bench/gather_ceiling.py --json",
        "shapes": [1],
    }


def test_ncu_stall_summary():
    rows = [
        {"Source": "  LDS.U8 R1, [R2]", "stall_mio": "6", "stall_wait": "0", "stall_mio (Not Issued)": "9"},
        {"Source": "@P0 LDS.64 R4, [R2]", "stall_mio": "0", "stall_wait": "4", "stall_mio (Not Issued)": "9"},
        {
            "Source": "HMMA.16816.F32 R8, R4, R6, R8",
            "stall_mio": "0",
            "stall_wait": "10",
            "stall_mio (Not Issued)": "0",
        },
    ]
    summary = ncu_stalls.summarize(rows)
    assert summary["samples"] == 20  # the "(Not Issued)" duplicates are not counted twice
    assert summary["reasons"] == {"wait": 0.7, "mio": 0.3}
    assert summary["by_opcode"]["LDS"] == {"share": 0.5, "reasons": {"mio": 0.3, "wait": 0.2}}
    assert summary["top_instructions"][0]["sass"].startswith("HMMA")


# ---------------------------------------------------------------- the benches on the real control plane (--quick)


def run_cluster_bench(script: str, *args: str, timeout: float = 240) -> dict:
    """A bench's --quick run as `make bench` would start it: its own control plane, its JSON on stdout."""
    import os
    import subprocess

    env = {
        k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "TRITON_INTERPRET", "GLUON_RECONCILE_SECONDS")
    }
    env["PYTHONPATH"] = (
        os.pathsep.join(str(ROOT / p) for p in ("common", "agent", "operator", "localcluster")) + os.pathsep + str(ROOT)
    )
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), "--json", "--quick", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", report["date"]) and report["machine"]["nproc"] >= 1
    assert report["command"].startswith(f"python bench/{script}")
    return report


def test_scale_quick_converges_with_one_write_per_state_change_and_promotes_everything():
    report = run_cluster_bench("scale.py")
    (result,) = report["results"]
    assert result["apiserver_version"].startswith("v1.")
    assert result["nodes"] == 10 and result["node_state_changes"] >= 10  # every node got its first state
    assert 0 < result["node_writes_per_node_per_state_change"] <= 2
    # the canary is analysed once an interval, each analysis a fixed set of queries (speed and the load gauges)
    from gluon_operator import analysis

    assert 0 < result["promql_queries_per_rollout_per_interval"] <= 1.5 * (1 + len(analysis.COVARIATES))
    assert result["operator_peak_rss_mb"] > 0 and result["components_while_converging"]["kube-apiserver"]["rss_mb"] > 0
    # the floor: the same 10 node writes by an ideal client, on the same control plane, none refused
    assert result["floor_writes"] == 10 and result["floor_writes_refused"] == 0 and result["floor_seconds"] > 0
    assert result["converge_over_floor"] == round(result["converge_seconds"] / result["floor_seconds"], 2)
    assert result["operator_start_seconds"] + result["operator_writing_seconds"] == pytest.approx(
        result["converge_seconds"], abs=0.2
    )
    # the operator's own counters: at least one planned reconcile, CPU in every phase that had work
    assert result["reconciles_to_converge"] >= 1
    phases = result["operator_cpu_seconds_by_phase"]
    assert phases["watch"] > 0 and phases["plan"] > 0 and phases["write"] > 0
    promoted = result["fully_promoted"]
    assert promoted["promoted_nodes"] == promoted["eligible_nodes"] == 8 and not promoted["status_writes_refused"]
    assert promoted["kubectl_get_gr_output"][1].split()[:3] == ["scale", "Complete", "8"]


def test_agent_overhead_quick_measures_the_daemon_through_the_real_api_server():
    report = run_cluster_bench("agent_overhead.py")
    assert report["apiserver_version"].startswith("v1.") and report["metrics_requests"] == 50
    assert 10 < report["idle_rss_mb"] < 1000 and report["metrics_latency_ms_p50"] <= report["metrics_latency_ms_p99"]


def test_admission_quick_mutates_only_the_matched_arm_and_times_the_init_containers():
    report = run_cluster_bench("admission.py")
    latency, start = report["create_latency"], report["init_containers"]
    assert latency["every_pod_mutated_as_expected"]
    assert all(arm["creates"] == 100 for arm in latency["arms"].values())  # 5 s at 20/s in each arm
    assert start["starts"] == 2 and all(s > 0 for s in start["init_seconds"])
    assert start["flags"] == ["0"]  # the simulated serving image has no aiter: the preflight keeps the safe path
