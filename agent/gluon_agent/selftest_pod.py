"""`python3 -m gluon_agent.selftest_pod`: the self-test run *in a serving image*, in a self-test pod the operator
pins to one node with that image by digest. Stdlib only, plus the image's own torch, Triton and aiter (which
only the self-test's child processes import).

Two steps, two containers:
  1. `gluon-agent selftest-pod --install DIR` (agent image, init container): copy SELFTEST_POD_MODULES into the
     shared emptyDir, under DIR/lib.
  2. (serving image) `PYTHONPATH=DIR/lib python3 -m gluon_agent.selftest_pod --serving-config JSON --deadline S`:
     probe this image and self-test both paths on the node's GPUs as `gluon-agent selftest` does, print the
     full report to stdout (the pod's log) and write the proof (gluon_common.report.PodProof) to the
     termination log, always within PROOF_MESSAGE_LIMIT bytes: details are dropped first (`truncated`).

The verdict is in the message: whatever goes wrong (an exception, no GPU, a crashed self-test, the deadline,
SIGTERM) is a message with result "error" and the reason in selftest.problems, and exit status 0; non-zero
only when not even that message could be written.

The summaries built here are also the agent's Node report (daemon.selftest_summary and daemon.node_report
validate them into gluon_common.report's models, which this image cannot import: they need pydantic).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, Mapping, Sequence

from gluon_common.sglang_routes import DEFAULT_SERVING, ServingConfig

from . import isolation
from .fingerprint import fingerprint
from .preflight import PORTABLE_MODULES, ModuleSet, copy_modules
from .probe import DEFAULT_TIMEOUT_S as PROBE_TIMEOUT_S
from .probe import probe
from .selftest import runner

# What the pod's container needs besides the preflight's modules: the self-test, its children and the
# --source seam. tests/test_selftest_pod.py checks the set is closed under its imports.
SELFTEST_POD_MODULES: ModuleSet = {
    "gluon_agent": (*PORTABLE_MODULES["gluon_agent"], "fingerprint.py", "sources.py", "selftest_pod.py"),
    "gluon_agent.selftest": (
        "__init__.py",
        "backends.py",
        "capture_guard.py",
        "cases.py",
        "problem.py",
        "reference.py",
        "runner.py",
        "timing.py",
        "triton_mla.py",  # also read by the fingerprint (its source hash)
        "worker.py",
    ),
    "gluon_common": PORTABLE_MODULES["gluon_common"],
}
# gluon_common.report's values, repeated: that module needs pydantic (tests check they agree).
REPORT_SCHEMA_VERSION = 1
PROOF_MESSAGE_LIMIT = 4096  # the kubelet keeps at most this much of a termination message
TERMINATION_LOG = "/dev/termination-log"
DEFAULT_DEADLINE_S = 1200.0  # the operator passes its own (the pod's activeDeadlineSeconds less a margin)
TRIGGER = "selftest-pod"
MAX_REASONS = 5  # per GPU and path, on the Node report and in the full-size proof

Report = Dict[str, Any]  # typing's Dict: under a python3 as old as 3.8 the error verdict is still written


# ---------------------------------------------------------------- summaries (the Node report's and the proof's)


def max_rel_l2(info: Mapping[str, Any]) -> float | None:
    """The worst relative L2 error over a path's correctness cases, None when none has one."""
    errors = [c["rel_l2"] for c in (info.get("child") or {}).get("cases", []) if c.get("rel_l2") is not None]
    return max(errors) if errors else None


def gpu_summary(gpu: Mapping[str, Any]) -> Report:
    """One GPU of a runner report, as gluon_common.report.GpuResult reads it."""
    paths = gpu.get("paths", {})
    return {
        "index": gpu.get("index"),
        "result": gpu.get("result", {}),
        "speedup": gpu.get("speedup", {}),
        "max_rel_l2": {path: max_rel_l2(info) for path, info in paths.items()},
        "reasons": {p: i.get("reasons", [])[:MAX_REASONS] for p, i in paths.items() if i.get("reasons")},
    }


