"""The layers (docs/design.md §10): which package may import which, and what the client, a
capture hook and ``sgme --help`` may load — imports inside functions counted.

Every import of ``pipeline`` and ``workers`` is read from the source (the AST, at any depth),
as an edge that runs when the module is imported (``top``) or only when a function runs
(``deferred``). Imports under ``if TYPE_CHECKING:`` never run and are not edges here.

- **Packages**: the core (``pipeline``'s own modules, ``database``, ``refiners``) never imports
  a transport (``api``, ``ui``, ``mcp``), the command line, live capture or the importers; a
  transport imports the core (``api`` mounts the web view, ``mcp`` reaches the API's token
  check); only the command line imports everything.
- **The client path** — ``pipeline.client``, live capture, the importers and ``sgme capture``:
  what they can ever import, deferred imports followed, holds no server (SQLAlchemy, FastAPI,
  Starlette, uvicorn, Celery, Jinja, nor our index, service, runtime or transports). A hook
  runs at the end of every agent turn; what it loads is paid each time.
- **``sgme --help``**: what every ``pipeline.cli`` module imports at its top (each command
  imports what it uses when it runs) holds no server either.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Module:
    """One module's imports: ``top`` run when it is imported, ``deferred`` inside functions."""

    name: str
    package: bool  #: an ``__init__.py``
    top: set[str] = field(default_factory=set)
    deferred: set[str] = field(default_factory=set)


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def read(name: str, source: str, *, package: bool = False) -> Module:
    """The imports of module ``name`` (``package``: its ``__init__``) whose text is
    ``source``. ``from pkg import name`` is read as ``pkg:name`` (resolved in :func:`graph`);
    relative imports are made absolute."""
    module = Module(name, package)
    here = name if package else name.rpartition(".")[0]

    def visit(node: ast.AST, deferred: bool) -> None:
        if isinstance(node, ast.If) and _type_checking(node.test):
            for branch in node.orelse:
                visit(branch, deferred)
            return
        found: set[str] = set()
        if isinstance(node, ast.Import):
            found = {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = here.split(".")
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join([*parts, *([base] if base else [])])
            found = {f"{base}:{alias.name}" for alias in node.names}
        (module.deferred if deferred else module.top).update(found)
        inner = deferred or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    visit(ast.parse(source), False)
    return module


def graph(modules: Iterable[Module]) -> dict[str, Module]:
    """The modules by name, each import narrowed to what it names: one of these modules
    (``from pkg import sub`` is ``pkg.sub`` when that is a module, else ``pkg``), or a
    third-party package's top name."""
    known = {m.name: m for m in modules}

    def narrow(names: set[str]) -> set[str]:
        kept = set()
        for found in names:
            base, _, member = found.partition(":")
            name = f"{base}.{member}" if f"{base}.{member}" in known else base
            if name in known:
                kept.add(name)
            elif name.split(".")[0] not in {"pipeline", "workers"}:
                kept.add(name.split(".")[0])
            else:
                raise AssertionError(f"import of {found!r}: no such module of ours")
        return kept

    for module in known.values():
        module.top = narrow(module.top) - {module.name}
        module.deferred = narrow(module.deferred) - {module.name} - module.top
    return known


def _sources() -> dict[str, Module]:
    found = []
    for package in ("pipeline", "workers"):
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            is_package = parts[-1] == "__init__"
            name = ".".join(parts[:-1] if is_package else parts)
            found.append(read(name, path.read_text(encoding="utf-8"), package=is_package))
    return graph(found)


MODULES = _sources()


def loaded(
    modules: Mapping[str, Module], roots: Iterable[str], *, deferred: bool
) -> dict[str, list[str]]:
    """Everything importing ``roots`` can load, each with one chain of imports that gets
    there: the imports at the top of each module reached, and the ``__init__`` of every
    package on the way; with ``deferred``, the imports inside the functions of the modules
    imported too (not of a package only passed through, nor of what its ``__init__``
    imports: that code runs, not their functions — ``pipeline.cli`` hands ``sgme capture``
    over before it imports any other command)."""
    chains: dict[str, list[str]] = {}
    followed: dict[str, bool] = {}  #: name → whether its deferred imports were followed
    todo = [(root, [root], deferred) for root in roots]
    while todo:
        name, chain, inner = todo.pop()
        if name in followed and (followed[name] or not inner):
            continue
        chains.setdefault(name, chain)
        followed[name] = inner
        module = modules.get(name)
        if module is None:
            continue  # third party: its own imports are not read
        parents = [name.rsplit(".", n)[0] for n in range(1, name.count(".") + 1)]
        todo += [(p, [*chain, p], False) for p in parents]
        nexts = module.top | (module.deferred if inner else set())
        # what a package passed through imports at its top runs; its functions need not
        todo += [(n, [*chain, n], inner) for n in sorted(nexts)]
    return chains


#: what the client path and ``sgme --help`` must never load
SERVER = (
    "sqlalchemy",
    "fastapi",
    "starlette",
    "uvicorn",
    "celery",
    "kombu",
    "alembic",
    "jinja2",
    "workers",
    "pipeline.api",
    "pipeline.ui",
    "pipeline.mcp",
    "pipeline.database",
    "pipeline.tables",
    "pipeline.index",
    "pipeline.service",
    "pipeline.runtime",
)


def server_loaded(chains: Mapping[str, list[str]]) -> dict[str, str]:
    """Each server module in ``chains``, with the imports that reach it."""
    return {
        name: " -> ".join(chain)
        for name, chain in sorted(chains.items())
        if any(name == s or name.startswith(f"{s}.") for s in SERVER)
    }


def client_path(modules: Mapping[str, Module]) -> list[str]:
    """The modules a client or a hook runs: the client, live capture, the importers and
    ``sgme capture``."""
    return [
        name
        for name in modules
        if name in {"pipeline.client", "pipeline.cli.capture"}
        or name.startswith(("pipeline.capture", "pipeline.importers"))
    ]


#: package → the packages it may import (``core``: ``pipeline``'s own modules)
ALLOWED = {
    "core": {"core", "pipeline.database", "pipeline.refiners"},
    "pipeline.database": {"core"},
    "pipeline.refiners": {"core"},
    "pipeline.migrations": {"core", "pipeline.database"},
    "pipeline.importers": {"core"},
    "pipeline.capture": {"core", "pipeline.importers"},
    "pipeline.ui": {"core"},
    "pipeline.api": {"core", "pipeline.ui"},
    "pipeline.mcp": {"core", "pipeline.api"},
    "pipeline.cli": {
        "core",
        "pipeline.database",
        "pipeline.importers",
        "pipeline.capture",
        "pipeline.api",
        "pipeline.ui",
        "pipeline.mcp",
    },
    "workers": {"core", "pipeline.database"},
}


def package_of(name: str) -> str:
    """The package ``name`` belongs to in :data:`ALLOWED` (``core`` for ``pipeline.x``)."""
    parts = name.split(".")
    if parts[0] == "workers":
        return "workers"
    if f"pipeline.{parts[1] if len(parts) > 1 else ''}" in ALLOWED:
        return f"pipeline.{parts[1]}"
    return "core"


def layer_violations(modules: Mapping[str, Module]) -> list[str]:
    """Each import, deferred ones too, of a package its package may not import."""
    found = []
    for name, module in sorted(modules.items()):
        mine = package_of(name)
        for other in sorted(module.top | module.deferred):
            if other.split(".")[0] not in {"pipeline", "workers"} or other == "pipeline":
                continue
            theirs = package_of(other)
            if theirs != mine and theirs not in ALLOWED[mine]:
                found.append(f"{name} ({mine}) imports {other} ({theirs})")
    return found


# ---------------------------------------------------------------------------------------------
# the rules, on the real tree


def test_the_sources_are_read_with_their_deferred_imports() -> None:
    assert {"pipeline.client", "pipeline.cli.capture", "pipeline.api.app"} <= set(MODULES)
    # build_parser imports the command modules inside the function
    assert "pipeline.cli.browse" in MODULES["pipeline.cli"].deferred
    assert "pipeline.cli.browse" not in MODULES["pipeline.cli"].top
    # chat imports its sibling relatively
    assert "pipeline.importers.convention" in MODULES["pipeline.importers.chat"].top


def test_every_package_imports_only_the_packages_below_it() -> None:
    assert layer_violations(MODULES) == []


def test_the_client_and_a_hook_never_load_the_server() -> None:
    roots = client_path(MODULES)
    assert {"pipeline.client", "pipeline.capture.runner", "pipeline.cli.capture"} <= set(roots)
    assert server_loaded(loaded(MODULES, roots, deferred=True)) == {}


def test_sgme_help_loads_no_server() -> None:
    roots = [name for name in MODULES if name.startswith("pipeline.cli")]
    assert server_loaded(loaded(MODULES, roots, deferred=False)) == {}


# ---------------------------------------------------------------------------------------------
# the checks fail on a wrong import


def _with(name: str, source: str) -> dict[str, Module]:
    """The real tree with one more module, ``name``, reading ``source``."""
    fresh = _sources()
    fresh[name] = graph([*fresh.values(), read(name, source)])[name]
    return fresh


def test_a_client_path_module_importing_the_service_in_a_function_is_caught() -> None:
    bad = "def deliver():\n    from pipeline import service\n    return service\n"
    modules = _with("pipeline.capture.bad", bad)
    found = server_loaded(loaded(modules, client_path(modules), deferred=True))
    assert found["pipeline.service"].startswith("pipeline.capture.bad -> pipeline.service")
    assert "sqlalchemy" in found


def test_a_cli_module_importing_fastapi_at_its_top_is_caught_and_in_a_function_is_not() -> None:
    top = _with("pipeline.cli.bad", "import fastapi\n")
    assert server_loaded(loaded(top, ["pipeline.cli.bad"], deferred=False)) == {
        "fastapi": "pipeline.cli.bad -> fastapi"
    }
    inner = _with("pipeline.cli.bad", "def run():\n    import fastapi\n")
    assert server_loaded(loaded(inner, ["pipeline.cli.bad"], deferred=False)) == {}


def test_the_core_importing_a_transport_is_caught() -> None:
    modules = _with("pipeline.bad", "def f():\n    from pipeline.api import app\n")
    assert layer_violations(modules) == [
        "pipeline.bad (core) imports pipeline.api.app (pipeline.api)"
    ]


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import fastapi\n", {"typing"}),
        ("class A:\n    import fastapi\n", {"fastapi"}),  # a class body runs at import
        ("from . import convention\n", {"pipeline.importers.convention"}),
        ("from ..capture import spool\n", {"pipeline.capture.spool"}),
    ],
)
def test_what_counts_as_an_import_at_the_top(source: str, expected: set[str]) -> None:
    modules = _with("pipeline.importers.bad", source)
    assert modules["pipeline.importers.bad"].top == expected


