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
import operator
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
from pipeline.settings import Backlog
from pipeline.tables import Kind, Status

#: a fault-injection hook: called with a step name at each step of a flush (tests use it)
FaultHook = Callable[[str], None]
FLUSH_STEPS = ("locked", "read", "truncated", "written", "committed")
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
    #: the last seq acknowledged when the round read the file (:func:`flush` writes up to it)
    acknowledged: int = 0


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


def _check_file(
    db: database.Database, path_of: Callable[[str], Path], row: tables.FileRow, fault: FaultHook
) -> tuple[Path, int | None]:
    """The file's path and length, once it is exactly what was committed: a torn tail left by
    a crash is cut (the journal proves it was never acknowledged); a missing or shorter file
    is damage, and nothing is written past a hole. The length is None when the file does not
    exist yet."""
    expected = row.flushed_bytes
    try:
        path = path_of(row.path)
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
    batch: list[tables.JournalRow]  #: the journal rows it was made of

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
    return _Chunk(row, data, found, seq, head.hex(), ended_at, cataloged, batch)


def _write(path: Path, chunk: _Chunk, *, exists: bool) -> None:
    """Write a chunk after the committed bytes and make it durable (a new file with
    ``O_EXCL``, and its directory entry)."""
    if not exists:
        store.create(path, chunk.data)
    else:
        store.append(path, chunk.data, expected_size=chunk.row.flushed_bytes)
        if chunk.row.flushed_bytes == 0:
            store.fsync_dir(path.parent)


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
    """What one :func:`flush_files` did with the files it was given: each one's result or
    error, and what is left of them (:attr:`left`) for the caller to run again."""

    #: files written (one chunk each: ``more`` when acknowledged appends are left past it),
    #: or with nothing to write
    results: dict[str, FlushResult] = dataclasses.field(default_factory=dict)
    #: files that could not be written, each with its error: damaged (recorded as an
    #: anomaly), gone from the index, busy past the lock timeout in a round that waits for
    #: its lock, or whose write or commit failed in a round of one file
    errors: dict[str, Exception] = dataclasses.field(default_factory=dict)
    #: files to run again in a round of their own, which waits for the lock: another thread
    #: or process held the lock, or the file's write or the shared commit failed in a round
    #: of several (its bytes past ``flushed_bytes`` were never committed: that round cuts
    #: them and writes them again, or reports why not)
    again: list[str] = dataclasses.field(default_factory=list)
    #: files past the round's byte budget, not read: to flush in a later round
    later: list[str] = dataclasses.field(default_factory=list)

    @property
    def left(self) -> list[str]:
        """The files this round did not finish: :attr:`again`, :attr:`later`, and the ones
        written with acknowledged appends left past them (``more``)."""
        more = [file_id for file_id, result in self.results.items() if result.more]
        return [*self.again, *self.later, *more]


def flush_files(
    db: database.Database,
    file_locks: locks.FileLocks,
    data_dir: Path,
    file_ids: list[str],
    *,
    chunk_bytes: int = Backlog.flush_chunk_bytes,
    run: Runner = serially,
    fault: FaultHook = _no_fault,
    wait: bool = False,
) -> Round:
    """One flush round (docs/design.md §3) over any set of files: the journal rows of each
    written to it, with one read snapshot and one commit for all; a round of one file is the
    same code.

    The steps, shared by the files: their locks (with ``wait``, a round of one file waits for
    its lock; otherwise the ones free now take part and the others are :attr:`Round.again`);
    one read snapshot of their rows and journal batches; the repair of each file that needs
    it (a redaction a crash interrupted is finished, an archive restored, a torn tail cut; a
    hole, a journal gap or a failed restore recorded as damage and the file's error); one
    write and ``fdatasync`` per file (through ``run``: in parallel, the disk takes concurrent
    syncs about as fast as one); then one lazy commit of every file's fenced advance, journal
    deletion and catalog rows. The round reads about ``chunk_bytes`` in all (one journal row
    per file at least), so its memory is that of one chunk; the files past it are
    :attr:`Round.later`. Each file written gets one chunk: ``more`` when acknowledged appends
    are left, which the caller runs again (:attr:`Round.left`); :func:`flush` loops.
    """
    if not wait:
        with file_locks.hold_many(file_ids) as (locked, busy):
            done = Round(again=list(busy))
            return _locked_round(db, data_dir, locked, done, chunk_bytes, run, fault)
    (file_id,) = file_ids
    taken = False
    try:
        with file_locks.hold(file_id):
            taken = True
            return _locked_round(db, data_dir, file_ids, Round(), chunk_bytes, run, fault)
    except errors.LockTimeout as exc:
        if taken:
            raise
        return Round(errors={file_id: exc})


