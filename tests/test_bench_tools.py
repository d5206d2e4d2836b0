"""The kernel-analysis tools under bench/: ablation variants still match the kernel and compute what they
claim (under the interpreter), and the ncu stall summary adds up."""

from __future__ import annotations

import sys

import pytest

from gluon_agent.selftest.problem import make_problem
from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import mla_ablation  # noqa: E402
import ncu_stalls  # noqa: E402


def rel_l2_of_variant(name: str, tmp_path) -> float:
    with mla_ablation.using_kernel(mla_ablation.variant_kernel(name, tmp_path)):
        return mla_ablation.rel_l2(make_problem([37, 130], seed=1), mla_ablation.kernel_mode("native-12", None))


@pytest.mark.parametrize("name, correct", [("kernel", True), ("byte_value_tile", True), ("one_qk_chain", True), ("pair_value_tile", True),
                                          ("no_value_product", False), ("no_latent_qk", False)])
def test_ablation_variants_match_the_kernel_and_do_what_they_say(name, correct, tmp_path):
    assert (rel_l2_of_variant(name, tmp_path) < 1e-2) is correct


def test_previous_configs_are_timed_for_their_own_batch_class_only(monkeypatch):
    monkeypatch.setattr(mla_ablation.triton_mla, "interpreting", lambda: False)  # the GPU configs
    small = mla_ablation.previous_configs_for(1)
    assert [prev.label for prev in small] == ["batch < 8, session 3", "batch < 8, 64-wide QK slices"]
    assert all(prev.config != mla_ablation.triton_mla.config_for(1) for prev in small)
    assert mla_ablation.previous_configs_for(32) == []


def test_an_ablation_that_no_longer_matches_names_its_text(tmp_path, monkeypatch):
    monkeypatch.setitem(mla_ablation.VARIANTS, "stale", [("no such line in the kernel\n", "")])
    with pytest.raises(SystemExit, match="'stale' no longer matches triton_mla.py: 'no such line"):
        mla_ablation.variant_kernel("stale", tmp_path)


def test_ncu_stall_summary():
    rows = [
        {"Source": "  LDS.U8 R1, [R2]", "stall_mio": "6", "stall_wait": "0", "stall_mio (Not Issued)": "9"},
        {"Source": "@P0 LDS.64 R4, [R2]", "stall_mio": "0", "stall_wait": "4", "stall_mio (Not Issued)": "9"},
        {"Source": "HMMA.16816.F32 R8, R4, R6, R8", "stall_mio": "0", "stall_wait": "10", "stall_mio (Not Issued)": "0"},
    ]
    summary = ncu_stalls.summarize(rows)
    assert summary["samples"] == 20  # the "(Not Issued)" duplicates are not counted twice
    assert summary["reasons"] == {"wait": 0.7, "mio": 0.3}
    assert summary["by_opcode"]["LDS"] == {"share": 0.5, "reasons": {"mio": 0.3, "wait": 0.2}}
    assert summary["top_instructions"][0]["sass"].startswith("HMMA")
