"""Appends in batches (docs/design.md §3, appends over HTTP): the appends that arrived together,
applied with a few statements for all of them.

On SQLite the group committer's transaction holds the database's one write lock, and every
statement lets go of the GIL and must win it back, behind the threads that read and answer
requests: an append made its five or six driver calls (a savepoint, the session's row, the
journal row, the row's update, the release) each with a wait of its own under the lock. Here
the *plain* appends of a batch — no ``sequence``, no ``idempotency_key``, to a session that
has no other append in the batch — share them: their sessions' rows in one ``SELECT``, their
journal rows in one multi-row ``INSERT``, the rows' ``next_seq`` in one ``UPDATE``. Everything
an append is refused for (a session that numbers its appends, a full backlog of its file) is
decided from the row in Python, before anything is written, and refuses that append alone; an
append to a session with no file yet goes through :func:`ingest.apply_append` in a savepoint of
its own (it creates the row) and the session's next appends follow it in the batch.

The other appends run as before, one piece of work each, in the same group and its one durable
commit. A batch whose statements failed as a whole (a bug, a full disk) is run again one
append at a time, so an append fails alone, as it would have.

On PostgreSQL each statement is a round trip: an append alone made three (its row, the journal
row, the row's update), most of the API's CPU under load. The batch makes three for all, and
takes its rows' locks (``FOR NO KEY UPDATE``, as an append alone does) in file order, in one
statement (a batch of more than :attr:`database.Sized.MAX_ROWS` sessions, more than the API
ever puts in one, in file order within each of its statements), at the place of its first
known file in the group's order (docs/design.md §3, "Lock order"). A session whose file is not
known yet may lock out of that order, as an append alone of such a session does; a deadlock
then costs the group a second run.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, cast

import sqlalchemy as sa

from pipeline import backlog, database, errors, index, ingest, ordering, tables, validation
from pipeline.database.commits import in_savepoint
from pipeline.ledger import Session
from pipeline.settings import Backlog

_R = tables.raw_files.c


class _Row(NamedTuple):
    """What a batch reads of a session's row: not the whole row, whose eight times are eight
    strings to parse."""

    file_id: str
    agent_id: str
    source_type: str
    session_key: str
    status: str
    next_seq: int
    flushed_seq: int
    flush_pending: bool
    next_sequence: int | None


def append_many(
    db: database.Database,
    bodies: list[validation.Append],
    *,
    limits: Backlog | None = None,
    keys: Sequence[str | None] | None = None,
) -> list[ingest.AppendResult | BaseException]:
    """:func:`ingest.append` for several appends at once: each committed in one shared
    transaction or refused alone; each one's result or error, in order. ``keys``: each
    one's session's file where it is known (:class:`ingest.KnownFiles`), for the order in
    which PostgreSQL's row locks are taken (SQLite takes none)."""
    now = db.now()
    plain = _plain(bodies)
    if len(plain) < 2:
        return _one_by_one(db, bodies, limits=limits, now=now, keys=keys)
    taken = set(plain)
    rest = [i for i in range(len(bodies)) if i not in taken]
    batch = functools.partial(
        apply_batch, appends=[bodies[i] for i in plain], limits=limits, now=now
    )
    works: list[Callable[[sa.Connection], object]] = [batch]
    works += [_single(bodies[i], limits, now) for i in rest]
    keyed = [None] * len(bodies) if keys is None else keys
    first = min((k for k in (keyed[i] for i in plain) if k is not None), default=None)
    done = db.group.run_many(works, keys=[first, *(keyed[i] for i in rest)])
    together: Sequence[object]
    if isinstance(done[0], errors.IndexUnavailable):  # the group failed: so does each
        together = [done[0]] * len(plain)
    elif isinstance(done[0], BaseException):  # the batch alone: run its appends one by one
        together = _one_by_one(db, [bodies[i] for i in plain], limits=limits, now=now)
    else:
        together = cast(list[object], done[0])
    outcomes = dict(zip([*plain, *rest], [*together, *done[1:]], strict=True))
    return [outcomes[i] for i in range(len(bodies))]


def _one_by_one(
    db: database.Database,
    bodies: list[validation.Append],
    *,
    limits: Backlog | None,
    now: dt.datetime,
    keys: Sequence[str | None] | None = None,
) -> list[ingest.AppendResult | BaseException]:
    """Each append a piece of work of its own, in one group."""
    works = [_single(body, limits, now) for body in bodies]
    return db.group.run_many(works, keys=keys)  # type: ignore[arg-type]  # never Held


def _single(
    body: validation.Append, limits: Backlog | None, now: dt.datetime
) -> Callable[[sa.Connection], object]:
    return functools.partial(ingest.apply_append, append=body, limits=limits, now=now)


