"""Engines for SQLite and PostgreSQL, and the one place database errors are sorted.

The same code runs on SQLite (embedded: WAL, ``synchronous=FULL``, a busy timeout and
``BEGIN IMMEDIATE`` so concurrent writers queue instead of failing) and on PostgreSQL
(psycopg 3). Database errors leave this package as :mod:`pipeline.errors`, sorted here by what
the caller should do (:func:`map_error`): a lost connection or a busy database is transient
(503, retried); a deadlock or a serialization failure is a :class:`errors.TransactionAborted`
(the same work may succeed when run again); a constraint is a conflict (409); anything else is
a bug (500, never retried).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

from pipeline import errors, settings

SQLITE_POOL_SIZE = 64  #: SQLite connections a process keeps open

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
#: PostgreSQL SQLSTATEs after which it has rolled the whole transaction back to resolve a
#: conflict between transactions: the same work may succeed when run again
_ABORTED = {"40001": errors.SerializationFailure, "40P01": errors.Deadlock}


def normalize_url(url: str) -> str:
    """Use psycopg 3 for plain ``postgresql://`` URLs."""
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


def is_postgres_url(url: str) -> bool:
    """True for a PostgreSQL URL (any driver)."""
    return url.startswith(("postgresql:", "postgresql+", "postgres:"))


def create_engine(
    url: str,
    *,
    busy_timeout: float = settings.DEFAULT_BUSY_TIMEOUT,
    synchronous: str = settings.DEFAULT_SQLITE_SYNCHRONOUS,
    create: bool = True,
) -> sa.Engine:
    """An engine for ``url``; SQLite gets WAL, ``synchronous``, a busy timeout and
    ``BEGIN IMMEDIATE``. ``create=False``: a SQLite database that does not exist yet is
    refused (:class:`errors.Misconfigured`, naming its path) instead of made empty."""
    url = normalize_url(url)
    if not url.startswith("sqlite"):
        return sa.create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)
    synchronous = synchronous.upper()
    if synchronous not in settings.SQLITE_SYNCHRONOUS:
        raise errors.Misconfigured(
            f"sqlite_synchronous must be one of {', '.join(settings.SQLITE_SYNCHRONOUS)}, got "
            f"{synchronous!r}: anything weaker can lose acknowledged appends in a power cut"
        )
    if url.startswith("sqlite:///") and url != "sqlite:///:memory:":
        path = Path(url.removeprefix("sqlite:///"))
        if create:
            path.parent.mkdir(parents=True, exist_ok=True)
        elif not path.exists():
            raise errors.Misconfigured(
                f"no index at {path}: nothing was ever stored with this data directory and "
                "database URL (check --data-dir / SGME_DATA_DIR), or run `sgme migrate` to "
                "start a new store there"
            )
    engine = sa.create_engine(
        url,
        connect_args={"timeout": busy_timeout, "check_same_thread": False},
        # Connections are cheap to keep and costly to open (the pragmas below): enough for
        # every thread of a busy process (the API's thread pool, the worker's threads).
        pool_size=SQLITE_POOL_SIZE,
        max_overflow=SQLITE_POOL_SIZE,
    )

    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Take transaction control from the driver so BEGIN IMMEDIATE can be issued below.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={int(busy_timeout * 1000)}")
        cursor.execute(f"PRAGMA synchronous={synchronous}")
        cursor.execute("PRAGMA foreign_keys=ON")
        # Deleted rows (a flushed journal row, a redacted message's terms, an erased file's
        # rows) are overwritten with zeros, in their pages and on the freelist: text removed
        # on purpose must not stay readable in the file (docs/privacy.md)
        cursor.execute("PRAGMA secure_delete=ON")
        cursor.close()
        _record.info["synchronous"] = _record.info[_DURABLE] = synchronous

    @sa.event.listens_for(engine, "begin")
    def _on_begin(conn: sa.Connection) -> None:
        # A deferred transaction that reads and then writes fails with SQLITE_BUSY when another
        # writer committed in between; taking the write lock up front makes writers queue.
        # A read-only snapshot (reading()) needs no lock: WAL readers never wait for writers.
        # Straight on the driver: this runs for every transaction of the append path.
        # (a connection the Database holds is detached from the pool: no driver_connection)
        raw = conn.connection.driver_connection or conn.connection.dbapi_connection
        assert raw is not None
        if raw.in_transaction:  # begun on the driver (transactions._lean): this is its own
            return
        options = conn.get_execution_options()
        level = synchronous_level(conn.connection, options.get("sgme_durable", True))
        begin = "BEGIN" if options.get("sgme_reading") else "BEGIN IMMEDIATE"
        try:
            if conn.connection.info.get("synchronous", synchronous) != level:
                raw.execute(f"PRAGMA synchronous={level}")
                conn.connection.info["synchronous"] = level
            raw.execute(begin)
        except sqlite3.Error as exc:
            raise sa_exc.DBAPIError.instance(begin, None, exc, sqlite3.Error) from exc

    return engine


_DURABLE = "sgme_synchronous"  #: a SQLite connection's info: its ``synchronous`` when durable


def synchronous_level(connection: Any, durable: bool) -> str:
    """The ``synchronous`` a SQLite transaction on ``connection`` (a pooled or held
    connection, with its ``info``) commits at: the engine's own when ``durable``, else
    ``NORMAL`` (no wait for the disk; docs/design.md §3)."""
    return str(connection.info[_DURABLE]) if durable else "NORMAL"


def map_error(exc: sa_exc.SQLAlchemyError) -> errors.SgmeError:
    """The :mod:`pipeline.errors` class a database error belongs to."""
    orig = getattr(exc, "orig", None)
    aborted = _ABORTED.get(getattr(orig, "sqlstate", None) or "")
    if aborted is not None:
        return aborted(f"index transaction rolled back: {orig}")
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


def mapped(exc: BaseException) -> BaseException:
    """An exception as :mod:`pipeline` raises it: a database error becomes its
    :mod:`pipeline.errors` class (with the original as its cause), anything else stays as it
    is."""
    if not isinstance(exc, sa_exc.SQLAlchemyError):
        return exc
    error = map_error(exc)
    error.__cause__ = exc
    return error
