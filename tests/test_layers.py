"""Who imports whom: the operator and the agent share only gluon_common, and the product never imports
the harness (gluon_localcluster), which reaches into it only through seams the harness fills."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from gluon_agent.sources import named_source
from gluon_localcluster.fakes.simulated import SimulatedSource, agent_arguments, simulated_node

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"gluon_agent": "agent", "gluon_operator": "operator", "gluon_common": "common"}
# what each product package may import of ours
ALLOWED = {
    "gluon_common": {"gluon_common"},
    "gluon_agent": {"gluon_agent", "gluon_common"},
    "gluon_operator": {"gluon_operator", "gluon_common"},
}
OURS = {"gluon_agent", "gluon_operator", "gluon_common", "gluon_localcluster"}


def imported_packages(path: Path) -> set[str]:
    """The top-level packages a module imports (a relative import is its own package's)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module.split(".")[0])
    return out


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_each_product_package_imports_only_what_its_layer_allows(package):
    offenders = []
    for path in sorted((ROOT / PACKAGES[package] / package).rglob("*.py")):
        foreign = (imported_packages(path) & OURS) - ALLOWED[package]
        if foreign:
            offenders.append(f"{path.relative_to(ROOT)}: {sorted(foreign)}")
    assert offenders == []


def test_the_shared_ground_imports_nothing_at_package_import():
    """The preflight copies gluon_common's contract and routes into serving images without pydantic or the
    Kubernetes client: importing the package itself must need neither."""
    assert imported_packages(ROOT / "common/gluon_common/__init__.py") == set()


def test_the_agent_takes_the_harness_simulation_through_its_source_seam(tmp_path):
    sim = tmp_path / "sim.json"
    sim.write_text(json.dumps(simulated_node()))
    options = agent_arguments(sim)
    source = named_source(options[1], options[3])
    assert isinstance(source, SimulatedSource) and source.probe()["simulated"] is True


@pytest.mark.parametrize(
    "factory, why",
    [
        ("gluon_localcluster.fakes.simulated", "expected MODULE:FACTORY"),
        ("no_such_module_here:Source", "cannot import 'no_such_module_here'"),
        ("gluon_localcluster.fakes.simulated:NoSuchSource", "has no callable 'NoSuchSource'"),
    ],
)
def test_a_source_seam_that_names_nothing_usable_says_what_is_wrong(factory, why):
    with pytest.raises(ValueError, match=why):
        named_source(factory, "x")


def test_the_webhook_names_the_preflight_module_the_agent_copies():
    """The operator runs the agent's preflight by the name in the contract, never by importing the agent."""
    import importlib.util

    from gluon_agent import preflight
    from gluon_common import contract

    spec = importlib.util.find_spec(contract.PREFLIGHT_MODULE)
    assert spec is not None and Path(spec.origin) == Path(preflight.__file__)
    assert "gluon_agent/preflight.py" in {relative for _, relative in preflight.portable_sources()}
