"""Self-test orchestration, in the agent's process: stdlib only (torch lives in the children).

Per device, the accelerated then the fallback path each run in their own child process with a time
limit, on the same seed (so both see the same problems); devices run in parallel. A crash or hang is
an `error` for that path with the step it died in; the other path and the other devices still report.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Mapping

from ..fingerprint import fingerprint, fingerprint_parts
from ..isolation import ChildOutcome, run_isolated
from . import plan

PATHS = ("accelerated", "fallback")
DEFAULT_TIMEOUT_S = 300.0
DEVICE_INDEX_ENV = "GLUON_SELFTEST_DEVICE_INDEX"
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
    result = last_marked(outcome.stdout, plan.RESULT_MARKER)
    if outcome.ok and result is not None:
        return result, None
    step = last_marked(outcome.stdout, plan.PROGRESS_MARKER)
    where = f" during {step['step']} ({step['backend']})" if step else " before its first step"
    tail = [ln for ln in outcome.stderr.strip().splitlines() if ln.strip()][-1:]
    last = f"; last stderr line: {tail[0][:400]}" if tail else ""
    return None, f"child {outcome.detail}{where}{last}"


def run_path(device: str, index: int, path: str, spec: dict[str, Any], python: str, env: Mapping[str, str], timeout: float) -> dict[str, Any]:
    child_env = dict(env)
    child_env[DEVICE_INDEX_ENV] = str(index)
    argv = [python, "-m", "gluon_agent.selftest.worker", json.dumps(spec | {"device": device, "path": path})]
    outcome = run_isolated(argv, timeout=timeout, env=child_env)
    child, failure = interpret(outcome)
    result, reasons = plan.path_verdict(child, failure)
    return {"result": result, "reasons": reasons, "child": child, "child_seconds": round(outcome.seconds, 2)}


def run_device(device: str, index: int, spec: dict[str, Any], python: str, env: Mapping[str, str], timeout: float) -> dict[str, Any]:
    paths = {path: run_path(device, index, path, spec, python, env, timeout) for path in PATHS}
    timings = {p: (paths[p]["child"] or {}).get("timing", []) for p in PATHS}
    speedup = plan.speedups(timings["accelerated"], timings["fallback"])
    slow = plan.speed_gate(spec["backend_set"], speedup) if paths["accelerated"]["result"] == "pass" else None
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


def run_selftest(
    probe_report: Mapping[str, Any],
    backend_set: str | None = None,
    cpu_interpret: bool = False,
    cpu_devices: int = 1,
    timeout: float = DEFAULT_TIMEOUT_S,
    timing: bool = True,
    python: str | None = None,
    env: Mapping[str, str] | None = None,
    seed: int | None = None,
) -> dict[str, Any]:
    started = time.monotonic()
    chosen = choose_backend_set(probe_report, backend_set)
    env = dict(os.environ if env is None else env)
    if cpu_interpret:
        env["TRITON_INTERPRET"] = "1"
    spec = {
        "backend_set": chosen,
        "seed": secrets.randbits(40) if seed is None else seed,  # fresh inputs every run
        "timing": timing,
        "memory_limit_bytes": plan.MEMORY_LIMIT_BYTES,
    }
    devices = devices_for(probe_report, cpu_interpret, cpu_devices)
    with ThreadPoolExecutor(max_workers=max(1, len(devices))) as pool:
        futures = [
            pool.submit(run_device, d, i, spec, python or sys.executable, env, timeout) for i, d in enumerate(devices)
        ]
        gpus = [f.result() for f in futures]
    per_path = [r for g in gpus for r in g["result"].values()]
    problems = [] if gpus else ["no GPU visible: nothing to test"]
    return {
        "schema_version": SCHEMA_VERSION,
        "mode": "cpu-interpret" if cpu_interpret else "gpu",
        "backend_set": chosen,
        "backends": {p: gpus[0]["paths"][p]["child"]["backend"] for p in PATHS if gpus and gpus[0]["paths"][p]["child"]},
        "thresholds": plan.thresholds(chosen),
        "fingerprint": fingerprint(dict(probe_report)),
        "fingerprint_parts": fingerprint_parts(dict(probe_report)),
        "seed": spec["seed"],
        "gpus": gpus,
        "result": plan.worst(per_path) if gpus else "error",
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
                lines.append(f"  {path:<11} {case['backend']:<18} {case['case']:<14} rel_l2={rel} cos_diff={cos} {mark}")
            for t in child.get("timing", []):
                lines.append(
                    f"  {path:<11} {t['backend']:<18} {t['case']:<14} {t['ms'] * 1e3:9.1f} us "
                    f"{t['kv_tbps']:.2f} TB/s ({t.get('ratio_to_ceiling', 0):.2f} of copy)"
                )
            for g in child.get("graph", []):
                ratio = "-" if g["ratio"] is None else f"{g['ratio']:.2f}"
                lines.append(f"  {path:<11} {g['backend']:<18} graph replay/eager={ratio} {'ok' if not g['problems'] else 'FAIL'}")
            lines += [f"  {path:<11} reason: {r}" for r in info["reasons"]]
        for case, value in gpu["speedup"].items():
            lines.append(f"  speedup {case}: {value:.2f}x")
    return "\n".join(lines)
