"""The index: SQLAlchemy Core tables and small functions that take a Connection.

No file access here. The same code runs on SQLite (embedded: WAL, busy_timeout, and
``BEGIN IMMEDIATE`` so concurrent writers queue instead of failing) and on PostgreSQL
(psycopg 3). All times are naive UTC datetimes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
import os
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import postgresql, sqlite

from pipeline import errors

STATUSES = ("pending", "new", "refined", "error", "archived")

metadata = sa.MetaData()
_BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

raw_files = sa.Table(
    "raw_files",
    metadata,
    sa.Column("file_id", sa.String(36), primary_key=True),
    sa.Column("path", sa.Text, nullable=False),
    sa.Column("source_type", sa.String(16), nullable=False),
    sa.Column("agent_id", sa.String(64), nullable=False),
    sa.Column("session_key", sa.Text, nullable=False),
    sa.Column("metadata_json", sa.Text, nullable=False, server_default="{}"),
    sa.Column("started_at", sa.DateTime, nullable=False),
    sa.Column("ended_at", sa.DateTime),
    # pending (acknowledged, not yet on disk) | new | refined | error | archived
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("next_seq", sa.Integer, nullable=False, server_default="1"),
    sa.Column("flushed_seq", sa.Integer, nullable=False, server_default="0"),
    sa.Column("flushed_bytes", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("chain_head", sa.String(64)),
    sa.Column("flush_pending", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("flushed_at", sa.DateTime),
    sa.Column("last_refined_seq", sa.Integer, nullable=False, server_default="0"),
    sa.Column("refined_at", sa.DateTime),
    sa.Column("refine_epoch", sa.Integer, nullable=False, server_default="0"),
    sa.Column("refine_lease_until", sa.DateTime),
    sa.Column("archived_at", sa.DateTime),
    sa.Column("created_at", sa.DateTime, nullable=False),
    sa.Column("updated_at", sa.DateTime, nullable=False),
    sa.UniqueConstraint("agent_id", "source_type", "session_key", name="uq_raw_files_session"),
)
sa.Index("ix_raw_files_status", raw_files.c.status)
sa.Index("ix_raw_files_agent", raw_files.c.agent_id, raw_files.c.file_id)

append_journal = sa.Table(
    "append_journal",
    metadata,
    sa.Column("id", _BigId, primary_key=True, autoincrement=True),
    sa.Column("file_id", sa.String(36), sa.ForeignKey("raw_files.file_id"), nullable=False),
    sa.Column("first_seq", sa.Integer, nullable=False),
    sa.Column("last_seq", sa.Integer, nullable=False),
    sa.Column("last_ts", sa.String(40), nullable=False),
    sa.Column("data", sa.Text, nullable=False),
    sa.Column("created_at", sa.DateTime, nullable=False),
    sa.UniqueConstraint("file_id", "first_seq", name="uq_append_journal_seq"),
)
sa.Index("ix_append_journal_created", append_journal.c.created_at)

append_keys = sa.Table(
    "append_keys",
    metadata,
    sa.Column("agent_id", sa.String(64), primary_key=True),
    sa.Column("idempotency_key", sa.String(200), primary_key=True),
    sa.Column("request_hash", sa.String(64), nullable=False),
    sa.Column("response_json", sa.Text, nullable=False),
    sa.Column("created_at", sa.DateTime, nullable=False),
)

anomalies = sa.Table(
    "anomalies",
    metadata,
    sa.Column("id", _BigId, primary_key=True, autoincrement=True),
    sa.Column("file_id", sa.String(36)),
    sa.Column("kind", sa.String(40), nullable=False),
    sa.Column("detail", sa.Text, nullable=False),
    sa.Column("created_at", sa.DateTime, nullable=False),
)
sa.Index("ix_anomalies_file", anomalies.c.file_id)
sa.Index("ix_anomalies_kind", anomalies.c.kind)

l1_items = sa.Table(
    "l1_items",
    metadata,
    sa.Column("id", _BigId, primary_key=True, autoincrement=True),
    sa.Column("file_id", sa.String(36), sa.ForeignKey("raw_files.file_id"), nullable=False),
    sa.Column("agent_id", sa.String(64), nullable=False),
    sa.Column("kind", sa.String(40), nullable=False),
    sa.Column("content", sa.Text, nullable=False),
    sa.Column("source_refs", sa.Text, nullable=False),  # JSON list of "file_id:seq"
    sa.Column("refiner", sa.String(64), nullable=False),
    sa.Column("segment_lo", sa.Integer, nullable=False),  # the segment is lo < seq <= hi
    sa.Column("segment_hi", sa.Integer, nullable=False),
    # sha256 of (kind, content, source_refs): a retried or duplicated job stores nothing twice
    sa.Column("item_hash", sa.String(64), nullable=False),
    sa.Column("created_at", sa.DateTime, nullable=False),
    sa.UniqueConstraint("file_id", "item_hash", name="uq_l1_items_hash"),
)
sa.Index("ix_l1_items_agent", l1_items.c.agent_id, l1_items.c.id)


def utcnow() -> dt.datetime:
    """Now, as the naive UTC datetime the index stores."""
    return dt.datetime.now(dt.UTC).replace(tzinfo=None)


@dataclasses.dataclass(frozen=True)
class FileRow:
    """One row of ``raw_files``."""

    file_id: str
    path: str
    source_type: str
    agent_id: str
    session_key: str
    metadata_json: str
    started_at: dt.datetime
    ended_at: dt.datetime | None
    status: str
    next_seq: int
    flushed_seq: int
    flushed_bytes: int
    chain_head: str | None
    flush_pending: bool
    flushed_at: dt.datetime | None
    last_refined_seq: int
    refined_at: dt.datetime | None
    refine_epoch: int
    refine_lease_until: dt.datetime | None
    archived_at: dt.datetime | None
    created_at: dt.datetime
    updated_at: dt.datetime

    @classmethod
    def from_row(cls, row: sa.Row[Any]) -> FileRow:
        """Build from a ``raw_files`` result row."""
        return cls(**row._asdict())

    @property
    def metadata(self) -> dict[str, Any]:
        """The metadata the creating append sent."""
        value = json.loads(self.metadata_json)
        assert isinstance(value, dict)
        return value

    def to_json(self) -> dict[str, Any]:
        """The row as the API shows it."""
        data = dataclasses.asdict(self)
        data.pop("metadata_json")
        data["metadata"] = self.metadata
        data["message_count"] = self.flushed_seq
        data["pending_messages"] = self.next_seq - 1 - self.flushed_seq
        for key, value in data.items():
            if isinstance(value, dt.datetime):
                data[key] = value.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        return data


@dataclasses.dataclass(frozen=True)
class JournalRow:
    """One acknowledged append not yet in its file."""

    id: int
    file_id: str
    first_seq: int
    last_seq: int
    last_ts: str
    data: str
    created_at: dt.datetime

    @classmethod
    def from_row(cls, row: sa.Row[Any]) -> JournalRow:
        """Build from an ``append_journal`` result row."""
        return cls(**row._asdict())


# ---------------------------------------------------------------------------------------------
# engines and transactions


def normalize_url(url: str) -> str:
    """Use psycopg 3 for plain ``postgresql://`` URLs."""
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