def selftest_summary(report: Mapping[str, Any], trigger: str, fingerprint: str | None = None) -> Report:
    """The self-test report cut to what the operator and a person need (gluon_common.report.SelfTest's fields);
    the full report stays in the log. `fingerprint`: the one the verdict is published for, when not the
    report's own."""
    routes = report.get("routes") or {}
    return {
        "result": report.get("result"),
        "fingerprint": fingerprint or report.get("fingerprint"),
        "tested_at": report.get("finished_at"),
        "seconds": report.get("seconds"),
        "trigger": trigger,
        "mode": report.get("mode"),
        "backend_set": report.get("backend_set"),
        "thresholds": report.get("thresholds"),
        "problems": report.get("problems", []),
        "simulated": bool(report.get("simulated")),
        "serving": report.get("serving"),  # the configuration proved, with its digest (the operator gates on it)
        "no_route": {path: info.get("no_route") for path, info in routes.items() if info.get("no_route")},
        "gpus": [gpu_summary(gpu) for gpu in report.get("gpus", [])],
    }


def probe_summary(probe_report: Mapping[str, Any]) -> Report:
    """The probe's facts the reports carry (gluon_common.report.Probe's fields)."""
    return {
        "capable": bool(probe_report.get("capable")),
        "ready": probe_report.get("ready"),
        "missing_for_capable": probe_report.get("missing_for_capable", []),
        "summary": probe_report.get("summary"),
        "import_crash": probe_report.get("import_crash"),
        "sglang": probe_report.get("sglang"),
        "simulated": bool(probe_report.get("simulated")),
    }


# ---------------------------------------------------------------- the proof, within PROOF_MESSAGE_LIMIT bytes


def plain(value: Any) -> Any:
    """`value` as strict JSON data: a NaN or infinite float is null (the operator's parser refuses them),
    tuples are lists, anything else unknown is its text."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return str(value)


def encode(proof: Mapping[str, Any]) -> str:
    """ASCII JSON (non-ASCII escaped): a character is a byte."""
    return json.dumps(proof, sort_keys=True, separators=(",", ":"), allow_nan=False)


def cut(text: Any, limit: int) -> Any:
    if not isinstance(text, str) or len(text) <= limit:
        return text
    return text[: max(0, limit - 3)] + "..."


def each_gpu(proof: Report, change: Callable[[Report], None]) -> None:
    for gpu in proof["selftest"].get("gpus", []):
        if isinstance(gpu, dict):
            change(gpu)


def drop_details(proof: Report) -> None:
    """What is for people only: speedups, errors, thresholds, the routes' evidence, the serving config's
    fields (its digest decides), the probe's summary sentence."""
    test, found = proof["selftest"], proof["probe"]
    test["thresholds"] = None
    if isinstance(test.get("serving"), dict):
        test["serving"] = {"digest": test["serving"].get("digest")}
    found["summary"] = None
    if isinstance(found.get("sglang"), dict):
        found["sglang"].pop("evidence", None)
    each_gpu(proof, lambda gpu: gpu.update(speedup={}, max_rel_l2={}))


def first_reasons(proof: Report) -> None:
    """One reason per GPU and path (the operator reads only the first), no unrouted q_lens."""
    proof["selftest"]["no_route"] = {}
    each_gpu(proof, lambda gpu: gpu.update(reasons={p: r[:1] for p, r in (gpu.get("reasons") or {}).items()}))


def texts_cut_to(limit: int) -> Callable[[Report], None]:
    def shorten(proof: Report) -> None:
        test, found = proof["selftest"], proof["probe"]
        test["problems"] = [cut(p, limit) for p in test.get("problems") or []]
        found["missing_for_capable"] = [cut(m, limit) for m in found.get("missing_for_capable") or []]
        found["import_crash"] = cut(found.get("import_crash"), limit)
        each_gpu(
            proof,
            lambda gpu: gpu.update(
                reasons={p: [cut(t, limit) for t in r] for p, r in (gpu.get("reasons") or {}).items()}
            ),
        )

    return shorten


