"""The append protocol (DESIGN §3): ingest into the journal, then flush to the file.

Ingest is the acknowledgement point: one transaction allocates seqs, renders the blocks and
stores them as one ``append_journal`` row. The file is written later by :func:`flush`, under
a per-file lock, from the journal alone, so a lost queue message, a crashed worker or a wiped
broker can delay a write but never lose or repeat one. An append numbered by its sender
(``sequence``) is written only in that order (:mod:`pipeline.ordering`).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import json
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from pipeline import (
    archive,
    catalog,
    commits,
    database,
    document,
    errors,
    index,
    ledger,
    metrics,
    ordering,
    rewrite,
    store,
    tables,
    validation,
)


@dataclasses.dataclass(frozen=True)
class Backlog:
    """How much may wait to be written (``backlog_*`` settings): past these, appends are
    refused with a ``Retry-After`` instead of acknowledged (DESIGN §3, bounded work)."""

    #: acknowledged messages of one file not yet in it (503 past this)
    max_file_messages: int = 100_000
    #: bytes waiting in the journal over all files (503 past this)
    max_total_bytes: int = 1024 * 1024 * 1024
    #: bytes kept free on the data volume: an append is acknowledged only if the journal's
    #: backlog and the append fit in the free space above this (507 otherwise)
    min_free_bytes: int = 64 * 1024 * 1024
    retry_after: float = 5.0  #: seconds a refused client is told to wait
    #: bytes a flush writes, fsyncs and commits at a time (one journal row at least)
    flush_chunk_bytes: int = 8 * 1024 * 1024


DEFAULT_BACKLOG = Backlog()
#: a fault-injection hook: called with a step name at each step of a flush (tests use it)
FaultHook = Callable[[str], None]
FLUSH_STEPS = ("locked", "read", "truncated", "written", "committed")


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

    def to_json(self) -> dict[str, Any]:
        """The API's response body."""
        return {
            "file_id": self.file_id,
            "first_seq": self.first_seq,
            "last_seq": self.last_seq,
            "source_refs": list(self.source_refs),
            "status": self.status,
        }


@dataclasses.dataclass(frozen=True)
class FlushResult:
    """What one flush wrote."""

    file_id: str
    messages: int
    bytes: int
    flushed_seq: int
    status: str  #: the file's status after the flush
    #: appends acknowledged while this flush ran wait past what it wrote: the caller must
    #: flush the file again (kick it); their ingest saw the flush pending and did not
    more: bool = False
    #: flushed messages not yet refined, as the flush saw them (refinement can only have
    #: become due by message count if this reaches ``refine_min_messages``)
    unrefined: int = 0
    #: until when a refinement job held the file's lease, as the flush saw it (a leased file
    #: is not dispatched again)
    leased_until: dt.datetime | None = None


class _KeyRaced(commits.Again):
    """A concurrent request with the same idempotency key committed first: roll back and
    answer, in the next group, as the key's recorded request did."""


def _replay(
    conn: sa.Connection, agent_id: str, key: str | None, digest: str
) -> AppendResult | None:
    """The recorded answer for a retried idempotency key, or None when the key is new."""
    if key is None:
        return None
    found = ledger.get_key(conn, agent_id, key)
    if found is None:
        return None
    recorded_hash, response = found
    if recorded_hash != digest:
        raise errors.Conflict(f"idempotency_key {key!r} was already used with a different body")
    response["source_refs"] = tuple(response["source_refs"])
    return AppendResult(**response, replayed=True)


def _remember(
    conn: sa.Connection, agent_id: str, key: str | None, digest: str, result: AppendResult
) -> None:
    if key is not None and not ledger.put_key(conn, agent_id, key, digest, result.to_json()):
        raise _KeyRaced


