"""Self-test orchestration, in the agent's process: stdlib only (torch lives in the children).

Per device, the accelerated then the fallback path each run in their own child process with a time
limit, on the same seed (so both see the same problems); devices run in parallel. Children start early
and import torch while they wait for their spec (see run_device, run_selftest). A crash or hang is
an `error` for that path with the step it died in; the other path and the other devices still report.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Mapping

from gluon_common import contract
from gluon_common.sglang_routes import ServingConfig, flag_routes

from ..fingerprint import fingerprint, fingerprint_parts
from ..isolation import ChildOutcome, run_isolated
from . import cases

PATHS = ("accelerated", "fallback")
DEFAULT_TIMEOUT_S = 300.0
DEVICE_INDEX_ENV = contract.ENV_SELFTEST_DEVICE_INDEX
SCHEMA_VERSION = 1


def choose_backend_set(probe_report: Mapping[str, Any], forced: str | None) -> str:
    """aiter where SGLang could take the Gluon path (capable gfx950 stack); our portable kernel elsewhere."""
    if forced and forced != "auto":
        return forced
    return "aiter" if probe_report.get("capable") else "triton"


def last_marked(stdout: str, marker: str) -> dict[str, Any] | None:
    lines = [ln[len(marker) :] for ln in stdout.splitlines() if ln.startswith(marker)]
    if not lines:
        return None
    try:
        return json.loads(lines[-1])
    except json.JSONDecodeError:
        return None


def interpret(outcome: ChildOutcome) -> tuple[dict[str, Any] | None, str | None]:
    """(child result, failure reason): exactly one is set."""
    result = last_marked(outcome.stdout, cases.RESULT_MARKER)
    if outcome.ok and result is not None:
        return result, None
    step = last_marked(outcome.stdout, cases.PROGRESS_MARKER)
    where = f" during {step['step']} ({step['backend']})" if step else " before its first step"
    tail = [ln for ln in outcome.stderr.strip().splitlines() if ln.strip()][-1:]
    last = f"; last stderr line: {tail[0][:400]}" if tail else ""
    return None, f"child {outcome.detail}{where}{last}"


SpecSource = Callable[[], "dict[str, Any] | None"]  # blocks until the spec is known; None: cancelled


def run_path(
    device: str,
    index: int,
    path: str,
    spec_text: Callable[[], str | None],
    python: str,
    env: Mapping[str, str],
    timeout: float,
) -> dict[str, Any] | None:
    """One path's child, started at once (it imports torch meanwhile), its spec sent when known.
    None when it was cancelled before its spec was sent."""
    child_env = dict(env)
    child_env[DEVICE_INDEX_ENV] = str(index)
    argv = [
        python,
        "-m",
        "gluon_agent.selftest.worker",
        "-",
        device,
        path,
    ]  # the device is prewarmed while the spec comes
    outcome = run_isolated(argv, timeout=timeout, env=child_env, stdin_text=spec_text)
    if outcome.status == "cancelled":
        return None
    child, failure = interpret(outcome)
    result, reasons = cases.path_verdict(child, failure)
    return {"result": result, "reasons": reasons, "child": child, "child_seconds": round(outcome.seconds, 2)}


def run_device(
    device: str, index: int, spec_source: SpecSource, python: str, env: Mapping[str, str], timeout: float
) -> dict[str, Any] | None:
    """Both path children start together, so their imports overlap (and overlap the probe when the spec
    comes from it); the fallback gets its spec only once the accelerated child has ended, so GPU work,
    memory and timings are never shared. None when cancelled."""
    accelerated_done = threading.Event()

    def spec_text(path: str) -> Callable[[], str | None]:
        def deliver() -> str | None:
            spec = spec_source()
            if spec is None:
                return None
            if path == "fallback":
                accelerated_done.wait()
            mine = spec.get("paths", {}).get(path, {})
            return json.dumps(
                spec
                | {
                    "device": device,
                    "path": path,
                    "mtp_q_lens": mine.get("q_lens", []),
                    "routes": mine.get("routes", {}),
                }
            )

        return deliver

    with ThreadPoolExecutor(max_workers=1) as pool:
        fallback = pool.submit(run_path, device, index, "fallback", spec_text("fallback"), python, env, timeout)
        try:
            accelerated = run_path(device, index, "accelerated", spec_text("accelerated"), python, env, timeout)
        finally:
            accelerated_done.set()
        paths = {"accelerated": accelerated, "fallback": fallback.result()}
    if accelerated is None or paths["fallback"] is None:
        return None
    spec = spec_source() or {}
    backend_set = spec.get("backend_set")
    for path, flag in (("accelerated", "1"), ("fallback", "0")):
        reason = cases.no_route_reason(flag, spec.get("paths", {}).get(path, {}))
        if reason and paths[path]["result"] == "fail":  # the kernel's own refusal follows it
            paths[path]["reasons"].insert(0, reason)
    timings = {p: (paths[p]["child"] or {}).get("timing", []) for p in PATHS}
    speedup = cases.speedups(timings["accelerated"], timings["fallback"])
    slow = cases.speed_gate(backend_set, speedup) if paths["accelerated"]["result"] == "pass" else None
    if slow:
        paths["accelerated"]["result"] = "fail"
        paths["accelerated"]["reasons"].append(slow)
    return {
        "index": index,
        "device": device,
        "result": {p: paths[p]["result"] for p in PATHS},
        "speedup": speedup,
        "paths": paths,
    }


def devices_for(probe_report: Mapping[str, Any], cpu_interpret: bool, cpu_devices: int) -> list[str]:
    if cpu_interpret:
        return ["cpu"] * cpu_devices
    return [f"cuda:{g['index']}" for g in probe_report.get("gpus", [])]


def guess_devices(cpu_interpret: bool, cpu_devices: int) -> list[str]:
    """The devices the probe will most likely report, from what needs no torch: the visible-devices
    variables, else the device files. Only used to start children early; a wrong guess costs nothing
    but their imports (they are cancelled and the real list is run)."""
    if cpu_interpret:
        return ["cpu"] * cpu_devices
    for variable in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"):
        value = os.environ.get(variable)
        if value is not None:
            return [f"cuda:{i}" for i, d in enumerate(x for x in value.split(",") if x.strip() not in ("", "-1"))]
    nvidia = [p for p in Path("/dev").glob("nvidia*") if p.name[len("nvidia") :].isdigit()]
    amd = sorted(Path("/dev/dri").glob("renderD*")) if Path("/dev/kfd").exists() else []
    return [f"cuda:{i}" for i in range(len(nvidia) or len(amd))]


def run_devices(
    devices: list[str],
    spec_source: SpecSource,
    python: str,
    env: Mapping[str, str],
    timeout: float,
    pool: ThreadPoolExecutor,
) -> list[Future]:
    return [pool.submit(run_device, d, i, spec_source, python, env, timeout) for i, d in enumerate(devices)]


def run_selftest(
    probe_report: Mapping[str, Any] | Callable[[], Mapping[str, Any]],
    backend_set: str | None = None,
    cpu_interpret: bool = False,
    cpu_devices: int = 1,
    timeout: float = DEFAULT_TIMEOUT_S,
    timing: bool = True,
    python: str | None = None,
    env: Mapping[str, str] | None = None,
    seed: int | None = None,
    mtp_q_lens: tuple[int, ...] = cases.MTP_Q_LENS,
    serving: ServingConfig | None = None,
) -> dict[str, Any]:
    """`probe_report` may be the probe itself (a callable): then the children for the devices it will
    most likely find start first and import torch while it runs (the warm self-test's wall time is
    mostly imports)."""
    started = time.monotonic()
    python = python or sys.executable
    env = dict(os.environ if env is None else env)
    if cpu_interpret:
        env["TRITON_INTERPRET"] = "1"
    seed = secrets.randbits(40) if seed is None else seed  # fresh inputs every run
    spec_known: Future = Future()
    early = guess_devices(cpu_interpret, cpu_devices) if callable(probe_report) else []
    with ThreadPoolExecutor(max_workers=64) as pool:  # one thread per device, twice if the guess was wrong
        started_early = run_devices(early, spec_known.result, python, env, timeout, pool)
        try:
            report = dict(probe_report() if callable(probe_report) else probe_report)
        except BaseException:
            spec_known.set_result(None)  # cancel the early children, then let the probe's error out
            raise
        chosen = choose_backend_set(report, backend_set)
        sglang = report.get("sglang")
        config = serving or ServingConfig(verify_q_lens=tuple(mtp_q_lens))
        routes = flag_routes(sglang, config)
        spec = {
            "backend_set": chosen,
            "seed": seed,
            "timing": timing,
            "memory_limit_bytes": cases.MEMORY_LIMIT_BYTES,
            "sglang": sglang,
            "paths": cases.path_plan(chosen, routes, config.q_lens),
            "serving_setup": {
                "speculative": bool(config.verify_q_lens),
                "page_size": config.page_size,
                "dp_attention": config.dp_attention,
                "max_seqlen_qo": max(config.q_lens),
            },
        }
        devices = devices_for(report, cpu_interpret, cpu_devices)
        if early and devices == early:
            futures = started_early
            spec_known.set_result(spec)
        else:
            spec_known.set_result(None)
            futures = run_devices(devices, lambda: spec, python, env, timeout, pool)
        gpus = [f.result() for f in futures]
        for f in started_early:
            f.result()  # cancelled ones end at once
    per_path = [r for g in gpus for r in g["result"].values()]
    problems = [] if gpus else ["no GPU visible: nothing to test"]
    return {
        "schema_version": SCHEMA_VERSION,
        "mode": "cpu-interpret" if cpu_interpret else "gpu",
        "backend_set": chosen,
        "backends": {
            p: gpus[0]["paths"][p]["child"]["backend"] for p in PATHS if gpus and gpus[0]["paths"][p]["child"]
        },
        "thresholds": cases.thresholds(chosen),
        "sglang": report.get("sglang"),
        "serving": config.as_dict() | {"digest": config.digest},
        "routes": {
            path: {"q_lens": [1, *p["q_lens"]], "routes": p["routes"], "no_route": p["no_route"]}
            for path, p in spec["paths"].items()
        },
        "fingerprint": fingerprint(report),
        "fingerprint_parts": fingerprint_parts(report),
        "seed": seed,
        "gpus": gpus,
        "result": cases.worst(per_path) if gpus else "error",
        "failures": cases.gpu_failures(gpus),
        "problems": problems,
        "seconds": round(time.monotonic() - started, 2),
        "finished_at": time.time(),
    }


def format_table(report: Mapping[str, Any]) -> str:
    lines = [
        f"self-test {report['result'].upper()}  mode={report['mode']} backends={report['backend_set']} "
        f"fingerprint={report['fingerprint']} seconds={report['seconds']}",
    ]
    lines += [f"  problem: {p}" for p in report["problems"]]
    lines += [
        f"  GPU {f['gpu']} ({f['device']}) {f['path']} {f['result']}: {f['reason']}" for f in report.get("failures", [])
    ]
    routes = report.get("sglang") or {}
    if routes:
        lines.append(
            f"  serving SGLang {routes.get('version')}: flag-0 route {routes.get('flag0_route')}, "
            f"q_len>1 through Gluon {routes.get('mtp_through_gluon')} ({routes.get('evidence')})"
        )
    serving = report.get("serving") or {}
    if serving:
        lines.append(
            f"  serving config {serving.get('digest')}: q_lens {[1, *serving.get('verifyQLens', [])]}, "
            f"DCP {serving.get('dcpSize')} ({serving.get('dcpDecodeBackend')}), persist {serving.get('persist')}, "
            f"page size {serving.get('pageSize')}, DP attention {serving.get('dpAttention')}"
        )
    for path, planned in (report.get("routes") or {}).items():
        lines += [f"  {path}: no route: {reason}" for reason in planned.get("no_route", [])]
    for gpu in report["gpus"]:
        results = " ".join(f"{p}={gpu['result'][p]}" for p in PATHS)
        lines.append(f"{gpu['device']}: {results}")
        for path in PATHS:
            info = gpu["paths"][path]
            child = info["child"] or {}
            for case in child.get("cases", []):
                rel = "-" if case["rel_l2"] is None else f"{case['rel_l2']:.2e}"
                cos = "-" if case["cos_diff"] is None else f"{case['cos_diff']:.2e}"
                mark = "ok" if not case["problems"] else "FAIL"
                lines.append(
                    f"  {path:<11} {case['backend']:<18} {case['case']:<14} rel_l2={rel} cos_diff={cos} {mark}"
                )
            for t in child.get("timing", []):
                lines.append(
                    f"  {path:<11} {t['backend']:<18} {t['case']:<14} {t['ms'] * 1e3:9.1f} us "
                    f"{t['kv_tbps']:.2f} TB/s ({t.get('ratio_to_ceiling', 0):.2f} of copy)"
                )
            for g in child.get("graph", []):
                ratio = "-" if g["ratio"] is None else f"{g['ratio']:.2f}"
                lines.append(
                    f"  {path:<11} {g['backend']:<18} graph replay/eager={ratio} "
                    f"{'ok' if not g['problems'] else 'FAIL'}"
                )
            lines += [f"  {path:<11} reason: {r}" for r in info["reasons"]]
        for case, value in gpu["speedup"].items():
            lines.append(f"  speedup {case}: {value:.2f}x")
    return "\n".join(lines)
