"""The package's modules import one another one way (DESIGN.md section 2): no cycles.

Every import of a package module counts, at the top of a file or inside a function (a lazy
import is still a dependency), and so do type-only imports under `if TYPE_CHECKING:`.
`__init__` (which names every public name lazily) and `__main__` stand above everything.
"""

from __future__ import annotations

import ast
from pathlib import Path

import loadax_mesh

PACKAGE = Path(loadax_mesh.__file__).parent
TOP = ("__init__", "__main__")


def modules() -> dict[str, Path]:
    """Dotted module name (relative to the package) -> file."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" and len(parts) > 1 else parts)
        found[name] = path
    return found


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The package modules `name` imports anywhere in its file."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[: len(package) - node.level + 1]
            stem = ".".join([*base, *node.module.split(".")] if node.module else base)
            for alias in node.names:  # `from . import render` names a module
                sub = f"{stem}.{alias.name}".lstrip(".")
                out.add(sub if sub in known else stem)
        elif isinstance(node, ast.ImportFrom | ast.Import):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else node.names
            for module in (n if isinstance(n, str) else n.name for n in names):
                if module.startswith("loadax_mesh."):
                    out.add(module.removeprefix("loadax_mesh."))
    return out - {name, ""}


def graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    return {n: imports(n, p, known) for n, p in found.items() if n not in TOP}


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a list of modules (first == last), or None."""
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)) is not None:
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (cycle := visit(node)) is not None:
            return cycle
    return None


def test_the_reader_sees_the_imports() -> None:
    edges = graph()
    assert {"errors", "plan", "presets"} <= edges["config"]
    assert "errors" in edges["solver.hybrid"]  # `from ..errors import ...`
    assert {"launcher", "render", "picture"} <= edges["cli"]  # lazy and `from . import x`
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_no_module_imports_one_that_imports_it_back() -> None:
    assert find_cycle(graph()) is None


def test_the_core_stands_below_the_planner() -> None:
    edges = graph()
    below = {"errors", "_configs", "shapes", "rules", "devices", "catalogue"}
    for name in below:
        assert not edges[name] - below, (name, edges[name] - below)
