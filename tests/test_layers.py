"""The package's wings and the one way their imports point (docs/design.md section 2).

Every import of a package module counts, at the top of a file or inside a function (a lazy
import is still a dependency), and so do type-only imports under `if TYPE_CHECKING:`.
`__init__` (which names every public name lazily), `__main__` and `distributed` (the public
path of jobs/distributed.py) stand above everything.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import loadax_mesh

PACKAGE = Path(loadax_mesh.__file__).parent
TOP = ("__init__", "__main__", "distributed")

# Highest first: a module may import its own layer (no cycles) and the layers below it.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("cli",),  # the command line
    ("view", "export"),  # the plan for people, and in other trainers' terms
    ("cost", "compiler"),  # the cost model, and what the compiler says
    ("workload", "jobs"),  # the reference step, and running on a mesh
    ("config", "config_data", "presets", "plan", "quality", "groups"),  # the planner's core
    ("solver",),  # device ordering
    ("hardware",),  # what a machine is
    ("shapes", "rules", "_configs", "published_runs"),  # the core's leaves; the runs are data
    ("errors",),
)

# Arrows up that the public contract asks for: a method of a lower wing's class that hands the user
# to a higher wing. Each is a lazy import inside that method, so loading stays one-way, and the
# wing it reaches never imports the core class back (no circle, type-only imports included).
# `MeshConfig.from_preset("auto")` needs none: the package's face registers the cost model's
# choice as a computed preset.
FACADES = {
    ("plan", "view.report"): "MeshPlan.describe() is the text report",
    ("plan", "export.maxtext"): "MeshPlan.to_maxtext(train) is MaxText's config keys",
    ("plan", "export.axlearn"): "MeshPlan.to_axlearn() is AXLearn's mesh_shape and mesh_rules",
    ("plan", "export.flax_rules"): "MeshPlan.to_flax_rules() is Flax's logical axis rules",
    ("plan", "workload.spec"): "MeshPlan.to_maxtext(train) takes a TrainSpec (type-only import)",
    ("cost.choose.mesh", "view.estimate"): "str(ranking) is the ranking's text (the CLI's)",
}


def modules() -> dict[str, Path]:
    """Dotted module name (relative to the package) -> file."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" and len(parts) > 1 else parts)
        found[name] = path
    return found


def imports(name: str, path: Path, known: set[str], *, top_level_only: bool = False) -> set[str]:
    """The package modules `name` imports anywhere in its file (or only at its top level)."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    out = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[: len(package) - node.level + 1]
            stem = ".".join([*base, *node.module.split(".")] if node.module else base)
            for alias in node.names:  # `from . import report` names a module
                sub = f"{stem}.{alias.name}".lstrip(".")
                out.add(sub if sub in known else stem)
        elif isinstance(node, ast.ImportFrom | ast.Import):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else node.names
            for module in (n if isinstance(n, str) else n.name for n in names):
                if module.startswith("loadax_mesh."):
                    out.add(module.removeprefix("loadax_mesh."))
    return out - {name, ""}


def graph(*, facades: bool = True) -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    edges = {n: imports(n, p, known) for n, p in found.items() if n not in TOP}
    if not facades:
        edges = {n: {m for m in out if (n, m) not in FACADES} for n, out in edges.items()}
    return edges


def layer(name: str) -> int:
    """The index in LAYERS of a module's wing (0 is the top)."""
    wing = name.split(".")[0]
    for k, names in enumerate(LAYERS):
        if wing in names:
            return k
    raise AssertionError(f"{name} is in no layer of LAYERS: place it")


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
    assert {"jobs.launcher", "view.report", "view.picture"} <= edges["cli.main"]  # lazy, `from`
    assert "view.report" in edges["plan"] and "view.report" not in graph(facades=False)["plan"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_every_module_sits_in_a_layer() -> None:
    for name in graph():
        layer(name)


def test_no_arrow_points_up() -> None:
    up = [(a, b) for a, out in graph(facades=False).items() for b in out if layer(b) < layer(a)]
    assert not up, f"imports that point up the layers (a -> b): {sorted(up)}"


def test_a_facade_imports_its_wing_only_when_called() -> None:
    found = modules()
    for (a, b), why in FACADES.items():
        assert b in imports(a, found[a], set(found)), (a, b, "is no longer imported: drop it")
        assert b not in imports(a, found[a], set(found), top_level_only=True), (a, b, why)


# The cost wing's own layers (docs/architecture.md), highest first: the chooser, then what
# estimates one plan, then the step's cost as one interface, then the pipelined step's parts,
# then memory and time, then the parts a step is made of, then the facts they are read with.
COST_LAYERS: tuple[tuple[str, ...], ...] = (
    ("choose",),
    ("referees",),
    ("estimate", "conditions"),
    ("step",),
    ("pipeline",),
    ("memory", "timing"),
    ("parts",),
    ("band", "calibration"),
)


def cost_layer(name: str) -> int:
    """The index in COST_LAYERS of a cost module's sub-package or root module."""
    part = name.split(".")[1]
    for k, names in enumerate(COST_LAYERS):
        if part in names:
            return k
    raise AssertionError(f"{name} is in no layer of COST_LAYERS: place it")


def test_inside_the_cost_wing_no_arrow_points_up() -> None:
    inside = {n: {m for m in out if m.startswith("cost.")} for n, out in graph().items()}
    cost = {n: out for n, out in inside.items() if n.startswith("cost.")}
    assert {"parts", "memory", "timing", "pipeline", "choose"} <= {n.split(".")[1] for n in cost}
    up = [(a, b) for a, out in cost.items() for b in out if cost_layer(b) < cost_layer(a)]
    assert not up, f"imports that point up the cost wing's layers (a -> b): {sorted(up)}"
    assert sum(1 for p in (PACKAGE / "cost").glob("*.py")) <= 8, "cost/ holds its root modules"


def test_no_module_imports_one_that_imports_it_back() -> None:
    assert find_cycle(graph()) is None  # facades and type-only imports included


def test_no_module_is_over_400_lines() -> None:
    long = {
        n: lines for n, p in modules().items() if (lines := len(p.read_text().splitlines())) > 400
    }
    assert not long, f"split these where they hold two ideas: {long}"


# A platform named in a test of its string: what the hardware profile's traits answer instead.
PLATFORM_TEST = re.compile(
    r"""[!=]=\s*["'](tpu|gpu|cpu)["']|startswith\(["'](tpu|gpu|cpu)|["'](tpu|gpu)["']\s+(if|else)\b"""
    r"""|\bin\s+\(["'](tpu|gpu|cpu)["']|\{["'](tpu|gpu)["']\s*:"""
)


def test_only_the_hardware_wing_tests_platform_names() -> None:
    hits = [
        f"{path.relative_to(PACKAGE)}:{i}: {line.strip()}"
        for name, path in modules().items()
        if not name.startswith("hardware")
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if PLATFORM_TEST.search(line)
    ]
    assert not hits, "read hardware.profile's traits instead:\n" + "\n".join(hits)
    assert PLATFORM_TEST.search('if t.platform == "tpu":')
    assert PLATFORM_TEST.search('x.hardware.startswith("gpu-")')
    assert not PLATFORM_TEST.search("traits = platform_traits(table.platform)")
