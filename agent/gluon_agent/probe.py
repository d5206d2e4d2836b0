"""The capability probe of SGLang PR #34647, re-implemented to probe any Python interpreter.

Stdlib only (the preflight runs it under a serving image's python3). The facts come from
`probe_child` checks run in the probed interpreter, one child process per check, in parallel;
the verdict is a pure function of the facts.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from gluon_common import sglang_env
from gluon_common.contract import FLAG_ENV
from gluon_common.sglang_routes import decode_routes

from .isolation import ChildOutcome, run_isolated
from .probe_child import CHECKS, RESULT_MARKER

SCHEMA_VERSION = 1
REQUIRED_ARCH = "gfx950"  # mla_gluon asserts gfx950 (MI350X/MI355X)
CGA_MIN_TRITON = "3.7"
DEFAULT_TIMEOUT_S = 120.0  # aiter's first import can JIT-build for a while
CHILD_SOURCE = Path(__file__).with_name("probe_child.py").read_text()


# Wording of SGLang's MlaGluonCapability.missing_for_ready(), then ours.
MISSING_ENV = f"{FLAG_ENV}=0"
MISSING_IMPORT = "aiter.ops.triton.gluon.mla_gluon import"


@dataclass(frozen=True)
class EnvFlag:
    raw: str | None
    enabled: bool
    valid: bool


def parse_sglang_flag(raw: str | None) -> EnvFlag:
    """SGLang's reading of the flag (gluon_common.sglang_env): an unset or unreadable value is its default, on."""
    return EnvFlag(
        raw, sglang_env.env_bool(raw, sglang_env.FLAG_DEFAULT), raw is None or sglang_env.parsed(raw) is not None
    )


@dataclass(frozen=True)
class Facts:
    """What the verdict depends on; everything else in the report is information."""

    enabled_by_env: bool
    import_ok: bool
    triton_version: str | None
    triton_cga_layout_ok: bool
    gpu_archs: tuple[str, ...]
    fp8_e4m3fn_ok: bool
    kfd_access: str | None = None  # probe_child.device_access of /dev/kfd (None: not checked)


@dataclass(frozen=True)
class Verdict:
    capable: bool
    ready: bool
    missing_for_capable: list[str]
    missing_for_ready: list[str]
    summary: str


def missing_for_capable(facts: Facts) -> list[str]:
    missing = []
    if not facts.import_ok:
        missing.append(MISSING_IMPORT)
    if not facts.triton_cga_layout_ok:
        have = facts.triton_version or "unknown"
        missing.append(f"Triton Gluon cga_layout (have {have}, need >= {CGA_MIN_TRITON})")
    if not facts.gpu_archs and (facts.kfd_access or "").startswith("denied"):
        missing.append(
            f"GPU arch {REQUIRED_ARCH} (no GPU visible: opening /dev/kfd was {facts.kfd_access}; on a standard "
            "container runtime only a privileged container or a device plugin's allocation may open it: the chart's "
            "agent.privileged or agent.gpuAccess=resource)"
        )
    elif not facts.gpu_archs:
        missing.append(f"GPU arch {REQUIRED_ARCH} (no GPU visible)")
    else:
        wrong = sorted({a for a in facts.gpu_archs if a != REQUIRED_ARCH})
        if wrong:
            missing.append(f"GPU arch {REQUIRED_ARCH} (have {', '.join(wrong)})")
    if not facts.fp8_e4m3fn_ok:
        missing.append("fp8 e4m3fn (torch.float8_e4m3fn unusable on this device)")
    return missing


def missing_for_ready(facts: Facts) -> list[str]:
    """What SGLang's own probe (aiter_mla_gluon._gluon_fn) lacks: the env flag, the import, cga_layout.
    SGLang checks neither the GPU arch nor fp8; those stay in missing_for_capable."""
    missing = [] if facts.enabled_by_env else [MISSING_ENV]
    if not facts.import_ok:
        missing.append(MISSING_IMPORT)
    if not facts.triton_cga_layout_ok:
        missing.append(f"Triton Gluon cga_layout (have {facts.triton_version or 'unknown'}, need >= {CGA_MIN_TRITON})")
    return missing