def ingest(
    engine: sa.Engine,
    body: Mapping[str, Any] | bytes | validation.Append,
    *,
    limits: validation.Limits = validation.DEFAULT_LIMITS,
    backlog: Backlog | None = None,
) -> AppendResult:
    """Validate an append and commit it to the journal (the acknowledgement point).

    Nothing is written when anything in the body is wrong. The caller enqueues a flush when
    ``result.kick`` is true (no flush was already pending for the file). With ``backlog``,
    an append that would leave more than ``backlog.max_file_messages`` messages waiting for
    the file's flush is refused with :class:`errors.Overloaded`. A ``sequence`` that is not
    the one its session expects next is refused with :class:`errors.OutOfOrder`
    (:mod:`pipeline.ordering`).
    """
    append = body if isinstance(body, validation.Append) else validation.parse_append(body, limits)
    apply = functools.partial(apply_append, append=append, backlog=backlog)
    result = commits.group(engine).run(apply)
    assert isinstance(result, AppendResult)  # only a held append is answered otherwise
    return result


def ingest_queued(
    engine: sa.Engine,
    append: validation.Append,
    *,
    backlog: Backlog | None = None,
    wait_seconds: float = ordering.DEFAULT_WAIT_SECONDS,
) -> AppendResult | ordering.Held:
    """:func:`ingest` for an append that came through the queue, where nobody waits for an
    answer: one ahead of its session's order is held until its predecessor lands (or
    ``wait_seconds`` pass), one behind it is recorded and dropped (:mod:`pipeline.ordering`)."""
    apply = functools.partial(
        apply_append, append=append, backlog=backlog, hold=True, wait_seconds=wait_seconds
    )
    return commits.group(engine).run(apply)


def writer(backlog: Backlog | None = None) -> ordering.Writer[AppendResult]:
    """What writes an append after its session's last one, for :mod:`pipeline.ordering`'s
    held appends (the sweeper's :func:`ordering.settle_waiting`)."""
    return functools.partial(_write, backlog=backlog)


def apply_append(
    conn: sa.Connection,
    *,
    append: validation.Append,
    backlog: Backlog | None = None,
    hold: bool = False,
    wait_seconds: float = ordering.DEFAULT_WAIT_SECONDS,
) -> AppendResult | ordering.Held:
    """Ingest's work inside the caller's transaction: find or create the session's row and
    lock it, check the idempotency key, then (by the session's order, when the append has a
    ``sequence``: ``hold`` is :func:`ingest_queued`'s) allocate seqs, journal the rendered
    blocks, remember the key."""
    session = ordering.session_of(append)
    write = writer(backlog)
    if append.sequence is None:
        row = index.find_file(conn, *session)
        if row is None:
            ordering.lock(conn, session)  # numbered appends may be waiting for its first
            ordering.check_unsequenced(conn, None, session)
            row = _create(conn, append)
        # Checked under the row lock, so two retries of one request cannot both pass.
        replayed = _replay(conn, append.agent_id, append.idempotency_key, append.digest)
        if replayed is not None:
            return replayed
        ordering.check_unsequenced(conn, row, session)
        return write(conn, row, append)
    # Numbered: the session's lock first, as the file may not exist yet (the appends held for
    # its first one); the replay under it, so that a redelivered task replays.
    ordering.lock(conn, session)
    row = index.find_file(conn, *session)
    replayed = _replay(conn, append.agent_id, append.idempotency_key, append.digest)
    if replayed is not None:
        return replayed
    return ordering.apply(conn, row, append, write=write, hold=hold, wait_seconds=wait_seconds)


def _create(conn: sa.Connection, append: validation.Append) -> tables.FileRow:
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
        status="pending",
    )
    # On PostgreSQL a concurrent creator may have won; either way lock the row now.
    row = index.find_file(conn, append.agent_id, append.source_type, append.session_key)
    assert row is not None
    return row