def create_engine(url: str, *, busy_timeout: float = 30.0) -> sa.Engine:
    """An engine for ``url``; SQLite gets WAL, a busy timeout and ``BEGIN IMMEDIATE``."""
    url = normalize_url(url)
    if not url.startswith("sqlite"):
        return sa.create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)
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
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @sa.event.listens_for(engine, "begin")
    def _on_begin(conn: sa.Connection) -> None:
        # A deferred transaction that reads and then writes fails with SQLITE_BUSY when another
        # writer committed in between; taking the write lock up front makes writers queue.
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def is_postgres(conn_or_engine: sa.Connection | sa.Engine) -> bool:
    """True on PostgreSQL."""
    return conn_or_engine.dialect.name == "postgresql"


class ConstraintViolation(errors.Conflict):
    """A unique or foreign key constraint refused a write (often a concurrent writer won)."""


def _map_db_error(exc: sa_exc.SQLAlchemyError) -> errors.SgmeError:
    if isinstance(exc, sa_exc.IntegrityError):
        return ConstraintViolation(f"index constraint violated: {exc.orig}")
    return errors.IndexUnavailable(f"index database error: {getattr(exc, 'orig', exc)}")


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
        raise _map_db_error(exc) from exc
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
        raise _map_db_error(exc) from exc
    try:
        yield
    finally:
        try:
            conn.execute(sa.text("SELECT pg_advisory_unlock(hashtext(:k))"), {"k": key})
            conn.commit()
        except sa_exc.SQLAlchemyError:
            conn.invalidate()  # closing the session releases the lock anyway
        conn.close()