def decide(facts: Facts) -> Verdict:
    """Capable: the stack and hardware can run the Gluon path. Ready: SGLang would take it now (its
    own decision: env, import, cga_layout)."""
    for_capable = missing_for_capable(facts)
    for_ready = missing_for_ready(facts)
    capable = not for_capable
    ready = not for_ready
    if ready and capable:
        summary = f"Gluon MLA h12+fp8 ready (Triton={facts.triton_version})"
    elif ready:
        summary = "SGLang would take the Gluon MLA path, but this node cannot run it (" + "; ".join(for_capable) + ")"
    elif capable:
        summary = f"Gluon MLA h12+fp8 capable but disabled by {MISSING_ENV}"
    else:
        summary = (
            "Gluon MLA h12+fp8 disabled; fallback to zero-pad mla_decode_fwd ("
            + "; ".join(for_ready + [m for m in for_capable if m not in for_ready])
            + ")"
        )
    return Verdict(capable, ready, for_capable, for_ready, summary)


@dataclass
class CheckRun:
    name: str
    status: str
    seconds: float
    detail: str
    result: dict[str, Any] = field(default_factory=dict)


def parse_child(name: str, outcome: ChildOutcome) -> CheckRun:
    lines = [ln for ln in outcome.stdout.splitlines() if ln.startswith(RESULT_MARKER)]
    if outcome.ok and lines:
        try:
            return CheckRun(name, "ok", outcome.seconds, outcome.detail, json.loads(lines[-1][len(RESULT_MARKER) :]))
        except json.JSONDecodeError as exc:
            return CheckRun(name, "bad-output", outcome.seconds, f"unreadable result: {exc}")
    if outcome.ok:
        return CheckRun(name, "bad-output", outcome.seconds, "exited without a result line")
    tail = outcome.stderr.strip().splitlines()[-1:] or [""]
    detail = outcome.detail + (f"; last stderr line: {tail[0][:300]}" if tail[0] else "")
    return CheckRun(name, outcome.status, outcome.seconds, detail)


def run_check(python: str, name: str, env: Mapping[str, str], timeout: float, cwd: str) -> CheckRun:
    argv = [python, "-c", CHILD_SOURCE, name]
    return parse_child(name, run_isolated(argv, timeout=timeout, env=env, cwd=cwd))


def run_checks(python: str, env: Mapping[str, str], timeout: float) -> dict[str, CheckRun]:
    with tempfile.TemporaryDirectory(prefix="gluon-probe-") as empty_cwd:  # nothing importable by accident
        with ThreadPoolExecutor(max_workers=len(CHECKS)) as pool:
            futures = {n: pool.submit(run_check, python, n, env, timeout, empty_cwd) for n in CHECKS}
            return {n: f.result() for n, f in futures.items()}


def import_failure(run: CheckRun) -> str | None:
    """SGLang only sees the exception; a dead or hung child is a failure with its reason."""
    if run.status == "ok":
        return run.result.get("import_error")
    return f"import child {run.detail}"


def import_crash(run: CheckRun) -> str | None:
    """Why SGLang's serving process would not start with the flag on, or None. SGLang's _gluon_fn catches
    only ImportError: another exception, an abort or a hang in the import stops it (louder than "not
    capable": the flag must never be turned on here)."""
    if run.status == "ok" and (run.result.get("import_ok") or run.result.get("import_error_is_importerror", True)):
        return None
    failure = import_failure(run)
    return (
        f"{MISSING_IMPORT} fails with {failure}, not ImportError: SGLang catches only ImportError, so with "
        f"{FLAG_ENV} on its serving process fails to start"
    )