def test_the_mcp_tools_on_the_api_call_it_in_process_and_sgme_mcp_is_a_client() -> None:
    """``/mcp`` calls the routes' functions (no HTTP client of the app itself); ``sgme mcp``
    on stdio calls the HTTP API and loads no server of its own."""
    for name in ("pipeline.mcp.http", "pipeline.mcp.local"):
        imported = MODULES[name].top | MODULES[name].deferred
        assert not imported & {"httpx", "pipeline.client"}, name
    chains = loaded(MODULES, ["pipeline.mcp.stdio"], deferred=True)
    found = {
        name: chain
        for name, chain in server_loaded(chains).items()
        if not name.startswith("pipeline.mcp")  # itself: the transport
    }
    assert found == {}


def test_the_migrations_run_none_of_todays_code() -> None:
    """A revision runs against the schema of its day; today's modules write today's schema.
    What must be made again from the files is asked for by name and done at head
    (``pipeline.database.schema.migrate``'s refill)."""
    revisions = [name for name in MODULES if name.startswith("pipeline.migrations.versions.")]
    assert len(revisions) >= 12
    ours = {
        name: sorted(i for i in module.top | module.deferred if i.startswith("pipeline"))
        for name, module in MODULES.items()
        if name in revisions
    }
    assert {name: found for name, found in ours.items() if found} == {}