def results_only(proof: Report) -> None:
    """Per GPU its index and results; the first problems and missing facts; the routes' names alone."""
    test, found = proof["selftest"], proof["probe"]
    test["problems"] = (test.get("problems") or [])[:3]
    found["missing_for_capable"] = (found.get("missing_for_capable") or [])[:4]
    if isinstance(found.get("sglang"), dict):
        found["sglang"] = {k: found["sglang"].get(k) for k in ("version", "flag0_route", "mtp_through_gluon")}
    test["gpus"] = [
        {"index": g.get("index"), "result": g.get("result")} for g in test.get("gpus") or [] if isinstance(g, dict)
    ]


# Applied in turn until the message fits: details first, the verdict's own fields last.
SHRINK_STEPS: Sequence[Callable[[Report], None]] = (
    drop_details,
    first_reasons,
    texts_cut_to(300),
    texts_cut_to(100),
    results_only,
    texts_cut_to(40),
)


def short_text(value: Any, limit: int) -> str | None:
    return None if value is None else cut(str(value), limit)


def minimal(proof: Mapping[str, Any], limit: int) -> Report:
    """The last resort: the verdict, the fingerprint, the serving digest, the probe's verdict and first facts,
    the first problem, then as many GPUs' results as fit. Its texts are short enough for `limit` even when
    every character is escaped (six bytes); the GPUs are added only while the message fits."""
    test, found = proof["selftest"], proof["probe"]
    serving = test.get("serving") if isinstance(test.get("serving"), dict) else {}
    missing = found.get("missing_for_capable") if isinstance(found.get("missing_for_capable"), list) else []
    problems = test.get("problems") if isinstance(test.get("problems"), list) else []
    short: Report = {
        "schema_version": REPORT_SCHEMA_VERSION,
        "probe": {
            "capable": found.get("capable") is True,
            "simulated": found.get("simulated") is True,
            "missing_for_capable": [cut(str(m), 40) for m in missing[:4]],
            "import_crash": short_text(found.get("import_crash"), 120),
        },
        "selftest": {
            "result": short_text(test.get("result"), 16),
            "fingerprint": short_text(test.get("fingerprint"), 64),
            "serving": {"digest": short_text(serving.get("digest"), 64)},
            "trigger": TRIGGER,
            "problems": [cut(str(p), 120) for p in problems[:1]]
            + [f"the proof did not fit {limit} bytes: the pod's log has the report"],
            "gpus": [],
        },
        "truncated": True,
    }
    for gpu in test.get("gpus") or []:
        if not isinstance(gpu, dict):
            continue
        short["selftest"]["gpus"].append({"index": gpu.get("index"), "result": gpu.get("result")})
        if len(encode(short)) > limit:
            short["selftest"]["gpus"].pop()
            break
    return short


def proof_message(proof: Mapping[str, Any], limit: int = PROOF_MESSAGE_LIMIT) -> str:
    """`proof` ({schema_version, probe, selftest, truncated}) as JSON within `limit` bytes."""
    current: Report = plain(proof)
    text = encode(current)
    for step in SHRINK_STEPS:
        if len(text) <= limit:
            return text
        step(current)
        current["truncated"] = True
        text = encode(current)
    return text if len(text) <= limit else encode(minimal(current, limit))


def make_proof(probe_report: Mapping[str, Any] | None, report: Mapping[str, Any]) -> Report:
    return {
        "schema_version": REPORT_SCHEMA_VERSION,
        "probe": probe_summary(probe_report or {}),
        "selftest": selftest_summary(report, TRIGGER),
        "truncated": False,
    }


# ---------------------------------------------------------------- running it


