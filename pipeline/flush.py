"""Flush (docs/design.md §3): the journal's rows of a file written to the file, once.

Under the per-file lock (:class:`locks.FileLocks`): compare the file's length with the
committed ``flushed_bytes`` — longer, the tail was never acknowledged (a flush died
mid-write) and is cut (``torn_tail_truncated``); shorter or missing, the file lost
acknowledged bytes: status ``error`` (``file_shrunk``/``file_missing``) and nothing written
past the hole. Then the pending rows go out in one ``write`` on an ``O_APPEND`` descriptor and
an fsync (files are created with ``O_EXCL`` and their directory fsynced), and one transaction
advances ``flushed_seq``, ``flushed_bytes`` and ``chain_head`` fenced on the old
``flushed_seq``, deletes the applied journal rows and writes their catalog and search rows.
That commit is lazy (no disk flush of its own): if a power cut takes it back, the journal rows
are still there and the file is longer than ``flushed_bytes``, so the next flush cuts the tail
and writes the same bytes again.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import time
from collections.abc import Callable
from pathlib import Path

import sqlalchemy as sa

from pipeline import (
    anomalies,
    archive,
    catalog,
    database,
    document,
    errors,
    index,
    ledger,
    locks,
    metrics,
    rewrite,
    store,
    tables,
)
from pipeline.tables import Kind, Status

#: a fault-injection hook: called with a step name at each step of a flush (tests use it)
FaultHook = Callable[[str], None]
FLUSH_STEPS = ("locked", "read", "truncated", "written", "committed")
DEFAULT_CHUNK_BYTES = 8 * 1024 * 1024  #: ``backlog_flush_chunk_bytes``


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


def _damaged(
    db: database.Database, file_id: str, kind: Kind, detail: str, *, mark_error: bool = True
) -> errors.FileDamaged:
    """Record that a file cannot be flushed. The sweeper keeps re-kicking it (its journal rows
    wait), so the anomaly is recorded once and then only counted; the error's ``first`` says
    whether this was the first time (the caller logs only that one)."""
    with db.transaction() as conn:
        if mark_error:
            first = index.record_damage(conn, file_id, kind, detail, now=db.now())
        else:
            first = anomalies.record(conn, file_id, kind, detail, now=db.now()) == 1
    damaged = errors.FileDamaged(f"file {file_id}: {detail}")
    damaged.first = first
    return damaged


def _no_fault(step: str) -> None:
    return None


def flush(
    db: database.Database,
    file_locks: locks.FileLocks,
    data_dir: Path,
    file_id: str,
    *,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
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
    process that commit at the same moment (:mod:`pipeline.database.commits`).
    """
    with file_locks.hold(file_id):
        fault("locked")
        # A redaction a crash interrupted is finished before anything is appended (the file
        # and its index row may be one step apart until then: pipeline.rewrite).
        rewrite.settle_locked(db, data_dir, file_id)
        started = time.perf_counter()
        with db.reading(held=True) as conn:
            row = index.get_file(conn, file_id)
            if row is None:
                raise errors.NotFound(f"no file {file_id}")
            # What is acknowledged now; what comes later is the caller's to flush again.
            upto = row.next_seq - 1
            batch = ledger.journal_batch(conn, file_id, row.flushed_seq, chunk_bytes, upto=upto)
        if not batch:
            if row.flush_pending:
                with db.transaction(durable=False) as conn:
                    index.settle_flush(conn, file_id)
            return FlushResult(file_id, 0, 0, row.flushed_seq, row.status)
        fault("read")
        if row.status == Status.ARCHIVED:
            # An append to an archived session brings the file back first (docs/design.md §5).
            try:
                row = archive.restore_locked(db, data_dir, row)
            except errors.FileDamaged as exc:
                # Stay archived (reads keep decompressing); the appends wait in the journal.
                raise _damaged(
                    db, file_id, Kind.RESTORE_FAILED, exc.detail, mark_error=False
                ) from None
        path, current = _check_file(db, data_dir, row, fault)
        first_seq, first_bytes = row.flushed_seq, row.flushed_bytes
        while True:
            row, next_seq = _write_chunk(
                db, path, row, batch, exists=current is not None, fault=fault
            )
            current = row.flushed_bytes
            now = db.now()
            for entry in batch:
                metrics.ACK_TO_FLUSH_SECONDS.observe((now - entry.created_at).total_seconds())
            if row.flushed_seq >= upto:
                break
            with db.reading(held=True) as conn:
                batch = ledger.journal_batch(conn, file_id, row.flushed_seq, chunk_bytes, upto=upto)
        metrics.FLUSH_SECONDS.observe(time.perf_counter() - started)
        messages, size = row.flushed_seq - first_seq, row.flushed_bytes - first_bytes
        more = next_seq - 1 > row.flushed_seq
        return FlushResult(
            file_id,
            messages,
            size,
            row.flushed_seq,
            Status.NEW,
            more=more,
            unrefined=row.flushed_seq - row.last_refined_seq,
            leased_until=row.refine_lease_until,
        )


def _check_file(
    db: database.Database, data_dir: Path, row: tables.FileRow, fault: FaultHook
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
        raise _damaged(db, row.file_id, Kind.FILE_REPLACED, exc.detail) from None
    if current is None and expected > 0:
        raise _damaged(db, row.file_id, Kind.FILE_MISSING, f"{row.path} is missing")
    if current is not None and current < expected:
        raise _damaged(
            db,
            row.file_id,
            Kind.FILE_SHRUNK,
            f"{row.path} is {current} bytes but {expected} were committed; not writing past a hole",
        )
    if current is not None and current > expected:
        store.truncate(path, expected)
        with db.transaction() as conn:
            anomalies.record(
                conn,
                row.file_id,
                Kind.TORN_TAIL_TRUNCATED,
                f"cut {current - expected} unacknowledged bytes after offset {expected}",
                key=str(expected),
                now=db.now(),
            )
        fault("truncated")
        current = expected
    return path, current


def _write_chunk(
    db: database.Database,
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
                db,
                row.file_id,
                Kind.JOURNAL_GAP,
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

    now = db.now()

    def commit(conn: sa.Connection) -> int:
        next_seq = index.advance_flushed(
            conn,
            owner.file_id,
            old_seq=row.flushed_seq,
            flushed_seq=seq,
            flushed_bytes=expected + len(data),
            chain_head=head.hex(),
            ended_at=ended_at,
            now=now,
        )
        if next_seq is None:
            raise errors.Conflict(f"file {owner.file_id} was flushed by someone else meanwhile")
        ledger.delete_journal(conn, owner.file_id, seq)
        catalog.add(conn, owner, found)
        return next_seq

    next_seq = db.commit(commit, durable=False)
    fault("committed")
    advanced = dataclasses.replace(
        row, flushed_seq=seq, flushed_bytes=expected + len(data), chain_head=head.hex()
    )
    return advanced, next_seq


def stale_files(db: database.Database, *, age: float) -> list[str]:
    """Files whose journal rows have waited ``age`` seconds or more (the sweeper's list); with
    ``age`` 0, every file with journal rows, however young (a restart: no kick is on its way
    for any of them)."""
    older_than = db.now() - dt.timedelta(seconds=age) if age > 0 else None
    with db.reading() as conn:
        return ledger.stale_journal_files(conn, older_than)