def _locked_round(
    db: database.Database,
    data_dir: Path,
    locked: list[str],
    done: Round,
    chunk_bytes: int,
    run: Runner,
    fault: FaultHook,
) -> Round:
    """The steps of :func:`flush_files` under the locks of ``locked`` (``done`` holds what
    the locks left already)."""
    several = len(locked) + len(done.again) > 1
    fault("locked")
    started = time.perf_counter()
    todo: list[tuple[tables.FileRow, list[tables.JournalRow], _Tail]] = []
    settle: list[tables.FileRow] = []  #: pending files with nothing to write
    unfinished: list[str] = []  #: files with a redaction to finish
    budget = chunk_bytes
    with db.reading(held=True) as conn:
        for file_id in locked:
            if budget <= 0:
                done.later.append(file_id)
            elif (read := _read(conn, file_id, budget, done)) is not None:
                if isinstance(read, str):
                    unfinished.append(file_id)
                elif read[1]:
                    budget -= sum(entry.size for entry in read[1])
                    todo.append(read)
                elif read[0].flush_pending:
                    settle.append(read[0])
    for file_id in unfinished:
        # A redaction a crash interrupted is finished before anything is appended (the
        # file and its index row may be one step apart until then: pipeline.rewrite).
        try:
            rewrite.settle_locked(db, data_dir, file_id)
            with db.reading(held=True) as conn:
                read = _read(conn, file_id, max(budget, 1), done, settled=True)
        except errors.SgmeError as exc:  # this file's, not the round's
            done.errors[file_id] = exc
            continue
        if read is not None and not isinstance(read, str):
            if read[1]:
                budget -= sum(entry.size for entry in read[1])
                todo.append(read)
            elif read[0].flush_pending:
                settle.append(read[0])
    fault("read")
    chunks: list[tuple[Path, _Chunk, bool]] = []
    # the files' paths, their directories checked for symlinks under the round's locks: each
    # directory once in a round of several (store.CheckedDirs)
    path_of = (
        store.CheckedDirs(data_dir).path if several else functools.partial(store.checked, data_dir)
    )
    for row, batch, tail in todo:
        try:
            chunks.append(_ready(db, data_dir, path_of, row, batch, tail, fault))
        except errors.SgmeError as exc:
            done.errors[row.file_id] = exc
    if not chunks and not settle:
        return done
    outcomes: list[BaseException | None] = [None]
    if len(chunks) == 1:  # a round of one file syncs on the calling thread
        path, chunk, exists = chunks[0]
        try:
            _write(path, chunk, exists=exists)
        except Exception as exc:
            outcomes = [exc]
    else:
        outcomes = run(
            [functools.partial(_write, p, chunk, exists=exists) for p, chunk, exists in chunks]
        )
    written = []
    for (_, chunk, _), error in zip(chunks, outcomes, strict=True):
        if error is None:
            written.append(chunk)
        else:
            _failed(done, chunk.row.file_id, error, several=several)
    if not written and not settle:
        return done
    fault("written")
    now = db.now()
    try:
        settled, advanced = _commit(db, settle, written, now)
    except errors.SgmeError as exc:
        for file_id in [*(c.row.file_id for c in written), *(r.file_id for r in settle)]:
            _failed(done, file_id, exc, several=several)
        return done
    fault("committed")
    for row, was_settled in zip(settle, settled, strict=True):
        # not settled: an append came meanwhile and its ingest did not kick the file
        done.results[row.file_id] = FlushResult(
            row.file_id,
            0,
            0,
            row.flushed_seq,
            row.status,
            more=not was_settled,
            acknowledged=row.flushed_seq,
        )
    for chunk, next_seq in zip(written, advanced, strict=True):
        old = chunk.row
        if next_seq is None:  # cannot happen under the lock
            conflict = errors.Conflict(f"file {old.file_id} was flushed by someone else")
            _failed(done, old.file_id, conflict, several=several)
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
            acknowledged=old.next_seq - 1,
        )
        for entry in chunk.batch:
            metrics.ACK_TO_FLUSH_SECONDS.observe((now - entry.created_at).total_seconds())
    if written:
        metrics.FLUSH_SECONDS.observe(time.perf_counter() - started)
    return done


def _read(
    conn: sa.Connection, file_id: str, budget: int, done: Round, *, settled: bool = False
) -> tuple[tables.FileRow, list[tables.JournalRow], _Tail] | str | None:
    """A file's part of the round's snapshot: its row, its first journal rows up to the last
    seq acknowledged now (what comes later is the caller's to run again) and its last
    messages (:func:`_tail`: their catalog rows, or what the last flush kept of them).
    ``"unfinished"`` while a redaction of the file is unfinished (unless ``settled``: finished
    just now); None, with the file's result or error in ``done``, when there is nothing more
    to do."""
    row, pending = audit.file_and_pending(conn, file_id)
    if pending and not settled:
        return "unfinished"
    if row is None:
        done.errors[file_id] = errors.NotFound(f"no file {file_id}")
        return None
    batch = ledger.journal_batch(conn, file_id, row.flushed_seq, budget, upto=row.next_seq - 1)
    if not batch and not row.flush_pending:
        done.results[file_id] = FlushResult(
            file_id, 0, 0, row.flushed_seq, row.status, acknowledged=row.flushed_seq
        )
        return None
    return row, batch, _tail(conn, row) if batch else []


