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

import collections
import dataclasses
import datetime as dt
import functools
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from pipeline import (
    anomalies,
    archive,
    audit,
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
from pipeline.settings import Refine
from pipeline.tables import Kind, Status

#: a fault-injection hook: called with a step name at each step of a flush (tests use it)
FaultHook = Callable[[str], None]
FLUSH_STEPS = ("locked", "read", "truncated", "written", "committed")
DEFAULT_CHUNK_BYTES = 8 * 1024 * 1024  #: ``backlog_flush_chunk_bytes``
#: files whose :class:`catalog.Recent` a process keeps (:func:`_kept`), the last flushed
RECENT_FILES = 4_096


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
        started = time.perf_counter()
        snapshot = _snapshot(db, file_id, chunk_bytes)
        if snapshot is None:
            # A redaction a crash interrupted is finished before anything is appended (the
            # file and its index row may be one step apart until then: pipeline.rewrite).
            rewrite.settle_locked(db, data_dir, file_id)
            snapshot = _snapshot(db, file_id, chunk_bytes, settled=True)
            assert snapshot is not None
        row, upto, batch, tail = snapshot
        fault("read")
        if not batch:
            more = False
            if row.flush_pending:
                with db.transaction(durable=False) as conn:
                    more = not index.settle_flush(conn, file_id)
            return FlushResult(file_id, 0, 0, row.flushed_seq, row.status, more=more)
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
        # the restore of an archive keeps every offset: the tail read before it holds
        before = _before(path, row, tail)
        while True:
            row, next_seq, before = _write_chunk(
                db, path, row, batch, before, exists=current is not None, fault=fault
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


def _snapshot(
    db: database.Database, file_id: str, chunk_bytes: int, *, settled: bool = False
) -> tuple[tables.FileRow, int, list[tables.JournalRow], _Tail] | None:
    """The file's row, the last seq acknowledged now (what comes later is the caller's to
    flush again), its first journal rows and its last messages (:func:`_tail`: their
    catalog rows, or what the last flush kept of them), in one snapshot; None while a
    redaction of the file is unfinished (unless ``settled``: finished just now)."""
    with db.reading(held=True) as conn:
        row, unfinished = audit.file_and_pending(conn, file_id)
        if unfinished and not settled:
            return None
        if row is None:
            raise errors.NotFound(f"no file {file_id}")
        upto = row.next_seq - 1
        batch = ledger.journal_batch(conn, file_id, row.flushed_seq, chunk_bytes, upto=upto)
        tail = _tail(conn, row) if batch else []
    return row, upto, batch, tail


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


@dataclasses.dataclass(frozen=True)
class _Chunk:
    """One chunk of a file's journal rows, ready to write: its bytes, the blocks in them, and
    what the file's row becomes once they are written."""

    row: tables.FileRow
    data: bytes
    found: list[document.Located]
    seq: int  #: the last seq in it
    head: str  #: the chain head after it
    ended_at: dt.datetime
    #: the blocks' catalog rows and search terms, made before the commit: not under the
    #: write lock
    cataloged: catalog.Ready

    def advance(self, conn: sa.Connection, now: dt.datetime) -> int | None:
        """The fenced update of the file's row (:func:`applied` writes the rest); the file's
        ``next_seq``, or None when someone else advanced it meanwhile (nothing changed)."""
        row = self.row
        return index.advance_flushed(
            conn,
            row.file_id,
            old_seq=row.flushed_seq,
            flushed_seq=self.seq,
            flushed_bytes=row.flushed_bytes + len(self.data),
            chain_head=self.head,
            ended_at=self.ended_at,
            now=now,
        )

    def advanced(self) -> tables.FileRow:
        """The file's row as it is once this chunk is committed."""
        return dataclasses.replace(
            self.row,
            flushed_seq=self.seq,
            flushed_bytes=self.row.flushed_bytes + len(self.data),
            chain_head=self.head,
        )


def applied(conn: sa.Connection, chunks: Sequence[_Chunk]) -> None:
    """What follows the advance of chunks' files, in the same transaction: their journal
    rows' deletion and their messages' catalog rows and terms, a round's files at once (a
    statement each, not a statement each per file)."""
    ledger.delete_journals(conn, [(chunk.row.file_id, chunk.seq) for chunk in chunks])
    catalog.add_ready(conn, [chunk.cataloged for chunk in chunks])


def _gap(row: tables.FileRow, batch: list[tables.JournalRow]) -> str | None:
    """Why ``batch`` does not continue the file (a journal gap), or None."""
    seq = row.flushed_seq
    for entry in batch:
        if entry.first_seq != seq + 1:
            return f"journal resumes at seq {entry.first_seq}, file ends at seq {seq}"
        seq = entry.last_seq
    return None


#: the file's last messages, whose words are the context terms of the first ones a flush
#: writes: their catalog rows (their texts to read from the file), or what the file's last
#: flush in this process kept of them
_Tail = list[tables.MessageRow] | catalog.Recent


def _tail(conn: sa.Connection, row: tables.FileRow) -> _Tail:
    """The :data:`_Tail` of a file (:data:`catalog.CONTEXT_TURNS` messages): what this
    process's last flush of it kept, if the file is still as that flush left it, else their
    catalog rows."""
    if row.source_type == "upload" or not row.flushed_seq or not catalog.CONTEXT_TURNS:
        return []
    kept = _kept(row)
    if kept is not None:
        return kept
    after = max(0, row.flushed_seq - catalog.CONTEXT_TURNS)
    return catalog.rows(conn, row.file_id, after=after, upto=row.flushed_seq)


#: file_id -> (its flushed_seq and chain head after this process's last flush of it, the
#: catalog.Recent that flush made), the :data:`RECENT_FILES` flushed last. The chain head is
#: a hash of every byte of the file: a redaction, or anything else that changes a message,
#: changes it, and the entry is passed over.
_recent: collections.OrderedDict[str, tuple[int, str | None, catalog.Recent]] = (
    collections.OrderedDict()
)
_recent_lock = threading.Lock()  #: the flush threads share it


def _kept(row: tables.FileRow) -> catalog.Recent | None:
    """The :class:`catalog.Recent` this process's last flush of ``row``'s file made, if the
    file is still as it left it (the same seq and chain head), else None. A flush at one
    message a call then reads no earlier message back and makes no terms of it again."""
    with _recent_lock:
        found = _recent.get(row.file_id)
    if found is None or found[:2] != (row.flushed_seq, row.chain_head):
        return None
    return found[2]


def _keep(row: tables.FileRow, recent: catalog.Recent) -> None:
    """Keep ``recent`` for the next flush of ``row``'s file (``row``: as the commit left it)."""
    if row.source_type == "upload":
        return
    with _recent_lock:
        _recent[row.file_id] = (row.flushed_seq, row.chain_head, recent)
        _recent.move_to_end(row.file_id)
        while len(_recent) > RECENT_FILES:
            _recent.popitem(last=False)


def _before(path: Path, row: tables.FileRow, tail: _Tail) -> catalog.Before:
    """The messages before a flush's first, as :func:`catalog.ready` takes them: what was
    kept of them, else their texts (:func:`_texts_before`)."""
    if isinstance(tail, catalog.Recent):
        return tail
    return _texts_before(path, row, tail)


def _texts_before(path: Path, row: tables.FileRow, tail: list[tables.MessageRow]) -> list[str]:
    """The texts of the messages of :func:`_tail`, read whole from the file (a redaction
    makes their context terms again from the whole texts, and must find the same); none
    when the catalog lacks one of them (a store migrated without its data directory, not yet
    reindexed: ``sgme reindex`` makes every context again)."""
    if not tail or len(tail) < min(row.flushed_seq, catalog.CONTEXT_TURNS):
        return []
    start = tail[0].byte_offset  # the messages are adjacent: one read for them all
    data = store.read_range(path, start, tail[-1].byte_offset + tail[-1].byte_length - start)
    texts = []
    for message in tail:
        at = message.byte_offset - start
        try:
            block = data[at : at + message.byte_length]
            texts.append(document.parse_block(block, message.seq).content)
        except errors.FormatError as exc:  # the committed bytes, checked by the chain: a bug
            raise errors.InternalError(f"{row.file_id}: {exc.detail}") from exc
    return texts


def _prepare(
    row: tables.FileRow,
    batch: list[tables.JournalRow],
    before: catalog.Before,
    *,
    postgres: bool,
) -> _Chunk:
    """The chunk of ``batch`` (which :func:`_gap` found continuous): its bytes, blocks, chain
    head and catalog rows (for the database ``postgres`` names; ``before``: the file's
    messages before it, for the context terms). A journal that does not parse is a bug
    (:class:`errors.InternalError`)."""
    seq = batch[-1].last_seq
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
    ended_at = max(document.parse_ts(e.last_ts) for e in batch).replace(tzinfo=None)
    cataloged = catalog.ready(catalog.Owner.of(row), found, postgres=postgres, before=before)
    return _Chunk(row, data, found, seq, head.hex(), ended_at, cataloged)


def _write(path: Path, chunk: _Chunk, *, exists: bool) -> None:
    """Write a chunk after the committed bytes and make it durable (a new file with
    ``O_EXCL``, and its directory entry)."""
    if not exists:
        store.create(path, chunk.data)
    else:
        store.append(path, chunk.data, expected_size=chunk.row.flushed_bytes)
        if chunk.row.flushed_bytes == 0:
            store.fsync_dir(path.parent)


def _write_chunk(
    db: database.Database,
    path: Path,
    row: tables.FileRow,
    batch: list[tables.JournalRow],
    before: catalog.Before,
    *,
    exists: bool,
    fault: FaultHook,
) -> tuple[tables.FileRow, int, catalog.Recent]:
    """Write one chunk of journal rows after the committed bytes, fsync, and commit it (the
    fenced update, the rows' deletion and their catalog rows in one transaction); the row as
    it now is, the file's ``next_seq`` at that commit, and the messages before the next chunk
    (``before``: those before this one), kept for the file's next flush too (:func:`_keep`)."""
    gap = _gap(row, batch)
    if gap is not None:
        raise _damaged(db, row.file_id, Kind.JOURNAL_GAP, gap)
    chunk = _prepare(row, batch, before, postgres=db.postgres)
    _write(path, chunk, exists=exists)
    fault("written")
    now = db.now()

    def commit(conn: sa.Connection) -> int:
        next_seq = chunk.advance(conn, now)
        if next_seq is None:
            raise errors.Conflict(f"file {row.file_id} was flushed by someone else meanwhile")
        applied(conn, [chunk])
        return next_seq

    next_seq = db.commit(commit, durable=False, key=row.file_id)
    fault("committed")
    advanced, recent = chunk.advanced(), chunk.cataloged.recent
    _keep(advanced, recent)
    return advanced, next_seq, recent


#: runs each thunk, perhaps in parallel (the flush threads' pool); each one's exception or None
Runner = Callable[[list[Callable[[], None]]], list[BaseException | None]]


def outcome(thunk: Callable[[], None]) -> BaseException | None:
    """Run ``thunk``: the exception it raised, or None (what a :data:`Runner` reports)."""
    try:
        thunk()
    except Exception as exc:
        return exc
    return None


def serially(thunks: list[Callable[[], None]]) -> list[BaseException | None]:
    """The :data:`Runner` that runs each thunk in turn on the calling thread."""
    return [outcome(thunk) for thunk in thunks]


@dataclasses.dataclass
class Round:
    """What one :func:`flush_many` did with the files it was given."""

    #: files it flushed (one chunk each: ``more`` when acknowledged appends are left)
    results: dict[str, FlushResult] = dataclasses.field(default_factory=dict)
    #: files to flush on their own (:func:`flush`): busy, damaged, torn, archived, with a
    #: redaction to finish, or whose write or commit failed — :func:`flush` repairs, records
    #: and reports each case as a flush of one file does
    alone: list[str] = dataclasses.field(default_factory=list)
    #: files past the round's byte budget, not read: to flush in a later round
    later: list[str] = dataclasses.field(default_factory=list)


def flush_many(
    db: database.Database,
    file_locks: locks.FileLocks,
    data_dir: Path,
    file_ids: list[str],
    *,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    run: Runner = serially,
    fault: FaultHook = _no_fault,
) -> Round:
    """One flush round (docs/design.md §3, batched flushes): the journal rows of many files
    written to them, with one read snapshot and one commit for all.

    The same protocol as :func:`flush`, file by file, with the steps shared: the files' locks
    (the ones free now), one read snapshot of their rows and journal batches, one write and
    ``fdatasync`` per file (through ``run``: in parallel, the disk takes concurrent syncs
    about as fast as one), then one lazy commit of every file's fenced advance, journal
    deletion and catalog rows. Only files in the plain state take part: a file that needs
    more than a write (a torn tail, a hole, a journal gap, an archive to restore, a redaction
    to finish) or whose write failed goes to :attr:`Round.alone`, for :func:`flush`. The round
    reads about ``chunk_bytes`` in all (one journal row per file at least), so its memory is
    that of one flush; the files past it are :attr:`Round.later`. If the commit fails, every
    written file is flushed alone: its bytes past ``flushed_bytes`` were never committed, and
    :func:`flush` cuts them and writes them again.
    """
    done = Round()
    with file_locks.hold_many(file_ids) as (locked, busy):
        done.alone.extend(busy)
        fault("locked")
        started = time.perf_counter()
        todo: list[tuple[tables.FileRow, list[tables.JournalRow], _Tail]] = []
        settle: list[tables.FileRow] = []  #: pending files with nothing to write
        budget = chunk_bytes
        with db.reading(held=True) as conn:
            for file_id in locked:
                if budget <= 0:
                    done.later.append(file_id)
                    continue
                row, unfinished = audit.file_and_pending(conn, file_id)
                if row is None or row.status == Status.ARCHIVED or unfinished:
                    done.alone.append(file_id)
                    continue
                upto = row.next_seq - 1
                batch = ledger.journal_batch(conn, file_id, row.flushed_seq, budget, upto=upto)
                if not batch:
                    if row.flush_pending:
                        settle.append(row)
                    else:
                        done.results[file_id] = FlushResult(
                            file_id, 0, 0, row.flushed_seq, row.status
                        )
                    continue
                budget -= sum(entry.size for entry in batch)
                todo.append((row, batch, _tail(conn, row)))
        fault("read")
        chunks: list[tuple[Path, _Chunk, bool]] = []
        paths = store.CheckedDirs(data_dir)  # under the round's locks: each directory once
        for row, batch, tail in todo:
            try:
                path = paths.path(row.path)
                current = store.size(path)
                if (current or 0) != row.flushed_bytes or _gap(row, batch) is not None:
                    done.alone.append(row.file_id)
                    continue
                before = _before(path, row, tail)
                chunk = _prepare(row, batch, before, postgres=db.postgres)
                chunks.append((path, chunk, current is not None))
            except errors.SgmeError:
                done.alone.append(row.file_id)
        outcomes = run(
            [
                functools.partial(_write, path, chunk, exists=exists)
                for path, chunk, exists in chunks
            ]
        )
        written = [
            chunk for (_, chunk, _), error in zip(chunks, outcomes, strict=True) if not error
        ]
        done.alone.extend(c.row.file_id for (_, c, _), e in zip(chunks, outcomes, strict=True) if e)
        fault("written")
        now = db.now()

        # each file's row updated in file order, as every group takes its locks
        # (pipeline.database.commits)
        steps: dict[str, Callable[[sa.Connection], Any]] = {
            **{
                row.file_id: functools.partial(index.settle_flush, file_id=row.file_id)
                for row in settle
            },
            **{chunk.row.file_id: functools.partial(chunk.advance, now=now) for chunk in written},
        }

        def commit(conn: sa.Connection) -> tuple[list[bool], list[int | None]]:
            done = {file_id: steps[file_id](conn) for file_id in sorted(steps)}
            settled = [done[row.file_id] for row in settle]
            advanced = [done[chunk.row.file_id] for chunk in written]
            applied(conn, [c for c, seq in zip(written, advanced, strict=True) if seq is not None])
            return settled, advanced

        try:
            settled, advanced = db.commit(commit, durable=False, key=min(steps, default=None))
        except errors.SgmeError:
            done.alone.extend(chunk.row.file_id for chunk in written)
            done.alone.extend(row.file_id for row in settle)
            return done
        fault("committed")
        for row, was_settled in zip(settle, settled, strict=True):
            # not settled: an append came meanwhile and its ingest did not kick the file
            more = not was_settled
            done.results[row.file_id] = FlushResult(
                row.file_id, 0, 0, row.flushed_seq, row.status, more=more
            )
        for chunk, next_seq in zip(written, advanced, strict=True):
            old = chunk.row
            if next_seq is None:  # cannot happen under the lock; flush() looks again
                done.alone.append(old.file_id)
                continue
            row = chunk.advanced()
            _keep(row, chunk.cataloged.recent)
            done.results[old.file_id] = FlushResult(
                old.file_id,
                row.flushed_seq - old.flushed_seq,
                len(chunk.data),
                row.flushed_seq,
                Status.NEW,
                more=next_seq - 1 > row.flushed_seq,
                unrefined=row.flushed_seq - row.last_refined_seq,
                leased_until=row.refine_lease_until,
            )
        for row, batch, _ in todo:
            if row.file_id in done.results:
                for entry in batch:
                    metrics.ACK_TO_FLUSH_SECONDS.observe((now - entry.created_at).total_seconds())
        if written:
            metrics.FLUSH_SECONDS.observe(time.perf_counter() - started)
    return done


def follow_up(
    results: list[FlushResult], *, refine: Refine, now: dt.datetime
) -> tuple[list[str], list[str]]:
    """What must follow these flushes: the files to kick again (appends acknowledged during
    their flush, whose ingest did not kick), and the files whose refinement became due by
    message count (due by idleness, the beat's periodic dispatch finds them)."""
    again = [result.file_id for result in results if result.more]
    due = []
    for result in results:
        leased = result.leased_until is not None and result.leased_until > now
        if (
            result.messages == 0
            or leased  # a job is running; it dispatches the file again when it commits
            or (result.unrefined < refine.min_messages and refine.idle_seconds > 0)
        ):
            continue
        due.append(result.file_id)
    return again, due


def stale_files(db: database.Database, *, age: float) -> list[str]:
    """Files whose journal rows have waited ``age`` seconds or more (the sweeper's list); with
    ``age`` 0, every file with journal rows, however young (a restart: no kick is on its way
    for any of them)."""
    older_than = db.now() - dt.timedelta(seconds=age) if age > 0 else None
    with db.reading() as conn:
        return ledger.stale_journal_files(conn, older_than)
