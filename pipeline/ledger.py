"""The ledger of appends, as named queries that take a Connection: journal rows (acknowledged,
not yet in their files: :mod:`pipeline.ingest` adds them, :mod:`pipeline.flush` applies them),
idempotency records (the answer each key got: the rule is :mod:`pipeline.idempotency`'s) and
waiting appends (queued ones held until their predecessor lands: :mod:`pipeline.ordering`)."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Collection, Sequence
from typing import Any, NamedTuple

import sqlalchemy as sa

from pipeline import database, tables

_J = tables.append_journal.c
_INSERT_JOURNAL = database.Prepared(
    sa.insert(tables.append_journal).values(database.binds(tables.append_journal))
)
#: the rows of one file after a seq, in seq order, as long as the bytes before each row stay
#: under a budget (so at least one row): a running sum over the ``size`` column
_RUNNING = (
    sa.select(
        tables.append_journal,
        sa.func.sum(_J.size).over(order_by=_J.first_seq).label("running"),
    )
    .where(
        _J.file_id == sa.bindparam("file_id"),
        _J.first_seq > sa.bindparam("seq"),
        _J.last_seq <= sa.bindparam("upto"),
    )
    .subquery()
)
_JOURNAL_BATCH = database.Prepared(
    sa.select(*(_RUNNING.c[c.name] for c in tables.append_journal.columns))
    .where(_RUNNING.c.running - _RUNNING.c.size < sa.bindparam("budget"))
    .order_by(_RUNNING.c.first_seq)
)
_DELETE_JOURNAL = database.Prepared(
    sa.delete(tables.append_journal).where(
        _J.file_id == sa.bindparam("file_id"), _J.last_seq <= sa.bindparam("seq")
    )
)


def add_journal(conn: sa.Connection, **values: Any) -> None:
    """Record one acknowledged append (``size`` is the UTF-8 length of its ``data``;
    ``created_at`` when it was acknowledged)."""
    _INSERT_JOURNAL.execute(conn, values)


def journal_batch(
    conn: sa.Connection, file_id: str, seq: int, budget: int, *, upto: int = 2**31 - 1
) -> list[tables.JournalRow]:
    """Journal rows of ``file_id`` with ``seq < seq <= upto``, in seq order, about ``budget``
    bytes of them (the first row whatever its size; then rows while the bytes before them
    are under it)."""
    params = {"file_id": file_id, "seq": seq, "budget": budget, "upto": upto}
    return [tables.JournalRow.of(row) for row in _JOURNAL_BATCH.rows(conn, params)]


def journal_after(conn: sa.Connection, file_id: str, seq: int) -> list[tables.JournalRow]:
    """Every journal row of ``file_id`` past ``seq``, in seq order."""
    return journal_batch(conn, file_id, seq, 2**62)


def delete_journals(conn: sa.Connection, upto: Sequence[tuple[str, int]]) -> None:
    """Drop the journal rows flushes applied: each file's (``(file_id, upto_seq)``) up to its
    seq, a round's files in one driver call."""
    if upto:
        _DELETE_JOURNAL.many(conn, [{"file_id": f, "seq": seq} for f, seq in upto])


#: each file's first journal row: the oldest it has waiting (its seqs were given in the order
#: of the acknowledgements; ``created_at`` is taken as an append starts, so one that raced
#: another of its session for the row lock can be younger than the next by that moment)
_FIRST = (
    sa.select(_J.file_id, sa.func.min(_J.first_seq).label("first_seq"))
    .group_by(_J.file_id)
    .subquery()
)


def stale_journal_files(conn: sa.Connection, older_than: dt.datetime | None) -> list[str]:
    """Files whose first journal row was created at or before ``older_than`` (every file with
    journal rows for None). Found through the ``(file_id, first_seq)`` key: no index of the
    creation times, which every acknowledgement would write a page of."""
    if older_than is None:
        return [row[0] for row in conn.execute(sa.select(_FIRST.c.file_id))]
    query = (
        sa.select(_J.file_id)
        .join(_FIRST, sa.and_(_J.file_id == _FIRST.c.file_id, _J.first_seq == _FIRST.c.first_seq))
        .where(_J.created_at <= older_than)
    )
    return [row[0] for row in conn.execute(query)]


def journal_backlog(
    conn: sa.Connection, *, agents: Collection[str] | None = None
) -> tuple[int, int, int]:
    """``(rows, messages, bytes)`` waiting in the journal (of ``agents``' files only, when
    given)."""
    query = sa.select(
        sa.func.count(),
        sa.func.coalesce(sa.func.sum(_J.last_seq - _J.first_seq + 1), 0),
        sa.func.coalesce(sa.func.sum(_J.size), 0),
    )
    if agents is not None:
        files = sa.select(tables.raw_files.c.file_id).where(
            tables.raw_files.c.agent_id.in_(sorted(agents))
        )
        query = query.where(_J.file_id.in_(files))
    rows, messages, size = conn.execute(query).one()
    return int(rows), int(messages), int(size)


