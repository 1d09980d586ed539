"""Engines, transactions, locks and the schema: the plumbing under :mod:`pipeline.index`.

The same code runs on SQLite (embedded: WAL, ``synchronous=FULL``, a busy timeout and
``BEGIN IMMEDIATE`` so concurrent writers queue instead of failing) and on PostgreSQL
(psycopg 3). Database errors leave this module as :mod:`pipeline.errors`, sorted by what the
caller should do: a lost connection or a busy database is transient (503, retried); a
constraint is a conflict (409); anything else is a bug (500, never retried).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sqlite3
import threading
from collections.abc import Iterator, Mapping, Sequence
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


def normalize_url(url: str) -> str:
    """Use psycopg 3 for plain ``postgresql://`` URLs."""
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


def is_postgres_url(url: str) -> bool:
    """True for a PostgreSQL URL (any driver)."""
    return url.startswith(("postgresql:", "postgresql+", "postgres:"))


def is_postgres(conn_or_engine: sa.Connection | sa.Engine) -> bool:
    """True on PostgreSQL."""
    return conn_or_engine.dialect.name == "postgresql"


def insert(conn: sa.Connection, table: sa.Table) -> Any:
    """An INSERT that can take ``on_conflict_do_*`` on either database."""
    return (postgresql.insert if is_postgres(conn) else sqlite.insert)(table)


class Prepared:
    """A Core statement executed straight on the driver's cursor: the append and flush paths
    run a handful of statements per message, and SQLAlchemy's per-execution machinery costs
    about ten times the statement itself on SQLite (43 µs against 4 µs for a lookup by key,
    measured here). The statement is compiled once per dialect by SQLAlchemy, which also
    converts the values both ways (its types' bind and result processors); only the
    execution is ours. It runs in the connection's current transaction. Bind parameters are
    given by key; a statement's own literal values are bound as compiled.
    """

    def __init__(self, statement: Any) -> None:
        self.statement = statement
        self._compiled: dict[str, _Compiled] = {}

    def _for(self, dialect: sa.Dialect) -> _Compiled:
        found = self._compiled.get(dialect.name)
        if found is None:
            found = self._compiled[dialect.name] = _Compiled(self.statement, dialect)
        return found

    def execute(self, conn: sa.Connection, params: Mapping[str, Any] | None = None) -> Any:
        """Run once; the driver's cursor (its ``rowcount`` and rows, unconverted)."""
        compiled = self._for(conn.dialect)
        cursor = _driver(conn).cursor()
        try:
            cursor.execute(compiled.sql, compiled.bind(params or {}))
        except conn.dialect.loaded_dbapi.Error as exc:
            raise _mapped(conn, compiled.sql, exc) from exc
        return cursor

    def many(self, conn: sa.Connection, params: Sequence[Mapping[str, Any]]) -> None:
        """Run once per mapping in ``params``, in one driver call (``executemany``)."""
        compiled = self._for(conn.dialect)
        cursor = _driver(conn).cursor()
        try:
            cursor.executemany(compiled.sql, [compiled.bind(p) for p in params])
        except conn.dialect.loaded_dbapi.Error as exc:
            raise _mapped(conn, compiled.sql, exc) from exc

    def rows(self, conn: sa.Connection, params: Mapping[str, Any] | None = None) -> list[Any]:
        """Every row, its values converted as SQLAlchemy would."""
        compiled = self._for(conn.dialect)
        cursor = self.execute(conn, params)
        return [compiled.row(raw) for raw in cursor.fetchall()]

    def first(self, conn: sa.Connection, params: Mapping[str, Any] | None = None) -> Any:
        """The first row (converted), or None."""
        compiled = self._for(conn.dialect)
        raw = self.execute(conn, params).fetchone()
        return None if raw is None else compiled.row(raw)

    def rowcount(self, conn: sa.Connection, params: Mapping[str, Any] | None = None) -> int:
        """Run once; the number of rows changed."""
        return int(self.execute(conn, params).rowcount)


class _Compiled:
    """One statement compiled for one dialect, with its value converters."""

    def __init__(self, statement: Any, dialect: sa.Dialect) -> None:
        compiled = statement.compile(dialect=dialect)
        self.sql = str(compiled)
        self.positional = compiled.positiontup if dialect.positional else None
        self.binds = [
            (name, bind.key, bind.value, bind.type.dialect_impl(dialect).bind_processor(dialect))
            for bind, name in compiled.bind_names.items()
        ]
        columns = getattr(statement, "exported_columns", ())
        self.columns = [c.key for c in columns]
        self.results = [
            c.type.dialect_impl(dialect).result_processor(dialect, None) for c in columns
        ]

    def bind(self, params: Mapping[str, Any]) -> Any:
        values = {}
        for name, key, default, process in self.binds:
            value = params.get(key, default)
            values[name] = process(value) if process is not None else value
        if self.positional is not None:
            return tuple(values[name] for name in self.positional)
        return values

    def row(self, raw: Sequence[Any]) -> dict[str, Any]:
        return {
            key: process(value) if process is not None else value
            for key, value, process in zip(self.columns, raw, self.results, strict=True)
        }


