"""Engines, transactions, locks and the schema: the plumbing under :mod:`pipeline.index`.

The same code runs on SQLite (embedded: WAL, ``synchronous=FULL``, a busy timeout and
``BEGIN IMMEDIATE`` so concurrent writers queue instead of failing) and on PostgreSQL
(psycopg 3). Database errors leave this module as :mod:`pipeline.errors`, sorted by what the
caller should do: a lost connection or a busy database is transient (503, retried); a
constraint is a conflict (409); anything else is a bug (500, never retried).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import postgresql, sqlite

from pipeline import errors

#: SQLite ``synchronous`` levels a deployment may choose; FULL fsyncs the WAL at each commit,
#: so an acknowledgement survives a power cut (NORMAL would not: DESIGN §3)
SQLITE_SYNCHRONOUS = ("FULL", "EXTRA")
DEFAULT_SQLITE_SYNCHRONOUS = "FULL"
DEFAULT_BUSY_TIMEOUT = 30.0  #: seconds SQLite waits for a lock before failing

#: SQLite result codes (the low byte of an extended code) that mean "try again later"
_SQLITE_TRANSIENT = {
    sqlite3.SQLITE_BUSY,
    sqlite3.SQLITE_LOCKED,
    sqlite3.SQLITE_NOMEM,
    sqlite3.SQLITE_IOERR,
    sqlite3.SQLITE_FULL,
    sqlite3.SQLITE_CANTOPEN,
    sqlite3.SQLITE_PROTOCOL,
    sqlite3.SQLITE_INTERRUPT,
    sqlite3.SQLITE_READONLY,
}


def normalize_url(url: str) -> str:
    """Use psycopg 3 for plain ``postgresql://`` URLs."""
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


def is_postgres(conn_or_engine: sa.Connection | sa.Engine) -> bool:
    """True on PostgreSQL."""
    return conn_or_engine.dialect.name == "postgresql"


def insert(conn: sa.Connection, table: sa.Table) -> Any:
    """An INSERT that can take ``on_conflict_do_*`` on either database."""
    return (postgresql.insert if is_postgres(conn) else sqlite.insert)(table)


