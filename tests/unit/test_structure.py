"""The shape of the code (STYLE.md): modules small enough to read, dependencies pointing one
way — ``pipeline`` never imports ``workers``, ``document`` imports nothing of ours but
``errors``, ``store`` and ``index`` never import each other."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 600
SOURCES = sorted(p for package in ("pipeline", "workers") for p in (ROOT / package).rglob("*.py"))


def _module(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def _imports(path: Path) -> set[str]:
    """The project modules ``path`` imports (``from pipeline import x`` counts as
    ``pipeline.x``), at any depth of the file, functions included."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in found if name.split(".")[0] in ("pipeline", "workers")}


def test_the_sources_are_found() -> None:
    names = {_module(p) for p in SOURCES}
    assert {"pipeline.journal", "pipeline.api.app", "workers.tasks"} <= names


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_is_longer_than_600_lines(path: Path) -> None:
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(ROOT)} has {lines} lines: split it on a seam"


def test_pipeline_never_imports_workers() -> None:
    offenders = {
        _module(p): sorted(i for i in _imports(p) if i.startswith("workers"))
        for p in SOURCES
        if _module(p).startswith("pipeline")
    }
    assert {m: i for m, i in offenders.items() if i} == {}


def test_the_core_modules_depend_only_on_what_they_should() -> None:
    allowed = {
        "pipeline.errors": set(),
        "pipeline.document": {"pipeline.errors"},
        "pipeline.store": {"pipeline.errors"},
        "pipeline.tables": set(),
        "pipeline.database": {"pipeline.errors"},
        "pipeline.validation": {"pipeline.document", "pipeline.errors"},
        "pipeline.index": {"pipeline.database", "pipeline.tables"},
    }
    for module, deps in allowed.items():
        path = ROOT / (module.replace(".", "/") + ".py")
        imported = {i for i in _imports(path) if i != "pipeline"}
        assert imported <= deps, f"{module} imports {sorted(imported - deps)}"


def test_no_import_cycle_between_modules() -> None:
    """Module-level imports only (an import inside a function runs late, by design)."""
    graph: dict[str, set[str]] = {}
    names = {_module(p) for p in SOURCES}
    for path in SOURCES:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        edges: set[str] = set()
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # ``from pkg import sub`` depends on the module pkg.sub (importing it runs
                # pkg's __init__ first, but that is not a dependency of this module on pkg)
                subs = {f"{node.module}.{a.name}" for a in node.names}
                candidates = (subs & names) or {node.module}
            elif isinstance(node, ast.Import):
                candidates = {a.name for a in node.names}
            else:
                continue
            edges |= {c for c in candidates if c in names}
        graph[_module(path)] = edges - {_module(path)}

    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in graph.get(node, ()):
            if state.get(nxt) == 1:
                raise AssertionError("import cycle: " + " -> ".join([*trail, node, nxt]))
            if nxt not in state:
                visit(nxt, [*trail, node])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