def migrate(engine: sa.Engine) -> None:
    """Bring the schema to the newest Alembic revision."""
    from alembic import command
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", "pipeline:migrations")
    try:
        with engine.begin() as conn:
            config.attributes["connection"] = conn
            command.upgrade(config, "head")
    except sa_exc.SQLAlchemyError as exc:
        raise _map_db_error(exc) from exc


# ---------------------------------------------------------------------------------------------
# raw_files


def _insert(conn: sa.Connection, table: sa.Table) -> Any:
    return (postgresql.insert if is_postgres(conn) else sqlite.insert)(table)


# The statements on the append path are built once: building a SQLAlchemy statement costs
# several times more than executing a cached one (bench/bench_append.py).
_GET_FILE = sa.select(raw_files).where(raw_files.c.file_id == sa.bindparam("file_id"))
_GET_FILE_FOR_UPDATE = _GET_FILE.with_for_update()
_FIND_FILE = sa.select(raw_files).where(
    raw_files.c.agent_id == sa.bindparam("agent_id"),
    raw_files.c.source_type == sa.bindparam("source_type"),
    raw_files.c.session_key == sa.bindparam("session_key"),
)
_FIND_FILE_FOR_UPDATE = _FIND_FILE.with_for_update()
_UPDATE_FILE: dict[tuple[str, ...], sa.Update] = {}  #: update_file's statements by column set


def get_file(conn: sa.Connection, file_id: str, *, for_update: bool = False) -> FileRow | None:
    """The row of ``file_id``, or None."""
    query = _GET_FILE_FOR_UPDATE if for_update else _GET_FILE
    row = conn.execute(query, {"file_id": file_id}).first()
    return FileRow.from_row(row) if row else None


def find_file(
    conn: sa.Connection, agent_id: str, source_type: str, session_key: str, *, for_update: bool
) -> FileRow | None:
    """The file of one session, or None."""
    query = _FIND_FILE_FOR_UPDATE if for_update else _FIND_FILE
    params = {"agent_id": agent_id, "source_type": source_type, "session_key": session_key}
    row = conn.execute(query, params).first()
    return FileRow.from_row(row) if row else None


def insert_file(conn: sa.Connection, **values: Any) -> bool:
    """Insert a row unless its session already has one; True when inserted."""
    now = utcnow()
    values.setdefault("created_at", now)
    values.setdefault("updated_at", now)
    stmt = _insert(conn, raw_files).values(**values).on_conflict_do_nothing()
    return bool(conn.execute(stmt).rowcount)