def create_engine(
    url: str,
    *,
    busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
    synchronous: str = DEFAULT_SQLITE_SYNCHRONOUS,
) -> sa.Engine:
    """An engine for ``url``; SQLite gets WAL, ``synchronous``, a busy timeout and
    ``BEGIN IMMEDIATE``."""
    url = normalize_url(url)
    if not url.startswith("sqlite"):
        return sa.create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)
    synchronous = synchronous.upper()
    if synchronous not in SQLITE_SYNCHRONOUS:
        raise errors.Misconfigured(
            f"sqlite_synchronous must be one of {', '.join(SQLITE_SYNCHRONOUS)}, got "
            f"{synchronous!r}: anything weaker can lose acknowledged appends in a power cut"
        )
    if url.startswith("sqlite:///") and url != "sqlite:///:memory:":
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    engine = sa.create_engine(
        url, connect_args={"timeout": busy_timeout, "check_same_thread": False}
    )
    _sqlite_locks.setdefault(str(engine.url.database), (threading.RLock(), busy_timeout))

    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Take transaction control from the driver so BEGIN IMMEDIATE can be issued below.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={int(busy_timeout * 1000)}")
        cursor.execute(f"PRAGMA synchronous={synchronous}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @sa.event.listens_for(engine, "begin")
    def _on_begin(conn: sa.Connection) -> None:
        # A deferred transaction that reads and then writes fails with SQLITE_BUSY when another
        # writer committed in between; taking the write lock up front makes writers queue.
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def map_error(exc: sa_exc.SQLAlchemyError) -> errors.SgmeError:
    """The :mod:`pipeline.errors` class a database error belongs to."""
    orig = getattr(exc, "orig", None)
    if isinstance(exc, sa_exc.IntegrityError):
        return errors.ConstraintViolation(f"index constraint violated: {orig}")
    if isinstance(exc, sa_exc.DBAPIError) and exc.connection_invalidated:
        return errors.IndexUnavailable(f"index database connection lost: {orig}")
    if isinstance(exc, sa_exc.TimeoutError | sa_exc.DisconnectionError):
        return errors.IndexUnavailable(f"index database unavailable: {exc}")
    if isinstance(orig, sqlite3.Error):
        # sqlite3 reports a typo'd column as OperationalError too: sort by result code.
        code = getattr(orig, "sqlite_errorcode", sqlite3.SQLITE_ERROR) & 0xFF
        if code in _SQLITE_TRANSIENT:
            return errors.IndexUnavailable(f"index database unavailable: {orig}")
        return errors.InternalError(f"index database error: {orig}")
    if isinstance(exc, sa_exc.OperationalError | sa_exc.InterfaceError):
        return errors.IndexUnavailable(f"index database unavailable: {orig}")
    return errors.InternalError(f"index database error: {orig or exc}")


#: Per SQLite database file: an in-process lock taken before ``BEGIN IMMEDIATE``, and the busy
#: timeout. SQLite's busy handler makes a connection that finds the write lock taken sleep in
#: steps of up to 100 ms, and nothing wakes it when the lock is freed; with the API's and the
#: embedded worker's threads contending, appends spent most of their time asleep
#: (bench/bench_http.py, embedded, p99 acknowledgement at half the maximum rate: 0.36–1.06 s
#: without this lock, 0.07–0.10 s with it). Threads of one process queue on this lock instead
#: and the next one runs as soon as it is free; other processes still meet the busy timeout.
_sqlite_locks: dict[str, tuple[threading.RLock, float]] = {}


def _reset_sqlite_locks() -> None:
    # A child forked while another thread held a lock must not inherit it held.
    for database, (_, timeout) in list(_sqlite_locks.items()):
        _sqlite_locks[database] = (threading.RLock(), timeout)


os.register_at_fork(after_in_child=_reset_sqlite_locks)


@contextlib.contextmanager
def transaction(engine: sa.Engine) -> Iterator[sa.Connection]:
    """One transaction; database errors come out as :mod:`pipeline.errors`."""
    found = _sqlite_locks.get(str(engine.url.database)) if engine.dialect.name == "sqlite" else None
    if found is not None and not found[0].acquire(timeout=found[1]):
        raise errors.IndexUnavailable(f"index database stayed locked for {found[1]:.0f} s")
    try:
        with engine.begin() as conn:
            yield conn
    except sa_exc.SQLAlchemyError as exc:
        raise map_error(exc) from exc
    finally:
        if found is not None:
            found[0].release()


@contextlib.contextmanager
def advisory_lock(engine: sa.Engine, key: str) -> Iterator[None]:
    """On PostgreSQL, a session advisory lock on ``key`` (hosts sharing a networked volume
    cannot rely on flock); elsewhere nothing."""
    if not is_postgres(engine):
        yield
        return
    try:
        conn = engine.connect()
        conn.execute(sa.text("SELECT pg_advisory_lock(hashtext(:k))"), {"k": key})
        conn.commit()
    except sa_exc.SQLAlchemyError as exc:
        raise map_error(exc) from exc
    try:
        yield
    finally:
        try:
            conn.execute(sa.text("SELECT pg_advisory_unlock(hashtext(:k))"), {"k": key})
            conn.commit()
        except sa_exc.SQLAlchemyError:
            conn.invalidate()  # closing the session releases the lock anyway
        conn.close()


# ---------------------------------------------------------------------------------------------
# the schema


def _alembic_config() -> Any:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", "pipeline:migrations")
    return config


def migrate(engine: sa.Engine, *, data_dir: Path | None = None) -> None:
    """Bring the schema to the newest Alembic revision; a revision that fills something from
    the files (the message catalog) reads them from ``data_dir``."""
    from alembic import command

    config = _alembic_config()
    try:
        with engine.begin() as conn:
            config.attributes["connection"] = conn
            config.attributes["data_dir"] = data_dir
            command.upgrade(config, "head")
    except sa_exc.SQLAlchemyError as exc:
        raise map_error(exc) from exc


def revisions(engine: sa.Engine) -> tuple[set[str], set[str]]:
    """``(current, head)``: the schema revisions the database is at and the code needs."""
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory

    head = set(ScriptDirectory.from_config(_alembic_config()).get_heads())
    try:
        with engine.connect() as conn:
            current = set(MigrationContext.configure(conn).get_current_heads())
    except sa_exc.SQLAlchemyError as exc:
        raise map_error(exc) from exc
    return current, head


def check_schema(engine: sa.Engine) -> None:
    """Refuse to work on a database whose schema is not the code's (nothing is changed)."""
    current, head = revisions(engine)
    if current == head:
        return
    where = ", ".join(sorted(current)) or "none (an empty database)"
    raise errors.Misconfigured(
        f"the index schema is at revision {where}; this version needs {', '.join(sorted(head))}: "
        "run `sgme migrate` first"
    )