def _plain(bodies: Sequence[validation.Append]) -> list[int]:
    """The indexes of the appends the batch may take: without a sequence or an idempotency
    key, to a session no other kind of append in ``bodies`` goes to (so that the appends of
    one session are applied in their order)."""
    mixed = {
        ordering.session_of(body)
        for body in bodies
        if body.sequence is not None or body.idempotency_key is not None
    }
    return [
        i
        for i, body in enumerate(bodies)
        if body.sequence is None
        and body.idempotency_key is None
        and ordering.session_of(body) not in mixed
    ]


def apply_batch(
    conn: sa.Connection,
    *,
    appends: Sequence[validation.Append],
    limits: Backlog | None,
    now: dt.datetime,
) -> list[ingest.AppendResult | errors.SgmeError]:
    """The plain appends of a batch, inside the caller's transaction; each one's result or
    the error that refused it, in order."""
    rows = find_sessions(conn, {ordering.session_of(append) for append in appends})
    journal: list[dict[str, object]] = []
    moved: dict[str, int] = {}  #: file_id -> its next_seq after the batch
    results: list[ingest.AppendResult | errors.SgmeError] = []
    for i, append in enumerate(appends):
        session = ordering.session_of(append)
        row = rows.get(session)
        if row is None or row.next_seq == 1:  # its first append: the one-append path
            results.append(_new_session(conn, f"b{i}", append, limits, now))
            rows.update(find_sessions(conn, {session}))
            continue
        try:
            ordering.check_unsequenced(conn, row, session)
            first = row.next_seq
            if limits is not None:
                backlog.check_file(first - 1 - row.flushed_seq, len(append.messages), limits)
        except errors.SgmeError as exc:
            results.append(exc)
            continue
        last = first + len(append.messages) - 1
        journal.append(ingest.journal_values(row.file_id, append, first, now))
        results.append(ingest.result_of(row, first, last))
        rows[session] = row._replace(next_seq=last + 1, flush_pending=True)
        moved[row.file_id] = last + 1
    _INSERT_JOURNAL.execute(conn, journal)
    index.record_appends(conn, moved, now=now)
    return results


def _new_session(
    conn: sa.Connection,
    name: str,
    append: validation.Append,
    limits: Backlog | None,
    now: dt.datetime,
) -> ingest.AppendResult | errors.SgmeError:
    """:func:`ingest.apply_append` in a savepoint of its own, as the group runs a piece: its
    result, or its error with nothing it did left behind."""
    work = functools.partial(ingest.apply_append, append=append, limits=limits, now=now)
    kind, value = in_savepoint(conn, name, work)
    assert kind != "again"  # only a key can race, and a plain append has none
    assert isinstance(value, ingest.AppendResult | errors.SgmeError)  # not queued: never held
    return value


def find_sessions(conn: sa.Connection, sessions: set[Session]) -> dict[Session, _Row]:
    """The rows of ``sessions`` that have one, locked (SQLite: the transaction holds the write
    lock; PostgreSQL: each row, in file order)."""
    found: dict[Session, _Row] = {}
    keys = [dict(zip(_SESSION, session, strict=True)) for session in sessions]
    statement = _LOCK_SESSIONS if database.is_postgres(conn) else _FIND_SESSIONS
    for row in statement.rows(conn, keys):
        record = _Row(**row)
        found[Session(record.agent_id, record.source_type, record.session_key)] = record
    return found


def _journal_rows(n: int) -> Any:
    columns = database.binds(tables.append_journal)
    return sa.insert(tables.append_journal).values(
        [
            {key: sa.bindparam(f"{key}_{i}", type_=bind.type) for key, bind in columns.items()}
            for i in range(n)
        ]
    )


def _find_sessions(n: int) -> Any:
    # OR of equalities, not a row value IN a list: SQLite searches the session index for
    # each (MULTI-INDEX OR) where it would scan the table for the IN
    return sa.select(*(_R[name] for name in _Row._fields)).where(
        sa.or_(
            *(
                sa.and_(*(_R[name] == sa.bindparam(f"{name}_{i}") for name in _SESSION))
                for i in range(n)
            )
        )
    )


def _lock_sessions(n: int) -> Any:
    """:func:`_find_sessions` with PostgreSQL's row locks, as an append alone takes its row's
    (``FOR NO KEY UPDATE``), taken in file order."""
    return _find_sessions(n).order_by(_R.file_id).with_for_update(key_share=True)


_SESSION = ("agent_id", "source_type", "session_key")
_INSERT_JOURNAL = database.Sized(_journal_rows)
_FIND_SESSIONS = database.Sized(_find_sessions)
_LOCK_SESSIONS = database.Sized(_lock_sessions)