def _driver(conn: sa.Connection) -> Any:
    driver = conn.connection.driver_connection
    assert driver is not None
    return driver


def _mapped(conn: sa.Connection, sql: str, exc: Exception) -> errors.SgmeError:
    wrapped = sa_exc.DBAPIError.instance(sql, None, exc, conn.dialect.loaded_dbapi.Error)
    return map_error(wrapped)


def mapped(exc: BaseException) -> BaseException:
    """An exception as :mod:`pipeline` raises it: a database error becomes its
    :mod:`pipeline.errors` class, anything else stays as it is."""
    if not isinstance(exc, sa_exc.SQLAlchemyError):
        return exc
    error = map_error(exc)
    error.__cause__ = exc
    return error


def savepoint(conn: sa.Connection, name: str, action: str) -> None:
    """``SAVEPOINT``, ``RELEASE SAVEPOINT`` or ``ROLLBACK TO SAVEPOINT`` ``name`` (``action``
    is ``"begin"``, ``"release"`` or ``"rollback"``), on the driver."""
    sql = {
        "begin": f"SAVEPOINT {name}",
        "release": f"RELEASE SAVEPOINT {name}",
        "rollback": f"ROLLBACK TO SAVEPOINT {name}",
    }[action]
    try:
        _driver(conn).cursor().execute(sql)
    except conn.dialect.loaded_dbapi.Error as exc:
        raise _mapped(conn, sql, exc) from exc