_K = tables.append_keys.c
_GET_KEY = database.Prepared(
    sa.select(_K.request_hash, _K.response_json).where(
        _K.agent_id == sa.bindparam("agent_id"), _K.idempotency_key == sa.bindparam("key")
    )
)


def get_key(conn: sa.Connection, agent_id: str, key: str) -> tuple[str, dict[str, Any]] | None:
    """``(request_hash, response)`` recorded for an idempotency key, or None."""
    row = _GET_KEY.first(conn, {"agent_id": agent_id, "key": key})
    return (row["request_hash"], json.loads(row["response_json"])) if row else None


_PUT_KEY: dict[str, database.Prepared] = {}  #: per dialect: the insert differs


def put_key(
    conn: sa.Connection,
    agent_id: str,
    key: str,
    request_hash: str,
    response: dict[str, Any],
    *,
    now: dt.datetime,
) -> bool:
    """Remember the answer given for an idempotency key; False when a concurrent request
    holding the same key got there first (its transaction committed meanwhile)."""
    stmt = _PUT_KEY.get(conn.dialect.name)
    if stmt is None:
        stmt = _PUT_KEY[conn.dialect.name] = database.Prepared(
            database.insert(conn, tables.append_keys)
            .values(database.binds(tables.append_keys))
            .on_conflict_do_nothing()
            .returning(_K.agent_id)
        )
    params = {
        "agent_id": agent_id,
        "idempotency_key": key,
        "request_hash": request_hash,
        "response_json": json.dumps(response),
        "created_at": now,
    }
    return stmt.first(conn, params) is not None


class Session(NamedTuple):
    """What names a session: one file once it has appends."""

    agent_id: str
    source_type: str
    session_key: str


_W = tables.waiting_appends.c
_OF_SESSION = (
    _W.agent_id == sa.bindparam("agent_id"),
    _W.source_type == sa.bindparam("source_type"),
    _W.session_key == sa.bindparam("session_key"),
)
_INSERT_WAITING = database.Prepared(
    sa.insert(tables.waiting_appends).values(database.binds(tables.waiting_appends))
)
_GET_WAITING = database.Prepared(
    sa.select(tables.waiting_appends).where(*_OF_SESSION, _W.sequence == sa.bindparam("sequence"))
)
_FIRST_WAITING = database.Prepared(
    sa.select(tables.waiting_appends).where(*_OF_SESSION).order_by(_W.sequence).limit(1)
)
_OLDEST_WAITING = database.Prepared(
    sa.select(sa.func.min(_W.received_at).label("received_at")).where(*_OF_SESSION)
)
_DELETE_WAITING = database.Prepared(
    sa.delete(tables.waiting_appends).where(*_OF_SESSION, _W.sequence == sa.bindparam("sequence"))
)


def hold(conn: sa.Connection, session: Session, **values: Any) -> None:
    """Keep a queued append until its predecessor lands (``values``: sequence, idempotency_key,
    request_hash, append_json, size, received_at)."""
    _INSERT_WAITING.execute(conn, {**session._asdict(), **values})


def waiting(conn: sa.Connection, session: Session, sequence: int) -> tables.WaitingRow | None:
    """The append of ``session`` waiting with ``sequence``, or None."""
    row = _GET_WAITING.first(conn, {**session._asdict(), "sequence": sequence})
    return tables.WaitingRow.of(row) if row else None


def first_waiting(conn: sa.Connection, session: Session) -> tables.WaitingRow | None:
    """The waiting append of ``session`` with the lowest sequence, or None."""
    row = _FIRST_WAITING.first(conn, session._asdict())
    return tables.WaitingRow.of(row) if row else None


def oldest_waiting(conn: sa.Connection, session: Session) -> dt.datetime | None:
    """When the longest-waiting append of ``session`` arrived (None: nothing waits)."""
    row = _OLDEST_WAITING.first(conn, session._asdict())
    return None if row is None else row["received_at"]


def release(conn: sa.Connection, session: Session, sequence: int) -> None:
    """Forget a waiting append (applied, or dropped)."""
    _DELETE_WAITING.execute(conn, {**session._asdict(), "sequence": sequence})


def waiting_sessions(conn: sa.Connection, older_than: dt.datetime | None) -> list[Session]:
    """Sessions with an append that has waited since ``older_than`` or before (every session
    with one for None)."""
    query = sa.select(_W.agent_id, _W.source_type, _W.session_key).group_by(
        _W.agent_id, _W.source_type, _W.session_key
    )
    if older_than is not None:
        query = query.where(_W.received_at <= older_than)
    return [Session(*row) for row in conn.execute(query)]


def waiting_backlog(
    conn: sa.Connection, *, agents: Collection[str] | None = None
) -> tuple[int, int]:
    """``(appends, bytes)`` waiting for their predecessors (of ``agents`` only, when given)."""
    query = sa.select(sa.func.count(), sa.func.coalesce(sa.func.sum(_W.size), 0))
    if agents is not None:
        query = query.where(_W.agent_id.in_(sorted(agents)))
    appends, size = conn.execute(query).one()
    return int(appends), int(size)
