"""No import cycle between any two modules of the project (docs/development.md, "Layers").

`lint-imports` checks the layer contracts of pyproject.toml in `make test`; this test checks
the one rule that needs no contract, with the standard library only, so it also runs where
import-linter is not installed: every import counts (module level, inside a function, under
``TYPE_CHECKING``), and the module graph of `synthgen` and `retriever` has no cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("synthgen", "retriever", "dpsynth")


def _modules() -> dict[str, Path]:
    """Dotted name -> file, for every module and package of the project."""
    out = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _owner(name: str, modules: dict[str, Path]) -> str | None:
    """The project module that `name` (a module, or a name inside one) belongs to."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports (`from a import b` counts a.b when b is a
    submodule, else a)."""
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(parent + ([node.module] if node.module else []))
                targets = [f"{base}.{alias.name}" for alias in node.names] or [base]
            for target in targets:
                owner = _owner(target, modules)
                if owner and owner != name:
                    graph[name].add(owner)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan 1972)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
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


def test_cycles_are_found():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_graph_sees_every_kind_of_import():
    graph = import_graph()
    # a lazy import inside a function, and `from package import submodule`
    assert "retriever.train" in graph["dpsynth.pipeline.retrieval_stages"]
    assert "dpsynth.pipeline.context" in graph["dpsynth.pipeline.runner"]
    assert "synthgen.privacy.accounting" in graph["synthgen.dp_plan"]


def test_no_import_cycle_between_any_two_modules():
    graph = import_graph()
    found = cycles(graph)
    message = "\n".join(
        " <-> ".join(component)
        + "\n  "
        + "\n  ".join(f"{m} imports {sorted(graph[m] & set(component))}" for m in component)
        for component in found
    )
    assert not found, f"import cycles (put the shared names in a module of their own):\n{message}"