def update_file(conn: sa.Connection, file_id: str, *where: Any, **values: Any) -> int:
    """Update one row if the extra ``where`` clauses hold; returns the rowcount (0 or 1)."""
    values.setdefault("updated_at", utcnow())
    columns = raw_files.c
    if where or any(k not in columns or isinstance(v, sa.ClauseElement) for k, v in values.items()):
        stmt = sa.update(raw_files).where(columns.file_id == file_id, *where).values(**values)
        return int(conn.execute(stmt).rowcount)
    keys = tuple(sorted(values))
    cached = _UPDATE_FILE.get(keys)
    if cached is None:
        cached = _UPDATE_FILE[keys] = (
            sa.update(raw_files)
            .where(columns.file_id == sa.bindparam("where_file_id"))
            .values({k: sa.bindparam(f"set_{k}", type_=columns[k].type) for k in keys})
        )
    params = {f"set_{k}": v for k, v in values.items()}
    params["where_file_id"] = file_id
    return int(conn.execute(cached, params).rowcount)


_START_FLUSH = (
    sa.update(raw_files)
    .where(raw_files.c.file_id == sa.bindparam("where_file_id"))
    .values(
        flush_pending=False,
        updated_at=sa.bindparam("set_updated_at", type_=raw_files.c.updated_at.type),
    )
    .returning(*raw_files.c)
)


def start_flush(conn: sa.Connection, file_id: str) -> FileRow | None:
    """Clear the file's flush-pending flag and return its row (None when there is no row)."""
    row = conn.execute(_START_FLUSH, {"where_file_id": file_id, "set_updated_at": utcnow()})
    found = row.first()
    return FileRow.from_row(found) if found else None


_ENDED_AT = sa.bindparam("set_ended_at", type_=raw_files.c.ended_at.type)
_ADVANCE_FLUSHED = (
    sa.update(raw_files)
    .where(
        raw_files.c.file_id == sa.bindparam("where_file_id"),
        raw_files.c.flushed_seq == sa.bindparam("where_flushed_seq"),
    )
    .values(
        flushed_seq=sa.bindparam("set_flushed_seq", type_=raw_files.c.flushed_seq.type),
        flushed_bytes=sa.bindparam("set_flushed_bytes", type_=raw_files.c.flushed_bytes.type),
        chain_head=sa.bindparam("set_chain_head", type_=raw_files.c.chain_head.type),
        status=sa.case((raw_files.c.status == "archived", "archived"), else_="new"),
        # The latest message time seen; an append may carry older timestamps than the last.
        ended_at=sa.case(
            (
                sa.or_(raw_files.c.ended_at.is_(None), raw_files.c.ended_at < _ENDED_AT),
                _ENDED_AT,
            ),
            else_=raw_files.c.ended_at,
        ),
        flushed_at=sa.bindparam("set_flushed_at", type_=raw_files.c.flushed_at.type),
        updated_at=sa.bindparam("set_updated_at", type_=raw_files.c.updated_at.type),
    )
)


def advance_flushed(
    conn: sa.Connection,
    file_id: str,
    *,
    old_seq: int,
    flushed_seq: int,
    flushed_bytes: int,
    chain_head: str,
    ended_at: dt.datetime,
) -> int:
    """Record a flush, if nobody advanced ``flushed_seq`` past ``old_seq`` meanwhile; the
    status becomes ``new`` (an archived file stays ``archived``). Returns the rowcount."""
    now = utcnow()
    params = {
        "where_file_id": file_id,
        "where_flushed_seq": old_seq,
        "set_flushed_seq": flushed_seq,
        "set_flushed_bytes": flushed_bytes,
        "set_chain_head": chain_head,
        "set_ended_at": ended_at,
        "set_flushed_at": now,
        "set_updated_at": now,
    }
    return int(conn.execute(_ADVANCE_FLUSHED, params).rowcount)


def list_files(
    conn: sa.Connection,
    *,
    agent_id: str | None = None,
    status: str | None = None,
    source_type: str | None = None,
    after: str | None = None,
    limit: int = 100,
) -> list[FileRow]:
    """Rows ordered by file_id, starting after the cursor ``after``."""
    query = sa.select(raw_files).order_by(raw_files.c.file_id).limit(limit)
    if agent_id is not None:
        query = query.where(raw_files.c.agent_id == agent_id)
    if status is not None:
        query = query.where(raw_files.c.status == status)
    if source_type is not None:
        query = query.where(raw_files.c.source_type == source_type)
    if after is not None:
        query = query.where(raw_files.c.file_id > after)
    return [FileRow.from_row(row) for row in conn.execute(query)]