def test_one_fork_hook_for_the_process() -> None:
    """``os.register_at_fork`` never forgets a hook: :mod:`pipeline.forks` holds the one
    hook, and objects with state a child must make afresh ask it (``reset_in_child``)."""
    hooks = sorted(
        path.relative_to(ROOT).as_posix()
        for package in ("pipeline", "workers")
        for path in (ROOT / package).rglob("*.py")
        if "register_at_fork" in path.read_text(encoding="utf-8")
    )
    assert hooks == ["pipeline/forks.py"]


#: the variables that say where a client's server is and who the client is
CLIENT_VARIABLES = {"SGME_URL", "SGME_TOKEN", "SGME_AGENT_ID"}


def client_variable_reads(source: str) -> list[str]:
    """Each read of a :data:`CLIENT_VARIABLES` variable in ``source``: ``x.get("SGME_URL"…)``,
    ``x["SGME_URL"]`` or ``os.getenv("SGME_URL")``, as ``line: name``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call | ast.Subscript):
            continue
        key: ast.expr | None = None
        if isinstance(node, ast.Call) and node.args:
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr in {"get", "getenv"}:
                key = node.args[0]
        elif isinstance(node, ast.Subscript):
            key = node.slice
        if isinstance(key, ast.Constant) and key.value in CLIENT_VARIABLES:
            found.append(f"{node.lineno}: {key.value}")
    return found


def test_a_clients_server_and_token_are_read_in_one_module_of_the_standard_library_only() -> None:
    """``SGME_URL``, ``SGME_TOKEN`` and ``SGME_AGENT_ID`` are read by :mod:`pipeline.remote`
    alone, which a capture hook loads without :mod:`pipeline.settings` (slow to import)."""
    reads = {
        path.relative_to(ROOT).as_posix(): found
        for package in ("pipeline", "workers")
        for path in sorted((ROOT / package).rglob("*.py"))
        if (found := client_variable_reads(path.read_text(encoding="utf-8")))
    }
    assert set(reads) == {"pipeline/remote.py"}
    module = MODULES["pipeline.remote"]
    assert sorted(i for i in module.top | module.deferred if i.startswith("pipeline")) == []
    hook = loaded(MODULES, ["pipeline.capture.config"], deferred=True)
    assert "pipeline.remote" in hook and "pipeline.settings" not in hook


def test_a_second_reader_of_a_clients_variables_is_caught() -> None:
    source = 'import os\n\nURL = os.environ.get("SGME_URL", "")\nT = os.environ["SGME_TOKEN"]\n'
    assert client_variable_reads(source) == ["3: SGME_URL", "4: SGME_TOKEN"]


def test_the_service_holds_its_collaborators_and_inherits_none() -> None:
    """Browsing, upkeep and removals are objects ``Service`` holds (``service.browsing``…),
    not mixins reaching into attributes it sets."""
    tree = ast.parse((ROOT / "pipeline" / "service.py").read_text(encoding="utf-8"))
    (service,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Service"]
    assert service.bases == []
    init = next(n for n in service.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    held = {
        target.attr
        for node in ast.walk(init)
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Attribute)
    }
    assert {"browsing", "upkeep", "removals"} <= held
