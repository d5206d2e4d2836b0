"""SIMULATION of GPUs on the CPU for the self-test's children: devices that crash, hang or lack free memory.
The self-test worker asks the module its device hooks name (contract.ENV_SELFTEST_DEVICE_HOOKS) about
devices that are not GPUs; `environment` names this one and sets its switches, keyed on the device index
the runner gives each child (contract.ENV_SELFTEST_DEVICE_INDEX). Never set in a deployment: the chart has
no way to, and the agent ships no fakes.

  ENV_FAULT     "INDEX:crash[:PATH]" / "INDEX:hang[:PATH]", comma-separated: that device's children (of that
                path) abort or hang at their first case;
  ENV_FREE_GIB  "INDEX:GIB", comma-separated: that fake device has only GIB GiB free, as if another process
                held it.
"""

from __future__ import annotations

import os
import time
from typing import Any

from gluon_common import contract

ENV_FAULT = "GLUON_SELFTEST_FAKE_FAULT"
ENV_FREE_GIB = "GLUON_SELFTEST_FAKE_FREE_GIB"
FAKE_DEVICE_TOTAL = 192 * 2**30  # a fake CPU device's "memory", as an MI355X/H200-class card
GIB = 2**30


def environment(fault: str = "", free_gib: str = "") -> dict[str, str]:
    """What a self-test child's environment needs for these fake devices (this checkout's localcluster/
    on its PYTHONPATH too: stacks.child_env)."""
    return {contract.ENV_SELFTEST_DEVICE_HOOKS: __name__, ENV_FAULT: fault, ENV_FREE_GIB: free_gib}


def device_rule(variable: str, path: str | None = None) -> str | None:
    """This child's entry in a switch ("INDEX:VALUE[:PATH],...")."""
    index = os.environ.get(contract.ENV_SELFTEST_DEVICE_INDEX, "0")
    for rule in filter(None, os.environ.get(variable, "").split(",")):
        parts = rule.split(":")
        if parts[0] == index and len(parts) > 1 and (len(parts) < 3 or parts[2] == path):
            return parts[1]
    return None


def memory_info(device: Any) -> tuple[int, int] | None:
    """(free, total) bytes of a fake device, only when a test gives them."""
    free = device_rule(ENV_FREE_GIB)
    return None if free is None else (int(float(free) * GIB), FAKE_DEVICE_TOTAL)


def before_first_case(device: Any, path: str) -> None:
    """The crash or hang a test asked of this fake device's child, at its first case."""
    fault = device_rule(ENV_FAULT, path)
    if fault == "crash":
        os.abort()
    if fault == "hang":
        time.sleep(3600)
