"""Where the agent's probe and self-test results come from: the real probe and GPU self-test, or a source
named on the command line (`gluon-agent run --source MODULE:FACTORY`): the seam the local-cluster harness
fills with its SIMULATION (gluon_localcluster.fakes.simulated), where no AMD GPU exists. The agent itself
ships no simulation."""

from __future__ import annotations

import importlib
from typing import Any, Protocol

from gluon_common.sglang_routes import DEFAULT_SERVING, ServingConfig

from .probe import probe
from .selftest import runner


class ResultSource(Protocol):
    name: str

    def probe(self) -> dict[str, Any]: ...

    def selftest(self, probe_report: dict[str, Any], serving: ServingConfig = DEFAULT_SERVING) -> dict[str, Any]: ...


class RealSource:
    name = "real"

    def __init__(self, cpu_interpret: bool = False, timeout: float = runner.DEFAULT_TIMEOUT_S) -> None:
        self.cpu_interpret = cpu_interpret
        self.timeout = timeout

    def probe(self) -> dict[str, Any]:
        return probe()

    def selftest(self, probe_report: dict[str, Any], serving: ServingConfig = DEFAULT_SERVING) -> dict[str, Any]:
        return runner.run_selftest(
            probe_report, cpu_interpret=self.cpu_interpret, timeout=self.timeout, serving=serving
        )


def named_source(factory: str, argument: str | None) -> ResultSource:
    """The source FACTORY(argument) from `factory` = "MODULE:FACTORY" (importable where the agent runs).
    A ValueError naming what is wrong otherwise."""
    module_name, _, attribute = factory.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"--source {factory!r}: expected MODULE:FACTORY, e.g. package.module:MySource")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"--source {factory!r}: cannot import {module_name!r}: {exc}") from exc
    make = getattr(module, attribute, None)
    if not callable(make):
        raise ValueError(f"--source {factory!r}: {module_name!r} has no callable {attribute!r}")
    return make(argument) if argument is not None else make()
