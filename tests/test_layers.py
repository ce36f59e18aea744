"""The import graph of ``src/retool``: no circle, and every import points down a floor.

The floors, from the ground up (a module may import its own floor and the
floors below it, never one above)::

    0  retool, errors, checks, limits,          what every module may use (limits: the
       interrupts, atomic                       bounds both a leaf and config check;
                                                atomic: the one atomic file write)
    1  types                                    the Tinker-shaped contract
    2  protocol, sandbox, reward, data,         the leaves: each owns one thing, and
       tracking, backends                       reads no run config (a backend's
                                                ``ModelConfig`` is a type only)
    3  config                                   every section, checked against
                                                retool.limits; imports no backend
    4  rollout                                  one batch of trajectories, scored
    5  evaluation                               N samples per problem, their numbers
    6  training                                 the RL step and SFT (periodic eval)
    7  report, diagnostics                      what reads a run or checks a setup
    8  cli                                      the commands

A module's floor is that of the longest prefix listed in :data:`FLOORS`.
An import counts wherever it is written (module top or inside a function),
except under ``if TYPE_CHECKING:`` (annotations only, never run). Importing
``a.b.c`` also runs the ``__init__`` of ``a`` and ``a.b``, so it counts as an
import of those packages too, unless the importer lives inside them: that is
how an import circle through a package's ``__init__`` is caught.

:data:`ALLOWED_UPWARD` lists the imports that may point up a floor, each with
the reason; a new one fails here and must either be fixed or argued for.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

FLOORS: dict[str, int] = {
    "retool": 0,
    "retool.errors": 0,
    "retool.checks": 0,
    "retool.limits": 0,
    "retool.atomic": 0,
    "retool.interrupts": 0,
    "retool.types": 1,
    "retool.protocol": 2,
    "retool.sandbox": 2,
    "retool.reward": 2,
    "retool.data": 2,
    "retool.tracking": 2,
    "retool.backends": 2,
    "retool.config": 3,
    "retool.rollout": 4,
    "retool.evaluation": 5,
    "retool.training": 6,
    "retool.report": 7,
    "retool.diagnostics": 7,
    "retool.cli": 8,
    "retool.__main__": 8,
}

# (importer, imported): why this one import may point up a floor. At most two.
ALLOWED_UPWARD: dict[tuple[str, str], str] = {
    ("retool.evaluation.models", "retool.training.run_dir"): (
        "`--model RUN_DIR[@STEP]` reads the run's checkpoint manifest, whose format "
        "training.run_dir owns (one reader of checkpoints.jsonl, not two)"
    ),
}


def modules(root: Path = SRC) -> dict[str, tuple[Path, bool]]:
    """Every module under ``root/retool``: dotted name -> (file, is a package)."""
    found = {}
    for path in sorted((root / "retool").rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        package = parts[-1] == "__init__"
        if package:
            parts = parts[:-1]
        found[".".join(parts)] = (path, package)
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


Edge = tuple[str, str, int, str]


def imports(root: Path = SRC) -> set[Edge]:
    """(importer, imported module, line, module the statement names) per project import.

    The last is the module the statement names; the second is it or one of the
    packages whose ``__init__`` importing it runs.
    """
    known = modules(root)

    def resolve(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    edges: set[Edge] = set()
    for name, (path, package) in known.items():
        here = name if package else name.rpartition(".")[0]

        def add(target: str | None, line: int, importer: str = name) -> None:
            if target is None or target == importer:
                return
            edges.add((importer, target, line, target))
            parent = target.rpartition(".")[0]  # running a.b.c runs a.b's __init__ first
            while parent and not importer.startswith(parent + ".") and importer != parent:
                edges.add((importer, parent, line, target))
                parent = parent.rpartition(".")[0]

        def visit(node: ast.AST, here: str = here) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.If) and _is_type_checking(child):
                    for other in child.orelse:
                        visit(other)
                    continue
                if isinstance(child, ast.Import):
                    for alias in child.names:
                        if alias.name.split(".")[0] == "retool":
                            add(resolve(alias.name), child.lineno)
                elif isinstance(child, ast.ImportFrom):
                    if child.level:
                        base = here.split(".")[: len(here.split(".")) - child.level + 1]
                        source = ".".join(base + ([child.module] if child.module else []))
                    else:
                        source = child.module or ""
                    if source.split(".")[0] == "retool":
                        for alias in child.names:
                            full = f"{source}.{alias.name}"
                            add(full if full in known else resolve(source), child.lineno)
                visit(child, here)

        visit(ast.parse(path.read_text(encoding="utf-8"), str(path)))
    return edges


def floor(module: str) -> int:
    parts = module.split(".")
    for end in range(len(parts), 0, -1):
        prefix = ".".join(parts[:end])
        if prefix in FLOORS:
            return FLOORS[prefix]
    raise AssertionError(f"{module} has no floor: add its package to FLOORS in {__file__}")


def cycles(edges: set[Edge]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    graph: dict[str, set[str]] = {}
    for source, target, _, _ in edges:
        graph.setdefault(source, set()).add(target)
        graph.setdefault(target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in graph[node]:
            if other not in index:
                connect(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
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
            connect(node)
    return found


def upward(edges: set[Edge]) -> list[Edge]:
    return sorted(edge for edge in edges if floor(edge[1]) > floor(edge[0]))


def test_the_import_graph_has_no_circle() -> None:
    found = cycles(imports())
    assert not found, f"import circles (each a set of modules that import each other): {found}"


def test_imports_point_down_a_floor_except_the_allowed_ones() -> None:
    found = upward(imports())
    unexpected = [
        f"{s} (floor {floor(s)}) imports {t} (floor {floor(t)}) at line {line}"
        + (f" (through {named})" if named != t else "")
        for s, t, line, named in found
        if (s, named) not in ALLOWED_UPWARD
    ]
    assert not unexpected, "imports up a floor:\n" + "\n".join(unexpected)
    assert len(ALLOWED_UPWARD) <= 2, "at most two upward imports, each with its reason"
    stale = set(ALLOWED_UPWARD) - {(s, named) for s, _, _, named in found}
    assert not stale, f"allowed upward imports that no longer exist (remove them): {stale}"


def reachable(edges: set[Edge], start: str) -> set[str]:
    """The modules that importing ``start`` (or any module inside it) may run."""
    graph: dict[str, set[str]] = {}
    for source, target, _, _ in edges:
        graph.setdefault(source, set()).add(target)
    todo = [m for m in graph if m == start or m.startswith(start + ".")]
    seen = set(todo)
    while todo:
        for other in graph.get(todo.pop(), ()):
            if other not in seen:
                seen.add(other)
                todo.append(other)
    return seen


def test_config_reaches_no_backend() -> None:
    """The config checks the services' limits from ``retool.limits``: no import path,
    direct or through another package, leads from ``retool.config`` to a backend."""
    found = sorted(m for m in reachable(imports(), "retool.config") if floor(m) == 2)
    assert found, "the graph lost config's imports of the leaves (protocol, sandbox, data)"
    backends = [m for m in found if m == "retool.backends" or m.startswith("retool.backends.")]
    assert not backends, f"retool.config reaches the backends: {backends}"


def test_every_module_has_a_floor() -> None:
    for name in modules():
        floor(name)


def test_the_check_sees_an_upward_import_and_a_circle(tmp_path: Path) -> None:
    """The graph is read from source: a planted upward import and circle are both found."""
    package = tmp_path / "retool"
    (package / "sandbox").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "config.py").write_text("from retool.sandbox.local import LIMIT\n")
    (package / "sandbox" / "__init__.py").write_text("")
    (package / "sandbox" / "local.py").write_text(
        "LIMIT = 1\n\ndef later():\n    from retool.config import RunConfig\n"
    )
    edges = imports(tmp_path)
    planted = ("retool.sandbox.local", "retool.config", 4, "retool.config")
    assert planted in upward(edges)
    assert ["retool.config", "retool.sandbox.local"] in cycles(edges)


def test_reachable_follows_imports_through_other_packages(tmp_path: Path) -> None:
    """A backend reached through a leaf counts: config -> sandbox -> backends is found."""
    package = tmp_path / "retool"
    for folder in ("config", "sandbox", "backends"):
        (package / folder).mkdir(parents=True)
        (package / folder / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "config" / "model.py").write_text("from retool.sandbox.url import parse\n")
    (package / "sandbox" / "url.py").write_text(
        "def parse():\n    from retool.backends.pytrio import RANKS\n"
    )
    (package / "backends" / "pytrio.py").write_text("RANKS = range(4, 65)\n")
    found = reachable(imports(tmp_path), "retool.config")
    assert {"retool.sandbox.url", "retool.backends.pytrio"} <= found