def _write(
    conn: sa.Connection,
    row: tables.FileRow | None,
    append: validation.Append,
    *,
    backlog: Backlog | None,
) -> AppendResult:
    """Write an append after the session's last one (its row made first if None): allocate
    seqs, journal the rendered blocks, move the session on, remember the key."""
    first = 1 if row is None else row.next_seq
    waiting = 0 if row is None else first - 1 - row.flushed_seq
    if backlog is not None and waiting + len(append.messages) > backlog.max_file_messages:
        raise errors.Overloaded(
            f"{waiting} messages of this session wait to be written; at most "
            f"{backlog.max_file_messages} may (backlog_max_file_messages)",
            retry_after=backlog.retry_after,
        )
    if row is None:
        row = _create(conn, append)
        first = row.next_seq
    rendered = "".join(
        document.render_block(m, first=first + i == 1) for i, m in enumerate(append.messages)
    )
    if first == 1:
        rendered = document.render_frontmatter(_header(row)) + rendered
    last = first + len(append.messages) - 1
    ledger.add_journal(
        conn,
        file_id=row.file_id,
        first_seq=first,
        last_seq=last,
        last_ts=max((m.ts for m in append.messages), key=document.parse_ts),
        data=rendered,
        size=len(rendered.encode("utf-8")),
    )
    if append.sequence is None:
        index.record_append(conn, row.file_id, next_seq=last + 1)
    elif not index.record_sequenced(
        conn,
        row.file_id,
        next_seq=last + 1,
        old_sequence=row.next_sequence,
        sequence=append.sequence,
    ):
        raise errors.InternalError(
            f"the next sequence of {row.file_id} moved although its session was locked"
        )
    result = AppendResult(
        file_id=row.file_id,
        first_seq=first,
        last_seq=last,
        source_refs=tuple(f"{row.file_id}:{seq}" for seq in range(first, last + 1)),
        status=row.status,
        kick=not row.flush_pending,
    )
    _remember(conn, append.agent_id, append.idempotency_key, append.digest, result)
    return result


def _header(row: tables.FileRow) -> document.Header:
    return document.Header(
        file_id=row.file_id,
        session_key=row.session_key,
        agent_id=row.agent_id,
        source_type=row.source_type,
        started_at=document.format_ts(row.started_at),
        metadata=row.metadata,
    )


def ingest_upload(
    engine: sa.Engine,
    body: Mapping[str, Any] | bytes | validation.Upload,
    *,
    limits: validation.Limits = validation.DEFAULT_LIMITS,
) -> AppendResult:
    """Commit an uploaded text document as a new file of one message (DESIGN §2.7)."""
    upload = body if isinstance(body, validation.Upload) else validation.parse_upload(body, limits)
    return commits.group(engine).run(functools.partial(apply_upload, upload=upload))


def apply_upload(conn: sa.Connection, *, upload: validation.Upload) -> AppendResult:
    """Ingest of an upload inside the caller's transaction."""
    replayed = _replay(conn, upload.agent_id, upload.idempotency_key, upload.digest)
    if replayed is not None:
        return replayed
    now = tables.utcnow()
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
        status="pending",
        next_seq=2,
        flush_pending=True,
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
    )
    result = AppendResult(
        file_id=file_id,
        first_seq=1,
        last_seq=1,
        source_refs=(f"{file_id}:1",),
        status="pending",
        kick=True,
    )
    _remember(conn, upload.agent_id, upload.idempotency_key, upload.digest, result)
    return result


# ---------------------------------------------------------------------------------------------
# flush


def _damaged(
    engine: sa.Engine, file_id: str, kind: str, detail: str, *, mark_error: bool = True
) -> errors.FileDamaged:
    """Record that a file cannot be flushed. The sweeper keeps re-kicking it (its journal rows
    wait), so the anomaly is recorded once and then only counted; the error's ``first`` says
    whether this was the first time (the caller logs only that one)."""
    with database.transaction(engine) as conn:
        if mark_error:
            first = index.record_damage(conn, file_id, kind, detail)
        else:
            first = index.record_anomaly(conn, file_id, kind, detail) == 1
    damaged = errors.FileDamaged(f"file {file_id}: {detail}")
    damaged.first = first
    return damaged


def _no_fault(step: str) -> None:
    return None