def read_serving_config(text: str) -> ServingConfig:
    """--serving-config: the JSON object (or @FILE holding it) the operator gives. ValueError or OSError."""
    if text.startswith("@"):
        with open(text[1:]) as handle:
            text = handle.read()
    return ServingConfig.from_dict(json.loads(text), "--serving-config")


class Run:
    """One self-test in this image: what is known so far, for the message whenever it has to be written."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.started = time.monotonic()
        self.stage = "argument check"
        self.serving: ServingConfig | None = None
        self.probe_report: Mapping[str, Any] | None = None

    def probed(self) -> Mapping[str, Any]:
        self.stage = "probe"
        self.probe_report = probe(timeout=self.args.probe_timeout)
        self.stage = "self-test"
        return self.probe_report

    def selftest(self) -> Report:
        if self.args.source_arg is not None and not self.args.source:
            raise ValueError("--source-arg without --source")
        self.stage = "serving config"
        text = self.args.serving_config
        self.serving = DEFAULT_SERVING if text is None else read_serving_config(text)
        if self.args.source:
            return self.from_source()
        self.stage = "self-test"
        return runner.run_selftest(  # as `gluon-agent selftest`: the children import torch while the probe runs
            self.probed, cpu_interpret=self.args.cpu_interpret, timeout=self.args.timeout, serving=self.serving
        )

    def from_source(self) -> Report:
        """--source MODULE:FACTORY, as `gluon-agent run --source` (the local harness's SIMULATION)."""
        from .sources import named_source

        self.stage = "source"
        source = named_source(self.args.source, self.args.source_arg)
        self.stage = "probe"
        self.probe_report = source.probe()
        self.stage = "self-test"
        return source.selftest(dict(self.probe_report), self.serving)

    def error_report(self, reason: str) -> Report:
        report: Report = {
            "result": "error",
            "problems": [reason],
            "gpus": [],
            "finished_at": time.time(),
            "seconds": round(time.monotonic() - self.started, 2),
        }
        if self.serving is not None:
            report["serving"] = dict(self.serving.as_dict(), digest=self.serving.digest)
        if self.probe_report is not None:
            report["fingerprint"] = fingerprint(dict(self.probe_report))
        return report

    def outcome(self) -> Report:
        try:
            return self.selftest()
        except Exception as exc:  # noqa: BLE001 - any failure is an error verdict, never a silent pod
            return self.error_report(f"the {self.stage} failed: {type(exc).__name__}: {exc}")


class Message:
    """The termination message, written once: by the run or by the deadline, whichever comes first."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock = threading.Lock()
        self.written: bool | None = None  # None: not yet; else whether the write succeeded

    def write(self, text: str) -> bool:
        """True when this call wrote it; False when it was written before or the write failed."""
        with self.lock:
            if self.written is not None:
                return False
            try:
                with open(self.path, "w") as handle:
                    handle.write(text)
                self.written = True
            except OSError as exc:
                print(f"selftest-pod: cannot write the termination log {self.path}: {exc}", file=sys.stderr)
                self.written = False
            return bool(self.written)


def publish(run: Run, message: Message, report: Mapping[str, Any]) -> bool:
    """Write the proof of `report`, then print the full report; False when the proof was written before."""
    try:
        text = proof_message(make_proof(run.probe_report, report))
    except Exception as exc:  # noqa: BLE001 - a report our summaries cannot read is still an error verdict
        text = proof_message(
            make_proof(None, run.error_report(f"the report is unreadable: {type(exc).__name__}: {exc}"))
        )
    if not message.write(text):
        return False
    try:
        full = {"probe": run.probe_report, "selftest": report, "proof": json.loads(text)}
        print(json.dumps(full, indent=2, sort_keys=True, default=str), flush=True)
    except Exception as exc:  # noqa: BLE001 - the verdict is written; the log is for people
        print(f"selftest-pod: cannot print the full report: {type(exc).__name__}: {exc}", file=sys.stderr)
    return True


def give_up(run: Run, message: Message, reason: str) -> None:
    """The deadline or SIGTERM came first: the error verdict, then the children killed, then the end."""
    if not publish(run, message, run.error_report(reason)) and message.written:
        return  # the run's own verdict was written first: it ends by itself
    isolation.kill_all()
    os._exit(0 if message.written else 1)


def start_watchdog(seconds: float, expire: Callable[[], None]) -> threading.Event:
    """`expire()` after `seconds` unless the returned event is set first."""
    done = threading.Event()

    def watch() -> None:
        if not done.wait(seconds):
            expire()

    threading.Thread(target=watch, name="deadline", daemon=True).start()
    return done


class UsageError(Exception):
    pass


class Parser(argparse.ArgumentParser):
    """Usage errors raise (main turns them into an error verdict) instead of exiting."""

    def error(self, message: str) -> Any:
        raise UsageError(f"{self.prog}: {message}")


def build_parser() -> Parser:
    parser = Parser(
        prog="gluon-agent selftest-pod", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--install", metavar="DIR", help="copy the self-test pod's modules into DIR/lib and exit")
    parser.add_argument(
        "--serving-config", metavar="JSON|@FILE", help="the serving config to prove (default: the default)"
    )
    parser.add_argument("--timeout", type=float, default=runner.DEFAULT_TIMEOUT_S, help="seconds per self-test child")
    parser.add_argument("--probe-timeout", type=float, default=PROBE_TIMEOUT_S, help="seconds per probe child")
    parser.add_argument("--cpu-interpret", action="store_true", help="the portable kernel on the CPU (no GPU)")
    parser.add_argument(
        "--source", metavar="MODULE:FACTORY", help="results from FACTORY(--source-arg), as `gluon-agent run`"
    )
    parser.add_argument("--source-arg", metavar="TEXT", help="the argument --source's factory is called with")
    parser.add_argument("--termination-log", default=TERMINATION_LOG)
    parser.add_argument("--deadline", type=float, default=DEFAULT_DEADLINE_S, help="seconds for the whole run")
    return parser


def termination_log_of(argv: Sequence[str]) -> Path:
    """--termination-log read alone, so a usage error still reaches the right file."""
    early = argparse.ArgumentParser(add_help=False)
    early.add_argument("--termination-log", default=TERMINATION_LOG)
    try:
        known, _ = early.parse_known_args(argv)
    except SystemExit:  # `--termination-log` without a value: the main parser says so
        return Path(TERMINATION_LOG)
    return Path(known.termination_log)


def install(target: Path) -> None:
    """The install init container's step: SELFTEST_POD_MODULES into `target/lib`."""
    copy_modules(target, SELFTEST_POD_MODULES)


def prove(args: argparse.Namespace, message: Message) -> bool:
    """The run under its deadline and SIGTERM; True when a message was written."""
    run = Run(args)
    done = start_watchdog(
        args.deadline, lambda: give_up(run, message, f"deadline passed: no verdict within {args.deadline:g} s")
    )
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM) if in_main else None
    if in_main:  # the handler only starts a thread: the main thread may hold the message's lock
        signal.signal(
            signal.SIGTERM,
            lambda *_: threading.Thread(
                target=give_up, args=(run, message, "terminated (SIGTERM) before a verdict"), daemon=True
            ).start(),
        )
    try:
        publish(run, message, run.outcome())
    finally:
        done.set()
        if in_main:
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
    return bool(message.written)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    message = Message(termination_log_of(argv))
    try:
        args = build_parser().parse_args(argv)
    except UsageError as exc:
        print(exc, file=sys.stderr)
        run = Run(argparse.Namespace())
        publish(run, message, run.error_report(f"usage: {exc}"))
        return 0 if message.written else 2
    if args.install:
        install(Path(args.install))
        return 0
    return 0 if prove(args, message) else 1


if __name__ == "__main__":
    sys.exit(main())
