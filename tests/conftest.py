"""Shared fixtures: an index on SQLite (always) and on PostgreSQL (a database of its own,
created and dropped by the test run; skipped off CI when PostgreSQL is not running, a failure
on CI), and a fresh data directory."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from pipeline import index

CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
POSTGRES_ADMIN_URL = os.environ.get(
    "SGME_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
REDIS_URL = os.environ.get("SGME_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")


def unavailable(reason: str) -> None:
    """Skip off CI; on CI a missing service is a failure."""
    if CI:
        pytest.fail(f"{reason} (CI=true: integration services must be up)")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A migrated PostgreSQL database of this test run's own; dropped at the end."""
    admin = sa.create_engine(
        index.normalize_url(POSTGRES_ADMIN_URL), isolation_level="AUTOCOMMIT"
    )
    name = f"sgme_test_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    try:
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    except sa.exc.OperationalError as exc:
        admin.dispose()
        unavailable(f"PostgreSQL not reachable at {POSTGRES_ADMIN_URL}: {exc.orig}")
    url = POSTGRES_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    engine = index.create_engine(url)
    index.migrate(engine)
    engine.dispose()
    try:
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty, migrated index: a SQLite file per test, or the run's PostgreSQL database
    with every table emptied."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'index.sqlite3'}"
        engine = index.create_engine(url)
        index.migrate(engine)
        engine.dispose()
        yield url
        return
    url = request.getfixturevalue("postgres_url")
    engine = index.create_engine(url)
    with engine.begin() as conn:
        names = ", ".join(t.name for t in index.metadata.sorted_tables)
        conn.execute(sa.text(f"TRUNCATE {names} RESTART IDENTITY CASCADE"))
    engine.dispose()
    yield url


@pytest.fixture
def engine(database_url: str) -> Iterator[sa.Engine]:
    """An engine on :func:`database_url`."""
    engine = index.create_engine(database_url)
    yield engine
    engine.dispose()


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    """An empty data directory."""
    path = tmp_path / "data"
    path.mkdir()
    return path
