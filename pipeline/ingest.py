"""Ingest (docs/design.md §3): an append or upload committed to the journal — the
acknowledgement point.

One transaction, run by the group committer (:meth:`database.Database.commit`): find or create
the session's ``raw_files`` row and lock it; answer a retried idempotency key from its record
(:mod:`pipeline.idempotency`); for an append numbered by its sender, ask
:mod:`pipeline.ordering` what to do; allocate seqs from ``next_seq``; render the blocks (seq 1
gets ``#``, the first append also the frontmatter); insert them as one ``append_journal`` row;
set ``flush_pending``. The commit is the acknowledgement; :mod:`pipeline.flush` writes the
file later from the journal alone.

Every function here takes input that was parsed and validated at the edge
(:class:`validation.Append`, :class:`validation.Upload`).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import json
import uuid
from typing import Any, Protocol

import sqlalchemy as sa

from pipeline import (
    backlog,
    database,
    document,
    errors,
    idempotency,
    index,
    ledger,
    ordering,
    refs,
    store,
    tables,
    validation,
)
from pipeline.settings import Backlog
from pipeline.tables import Status


@dataclasses.dataclass(frozen=True)
class AppendResult:
    """What an append is answered with; ``kick`` says whether a flush must be enqueued."""

    file_id: str
    first_seq: int
    last_seq: int
    source_refs: tuple[str, ...]
    status: str
    kick: bool = False
    replayed: bool = False
    #: messages not written because their key is an erasure's tombstone (then nothing is, and
    #: ``file_id`` is the erased file's)
    erased: int = 0

    def to_json(self) -> dict[str, Any]:
        """The answer as recorded for its idempotency key (and sent, with ``replayed``)."""
        return {
            "file_id": self.file_id,
            "first_seq": self.first_seq,
            "last_seq": self.last_seq,
            "source_refs": list(self.source_refs),
            "status": self.status,
        }

    @classmethod
    def replayed_from(cls, recorded: dict[str, Any], messages: int = 1) -> AppendResult:
        """The answer of a retried key, from its record; of an erased one (a tombstone: the
        ``messages`` of the append are not written), without seqs or refs."""
        if "erased" in recorded:
            return cls(recorded["erased"], 0, 0, (), "erased", erased=messages)
        return cls(**{**recorded, "source_refs": tuple(recorded["source_refs"])}, replayed=True)


def _recorded(conn: sa.Connection, append: validation.Append) -> AppendResult | None:
    """The answer of an append stored already (:mod:`pipeline.idempotency`): its key's record
    (a retry, or an erasure's tombstone), else that of the turn an earlier version of its
    sender stored it in; None when it is new."""
    found = idempotency.replay(conn, append.agent_id, append.idempotency_key, append.digest)
    if found is None:
        found = idempotency.covered(conn, append.agent_id, append.legacy_key)
    return None if found is None else AppendResult.replayed_from(found, len(append.messages))


@dataclasses.dataclass(frozen=True)
class Held:
    """A queued append not written now: waiting for its predecessor, or ``dropped`` (recorded
    as an anomaly: there is nobody to answer)."""

    sequence: int
    expected: int  #: what the session expected when it came
    dropped: bool = False
    #: a file that appends held before were written to meanwhile (a gap was let go): flush it
    kick: str | None = None


#: sessions :class:`KnownFiles` remembers before it starts over: a few MB (about 25 MB if
#: every key were 512 characters past the BMP)
KNOWN_FILES = 10_000


class KnownFiles:
    """The file of each session this process appended to lately: the key its next append
    takes in a group (:mod:`pipeline.database.commits`), so that the append locks the
    file's row in the same order as the flushes and refinements of other processes, which
    know their file. Past :data:`KNOWN_FILES` sessions it starts over. A session it does not
    know (its first append, or its first since then) goes without a key: first in its group,
    where it may meet the deadlock the order avoids, which the group survives by running
    again. A key that is out of date (the session's file was erased and made again) orders
    its group wrongly in the same way, and changes nothing else. With ``size`` 0 it remembers
    nothing (SQLite, which takes no row locks)."""

    def __init__(self, size: int = KNOWN_FILES) -> None:
        self.size = size
        self._files: dict[ledger.Session, str] = {}

    def key(self, append: validation.Append) -> str | None:
        """The file the session of ``append`` was last known to have, or None."""
        return self._files.get(ordering.session_of(append)) if self.size else None

    def learn(self, append: validation.Append, file_id: str) -> None:
        """The session of ``append`` has the file ``file_id``."""
        if not self.size:
            return
        if len(self._files) >= self.size:
            self._files.clear()
        self._files[ordering.session_of(append)] = file_id


def append(
    db: database.Database,
    body: validation.Append,
    *,
    limits: Backlog | None = None,
    key: str | None = None,
) -> AppendResult:
    """Commit an append to the journal (the acknowledgement point); nothing is written when
    anything in it is refused. The caller enqueues a flush when ``result.kick`` is true (no
    flush was already pending for the file). With ``limits``, an append that would leave more
    than ``max_file_messages`` waiting for the file's flush is :class:`errors.Overloaded`. A
    ``sequence`` that is not the one its session expects next is :class:`errors.OutOfOrder`.
    ``key``: the session's file, where the caller knows it (:class:`KnownFiles`)."""
    work = functools.partial(apply_append, append=body, limits=limits, now=db.now())
    result = db.commit(work, key=key)
    assert isinstance(result, AppendResult)  # only a queued append is held
    return result


def queued(
    db: database.Database,
    body: validation.Append,
    *,
    limits: Backlog | None = None,
    wait_seconds: float,
    key: str | None = None,
) -> AppendResult | Held:
    """:func:`append` for an append that came through the queue, where nobody waits for an
    answer: one ahead of its session's order is held until its predecessor lands (or
    ``wait_seconds`` pass), one behind it is recorded and dropped (:mod:`pipeline.ordering`)."""
    work = functools.partial(
        apply_append,
        append=body,
        limits=limits,
        now=db.now(),
        queued=True,
        wait_seconds=wait_seconds,
    )
    return db.commit(work, key=key)


def upload(db: database.Database, body: validation.Upload) -> AppendResult:
    """Commit an uploaded text document as a new file of one message (docs/design.md §2)."""
    return db.commit(functools.partial(apply_upload, upload=body, now=db.now()))


def apply_append(
    conn: sa.Connection,
    *,
    append: validation.Append,
    now: dt.datetime,
    limits: Backlog | None = None,
    queued: bool = False,
    wait_seconds: float = 0.0,
) -> AppendResult | Held:
    """Ingest's work inside the caller's transaction."""
    session = ordering.session_of(append)
    if append.sequence is None:
        row = index.find_file(conn, *session)
        # Checked under the row's lock (or the session's, before there is a row: none is made
        # for an append stored already or erased), so two retries of one request cannot both
        # pass.
        if row is None:
            ordering.lock(conn, session)  # numbered appends may be waiting for its first
            ordering.check_unsequenced(conn, None, session)
            recorded = _recorded(conn, append)
            if recorded is not None:
                return recorded
            row = _create(conn, append, now)
        else:
            recorded = _recorded(conn, append)
            if recorded is not None:
                return recorded
        ordering.check_unsequenced(conn, row, session)
        return _write(conn, row, append, limits, now)
    # Numbered: the session's lock first, as the file may not exist yet (the appends held for
    # its first one); the replay under it, so that a redelivered task replays.
    ordering.lock(conn, session)
    row = index.find_file(conn, *session)
    recorded = _recorded(conn, append)
    if recorded is not None:
        return recorded
    decision = ordering.decide(conn, row, append, queued=queued)
    assert append.sequence is not None
    if isinstance(decision, ordering.Write):
        written = _write(conn, row, append, limits, now)
        _settle(conn, session, limits=limits, wait_seconds=wait_seconds, now=now)
        return written
    if isinstance(decision, ordering.Drop):
        ordering.drop(conn, row.file_id if row else None, append, decision, now=now)
        return Held(append.sequence, decision.expected, dropped=True)
    if decision.new:
        ordering.hold(conn, append, now=now)
    kick = _settle(conn, session, limits=limits, wait_seconds=wait_seconds, now=now)
    return Held(append.sequence, decision.expected, kick=kick)


def settle_waiting(
    db: database.Database, *, age: float, limits: Backlog | None, wait_seconds: float
) -> list[str]:
    """Write the held appends that may go now, in every session where one has waited more
    than ``age`` seconds (the sweeper's part: a gap that never fills is let go even when no
    task of its session comes any more, and what a full backlog held back goes on); the files
    written to."""
    written = []
    for session in ordering.waiting_sessions(db, age=age):

        def work(conn: sa.Connection, session: ledger.Session = session) -> str | None:
            ordering.lock(conn, session)
            return _settle(conn, session, limits=limits, wait_seconds=wait_seconds, now=db.now())

        file_id = db.commit(work)
        if file_id is not None:
            written.append(file_id)
    return written


def _settle(
    conn: sa.Connection,
    session: ledger.Session,
    *,
    limits: Backlog | None,
    wait_seconds: float,
    now: dt.datetime,
) -> str | None:
    """Write what :func:`ordering.next_release` lets go for ``session``, in order, until it
    says nothing more may go (or the backlog is full: the next arrival or sweep comes back);
    the file written to, or None."""
    wrote: str | None = None
    while (
        release := ordering.next_release(conn, session, wait_seconds=wait_seconds, now=now)
    ) is not None:
        row = index.find_file(conn, *session)
        try:
            written = _write(conn, row, release.append, limits, now)
        except errors.Overloaded:
            break
        ordering.released(conn, release, written.file_id, wait_seconds=wait_seconds, now=now)
        wrote = written.file_id
    return wrote


def _create(conn: sa.Connection, append: validation.Append, now: dt.datetime) -> tables.FileRow:
    """The session's row, made by its first append (which gives started_at and metadata),
    and locked."""
    file_id = str(uuid.uuid4())
    index.insert_file(
        conn,
        file_id=file_id,
        path=store.relative_path(append.source_type, file_id),
        source_type=append.source_type,
        agent_id=append.agent_id,
        session_key=append.session_key,
        metadata_json=json.dumps(append.metadata, ensure_ascii=False),
        started_at=document.parse_ts(append.messages[0].ts).replace(tzinfo=None),
        status=Status.PENDING,
        now=now,
    )
    # On PostgreSQL a concurrent creator may have won; either way lock the row now.
    row = index.find_file(conn, append.agent_id, append.source_type, append.session_key)
    assert row is not None
    return row


def _write(
    conn: sa.Connection,
    row: tables.FileRow | None,
    append: validation.Append,
    limits: Backlog | None,
    now: dt.datetime,
) -> AppendResult:
    """Write an append after the session's last one (its row made first if None): allocate
    seqs, journal the rendered blocks, move the session on, remember the key."""
    first = 1 if row is None else row.next_seq
    if limits is not None:
        waiting = 0 if row is None else first - 1 - row.flushed_seq
        backlog.check_file(waiting, len(append.messages), limits)
    if row is None:
        row = _create(conn, append, now)
        first = row.next_seq
    last = first + len(append.messages) - 1
    header = _header(row) if first == 1 else None
    ledger.add_journal(conn, **journal_values(row.file_id, append, first, now, header=header))
    if append.sequence is None:
        index.record_append(conn, row.file_id, next_seq=last + 1, now=now)
    elif not index.record_sequenced(
        conn,
        row.file_id,
        next_seq=last + 1,
        old_sequence=row.next_sequence,
        sequence=append.sequence,
        now=now,
    ):
        raise errors.InternalError(
            f"the next sequence of {row.file_id} moved although its session was locked"
        )
    result = result_of(row, first, last)
    idempotency.remember(
        conn, append.agent_id, append.idempotency_key, append.digest, result.to_json(), now=now
    )
    return result


def journal_values(
    file_id: str,
    append: validation.Append,
    first: int,
    now: dt.datetime,
    *,
    header: document.Header | None = None,
) -> dict[str, Any]:
    """The journal row of an append that takes seqs from ``first`` in ``file_id``: its
    rendered blocks (seq 1 gets ``#``; the file's first append, given its ``header``, also the
    frontmatter)."""
    rendered = "".join(
        document.render_block(m, first=first + i == 1) for i, m in enumerate(append.messages)
    )
    if header is not None:
        rendered = document.render_frontmatter(header) + rendered
    return {
        "file_id": file_id,
        "first_seq": first,
        "last_seq": first + len(append.messages) - 1,
        "last_ts": max((m.ts for m in append.messages), key=document.parse_ts),
        "data": rendered,
        "size": len(rendered.encode("utf-8")),
        "created_at": now,
    }


class SessionRow(Protocol):
    """What an append's answer reads of its session's row (as it was before the append)."""

    @property
    def file_id(self) -> str: ...

    @property
    def status(self) -> str: ...

    @property
    def flush_pending(self) -> bool: ...


def result_of(row: SessionRow, first: int, last: int) -> AppendResult:
    """The answer to an append given seqs ``first`` to ``last`` in ``row``'s file (before the
    append: a flush is kicked when none was pending)."""
    return AppendResult(
        file_id=row.file_id,
        first_seq=first,
        last_seq=last,
        source_refs=refs.span(row.file_id, first, last),
        status=row.status,
        kick=not row.flush_pending,
    )


def _header(row: tables.FileRow) -> document.Header:
    return document.Header(
        file_id=row.file_id,
        session_key=row.session_key,
        agent_id=row.agent_id,
        source_type=row.source_type,
        started_at=document.format_ts(row.started_at),
        metadata=row.metadata,
    )


def apply_upload(
    conn: sa.Connection, *, upload: validation.Upload, now: dt.datetime
) -> AppendResult:
    """Ingest of an upload inside the caller's transaction."""
    recorded = idempotency.replay(conn, upload.agent_id, upload.idempotency_key, upload.digest)
    if recorded is not None:
        return AppendResult.replayed_from(recorded)
    file_id = str(uuid.uuid4())
    index.insert_file(
        conn,
        file_id=file_id,
        path=store.relative_path("upload", file_id),
        source_type="upload",
        agent_id=upload.agent_id,
        session_key=file_id,
        metadata_json=json.dumps(upload.metadata, ensure_ascii=False),
        started_at=now,
        status=Status.PENDING,
        next_seq=2,
        flush_pending=True,
        now=now,
    )
    header = document.Header(
        file_id=file_id,
        session_key=file_id,
        agent_id=upload.agent_id,
        source_type="upload",
        started_at=document.format_ts(now),
        metadata=upload.metadata,
    )
    rendered = document.render_frontmatter(header) + document.render_upload(upload.content)
    ledger.add_journal(
        conn,
        file_id=file_id,
        first_seq=1,
        last_seq=1,
        last_ts=document.format_ts(now),
        data=rendered,
        size=len(rendered.encode("utf-8")),
        created_at=now,
    )
    result = AppendResult(
        file_id=file_id,
        first_seq=1,
        last_seq=1,
        source_refs=(refs.format(file_id, 1),),
        status=Status.PENDING,
        kick=True,
    )
    idempotency.remember(
        conn, upload.agent_id, upload.idempotency_key, upload.digest, result.to_json(), now=now
    )
    return result
