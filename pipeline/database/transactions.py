"""The index as one process uses it: :class:`Database`, the handle every part of the pipeline
is given (by the runtime, :mod:`pipeline.runtime`) instead of a bare engine.

It owns what must be shared by everything in the process that writes to one index, and by
nothing else: the engine and its pool, the in-process write lock SQLite needs, the group
committer (:mod:`pipeline.database.commits`) and the clock. Two handles are two separate
users of the database: they do not share a group or a lock (they still exclude each other
through the database itself, only less cheaply).

The append path's transactions run on connections the handle *holds* instead of checking one
out of the pool each time: the group committer's (:meth:`Database.committing`, one connection
used by whichever thread leads the group) and one per thread for the flush's read snapshots
(:meth:`Database.reading` with ``held=True``). A checkout costs SQLAlchemy's pool bookkeeping
and, on PostgreSQL, a ``pool_pre_ping`` round trip; an append made three of them. A held
connection that fails is closed and replaced at its next use, so a database restart costs the
transaction that met it, as with a pooled one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

from pipeline import errors, forks, settings
from pipeline.clock import SYSTEM, Clock
from pipeline.database import commits, engines

T = TypeVar("T")
HELD_PING_AFTER = 5.0  #: seconds unused after which a held PostgreSQL connection is checked

#: connections a forked child inherited: never closed there (closing a PostgreSQL connection
#: sends its parent's session a goodbye over the shared socket), only dropped
_INHERITED: list[sa.Connection] = []


@dataclasses.dataclass(eq=False)
class _Held:
    """A connection held by one user (a thread, the group committer) of one process."""

    conn: sa.Connection
    pid: int = dataclasses.field(default_factory=os.getpid)
    closer: weakref.finalize[Any, Any] | None = None
    used: float = dataclasses.field(default_factory=time.monotonic)  #: last handed out

    def usable(self, *, ping: bool) -> bool:
        """Whether to use it again: this process's, open, and — with ``ping``, after
        :data:`HELD_PING_AFTER` seconds unused — still answering (a PostgreSQL server that
        restarted or dropped an idle session; ``pool_pre_ping``'s job, for an idle one only)."""
        if self.pid != os.getpid() or self.conn.closed or self.conn.invalidated:
            return False
        now = time.monotonic()
        if ping and now - self.used > HELD_PING_AFTER:
            try:
                with self.conn.begin():
                    self.conn.exec_driver_sql("SELECT 1")
            except sa_exc.SQLAlchemyError:
                return False
        self.used = now
        return True

    def drop(self) -> None:
        """Stop using the connection: closed in the process that opened it, only forgotten in
        a forked child."""
        if self.closer is not None:
            self.closer.detach()
        if self.pid != os.getpid():
            _INHERITED.append(self.conn)
            return
        _close_quietly(self.conn)


def _close_quietly(conn: sa.Connection) -> None:
    with contextlib.suppress(Exception):
        conn.close()


def _close_in(conn: sa.Connection, pid: int) -> None:
    """Close ``conn`` if this is the process that opened it (a thread's end)."""
    if pid == os.getpid():
        _close_quietly(conn)
    else:
        _INHERITED.append(conn)


class Database:
    """One index database: transactions (:meth:`transaction`), read snapshots
    (:meth:`reading`), group commits (:meth:`commit`) and the time (:meth:`now`).

    On SQLite, write transactions of this process first take :attr:`_writer`, an in-process
    lock, and only then ``BEGIN IMMEDIATE``. SQLite's busy handler makes a connection that
    finds the write lock taken sleep in steps of up to 100 ms, and nothing wakes it when the
    lock is freed; with the API's and the embedded worker's threads contending, appends spent
    most of their time asleep (bench/bench_http.py, embedded, p99 acknowledgement at half the
    maximum rate: 0.36–1.06 s without this lock, 0.07–0.10 s with it). Threads of one process
    queue on this lock instead and the next one runs as soon as it is free; other processes
    still meet the busy timeout.
    """

    def __init__(
        self,
        engine: sa.Engine,
        *,
        clock: Clock = SYSTEM,
        busy_timeout: float = settings.DEFAULT_BUSY_TIMEOUT,
    ) -> None:
        self.engine = engine
        self.clock = clock
        self.postgres = engine.dialect.name == "postgresql"
        #: how long a thread waits for the in-process write lock (SQLite's busy timeout)
        self.busy_timeout = busy_timeout
        self._writer: threading.RLock | None = None if self.postgres else threading.RLock()
        self.group = commits.Group(self, optimistic=self.postgres)
        self._committer: _Held | None = None
        self._readers = threading.local()
        self._held_lock = threading.Lock()
        self._held: weakref.WeakSet[_Held] = weakref.WeakSet()
        forks.reset_in_child(self)

    def after_fork_in_child(self) -> None:
        """A child forked while another thread held the lock, or led a group, must not
        inherit either. The parent's held connections stay the parent's: dropped at their
        next use here (:meth:`_Held.usable` checks the process), never closed."""
        if self._writer is not None:
            self._writer = threading.RLock()
        self.group = commits.Group(self, optimistic=self.postgres)
        self._held_lock = threading.Lock()

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        busy_timeout: float = settings.DEFAULT_BUSY_TIMEOUT,
        synchronous: str = settings.DEFAULT_SQLITE_SYNCHRONOUS,
        clock: Clock = SYSTEM,
        create: bool = True,
    ) -> Database:
        """A handle on a new engine for ``url`` (:func:`engines.create_engine`)."""
        engine = engines.create_engine(
            url, busy_timeout=busy_timeout, synchronous=synchronous, create=create
        )
        return cls(engine, clock=clock, busy_timeout=busy_timeout)

    @property
    def dialect(self) -> sa.Dialect:
        """The engine's dialect."""
        return self.engine.dialect

    def now(self) -> dt.datetime:
        """Now, by this database's clock (naive UTC, as the index stores times)."""
        return self.clock.now()

    def dispose(self) -> None:
        """Close the held and the pooled connections (pooled psycopg connections left to the
        garbage collector raise ResourceWarning)."""
        with self._held_lock:
            held, self._committer = list(self._held), None
            self._held.clear()
        for one in held:
            one.drop()
        self.engine.dispose()

    def _hold(self) -> _Held:
        conn = self.engine.connect()
        # Out of the pool: the handle closes it itself (at dispose, at its holder's end, or
        # when the handle is collected), whether or not the engine was disposed first.
        conn.detach()
        held = _Held(conn)
        held.closer = weakref.finalize(held, _close_in, conn, held.pid)
        with self._held_lock:
            self._held.add(held)
        return held

    def _lock_writer(self) -> threading.RLock | None:
        writer = self._writer
        if writer is not None and not writer.acquire(timeout=self.busy_timeout):
            raise errors.IndexUnavailable(
                f"index database stayed locked for {self.busy_timeout:.0f} s"
            )
        return writer

    @contextlib.contextmanager
    def transaction(self, *, durable: bool = True) -> Iterator[sa.Connection]:
        """One write transaction; database errors come out as :mod:`pipeline.errors`.

        ``durable=False`` is for a commit whose loss a power cut may take back because what
        it records can be redone from what a durable commit kept (a flush: its journal rows
        stay until it commits, docs/design.md §3). It does not wait for the disk (SQLite
        ``synchronous=NORMAL``, PostgreSQL ``synchronous_commit=off``), and it can never
        outlive a durable commit made after it: both databases make their log durable in
        order.
        """
        writer = self._lock_writer()
        try:
            with self.engine.connect() as conn:
                if not durable:
                    conn = conn.execution_options(sgme_durable=False)
                with conn.begin():
                    if not durable and self.postgres:
                        conn.exec_driver_sql("SET LOCAL synchronous_commit = off")
                    yield conn
        except sa_exc.SQLAlchemyError as exc:
            raise engines.map_error(exc) from exc
        finally:
            if writer is not None:
                writer.release()

    @contextlib.contextmanager
    def committing(self, *, durable: bool = True) -> Iterator[sa.Connection]:
        """:meth:`transaction` on the connection the group committer holds: only the group's
        leader calls it (:class:`commits.Group`), so one thread at a time uses it."""
        writer = self._lock_writer()
        held = self._committer
        try:
            if held is None or not held.usable(ping=self.postgres):
                if held is not None:
                    held.drop()
                held = self._committer = self._hold()
            if not self.postgres:
                with _lean(held.conn, "BEGIN IMMEDIATE", durable=durable):
                    yield held.conn
                return
            conn = held.conn.execution_options(sgme_durable=durable)
            with conn.begin():
                if not durable:
                    conn.exec_driver_sql("SET LOCAL synchronous_commit = off")
                yield conn
        except sa_exc.SQLAlchemyError as exc:
            self._replace_committer(held)
            raise engines.map_error(exc) from exc
        except errors.IndexUnavailable:  # lost or aborted: start the next on a fresh one
            self._replace_committer(held)
            raise
        finally:
            if writer is not None:
                writer.release()

    def _replace_committer(self, held: _Held | None) -> None:
        if held is not None:
            held.drop()
            if self._committer is held:
                self._committer = None

    @contextlib.contextmanager
    def reading(self, *, held: bool = False) -> Iterator[sa.Connection]:
        """A read-only transaction: one consistent snapshot. On SQLite it takes no write lock
        and waits for no writer (WAL); nothing may be written in it. ``held``: on the
        connection this thread holds for its snapshots (the flush's, many times a second),
        closed when the thread ends."""
        if held:
            with self._held_reading() as conn:
                yield conn
            return
        try:
            with self.engine.connect() as conn:
                if not self.postgres:
                    conn = conn.execution_options(sgme_reading=True)
                with conn.begin():
                    yield conn
        except sa_exc.SQLAlchemyError as exc:
            raise engines.map_error(exc) from exc

    @contextlib.contextmanager
    def _held_reading(self) -> Iterator[sa.Connection]:
        reader: _Held | None = getattr(self._readers, "held", None)
        try:
            if reader is None or not reader.usable(ping=self.postgres):
                if reader is not None:
                    reader.drop()
                reader = self._readers.held = self._hold()
                if not self.postgres:
                    reader.conn.execution_options(sgme_reading=True)
            if not self.postgres:
                with _lean(reader.conn, "BEGIN", durable=None):
                    yield reader.conn
                return
            with reader.conn.begin():
                yield reader.conn
        except sa_exc.SQLAlchemyError as exc:
            if reader is not None:
                reader.drop()
                self._readers.held = None
            raise engines.map_error(exc) from exc

    def commit(
        self, work: Callable[[sa.Connection], T], *, durable: bool = True, key: str | None = None
    ) -> T:
        """Run ``work`` in a transaction shared with whatever else this process is committing
        at the moment (:class:`commits.Group`); its value once that transaction committed.
        ``key``: the file whose row ``work`` locks, where the caller knows it (the groups
        lock rows in the order of their keys)."""
        return self.group.run(work, durable=durable, key=key)


