"""SIMULATION of a node's probe and self-test results, read from a file, for the local demo and tests
where no AMD GPU exists; it says so in every report it produces. The agent runs it through its source seam:
`gluon-agent run --source gluon_localcluster.fakes.simulated:SimulatedSource --source-arg FILE`
(agent_arguments below), with this checkout's localcluster/ on its PYTHONPATH."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Iterable

from gluon_agent.fingerprint import fingerprint, fingerprint_parts
from gluon_agent.probe import probe
from gluon_agent.selftest import runner
from gluon_common.sglang_routes import DEFAULT_SERVING, ServingConfig, decode_routes

SOURCE = f"{__name__}:SimulatedSource"


def agent_arguments(path: str | Path) -> list[str]:
    """`gluon-agent run` options that make its results this SIMULATION, read from `path`."""
    return ["--source", SOURCE, "--source-arg", str(path)]


class SimulatedSource:
    """Reads {"probe": {...}, "selftest": {"result": ..., "gpus": [...]}, "selftest_seconds": s} from a
    file on every call, so a test or the demo can change the node's facts while the agent runs.
    With "selftest": "cpu-interpret" the probe stays simulated but the self-test is the real runner on the
    CPU (real children, time limits and isolation; the kernels are whatever the environment provides, e.g.
    a fake aiter told to crash or hang).
    With "probe": "real" the probe is the agent's own, of the stack and devices it really sees (a real node's
    container: its device cgroup, the image's stack), and "selftest": {"every_gpu": {"accelerated": ...,
    "fallback": ..., "speedup": ...}} is the outcome on each GPU that probe found: only the kernels, which
    need an AMD GPU, are SIMULATION."""

    name = "simulation"

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def _read(self) -> dict[str, Any]:
        return json.loads(self.path.read_text())

    def probe(self) -> dict[str, Any]:
        facts = self._read()["probe"]
        return probe() if facts == "real" else dict(facts, simulated=True)

    def selftest(self, probe_report: dict[str, Any], serving: ServingConfig = DEFAULT_SERVING) -> dict[str, Any]:
        """The file's outcome, reported as a proof of `serving` (SIMULATION: nothing ran its routes)."""
        spec = self._read()
        if spec["selftest"] == "cpu-interpret":
            report = runner.run_selftest(
                probe_report,
                cpu_interpret=True,
                timeout=float(spec.get("selftest_timeout", runner.DEFAULT_TIMEOUT_S)),
                serving=serving,
            )
            return dict(report, simulated=True)
        started = time.monotonic()
        time.sleep(float(spec.get("selftest_seconds", 0)))
        report = dict(spec["selftest"])
        if "every_gpu" in report:
            report = simulated_selftest([g["index"] for g in probe_report.get("gpus") or []], **report["every_gpu"])
        report.setdefault("gpus", [])
        report.update(
            simulated=True,
            mode="simulation",
            fingerprint=fingerprint(probe_report),
            fingerprint_parts=fingerprint_parts(probe_report),
            seconds=round(time.monotonic() - started, 3),
            finished_at=time.time(),
            serving=serving.as_dict() | {"digest": serving.digest},
        )
        return report


def simulated_path(backend: str, result: str, tbps: float) -> dict[str, Any]:
    """One path's SIMULATED child report: a correctness case and a timed case, as the real worker reports."""
    problems = [] if result == "pass" else [f"simulated {result}"]
    kv_bytes = 32 * 65536 * 576
    return {
        "result": result,
        "reasons": problems,
        "child": {
            "backend": backend,
            "cases": [
                {"case": "long-b32-64k", "backend": backend, "rel_l2": 0.0017, "cos_diff": 1.4e-6, "problems": problems}
            ],
            "timing": [
                {"case": "long-b32-64k", "backend": backend, "ms": kv_bytes / (tbps * 1e12) * 1e3, "kv_tbps": tbps}
            ],
        },
    }


def simulated_node(
    capable: bool = True,
    accelerated: str = "pass",
    fallback: str = "pass",
    speedup: float = 2.3,
    driver: str = "6.12.12",
    gpus: int = 8,
    selftest_seconds: float = 0.0,
    sglang: str = "0.5.19",
) -> dict[str, Any]:
    """A SIMULATION file's content for one node: its probe facts and its self-test outcome. `sglang` is the
    serving image's SGLang version (its decode routes as the probe reports them for that release)."""
    arch = "gfx950" if capable else "gfx942"
    missing = [] if capable else [f"GPU arch gfx950 (have {arch})"]
    return {
        "probe": {
            "capable": capable,
            "ready": capable,
            "missing_for_capable": missing,
            "missing_for_ready": missing,
            "summary": "SIMULATION",
            "driver_version": driver,
            "hip_version": "7.0.51831",
            "torch_version": "2.9.0+rocm7.0",
            "triton_version": "3.7.0",
            "aiter_version": "0.1.6",
            "import_crash": None,
            "sglang": decode_routes({"sglang_version": sglang}),
            "gpus": [
                {"index": i, "arch": arch, "name": "AMD Instinct MI355X (simulated)", "uuid": f"sim-{i}"}
                for i in range(gpus)
            ],
        },
        "selftest": simulated_selftest(range(gpus), accelerated, fallback, speedup),
        "selftest_seconds": selftest_seconds,
    }


def simulated_selftest(
    gpus: Iterable[int], accelerated: str = "pass", fallback: str = "pass", speedup: float = 2.3
) -> dict[str, Any]:
    """A SIMULATED self-test's outcome: both paths' results and the speed-up on each of `gpus` (indices)."""
    worst = (
        "pass"
        if accelerated == fallback == "pass"
        else min((accelerated, fallback), key=("error", "fail", "deferred", "pass").index)
    )
    return {
        "result": worst,
        "backend_set": "aiter",
        "gpus": [
            {
                "index": i,
                "result": {"accelerated": accelerated, "fallback": fallback},
                "speedup": {"long-b1-128k": speedup, "long-b32-64k": speedup},
                "paths": {
                    path: simulated_path(backend, result, tbps)
                    for path, backend, result, tbps in (
                        ("accelerated", "aiter-gluon", accelerated, 3.4),
                        ("fallback", "aiter-zero-pad", fallback, 3.4 / speedup),
                    )
                },
            }
            for i in gpus
        ],
    }
