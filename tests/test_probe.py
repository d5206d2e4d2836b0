"""The capability probe: the pure verdict exhaustively, then real child interpreters over fake stacks."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import venv

import pytest

from gluon_agent import cli
from gluon_agent.probe import Facts, decide, parse_sglang_flag, probe
from gluon_localcluster.fakes.stacks import AITER_STACK, TORCH_GFX950, TRITON_36, failing_aiter, write_tree

CGA = "Triton Gluon cga_layout (have {}, need >= 3.7)"
IMPORT = "aiter.ops.triton.gluon.mla_gluon import"
ARCH_SETS = [(), ("gfx950",), ("gfx950", "gfx950"), ("gfx950", "gfx942"), ("sm_90",)]


@pytest.mark.parametrize(
    "enabled,import_ok,cga_ok,archs,fp8",
    list(itertools.product([True, False], [True, False], [True, False], ARCH_SETS, [True, False])),
)
def test_verdict_exhaustive(enabled, import_ok, cga_ok, archs, fp8):
    v = decide(Facts(enabled, import_ok, "3.6.0", cga_ok, archs, fp8))
    arch_ok = bool(archs) and all(a == "gfx950" for a in archs)
    assert v.capable == (import_ok and cga_ok and arch_ok and fp8)
    assert v.ready == (enabled and import_ok and cga_ok)  # SGLang's own decision: no arch or fp8 check
    expected = []
    if not import_ok:
        expected.append(IMPORT)
    if not cga_ok:
        expected.append(CGA.format("3.6.0"))
    if not archs:
        expected.append("GPU arch gfx950 (no GPU visible)")
    elif not arch_ok:
        expected.append("GPU arch gfx950 (have " + ", ".join(sorted(set(archs) - {"gfx950"})) + ")")
    if not fp8:
        expected.append("fp8 e4m3fn (torch.float8_e4m3fn unusable on this device)")
    assert v.missing_for_capable == expected
    sglang_decides = [m for m in expected if m in (IMPORT, CGA.format("3.6.0"))]
    assert v.missing_for_ready == ([] if enabled else ["SGLANG_AITER_MLA_GLUON=0"]) + sglang_decides
    assert ("ready" in v.summary) == (v.ready and v.capable)
    assert ("cannot run it" in v.summary) == (v.ready and not v.capable)


@pytest.mark.parametrize("access", [None, "absent", "ok", "denied (EPERM)"])
def test_no_gpu_names_a_denied_kfd_and_the_chart_values_that_grant_it(access):
    missing = decide(Facts(True, True, "3.7.0", True, (), True, kfd_access=access)).missing_for_capable
    if access == "denied (EPERM)":
        assert missing == [
            "GPU arch gfx950 (no GPU visible: opening /dev/kfd was denied (EPERM); on a standard container runtime "
            "only a privileged container or a device plugin's allocation may open it: the chart's agent.privileged "
            "or agent.gpuAccess=resource)"
        ]
    else:
        assert missing == ["GPU arch gfx950 (no GPU visible)"]
    assert decide(Facts(True, True, "3.7.0", True, ("gfx950",), True, kfd_access=access)).capable


def test_device_access_reads_absent_ok_and_denied(tmp_path):
    from gluon_agent import probe_child

    assert probe_child.device_access(str(tmp_path / "none")) == "absent"
    present = tmp_path / "dev"
    present.write_text("")
    assert probe_child.device_access(str(present)) == "ok"
    assert probe_child.device_access("/sys/kernel/notes").startswith("denied (")  # read-only for root too: EACCES


def test_verdict_unknown_triton_version():
    v = decide(Facts(True, True, None, False, ("gfx950",), True))
    assert v.missing_for_ready == [CGA.format("unknown")]


@pytest.mark.parametrize(
    "raw,enabled,valid",
    [
        (None, True, True),
        ("1", True, True),
        ("TRUE", True, True),
        ("yes", True, True),
        ("y", True, True),
        ("0", False, True),
        ("False", False, True),
        ("no", False, True),
        ("n", False, True),
        ("banana", True, False),  # SGLang warns and keeps its default, on
        ("", True, False),
        (" 0", True, False),  # SGLang does not strip
    ],
)
def test_sglang_flag_parsing(raw, enabled, valid):
    flag = parse_sglang_flag(raw)
    assert (flag.enabled, flag.valid, flag.raw) == (enabled, valid, raw)


def stack_env(clean_env, *paths, flag=None):
    env = dict(clean_env)
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in paths)
    if flag is not None:
        env["SGLANG_AITER_MLA_GLUON"] = flag
    return env


@pytest.fixture
def gfx950_torch(tmp_path):
    return write_tree(tmp_path / "torch_gfx950", TORCH_GFX950)


def test_capable_stack_with_real_triton(clean_env, gfx950_torch):
    report = probe(env=stack_env(clean_env, AITER_STACK, gfx950_torch))
    assert report["import_ok"] is True and report["import_error"] is None
    assert report["aiter_version"] == "0.1.99+fake"
    assert report["triton_cga_layout_ok"] is True  # the real PyPI Triton (3.9) has cga_layout
    assert report["triton_version"].startswith("3.")
    assert [g["arch"] for g in report["gpus"]] == ["gfx950", "gfx950"]
    assert report["hip_version"] == "7.0.51831"
    assert report["capable"] and report["ready"]
    assert report["missing_for_ready"] == []
    assert report["summary"].startswith("Gluon MLA h12+fp8 ready")


@pytest.mark.parametrize("flag,enabled,valid", [("0", False, True), ("1", True, True), ("garbage", True, False)])
def test_env_flag_values(clean_env, gfx950_torch, flag, enabled, valid):
    report = probe(env=stack_env(clean_env, AITER_STACK, gfx950_torch, flag=flag))
    assert report["capable"] is True  # capability ignores the flag
    assert (report["enabled_by_env"], report["env_value_valid"], report["env_value"]) == (enabled, valid, flag)
    assert report["ready"] is enabled
    assert report["missing_for_ready"] == ([] if enabled else ["SGLANG_AITER_MLA_GLUON=0"])


def test_triton_36_lacks_cga_layout(clean_env, gfx950_torch, tmp_path):
    triton36 = write_tree(tmp_path / "triton36", TRITON_36)
    report = probe(env=stack_env(clean_env, AITER_STACK, gfx950_torch, triton36))
    assert report["triton_version"] == "3.6.0"
    assert report["triton_cga_layout_ok"] is False
    assert report["capable"] is False
    assert report["missing_for_ready"] == [CGA.format("3.6.0")]


@pytest.mark.parametrize(
    "kind,error",
    [
        ("importerror", "ImportError: libmla_gluon.so: cannot open shared object file"),
        ("runtimeerror", "RuntimeError: aiter gluon kernels require triton>=3.6"),
    ],
)
def test_aiter_import_exceptions(clean_env, gfx950_torch, tmp_path, kind, error):
    report = probe(env=stack_env(clean_env, failing_aiter(tmp_path / kind, kind), gfx950_torch))
    assert report["import_ok"] is False
    assert report["import_error"] == error
    assert report["missing_for_ready"] == [IMPORT]
    # SGLang catches only ImportError: anything else stops its serving process, a finding of its own
    if kind == "importerror":
        assert report["import_crash"] is None
    else:
        assert report["import_crash"].startswith(f"{IMPORT} fails with {error}, not ImportError")
        assert "serving process fails to start" in report["summary"]
    assert report["triton_cga_layout_ok"] is True  # other facts survive the failed import


def test_aiter_import_abort(clean_env, gfx950_torch, tmp_path):
    report = probe(env=stack_env(clean_env, failing_aiter(tmp_path / "abort", "abort"), gfx950_torch))
    assert report["import_ok"] is False
    assert report["import_error"].startswith("import child killed by SIGABRT")
    assert report["checks"]["aiter"]["status"] == "signal"
    assert [g["arch"] for g in report["gpus"]] == ["gfx950", "gfx950"]
    assert report["missing_for_ready"] == [IMPORT]
    assert "killed by SIGABRT" in report["import_crash"]  # SGLang's process would die the same way


def test_aiter_import_hang_is_bounded(clean_env, gfx950_torch, tmp_path):
    report = probe(env=stack_env(clean_env, failing_aiter(tmp_path / "hang", "hang"), gfx950_torch), timeout=3)
    assert report["import_ok"] is False
    assert report["import_error"] == "import child timed out after 3 s (killed)"
    assert report["checks"]["aiter"]["status"] == "timeout"
    assert report["probe_seconds"] < 10
    assert report["capable"] is False


def test_no_gpu_real_torch(clean_env):
    report = probe(env=stack_env(clean_env, AITER_STACK))
    assert report["torch_version"].startswith("2.")
    assert report["gpus"] == []
    assert report["fp8_e4m3fn_ok"] is True  # e4m3fn round trip on the CPU
    assert report["missing_for_capable"] == ["GPU arch gfx950 (no GPU visible)"]
    assert report["ready"] and report["missing_for_ready"] == []  # SGLang would try Gluon here (and fail)


def test_probes_a_foreign_bare_interpreter(tmp_path, clean_env):
    """--python: facts come from the probed interpreter, not ours (a bare venv has no torch or triton)."""
    venv.create(tmp_path / "bare", with_pip=False)
    python = str(tmp_path / "bare" / "bin" / "python")
    report = probe(python=python, env=clean_env)
    assert report["python"] == python
    assert report["torch_version"] is None and report["triton_version"] is None
    assert report["import_error"] == "ModuleNotFoundError: No module named 'aiter'"
    assert report["torch_error"].startswith("ModuleNotFoundError")
    assert report["missing_for_ready"] == [IMPORT, CGA.format("unknown")]
    assert report["missing_for_capable"] == [
        IMPORT,
        CGA.format("unknown"),
        "GPU arch gfx950 (no GPU visible)",
        "fp8 e4m3fn (torch.float8_e4m3fn unusable on this device)",
    ]
    assert report["import_crash"] is None  # ModuleNotFoundError is an ImportError: SGLang falls back
    assert report["sglang"]["version"] is None


def test_missing_interpreter_is_reported(clean_env):
    report = probe(python="/nonexistent/python3", env=clean_env, timeout=5)
    assert report["capable"] is False
    assert report["checks"]["aiter"]["status"] == "spawn-failed"
    assert "could not start /nonexistent/python3" in report["import_error"]


def run_cli(*args, env):
    return subprocess.run(
        [sys.executable, "-m", "gluon_agent", *args], capture_output=True, text=True, env=env, timeout=60
    )


def test_cli_json_and_exit_codes(clean_env, gfx950_torch):
    capable = run_cli("probe", "--json", env=stack_env(clean_env, AITER_STACK, gfx950_torch, flag="0"))
    assert capable.returncode == 0, capable.stderr
    body = json.loads(capable.stdout)
    assert body["capable"] is True and body["ready"] is False and body["schema_version"] == 1

    incapable = run_cli("probe", env=stack_env(clean_env, AITER_STACK))
    assert incapable.returncode == 1
    assert "missing" in incapable.stdout and "GPU arch gfx950 (no GPU visible)" in incapable.stdout

    usage = run_cli("probe", "--timeout", "-1", env=clean_env)
    assert usage.returncode == 2 and "must be > 0" in usage.stderr


def test_cli_main_in_process(clean_env, gfx950_torch, capsys, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(map(str, (AITER_STACK, gfx950_torch))))
    monkeypatch.delenv("SGLANG_AITER_MLA_GLUON", raising=False)
    assert cli.main(["probe"]) == 0
    out = capsys.readouterr().out
    assert "capable" in out and "Gluon MLA h12+fp8 ready" in out