@contextlib.contextmanager
def _lean(conn: sa.Connection, begin: str, *, durable: bool | None) -> Iterator[None]:
    """A transaction on a held SQLite connection, begun and ended on the driver itself:
    SQLAlchemy's transaction objects and events cost about as much as the append's own
    statements (docs/design.md §3). Work that runs a Core statement in it makes SQLAlchemy
    begin one of its own, which the ``begin`` event sees the driver already in
    (:func:`engines.create_engine`) and which ends the driver's transaction with it.
    ``durable``: whether the commit waits for the disk (None: a read, as it is)."""
    fairy = conn.connection
    raw: Any = fairy.driver_connection or fairy.dbapi_connection
    try:
        synchronous = None if durable is None else engines.synchronous_level(fairy, durable)
        if synchronous is not None and fairy.info.get("synchronous") != synchronous:
            raw.execute(f"PRAGMA synchronous={synchronous}")
            fairy.info["synchronous"] = synchronous
        raw.execute(begin)
    except sqlite3.Error as exc:
        raise _wrapped(begin, exc) from exc
    try:
        yield
    except BaseException:
        try:
            if conn.in_transaction():
                conn.rollback()
            else:
                raw.rollback()
        except (sqlite3.Error, sa_exc.SQLAlchemyError):
            conn.invalidate()  # replaced at its next use; the work's own error goes on
        raise
    try:
        if conn.in_transaction():
            conn.commit()
        else:
            raw.commit()
    except sqlite3.Error as exc:
        with contextlib.suppress(sqlite3.Error):
            raw.rollback()
        raise _wrapped("COMMIT", exc) from exc


def _wrapped(sql: str, exc: sqlite3.Error) -> sa_exc.StatementError:
    """A driver's error as SQLAlchemy would have raised it (:func:`engines.map_error` sorts
    those)."""
    return sa_exc.DBAPIError.instance(sql, None, exc, sqlite3.Error)