def flush(
    engine: sa.Engine,
    data_dir: Path,
    file_id: str,
    *,
    lock_timeout: float = store.DEFAULT_LOCK_TIMEOUT,
    chunk_bytes: int = DEFAULT_BACKLOG.flush_chunk_bytes,
    file_lock: bool = True,
    fault: FaultHook = _no_fault,
) -> FlushResult:
    """Write every journal row of ``file_id`` past ``flushed_seq`` to its file, once.

    Idempotent: running it twice, concurrently or after a crash at any point, leaves each
    acknowledged message in the file exactly once and in seq order. The backlog goes out in
    chunks of about ``chunk_bytes`` (one journal row at least), each written, fsynced and
    committed before the next is read: memory stays bounded, and after a full disk the
    backlog drains as space frees instead of needing room for all of it at once. It writes
    what was acknowledged when it started; what came later is flushed again by the caller
    (``result.more``), so a busy session cannot keep one flush going for ever.

    Each chunk's commit is lazy (no disk flush of its own: its journal rows, deleted in it,
    are still there if a power cut takes it back) and shared with the other flushes of this
    process that commit at the same moment (:mod:`pipeline.commits`). ``file_lock=False``
    leaves out the lock file on the data volume: then PostgreSQL's advisory lock alone keeps
    two processes off one file (a networked volume whose ``flock`` cannot be trusted).
    """
    with (
        store.lock(data_dir, file_id, timeout=lock_timeout, flock=file_lock),
        database.advisory_lock(engine, file_id),
    ):
        fault("locked")
        # A redaction a crash interrupted is finished before anything is appended (the file
        # and its index row may be one step apart until then: pipeline.rewrite).
        rewrite.settle_locked(engine, data_dir, file_id)
        started = time.perf_counter()
        with database.reading(engine) as conn:
            row = index.get_file(conn, file_id)
            if row is None:
                raise errors.NotFound(f"no file {file_id}")
            # What is acknowledged now; what comes later is the caller's to flush again.
            upto = row.next_seq - 1
            batch = ledger.journal_batch(conn, file_id, row.flushed_seq, chunk_bytes, upto=upto)
        if not batch:
            if row.flush_pending:
                with database.transaction(engine, durable=False) as conn:
                    index.settle_flush(conn, file_id)
            return FlushResult(file_id, 0, 0, row.flushed_seq, row.status)
        fault("read")
        if row.status == "archived":
            # An append to an archived session brings the file back first (DESIGN §5).
            try:
                row = archive.restore_locked(engine, data_dir, row)
            except errors.FileDamaged as exc:
                # Stay archived (reads keep decompressing); the appends wait in the journal.
                raise _damaged(
                    engine, file_id, "restore_failed", exc.detail, mark_error=False
                ) from None
        path, current = _check_file(engine, data_dir, row, fault)
        first_seq, first_bytes = row.flushed_seq, row.flushed_bytes
        while True:
            row, next_seq = _write_chunk(
                engine, path, row, batch, exists=current is not None, fault=fault
            )
            current = row.flushed_bytes
            now = tables.utcnow()
            for entry in batch:
                metrics.ACK_TO_FLUSH_SECONDS.observe((now - entry.created_at).total_seconds())
            if row.flushed_seq >= upto:
                break
            with database.reading(engine) as conn:
                batch = ledger.journal_batch(conn, file_id, row.flushed_seq, chunk_bytes, upto=upto)
        metrics.FLUSH_SECONDS.observe(time.perf_counter() - started)
        messages, size = row.flushed_seq - first_seq, row.flushed_bytes - first_bytes
        more = next_seq - 1 > row.flushed_seq
        return FlushResult(
            file_id,
            messages,
            size,
            row.flushed_seq,
            "new",
            more=more,
            unrefined=row.flushed_seq - row.last_refined_seq,
            leased_until=row.refine_lease_until,
        )


