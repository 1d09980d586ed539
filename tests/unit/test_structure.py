"""The shape of the code (docs/design.md, "How the code reads"): dependencies pointing one
way — ``pipeline`` never imports ``workers``, the core modules import only what is below them,
and no two modules or packages import each other, counting imports made inside functions."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted(p for package in ("pipeline", "workers") for p in (ROOT / package).rglob("*.py"))
NAMES = {
    ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__") for p in SOURCES
}


def _module(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def _edges(path: Path) -> set[str]:
    """The project modules ``path`` imports, at any depth of the file (functions included):
    ``from pkg import sub`` is the module ``pkg.sub`` when there is one, else ``pkg``."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            subs = {f"{node.module}.{a.name}" for a in node.names}
            found |= (subs & NAMES) or {node.module}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    return {name for name in found if name in NAMES} - {_module(path)}


GRAPH = {_module(p): _edges(p) for p in SOURCES}


def test_the_sources_are_found() -> None:
    assert {"pipeline.ingest", "pipeline.flush", "pipeline.api.app", "workers.tasks"} <= set(GRAPH)


def test_pipeline_never_imports_workers() -> None:
    offenders = {
        module: sorted(i for i in edges if i.startswith("workers"))
        for module, edges in GRAPH.items()
        if module.startswith("pipeline")
    }
    assert {m: i for m, i in offenders.items() if i} == {}


def test_the_core_modules_depend_only_on_what_they_should() -> None:
    database = {m for m in GRAPH if m.startswith("pipeline.database")}
    allowed = {
        "pipeline.errors": set(),
        "pipeline.clock": set(),
        "pipeline.forks": set(),  # the one fork hook: imports nothing of ours
        "pipeline.vocabulary": set(),
        "pipeline.tables": {"pipeline.vocabulary"},
        "pipeline.refs": {"pipeline.errors"},
        "pipeline.settings": {"pipeline.errors", "pipeline.remote"},
        "pipeline.remote": set(),  # SGME_URL, SGME_TOKEN, SGME_AGENT_ID: standard library only
        "pipeline.document": {"pipeline.errors", "pipeline.refs", "pipeline.vocabulary"},
        "pipeline.store": {"pipeline.errors", "pipeline.forks"},
        "pipeline.validation": {
            "pipeline.document",
            "pipeline.errors",
            "pipeline.refs",
            "pipeline.settings",
            "pipeline.vocabulary",
        },
        "pipeline.answers": {"pipeline.refs", "pipeline.vocabulary"},
        "pipeline.anomalies": {"pipeline.database", "pipeline.tables"},
        "pipeline.index": {
            "pipeline.anomalies",
            "pipeline.database",
            "pipeline.errors",
            "pipeline.tables",
        },
        "pipeline.ledger": {"pipeline.database", "pipeline.tables"},
        **{
            m: {"pipeline.errors", "pipeline.settings", "pipeline.clock", "pipeline.forks"}
            | database
            for m in database
        },
    }
    for module, deps in allowed.items():
        imported = GRAPH[module]
        assert imported <= deps, f"{module} imports {sorted(imported - deps)}"


def test_store_and_index_never_import_each_other() -> None:
    assert "pipeline.index" not in GRAPH["pipeline.store"]
    assert "pipeline.store" not in GRAPH["pipeline.index"]


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*trail, node, nxt]
            if nxt not in state and (found := visit(nxt, [*trail, node])) is not None:
                return found
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node, [])) is not None:
            return found
    return None


def test_no_import_cycle_between_modules() -> None:
    """Any import counts, inside a function too: a cycle hidden in a function is still two
    modules that cannot be read, tested or moved apart."""
    cycle = _cycle(GRAPH)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or ())


def test_no_import_cycle_between_packages() -> None:
    def package(module: str) -> str:
        parts = module.split(".")
        return ".".join(parts[:2]) if len(parts) > 2 else module

    packages: dict[str, set[str]] = {}
    for module, edges in GRAPH.items():
        mine = package(module)
        packages.setdefault(mine, set()).update(package(e) for e in edges if package(e) != mine)
    # a package's own __init__ counts as the package
    cycle = _cycle({p: {e for e in edges if e != p} for p, edges in packages.items()})
    assert cycle is None, "import cycle between packages: " + " -> ".join(cycle or ())


def test_the_cycle_check_sees_imports_inside_functions() -> None:
    assert _cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]
    tree = ast.parse("def f():\n    from pipeline import errors\n")
    assert any(isinstance(node, ast.ImportFrom) for node in ast.walk(tree))
