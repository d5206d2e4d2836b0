"""The import graph of every package outside tests (gluon_operator and gluon_agent in operator/ and agent/,
the harness's in localcluster/, any other beside them) has no cycle. Read with `ast`, so every import
counts: those at module level and those inside functions (a lazy import hides a cycle from Python, not from
a reader)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE_ROOTS = [p for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".") and p.name != "tests"]


def product_modules() -> dict[str, Path]:
    """Dotted module name -> file, for every package directly under a source root (a top-level folder)."""
    modules: dict[str, Path] = {}
    for root in SOURCE_ROOTS:
        for init in root.glob("*/__init__.py"):
            for path in init.parent.rglob("*.py"):
                parts = path.relative_to(root).with_suffix("").parts
                modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def imported(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The product modules `module` imports anywhere in its file."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            base = base[: len(base) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:  # `from pkg import sub` imports the module pkg.sub
                out.add(f"{target}.{alias.name}" if f"{target}.{alias.name}" in modules else target)
    return {name for name in out if name in modules and name != module}


def import_graph() -> dict[str, set[str]]:
    modules = product_modules()
    return {name: imported(name, path, modules) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_graph_reads_both_kinds_of_import():
    graph = import_graph()
    assert {"gluon_operator", "gluon_agent"} <= {name.split(".")[0] for name in graph}
    assert "gluon_operator.world_types" in graph["gluon_operator.plan"]  # module level
    assert "gluon_operator.handlers" in graph["gluon_operator.cli"]  # inside a function


def test_cycles_are_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def reachable(graph: dict[str, set[str]], module: str) -> set[str]:
    """Every module `module` imports, directly or through others."""
    seen: set[str] = set()
    todo = [module]
    while todo:
        for nxt in graph[todo.pop()] - seen:
            seen.add(nxt)
            todo.append(nxt)
    return seen


def test_the_pure_plan_reaches_no_webhook_cache_or_api_call():
    """The reconcile's plan decides over plain data: label selectors are the spec's, the world's types
    their own module, so neither the webhook, the caches, the executor nor the Kubernetes client is imported."""
    reached = reachable(import_graph(), "gluon_operator.plan")
    shells = {"webhook", "world", "informer", "executor", "handlers", "evaluation", "promclient"}
    assert not reached & {f"gluon_operator.{name}" for name in shells}, sorted(reached)
    assert not [
        m for m in reached if m.rpartition(".")[2] == "kube"
    ]  # the Kubernetes client helpers, wherever they live


def test_no_import_cycle_outside_tests():
    graph = import_graph()
    found = cycles(graph)
    described = [" <-> ".join(c) + ": " + "; ".join(f"{m} -> {sorted(graph[m] & set(c))}" for m in c) for c in found]
    assert not found, "import cycles:\n" + "\n".join(described)