def count_files_by_status(conn: sa.Connection) -> dict[str, int]:
    """``{status: count}``."""
    query = sa.select(raw_files.c.status, sa.func.count()).group_by(raw_files.c.status)
    return {status: int(count) for status, count in conn.execute(query)}


# ---------------------------------------------------------------------------------------------
# append_journal and append_keys


_INSERT_JOURNAL = sa.insert(append_journal)
_JOURNAL_AFTER = (
    sa.select(append_journal)
    .where(
        append_journal.c.file_id == sa.bindparam("file_id"),
        append_journal.c.first_seq > sa.bindparam("seq"),
    )
    .order_by(append_journal.c.first_seq)
)
_DELETE_JOURNAL = sa.delete(append_journal).where(
    append_journal.c.file_id == sa.bindparam("file_id"),
    append_journal.c.last_seq <= sa.bindparam("seq"),
)


def add_journal(conn: sa.Connection, **values: Any) -> None:
    """Record one acknowledged append."""
    values.setdefault("created_at", utcnow())
    conn.execute(_INSERT_JOURNAL, values)


def journal_after(conn: sa.Connection, file_id: str, seq: int) -> list[JournalRow]:
    """Journal rows of ``file_id`` past ``seq``, in seq order."""
    rows = conn.execute(_JOURNAL_AFTER, {"file_id": file_id, "seq": seq})
    return [JournalRow.from_row(row) for row in rows]


def delete_journal(conn: sa.Connection, file_id: str, upto_seq: int) -> None:
    """Drop the journal rows a flush applied."""
    conn.execute(_DELETE_JOURNAL, {"file_id": file_id, "seq": upto_seq})


def stale_journal_files(conn: sa.Connection, older_than: dt.datetime | None) -> list[str]:
    """Files with journal rows created before ``older_than`` (all of them for None)."""
    query = sa.select(append_journal.c.file_id).group_by(append_journal.c.file_id)
    if older_than is not None:
        query = query.where(append_journal.c.created_at < older_than)
    return [row[0] for row in conn.execute(query)]


def journal_backlog(conn: sa.Connection) -> tuple[int, int]:
    """``(rows, messages)`` waiting in the journal."""
    query = sa.select(
        sa.func.count(),
        sa.func.coalesce(
            sa.func.sum(append_journal.c.last_seq - append_journal.c.first_seq + 1), 0
        ),
    )
    rows, messages = conn.execute(query).one()
    return int(rows), int(messages)


def get_key(conn: sa.Connection, agent_id: str, key: str) -> tuple[str, dict[str, Any]] | None:
    """``(request_hash, response)`` recorded for an idempotency key, or None."""
    row = conn.execute(
        sa.select(append_keys.c.request_hash, append_keys.c.response_json).where(
            append_keys.c.agent_id == agent_id, append_keys.c.idempotency_key == key
        )
    ).first()
    return (row[0], json.loads(row[1])) if row else None


def put_key(
    conn: sa.Connection, agent_id: str, key: str, request_hash: str, response: dict[str, Any]
) -> None:
    """Remember the answer given for an idempotency key."""
    conn.execute(
        sa.insert(append_keys).values(
            agent_id=agent_id,
            idempotency_key=key,
            request_hash=request_hash,
            response_json=json.dumps(response),
            created_at=utcnow(),
        )
    )


# ---------------------------------------------------------------------------------------------
# anomalies


@dataclasses.dataclass(frozen=True)
class Anomaly:
    """Something that went wrong with a file, kept for operators (``anomaly_warn``)."""

    id: int
    file_id: str | None
    kind: str
    detail: str
    created_at: dt.datetime

    @classmethod
    def from_row(cls, row: sa.Row[Any]) -> Anomaly:
        """Build from an ``anomalies`` result row."""
        return cls(**row._asdict())


