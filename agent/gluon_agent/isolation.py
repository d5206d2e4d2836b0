"""Run a child process with a hard time limit and describe how it ended. Stdlib only.

A crash (signal), a hang (timeout) or a non-zero exit is a result to report, never an exception of ours.
The child gets its own process group so a hang kills its grandchildren too (JIT compilers, workers).
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

STDIO_LIMIT = 64 * 1024  # keep the tail of a chatty child's output, not all of it
_live_groups: set[int] = set()  # process groups of running children, for kill_all() at shutdown
_live_lock = threading.Lock()


@dataclass(frozen=True)
class ChildOutcome:
    status: str  # "ok" | "exit" | "signal" | "timeout" | "spawn-failed" | "cancelled"
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float
    detail: str  # a human sentence for reports: "killed by SIGABRT", "timed out after 5.0 s"

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def describe_end(returncode: int | None, timed_out: bool, timeout: float) -> tuple[str, str]:
    if timed_out:
        return "timeout", f"timed out after {timeout:g} s (killed)"
    if returncode is None:
        return "spawn-failed", "did not start"
    if returncode < 0:
        return "signal", f"killed by {signal_name(-returncode)}"
    if returncode != 0:
        return "exit", f"exited with status {returncode}"
    return "ok", "exited normally"


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()


def kill_all() -> int:
    """Kill every running child group (the agent is shutting down). Returns how many were signalled."""
    with _live_lock:
        groups = list(_live_groups)
    for group in groups:
        try:
            os.killpg(group, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    return len(groups)


def run_isolated(
    argv: Sequence[str],
    timeout: float,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    stdin_text: str | Callable[[], str | None] | None = None,
) -> ChildOutcome:
    """`stdin_text` may be a callable: the child starts at once (its imports run meanwhile), the callable
    blocks until its input is known, and the time limit counts from then; None from it cancels the child."""
    started = time.monotonic()
    try:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.PIPE if stdin_text is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
            text=True,
            errors="replace",
        )
    except OSError as exc:
        return ChildOutcome("spawn-failed", None, "", str(exc), 0.0, f"could not start {argv[0]}: {exc}")
    with _live_lock:
        _live_groups.add(proc.pid)
    timed_out = False
    if callable(stdin_text):
        text = None
        try:
            text = stdin_text()
        finally:
            if text is None:  # cancelled, or the callable raised: the child must not outlive us
                _kill_group(proc)
                try:
                    proc.communicate(timeout=5)  # drains and closes the pipes
                except subprocess.TimeoutExpired:
                    pass
                with _live_lock:
                    _live_groups.discard(proc.pid)
        if text is None:
            return ChildOutcome(
                "cancelled", proc.returncode, "", "", time.monotonic() - started, "cancelled before its input was sent"
            )
        stdin_text = text
    try:
        out, err = proc.communicate(stdin_text, timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(proc)
        try:
            out, err = proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:  # a grandchild kept the pipes open past SIGKILL of the group
            out, err = "", ""
    status, detail = describe_end(proc.returncode, timed_out, timeout)
    if not timed_out:
        _kill_group(proc)  # reap stray grandchildren left behind by a finished child
    with _live_lock:
        _live_groups.discard(proc.pid)
    return ChildOutcome(
        status, proc.returncode, out[-STDIO_LIMIT:], err[-STDIO_LIMIT:], time.monotonic() - started, detail
    )