def _ready(
    db: database.Database,
    data_dir: Path,
    path_of: Callable[[str], Path],
    row: tables.FileRow,
    batch: list[tables.JournalRow],
    tail: _Tail,
    fault: FaultHook,
) -> tuple[Path, _Chunk, bool]:
    """A file's chunk, ready to write, once the file is repaired if it needs it (an archive
    restored, a torn tail cut: :func:`_check_file`) and its journal rows continue it; its
    path, and whether it exists. Damage is recorded and raised (:class:`errors.FileDamaged`)."""
    if row.status == Status.ARCHIVED:
        # An append to an archived session brings the file back first (docs/design.md §5).
        try:
            row = archive.restore_locked(db, data_dir, row)
        except errors.FileDamaged as exc:
            # Stay archived (reads keep decompressing); the appends wait in the journal.
            raise _damaged(
                db, row.file_id, Kind.RESTORE_FAILED, exc.detail, mark_error=False
            ) from None
    path, current = _check_file(db, path_of, row, fault)
    gap = _gap(row, batch)
    if gap is not None:
        raise _damaged(db, row.file_id, Kind.JOURNAL_GAP, gap)
    # the restore of an archive keeps every offset: the tail read before it holds
    before = _before(path, row, tail)
    return path, _prepare(row, batch, before, postgres=db.postgres), current is not None


def _failed(done: Round, file_id: str, error: BaseException, *, several: bool) -> None:
    """A file whose write or commit failed: in a round of several, to run again on its own
    (:attr:`Round.again`); in a round of one, that is its error."""
    if several:
        done.again.append(file_id)
    elif isinstance(error, Exception):
        done.errors[file_id] = error
    else:  # KeyboardInterrupt and the like are not a file's outcome
        raise error


def _commit(
    db: database.Database, settle: list[tables.FileRow], written: list[_Chunk], now: dt.datetime
) -> tuple[list[bool], list[int | None]]:
    """The round's one lazy commit: each pending file with nothing to write settled, each
    written chunk's fenced advance (each file's row updated in file order, as every group
    takes its locks: pipeline.database.commits), and what follows the advances (:func:`applied`).
    Whether each pending file settled, and each chunk's file's ``next_seq`` (None: advanced
    by someone else meanwhile, nothing changed)."""
    steps: list[tuple[str, Callable[[sa.Connection], Any]]] = [
        (row.file_id, functools.partial(index.settle_flush, file_id=row.file_id)) for row in settle
    ]
    steps += [(chunk.row.file_id, functools.partial(chunk.advance, now=now)) for chunk in written]
    steps.sort(key=operator.itemgetter(0))

    def commit(conn: sa.Connection) -> tuple[list[bool], list[int | None]]:
        got = {file_id: step(conn) for file_id, step in steps}
        advanced = [got[chunk.row.file_id] for chunk in written]
        applied(conn, [c for c, seq in zip(written, advanced, strict=True) if seq is not None])
        return [got[row.file_id] for row in settle], advanced

    result: tuple[list[bool], list[int | None]] = db.commit(commit, durable=False, key=steps[0][0])
    return result


def flush(
    db: database.Database,
    file_locks: locks.FileLocks,
    data_dir: Path,
    file_id: str,
    *,
    chunk_bytes: int = Backlog.flush_chunk_bytes,
    fault: FaultHook = _no_fault,
) -> FlushResult:
    """Write every journal row of ``file_id`` acknowledged when it starts to its file, once:
    rounds of one file (:func:`flush_files`, waiting for the file's lock) until they are
    written; the file's error raised.

    Idempotent: running it twice, concurrently or after a crash at any point, leaves each
    acknowledged message in the file exactly once and in seq order. The backlog goes out in
    chunks of about ``chunk_bytes`` (one journal row at least), each written, fsynced and
    committed before the next is read: memory stays bounded, and after a full disk the
    backlog drains as space frees instead of needing room for all of it at once. What came
    after it started is the caller's to flush again (``result.more``), so a busy session
    cannot keep one flush going for ever.
    """
    first: FlushResult | None = None
    messages = size = 0
    while True:
        done = flush_files(
            db, file_locks, data_dir, [file_id], chunk_bytes=chunk_bytes, fault=fault, wait=True
        )
        if file_id in done.errors:
            raise done.errors[file_id]
        result = done.results[file_id]
        if first is None:
            first = result
        messages, size = messages + result.messages, size + result.bytes
        if not result.messages or result.flushed_seq >= first.acknowledged:
            if result is first:
                return result
            return dataclasses.replace(result, messages=messages, bytes=size)


def stale_files(db: database.Database, *, age: float) -> list[str]:
    """Files whose journal rows have waited ``age`` seconds or more (the sweeper's list); with
    ``age`` 0, every file with journal rows, however young (a restart: no kick is on its way
    for any of them)."""
    older_than = db.now() - dt.timedelta(seconds=age) if age > 0 else None
    with db.reading() as conn:
        return ledger.stale_journal_files(conn, older_than)