def assemble(python: str, flag: EnvFlag, runs: dict[str, CheckRun], seconds: float) -> dict[str, Any]:
    meta, aiter, triton, torch = (runs[n].result for n in ("meta", "aiter", "triton", "torch"))
    gpus = torch.get("gpus", [])
    facts = Facts(
        enabled_by_env=flag.enabled,
        import_ok=runs["aiter"].status == "ok" and bool(aiter.get("import_ok")),
        triton_version=triton.get("triton_version") or meta.get("triton_dist_version"),
        triton_cga_layout_ok=bool(triton.get("triton_cga_layout_ok")),
        gpu_archs=tuple(g["arch"] for g in gpus),
        fp8_e4m3fn_ok=bool(torch.get("fp8_e4m3fn_ok")),
        kfd_access=meta.get("kfd_access"),
    )
    verdict = decide(facts)
    crash = None if facts.import_ok else import_crash(runs["aiter"])
    return {
        "schema_version": SCHEMA_VERSION,
        "python": python,
        "python_version": meta.get("python_version"),
        "env_var": FLAG_ENV,
        "env_value": flag.raw,
        "env_value_valid": flag.valid,
        "enabled_by_env": flag.enabled,
        "import_ok": facts.import_ok,
        "import_error": None if facts.import_ok else import_failure(runs["aiter"]),
        "import_crash": crash,
        "aiter_version": meta.get("aiter_version") or aiter.get("aiter_module_version"),
        "triton_version": facts.triton_version,
        "triton_cga_layout_ok": facts.triton_cga_layout_ok,
        "triton_error": triton.get("triton_error") or _check_problem(runs["triton"]),
        "torch_version": torch.get("torch_version") or meta.get("torch_dist_version"),
        "torch_error": torch.get("torch_error") or _check_problem(runs["torch"]),
        "hip_version": torch.get("hip_version"),
        "cuda_version": torch.get("cuda_version"),
        "driver_version": meta.get("driver_version"),
        "kfd_access": meta.get("kfd_access"),
        "gpus": gpus,
        "fp8_e4m3fn_ok": facts.fp8_e4m3fn_ok,
        "capable": verdict.capable,
        "ready": verdict.ready,
        "missing_for_capable": verdict.missing_for_capable,
        "missing_for_ready": verdict.missing_for_ready,
        "summary": verdict.summary if crash is None else f"{verdict.summary}. {crash}",
        "sglang": dict(decode_routes(runs["sglang"].result), check=runs["sglang"].status),
        "checks": {
            n: {"status": r.status, "seconds": round(r.seconds, 3), "detail": r.detail} for n, r in runs.items()
        },
        "probe_seconds": round(seconds, 3),
    }


def _check_problem(run: CheckRun) -> str | None:
    return None if run.status == "ok" else f"{run.name} check {run.detail}"


def probe(
    python: str | None = None, env: Mapping[str, str] | None = None, timeout: float = DEFAULT_TIMEOUT_S
) -> dict[str, Any]:
    """Probe `python` (default: this interpreter) with `env` (default: ours). Never raises for the stack's faults."""
    python = python or sys.executable
    env = dict(os.environ if env is None else env)
    started = time.monotonic()
    runs = run_checks(python, env, timeout)
    return assemble(python, parse_sglang_flag(env.get(FLAG_ENV)), runs, time.monotonic() - started)


def format_table(report: dict[str, Any]) -> str:
    def yes(value: bool) -> str:
        return "yes" if value else "NO"

    gpus = report["gpus"]
    gpu_text = ", ".join(f"{g['index']}:{g['arch']} {g['name']}" for g in gpus) or "none visible"
    env_text = report["env_value"] if report["env_value"] is not None else "(unset: SGLang default on)"
    if not report["env_value_valid"]:
        env_text += " (not a boolean: SGLang warns and uses its default, on)"
    rows = [
        ("python", f"{report['python']} ({report['python_version'] or '?'})"),
        (FLAG_ENV, f"{env_text} -> {'on' if report['enabled_by_env'] else 'off'}"),
        ("aiter import", yes(report["import_ok"]) + ("" if report["import_ok"] else f"  ({report['import_error']})")),
        ("aiter version", report["aiter_version"] or "not installed"),
        ("triton version", report["triton_version"] or "not installed"),
        ("gluon cga_layout", yes(report["triton_cga_layout_ok"])),
        (
            "torch",
            f"{report['torch_version'] or 'not installed'} hip={report['hip_version']} cuda={report['cuda_version']}",
        ),
        ("driver", report["driver_version"] or "unknown"),
        ("gpus", gpu_text),
        ("fp8 e4m3fn", yes(report["fp8_e4m3fn_ok"])),
        ("sglang", _sglang_text(report.get("sglang") or {})),
        ("capable", yes(report["capable"])),
        ("ready", yes(report["ready"])),
    ]
    width = max(len(k) for k, _ in rows)
    lines = [f"{k.ljust(width)}  {v}" for k, v in rows]
    missing = report["missing_for_ready"] + [
        m for m in report["missing_for_capable"] if m not in report["missing_for_ready"]
    ]
    lines += [f"{'missing'.ljust(width)}  {m}" for m in missing]
    if report.get("import_crash"):
        lines.append(f"{'IMPORT CRASH'.ljust(width)}  {report['import_crash']}")
    lines.append(report["summary"])
    return "\n".join(lines)


def _sglang_text(routes: dict[str, Any]) -> str:
    if not routes.get("version") and routes.get("flag0_route") == "unknown":
        return "not installed"
    mtp = {True: "yes", False: "no", None: "unknown"}[routes.get("mtp_through_gluon")]
    return f"{routes.get('version')} flag-0 route {routes.get('flag0_route')}, q_len>1 through Gluon {mtp}"