def _check_file(
    engine: sa.Engine, data_dir: Path, row: tables.FileRow, fault: FaultHook
) -> tuple[Path, int | None]:
    """The file's path and length, once it is exactly what was committed: a torn tail left by
    a crash is cut (the journal proves it was never acknowledged); a missing or shorter file
    is damage, and nothing is written past a hole. The length is None when the file does not
    exist yet."""
    expected = row.flushed_bytes
    try:
        path = store.checked(data_dir, row.path)
        current = store.size(path)
    except errors.FileDamaged as exc:  # a symlink where the file or a directory should be
        raise _damaged(engine, row.file_id, "file_replaced", exc.detail) from None
    if current is None and expected > 0:
        raise _damaged(engine, row.file_id, "file_missing", f"{row.path} is missing")
    if current is not None and current < expected:
        raise _damaged(
            engine,
            row.file_id,
            "file_shrunk",
            f"{row.path} is {current} bytes but {expected} were committed; not writing past a hole",
        )
    if current is not None and current > expected:
        store.truncate(path, expected)
        with database.transaction(engine) as conn:
            index.record_anomaly(
                conn,
                row.file_id,
                "torn_tail_truncated",
                f"cut {current - expected} unacknowledged bytes after offset {expected}",
                key=str(expected),
            )
        fault("truncated")
        current = expected
    return path, current


def _write_chunk(
    engine: sa.Engine,
    path: Path,
    row: tables.FileRow,
    batch: list[tables.JournalRow],
    *,
    exists: bool,
    fault: FaultHook,
) -> tuple[tables.FileRow, int]:
    """Write one chunk of journal rows after the committed bytes, fsync, and commit it (the
    fenced update, the rows' deletion and their catalog rows in one transaction); the row as
    it now is, and the file's ``next_seq`` at that commit."""
    seq = row.flushed_seq
    for entry in batch:
        if entry.first_seq != seq + 1:
            raise _damaged(
                engine,
                row.file_id,
                "journal_gap",
                f"journal resumes at seq {entry.first_seq}, file ends at seq {seq}",
            )
        seq = entry.last_seq
    data = "".join(entry.data for entry in batch).encode("utf-8")
    expected = row.flushed_bytes
    upload_ts = document.format_ts(row.started_at) if row.source_type == "upload" else None
    try:
        found = document.locate(
            data, base=expected, first_seq=row.flushed_seq + 1, upload_ts=upload_ts
        )
    except errors.FormatError as exc:  # the journal holds what ingest rendered: a bug
        raise errors.InternalError(
            f"journal of {row.file_id} does not parse: {exc.detail}"
        ) from exc
    if len(found) != seq - row.flushed_seq:
        raise errors.InternalError(
            f"journal of {row.file_id} holds {len(found)} blocks for seqs "
            f"{row.flushed_seq + 1}..{seq}"
        )
    head = (
        document.chain_start(data[: found[0].offset])
        if expected == 0
        else bytes.fromhex(row.chain_head or "")
    )
    for located in found:
        start = located.offset - expected
        head = document.chain_extend(head, data[start : start + located.length])
    if not exists:
        store.create(path, data)
    else:
        store.append(path, data, expected_size=expected)
        if expected == 0:
            store.fsync_dir(path.parent)
    fault("written")
    ended_at = max(document.parse_ts(e.last_ts) for e in batch).replace(tzinfo=None)
    owner = catalog.Owner.of(row)

    def commit(conn: sa.Connection) -> int:
        next_seq = index.advance_flushed(
            conn,
            owner.file_id,
            old_seq=row.flushed_seq,
            flushed_seq=seq,
            flushed_bytes=expected + len(data),
            chain_head=head.hex(),
            ended_at=ended_at,
        )
        if next_seq is None:
            raise errors.Conflict(f"file {owner.file_id} was flushed by someone else meanwhile")
        ledger.delete_journal(conn, owner.file_id, seq)
        catalog.add(conn, owner, found)
        return next_seq

    next_seq = commits.group(engine).run(commit, durable=False)
    fault("committed")
    advanced = dataclasses.replace(
        row, flushed_seq=seq, flushed_bytes=expected + len(data), chain_head=head.hex()
    )
    return advanced, next_seq


def stale_files(engine: sa.Engine, *, age: float) -> list[str]:
    """Files whose journal rows have waited more than ``age`` seconds (the sweeper's list)."""
    with database.transaction(engine) as conn:
        return ledger.stale_journal_files(conn, tables.utcnow() - dt.timedelta(seconds=age))