def record_anomaly(conn: sa.Connection, file_id: str | None, kind: str, detail: str) -> None:
    """Write one anomaly record."""
    conn.execute(
        sa.insert(anomalies).values(file_id=file_id, kind=kind, detail=detail, created_at=utcnow())
    )


def list_anomalies(
    conn: sa.Connection, *, file_id: str | None = None, kinds: Sequence[str] | None = None
) -> list[Anomaly]:
    """Anomalies, oldest first."""
    query = sa.select(anomalies).order_by(anomalies.c.id)
    if file_id is not None:
        query = query.where(anomalies.c.file_id == file_id)
    if kinds:
        query = query.where(anomalies.c.kind.in_(list(kinds)))
    return [Anomaly.from_row(row) for row in conn.execute(query)]


def count_anomalies_by_kind(conn: sa.Connection) -> dict[str, int]:
    """``{kind: count}``."""
    query = sa.select(anomalies.c.kind, sa.func.count()).group_by(anomalies.c.kind)
    return {kind: int(count) for kind, count in conn.execute(query)}


# ---------------------------------------------------------------------------------------------
# l1_items


@dataclasses.dataclass(frozen=True)
class L1Item:
    """One stored L1 item."""

    id: int
    file_id: str
    agent_id: str
    kind: str
    content: str
    source_refs: str
    refiner: str
    segment_lo: int
    segment_hi: int
    item_hash: str
    created_at: dt.datetime

    @classmethod
    def from_row(cls, row: sa.Row[Any]) -> L1Item:
        """Build from an ``l1_items`` result row."""
        return cls(**row._asdict())

    def to_json(self) -> dict[str, Any]:
        """The item as the API shows it."""
        return {
            "id": self.id,
            "file_id": self.file_id,
            "agent_id": self.agent_id,
            "kind": self.kind,
            "content": self.content,
            "source_refs": json.loads(self.source_refs),
            "refiner": self.refiner,
            "segment": {"lo": self.segment_lo, "hi": self.segment_hi},
            "created_at": self.created_at.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        }


def add_l1_items(conn: sa.Connection, items: Sequence[dict[str, Any]]) -> None:
    """Insert items, skipping any the file already has (same ``item_hash``)."""
    if not items:
        return
    now = utcnow()
    stmt = _insert(conn, l1_items).on_conflict_do_nothing(index_elements=["file_id", "item_hash"])
    conn.execute(stmt, [{**item, "created_at": now} for item in items])


def delete_l1_items(conn: sa.Connection, file_id: str) -> None:
    """Drop a file's items (before a full re-refine)."""
    conn.execute(sa.delete(l1_items).where(l1_items.c.file_id == file_id))


def list_l1_items(
    conn: sa.Connection,
    *,
    file_id: str | None = None,
    agent_id: str | None = None,
    after: int = 0,
    limit: int = 100,
) -> list[L1Item]:
    """Items in insertion order, after the id ``after``."""
    query = sa.select(l1_items).where(l1_items.c.id > after).order_by(l1_items.c.id).limit(limit)
    if file_id is not None:
        query = query.where(l1_items.c.file_id == file_id)
    if agent_id is not None:
        query = query.where(l1_items.c.agent_id == agent_id)
    return [L1Item.from_row(row) for row in conn.execute(query)]


def refinement_lag(conn: sa.Connection) -> tuple[int, int]:
    """``(sum, max)`` of ``flushed_seq - last_refined_seq`` over files that can be refined."""
    lag = raw_files.c.flushed_seq - raw_files.c.last_refined_seq
    query = sa.select(sa.func.coalesce(sa.func.sum(lag), 0), sa.func.coalesce(sa.func.max(lag), 0))
    total, worst = conn.execute(query.where(raw_files.c.status != "archived")).one()
    return int(total), int(worst)
