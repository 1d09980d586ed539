"""Shared fixtures: an index on SQLite (always) and on PostgreSQL (a database of its own,
created and dropped by the test run; skipped off CI when PostgreSQL is not running, a failure
on CI), a fresh data directory, and the ``sgme`` command run in this process."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import hypothesis
import pytest
import sqlalchemy as sa

from pipeline import cli, database, locks, settings, tables
from pipeline.clock import ManualClock

# Helper modules of the e2e tests: pytest rewrites their asserts too (before any test imports
# them), so a failed check there says what it compared.
pytest.register_assert_rewrite("harness", "services")

CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

#: property tests check results, never time: no per-example deadline (a loaded 2-core machine
#: running two xdist workers and their servers once made a 200 ms deadline fail). On CI the
#: examples are derandomized, so every run there finds the same things; a developer's run
#: draws new ones (that is how a crash of the redactor on ``--api-key=@`` at the end of a
#: text was found), and each one found becomes an ``@example``.
hypothesis.settings.register_profile(
    "sgme",
    deadline=None,
    suppress_health_check=[hypothesis.HealthCheck.too_slow],
    derandomize=CI,
)
hypothesis.settings.load_profile("sgme")
POSTGRES_ADMIN_URL = os.environ.get(
    "SGME_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
REDIS_URL = os.environ.get("SGME_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")


def unavailable(reason: str) -> NoReturn:
    """Skip off CI; on CI a missing service is a failure."""
    if CI:
        pytest.fail(f"{reason} (CI=true: integration services must be up)")
    pytest.skip(reason)


@contextlib.contextmanager
def scratch_database(prefix: str) -> Iterator[str]:
    """The URL of a new, empty PostgreSQL database, dropped afterwards. Skipped off CI when
    PostgreSQL does not answer; a failure on CI."""
    admin = sa.create_engine(
        database.normalize_url(POSTGRES_ADMIN_URL), isolation_level="AUTOCOMMIT"
    )
    name = f"{prefix}_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    try:
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    except sa.exc.OperationalError as exc:
        admin.dispose()
        unavailable(f"PostgreSQL not reachable at {POSTGRES_ADMIN_URL}: {exc.orig}")
    try:
        yield POSTGRES_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A migrated PostgreSQL database of this test run's own; dropped at the end."""
    with scratch_database("sgme_test") as url:
        engine = database.create_engine(url)
        database.migrate(engine)
        engine.dispose()
        yield url


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty, migrated index: a SQLite file per test, or the run's PostgreSQL database
    with every table emptied."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'index.sqlite3'}"
        engine = database.create_engine(url)
        database.migrate(engine)
        engine.dispose()
        yield url
        return
    yield request.getfixturevalue("postgres_database_url")


@pytest.fixture
def postgres_database_url(postgres_url: str) -> str:
    """The run's PostgreSQL database with every table emptied (a test for PostgreSQL only)."""
    engine = database.create_engine(postgres_url)
    with engine.begin() as conn:
        # every table but the store's identity, which its migration made once
        names = ", ".join(t.name for t in tables.metadata.sorted_tables if t.name != "deployment")
        conn.execute(sa.text(f"TRUNCATE {names} RESTART IDENTITY CASCADE"))
    engine.dispose()
    return postgres_url


@pytest.fixture
def engine(database_url: str) -> Iterator[sa.Engine]:
    """An engine on :func:`database_url`."""
    engine = database.create_engine(database_url)
    yield engine
    engine.dispose()


@pytest.fixture
def postgres_engine(postgres_database_url: str) -> Iterator[sa.Engine]:
    """An engine on :func:`postgres_database_url`."""
    engine = database.create_engine(postgres_database_url)
    yield engine
    engine.dispose()


@pytest.fixture
def clock() -> ManualClock:
    """A clock the test moves (:meth:`ManualClock.advance`) instead of sleeping."""
    return ManualClock()


@pytest.fixture
def db(engine: sa.Engine, clock: ManualClock) -> database.Database:
    """The index handle the pipeline is given, on :func:`engine`, with the test's clock."""
    return database.Database(engine, clock=clock)


@pytest.fixture
def postgres_db(postgres_engine: sa.Engine, clock: ManualClock) -> database.Database:
    """:func:`db` on PostgreSQL only."""
    return database.Database(postgres_engine, clock=clock)


@pytest.fixture
def file_locks(db: database.Database, data_dir: Path) -> locks.FileLocks:
    """The per-file locks of :func:`data_dir` on :func:`db`."""
    return locks.FileLocks(db, data_dir, timeout=settings.DEFAULT_LOCK_TIMEOUT)


def set_row(db: database.Database, file_id: str, **values: Any) -> None:
    """Change a ``raw_files`` row behind the pipeline's back (a test setting the scene: an old
    file, a lapsed lease)."""
    with db.transaction() as conn:
        stmt = sa.update(tables.raw_files).where(tables.raw_files.c.file_id == file_id)
        assert conn.execute(stmt.values(**values)).rowcount == 1


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    """An empty data directory."""
    path = tmp_path / "data"
    path.mkdir()
    return path


# ---------------------------------------------------------------------------------------------
# the `sgme` command in this process (tests/integration)


@dataclasses.dataclass(frozen=True)
class Run:
    """One ``sgme`` invocation: exit code, stdout bytes, stderr text."""

    code: int
    out: bytes
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


Sgme = Callable[..., Run]


@pytest.fixture
def sgme(
    data_dir: Path,
    database_url: str,
    capsysbinary: pytest.CaptureFixture[bytes],
    monkeypatch: pytest.MonkeyPatch,
) -> Sgme:
    """``sgme(command, *args, stdin=None)`` against this test's data dir and index."""
    for name in list(os.environ):
        if name.startswith("SGME_"):
            monkeypatch.delenv(name)
    capsysbinary.readouterr()

    def run(command: str, *args: str, stdin: str | None = None, common: bool = True) -> Run:
        argv = [command]
        if common:
            argv += ["--data-dir", str(data_dir), "--database-url", database_url]
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin or ""))
        code = cli.main([*argv, *args])
        out, err = capsysbinary.readouterr()
        return Run(code, out, err.decode("utf-8"))

    return run


def assert_one_line_error(run: Run, *needles: str) -> None:
    """A failed command: exit 2, nothing on stdout, one line on stderr naming the fault."""
    assert run.code == cli.EXIT_ERROR, run
    assert run.out == b""
    assert run.err.endswith("\n") and run.err.count("\n") == 1, run.err
    assert run.err.startswith("sgme "), run.err
    for needle in needles:
        assert needle in run.err, run.err


# ---------------------------------------------------------------------------------------------
# end-to-end fixtures (tests/e2e; harness.py lives there)


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Any]:
    """The test's child processes (``harness.Procs``); all stopped when it ends."""
    import harness

    group = harness.Procs(tmp_path / "logs")
    try:
        yield group
    finally:
        group.close()


@pytest.fixture
def production(tmp_path: Path) -> Iterator[tuple[Any, str, Any]]:
    """``(procs, database_url, redis)``: a fresh PostgreSQL database and Redis database 15;
    the children are stopped before the database is dropped and Redis emptied."""
    import harness

    with scratch_database("sgme_e2e") as url, harness.redis_database() as redis:
        group = harness.Procs(tmp_path / "logs")
        try:
            yield group, url, redis
        finally:
            group.close()