def binds(table: sa.Table) -> dict[str, Any]:
    """A bind parameter per column of ``table``, named and typed like it, for an INSERT's
    values (an autoincrement key left out)."""
    return {
        c.key: sa.bindparam(c.key, type_=c.type)
        for c in table.columns
        if not (c.primary_key and c.autoincrement is True)
    }


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
        url,
        connect_args={"timeout": busy_timeout, "check_same_thread": False},
        # Connections are cheap to keep and costly to open (the pragmas below): enough for
        # every thread of a busy process (the API's thread pool, the worker's threads).
        pool_size=SQLITE_POOL_SIZE,
        max_overflow=SQLITE_POOL_SIZE,
    )
    _sqlite_files.setdefault(
        str(engine.url.database), _SqliteFile(threading.RLock(), busy_timeout, synchronous)
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

    @sa.event.listens_for(engine, "begin")
    def _on_begin(conn: sa.Connection) -> None:
        # A deferred transaction that reads and then writes fails with SQLITE_BUSY when another
        # writer committed in between; taking the write lock up front makes writers queue.
        # A read-only snapshot (reading()) needs no lock: WAL readers never wait for writers.
        # Straight on the driver: this runs for every transaction of the append path.
        options = conn.get_execution_options()
        raw = conn.connection.driver_connection
        assert raw is not None
        level = synchronous if options.get("sgme_durable", True) else "NORMAL"
        begin = "BEGIN" if options.get("sgme_reading") else "BEGIN IMMEDIATE"
        try:
            if conn.connection.info.get("synchronous", synchronous) != level:
                raw.execute(f"PRAGMA synchronous={level}")
                conn.connection.info["synchronous"] = level
            raw.execute(begin)
        except sqlite3.Error as exc:
            raise sa_exc.DBAPIError.instance(begin, None, exc, sqlite3.Error) from exc

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


@dataclasses.dataclass(frozen=True)
class _SqliteFile:
    """What every engine on one SQLite database file shares in this process.

    ``lock`` is taken before ``BEGIN IMMEDIATE``. SQLite's busy handler makes a connection
    that finds the write lock taken sleep in steps of up to 100 ms, and nothing wakes it when
    the lock is freed; with the API's and the embedded worker's threads contending, appends
    spent most of their time asleep (bench/bench_http.py, embedded, p99 acknowledgement at
    half the maximum rate: 0.36–1.06 s without this lock, 0.07–0.10 s with it). Threads of one
    process queue on this lock instead and the next one runs as soon as it is free; other
    processes still meet the busy timeout."""

    lock: threading.RLock
    timeout: float  #: the busy timeout, also how long a thread waits for ``lock``
    synchronous: str  #: the level of a durable commit


_sqlite_files: dict[str, _SqliteFile] = {}


def _reset_sqlite_locks() -> None:
    # A child forked while another thread held a lock must not inherit it held.
    for database, found in list(_sqlite_files.items()):
        _sqlite_files[database] = dataclasses.replace(found, lock=threading.RLock())


os.register_at_fork(after_in_child=_reset_sqlite_locks)


@contextlib.contextmanager
def transaction(engine: sa.Engine, *, durable: bool = True) -> Iterator[sa.Connection]:
    """One transaction; database errors come out as :mod:`pipeline.errors`.

    ``durable=False`` is for a commit whose loss a power cut may take back because what it
    records can be redone from what a durable commit kept (a flush: its journal rows stay
    until it commits, DESIGN §3). It does not wait for the disk (SQLite ``synchronous=NORMAL``,
    PostgreSQL ``synchronous_commit=off``), and it can never outlive a durable commit made
    after it: both databases make their log durable in order.
    """
    found = _sqlite_files.get(str(engine.url.database)) if engine.dialect.name == "sqlite" else None
    if found is not None and not found.lock.acquire(timeout=found.timeout):
        raise errors.IndexUnavailable(f"index database stayed locked for {found.timeout:.0f} s")
    try:
        with engine.connect() as conn:
            if not durable:
                conn = conn.execution_options(sgme_durable=False)
            with conn.begin():
                if not durable and found is None:
                    conn.exec_driver_sql("SET LOCAL synchronous_commit = off")
                yield conn
    except sa_exc.SQLAlchemyError as exc:
        raise map_error(exc) from exc
    finally:
        if found is not None:
            found.lock.release()


@contextlib.contextmanager
def reading(engine: sa.Engine) -> Iterator[sa.Connection]:
    """A read-only transaction: one consistent snapshot. On SQLite it takes no write lock and
    waits for no writer (WAL); nothing may be written in it."""
    try:
        with engine.connect() as conn:
            if engine.dialect.name == "sqlite":
                conn = conn.execution_options(sgme_reading=True)
            with conn.begin():
                yield conn
    except sa_exc.SQLAlchemyError as exc:
        raise map_error(exc) from exc


@contextlib.contextmanager
def advisory_lock(engine: sa.Engine, key: str) -> Iterator[None]:
    """On PostgreSQL, a session advisory lock on ``key`` (hosts sharing a networked volume
    cannot rely on flock); elsewhere nothing."""
    with advisory_locks(engine, [key]):
        yield


@contextlib.contextmanager
def advisory_locks(engine: sa.Engine, keys: Sequence[str]) -> Iterator[None]:
    """:func:`advisory_lock` on every key of ``keys``, taken in sorted order on one connection
    of their own (many files of one batch need not hold a connection each)."""
    if not is_postgres(engine) or not keys:
        yield
        return
    try:
        conn = engine.connect()
    except sa_exc.SQLAlchemyError as exc:
        raise map_error(exc) from exc
    try:
        for key in sorted(set(keys)):
            conn.execute(sa.text("SELECT pg_advisory_lock(hashtext(:k))"), {"k": key})
        conn.commit()
    except sa_exc.SQLAlchemyError as exc:
        conn.invalidate()  # the session's end releases whatever it took
        conn.close()
        raise map_error(exc) from exc
    try:
        yield
    finally:
        try:
            conn.execute(sa.text("SELECT pg_advisory_unlock_all()"))
            conn.commit()
        except sa_exc.SQLAlchemyError:
            conn.invalidate()  # closing the session releases the locks anyway
        conn.close()


#: the first key of :func:`transaction_lock`'s two-key advisory locks: PostgreSQL keeps them
#: apart from the one-key locks of :func:`advisory_lock`, so the two can never collide
_TRANSACTION_LOCK_SPACE = 0x53474D45  # "SGME"
_TRANSACTION_LOCK = sa.text("SELECT pg_advisory_xact_lock(CAST(:space AS integer), hashtext(:k))")


def transaction_lock(conn: sa.Connection, key: str) -> None:
    """Hold a lock on ``key`` until ``conn``'s transaction ends (PostgreSQL: a transaction
    advisory lock, for what has no row to lock yet). SQLite needs none: its write
    transactions (``BEGIN IMMEDIATE``) run one at a time."""
    if conn.dialect.name == "postgresql":
        conn.execute(_TRANSACTION_LOCK, {"space": _TRANSACTION_LOCK_SPACE, "k": key})


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
