"""Bounded waiting, shared by tests, benches and the harness: every wait has a time limit and says what it
waited for."""

from __future__ import annotations

import time
from typing import Any, Callable


def wait_for(
    predicate: Callable[[], Any],
    timeout: float = 15.0,
    interval: float = 0.05,
    what: str = "condition",
    error: type[Exception] = AssertionError,
) -> Any:
    """The predicate's first truthy value; `error` after `timeout` seconds (tests: AssertionError)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise error(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)
