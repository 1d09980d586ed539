"""Cold archive (docs/design.md §5): compress, verify, restore.

Fully refined files unchanged for ``archive_after_days`` are compressed with zstd (content
checksum on) to ``raw/archive/YYYY-MM/{file_id}.md.zst``. The steps, in this order: write a
temp file; verify it (read back, decompressed, compared byte for byte with the original);
fsync it; rename it into place and fsync the directory; mark the row ``archived`` with the new
path; delete the original. A crash at any step leaves the original or a verified archive
(usually both), never neither and never a half file under the final name; running again
finishes or cleans up. Reads decompress on demand; an append restores the file first.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import datetime as dt
import functools
import hashlib
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

import sqlalchemy as sa
import zstandard

from pipeline import anomalies, database, document, errors, index, locks, store, tables
from pipeline.settings import Archive
from pipeline.tables import Kind, Status

CHUNK = 1 << 20  #: bytes per read while streaming
#: bytes up to which a temp file is verified in memory (read back whole, decompressed in one
#: call, compared with one memcmp); a larger one is streamed, in bounded memory
VERIFY_IN_MEMORY = 64 << 20
ARCHIVE_STEPS = ("temp_written", "verified", "renamed", "indexed", "deleted")
FaultHook = Callable[[str], None]


def _no_fault(step: str) -> None:
    return None


_contexts = threading.local()  # zstd contexts of this thread: made once, not once a file


def _compressor(options: Archive) -> zstandard.ZstdCompressor:
    key = (options.level, options.threads)
    found: dict[tuple[int, int], zstandard.ZstdCompressor] = _contexts.__dict__.setdefault(
        "compressors", {}
    )
    if key not in found:
        found[key] = zstandard.ZstdCompressor(
            level=options.level, write_checksum=True, threads=options.threads
        )
    return found[key]


def _decompressor() -> zstandard.ZstdDecompressor:
    found: zstandard.ZstdDecompressor | None = getattr(_contexts, "decompressor", None)
    if found is None:
        found = _contexts.decompressor = zstandard.ZstdDecompressor()
    return found


def archive_relative_path(row: tables.FileRow) -> str:
    """``raw/archive/YYYY-MM/{file_id}.md.zst``, YYYY-MM of started_at."""
    return f"raw/archive/{row.started_at:%Y-%m}/{row.file_id}.md.zst"


def live_relative_path(row: tables.FileRow) -> str:
    """Where the file lives when it is not archived."""
    return store.relative_path(row.source_type, row.file_id)


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What archiving one file did."""

    file_id: str
    bytes_before: int
    bytes_after: int


# ---------------------------------------------------------------------------------------------
# reading


def _chunks(handle: BinaryIO, limit: int | None = None) -> Iterator[bytes]:
    left = limit
    while left is None or left > 0:
        chunk = handle.read(CHUNK if left is None else min(CHUNK, left))
        if not chunk:
            return
        if left is not None:
            left -= len(chunk)
        yield chunk


def _decompressed_chunks(
    path: Path, decompressor: zstandard.ZstdDecompressor | None = None
) -> Iterator[bytes]:
    """The archive's content, streamed; FileDamaged for a corrupt or truncated frame. A given
    ``decompressor`` must serve no other stream until this one is done."""
    with store.reader(path) as handle:
        try:
            with (decompressor or zstandard.ZstdDecompressor()).stream_reader(handle) as stream:
                yield from _chunks(stream)
        except zstandard.ZstdError as exc:
            raise errors.FileDamaged(f"archive {path.name} is corrupt: {exc}") from None


def read_path(path: Path) -> bytes:
    """The whole content of an archive file (``reindex`` reads them without an index row)."""
    return b"".join(_decompressed_chunks(path))


def stream_archived(data_dir: Path, row: tables.FileRow, *, chunk: int = CHUNK) -> Iterator[bytes]:
    """The original bytes of an archived file, decompressed as they are read (the archive is
    opened before the first chunk: a missing one is an error the caller can still answer)."""
    handle = store.open_read(store.checked(data_dir, row.path))
    return _stream(handle, row, chunk)


def _stream(handle: BinaryIO, row: tables.FileRow, chunk: int) -> Iterator[bytes]:
    with handle:
        try:
            with zstandard.ZstdDecompressor().stream_reader(handle) as stream:
                left = row.flushed_bytes
                while left > 0:
                    data = stream.read(min(chunk, left))
                    if not data:
                        raise errors.FileDamaged(f"archive of {row.file_id} ends early")
                    left -= len(data)
                    yield data
        except zstandard.ZstdError as exc:
            raise errors.FileDamaged(f"archive of {row.file_id} is corrupt: {exc}") from None


def read_range(data_dir: Path, row: tables.FileRow, offset: int, length: int) -> bytes:
    """``length`` bytes of an archived file's original from ``offset``: decompressed as a
    stream up to them (a zstd frame cannot be entered in the middle), in bounded memory."""
    wanted = []
    position = 0
    for chunk in stream_archived(data_dir, row):
        end = position + len(chunk)
        if end > offset:
            wanted.append(chunk[max(0, offset - position) : offset + length - position])
        position = end
        if position >= offset + length:
            break
    return b"".join(wanted)


def read_archived(data_dir: Path, row: tables.FileRow) -> bytes:
    """The original bytes of an archived file, checked against the committed length."""
    data = b"".join(_decompressed_chunks(store.checked(data_dir, row.path)))
    if len(data) != row.flushed_bytes:
        raise errors.FileDamaged(
            f"archive of {row.file_id} holds {len(data)} bytes, {row.flushed_bytes} were committed"
        )
    return data


def _digest(chunks: Iterator[bytes]) -> tuple[str, int]:
    sha = hashlib.sha256()
    size = 0
    for chunk in chunks:
        sha.update(chunk)
        size += len(chunk)
    return sha.hexdigest(), size


# ---------------------------------------------------------------------------------------------
# choosing files


def _cutoff(db: database.Database, older_than_days: float) -> dt.datetime:
    return db.now() - dt.timedelta(days=older_than_days)


def cold_files(db: database.Database, *, older_than_days: float, limit: int = 1000) -> list[str]:
    """Fully refined files with nothing pending, unchanged for ``older_than_days``."""
    with db.reading() as conn:
        return index.cold_files(conn, cutoff=_cutoff(db, older_than_days), limit=limit)


def flag_unrefined(db: database.Database, *, older_than_days: float) -> list[str]:
    """Give each cold file that was never fully refined an ``unrefined_cold`` anomaly (once)."""
    now = db.now()
    with db.transaction() as conn:
        rows = index.cold_unrefined(conn, cutoff=_cutoff(db, older_than_days))
        for row in rows:
            anomalies.record(
                conn,
                row.file_id,
                Kind.UNREFINED_COLD,
                f"cold but not archived: {row.status}, refined up to seq "
                f"{row.last_refined_seq} of {row.flushed_seq}",
                now=now,
            )
    return [row.file_id for row in rows]


# ---------------------------------------------------------------------------------------------
# compress


@dataclasses.dataclass(frozen=True)
class _Packed:
    """A file compressed and verified under a temp name, not yet in place."""

    row: tables.FileRow
    original: Path
    temp: Path
    final: Path
    relative: str  #: the final path, relative to the data directory (the index's)
    size: int  #: bytes of the archive
    written: store.NewFile  #: the temp file, still open: fsynced through it, then closed


def _eligible(data_dir: Path, row: tables.FileRow) -> bool:
    """Whether the locked ``row`` is to be archived now (an archived one whose original
    survived a crash is finished on the way)."""
    if row.status == Status.ARCHIVED:
        _finish(data_dir, row)
        return False
    return row.status == Status.REFINED and row.next_seq == row.flushed_seq + 1


def _pack(
    paths: store.CheckedDirs,
    row: tables.FileRow,
    options: Archive,
    fault: FaultHook,
    opened: list[store.NewFile],
) -> _Packed:
    """The steps before the rename, under the file's lock: check the original against the
    index, compress it to a temp file and verify what the file holds (fsynced later, with the
    batch: :func:`_sync`). The temp file stays open, and is put in ``opened`` for the batch
    to close whatever happens."""
    original = paths.path(row.path)
    relative = archive_relative_path(row)
    final = paths.path(relative)
    temp = final.with_name(f".{final.name}.tmp")
    # Left by a crash before the index pointed at them: never committed, start over.
    store.remove(temp)
    store.remove(final)

    # One read: the chain check needs the whole file anyway (memory ~ 1.3x its size).
    data = store.read(original)
    if len(data) != row.flushed_bytes:
        raise errors.FileDamaged(
            f"file {row.file_id} is {len(data)} bytes, {row.flushed_bytes} committed; run sgme fsck"
        )
    head, _ = document.chain(data)
    if head.hex() != row.chain_head:
        raise errors.FileDamaged(f"file {row.file_id} fails its hash chain; run sgme fsck")
    try:
        packed = _compressor(options).compress(data)
    except zstandard.ZstdError as exc:
        raise errors.StorageUnavailable(f"compressing {row.file_id} failed: {exc}") from None
    # fsynced with the batch's other temps, before any of them is renamed (_sync)
    written = store.NewFile(temp, packed)
    opened.append(written)
    size = len(packed)
    del packed  # what is verified is what the file holds, read back, not this
    fault("temp_written")
    if not _verified(written, data):
        written.close()
        store.remove(temp)
        raise errors.FileDamaged(f"archive of {row.file_id} did not verify; original kept")
    fault("verified")
    return _Packed(row, original, temp, final, relative, size, written)


def _verified(written: store.NewFile, data: bytes) -> bool:
    """Whether the temp file holds one zstd frame of exactly ``written.size`` bytes whose
    content is exactly ``data``: read back through the descriptor that wrote it, decompressed
    (which checks the frame's content checksum too) and compared byte for byte. The frame
    header's content size is checked first, so a damaged header cannot make the decompressor
    allocate what it claims."""
    if len(data) > VERIFY_IN_MEMORY:
        return _same(_decompressed_chunks(written.path, _decompressor()), data)
    raw = written.read_back()
    try:
        if len(raw) != written.size or zstandard.frame_content_size(raw) != len(data):
            return False
        return bool(_decompressor().decompress(raw) == data)
    except zstandard.ZstdError:
        return False


def _sync(packed: _Packed) -> errors.SgmeError | None:
    """fsync a packed file's temp file (through the descriptor that wrote it) and close it;
    the error (its temp removed) if that failed."""
    try:
        packed.written.sync()
    except errors.SgmeError as exc:
        packed.written.close()
        with contextlib.suppress(errors.SgmeError):
            store.remove(packed.temp)
        return exc
    packed.written.close()
    return None


def _same(chunks: Iterable[bytes], data: bytes) -> bool:
    """Whether ``chunks`` add up to exactly ``data`` (compared as they come: no copy)."""
    view = memoryview(data)
    position = 0
    for chunk in chunks:
        end = position + len(chunk)
        if end > len(data) or view[position:end] != chunk:
            return False
        position = end
    return position == len(data)


def _settle(packed: _Packed, updated: bool, fault: FaultHook) -> Outcome | None:
    """After the index update: delete the original, or the archive when the update was
    refused (an append or a re-refine came in meanwhile: the original stays)."""
    if not updated:
        store.remove(packed.final)
        return None
    fault("indexed")
    # Not fsynced: if a crash undoes the unlink, finish_interrupted removes it again.
    store.remove(packed.original, durable=False)
    fault("deleted")
    return Outcome(packed.row.file_id, packed.row.flushed_bytes, packed.size)


def _mark_all(conn: sa.Connection, packed: Sequence[_Packed], now: dt.datetime) -> list[bool]:
    return [index.mark_archived(conn, p.row, path=p.relative, now=now) for p in packed]


def compress(
    db: database.Database,
    file_locks: locks.FileLocks,
    data_dir: Path,
    file_id: str,
    options: Archive = Archive(),  # noqa: B008 - a frozen value
    *,
    fault: FaultHook = _no_fault,
) -> Outcome | None:
    """Archive one file; None when it is no longer eligible (changed, already archived)."""
    ((_, outcome),) = compress_many(db, file_locks, data_dir, [file_id], options, fault=fault)
    if isinstance(outcome, errors.SgmeError):
        raise outcome
    return outcome


BATCH = 64  #: files :func:`compress_many` locks, renames and commits together
Result = Outcome | errors.SgmeError | None


def compress_many(
    db: database.Database,
    file_locks: locks.FileLocks,
    data_dir: Path,
    file_ids: Sequence[str],
    options: Archive = Archive(),  # noqa: B008 - a frozen value
    *,
    fault: FaultHook = _no_fault,
) -> Iterator[tuple[str, Result]]:
    """:func:`compress` over many files; yields each file's outcome, or the error that
    stopped it. The files go in batches of :data:`BATCH`: a batch's files are locked
    together, compressed ``workers`` at a time, largest first (zstd releases the GIL), each
    temp file's fsync started as soon as it is verified (``sync_threads`` at a time), renamed
    once that fsync has returned, their directories fsynced once, and their index rows
    updated in one commit — each file still takes every step of :func:`compress` in the same
    order."""
    with (
        concurrent.futures.ThreadPoolExecutor(max(1, options.workers)) as pool,
        concurrent.futures.ThreadPoolExecutor(max(1, options.sync_threads)) as syncs,
    ):
        for start in range(0, len(file_ids), BATCH):
            batch = file_ids[start : start + BATCH]
            yield from _compress_batch(db, file_locks, data_dir, batch, options, pool, syncs, fault)


def _compress_batch(
    db: database.Database,
    file_locks: locks.FileLocks,
    data_dir: Path,
    file_ids: Sequence[str],
    options: Archive,
    packers: concurrent.futures.Executor,
    syncers: concurrent.futures.Executor,
    fault: FaultHook,
) -> list[tuple[str, Result]]:
    """Archive ``file_ids`` together; ``packers`` run the packing of the eligible files and
    ``syncers`` the temp files' fsyncs."""
    outcomes: dict[str, Result] = {}
    opened: list[store.NewFile] = []  # temp files still open, closed whatever happens
    packing: list[concurrent.futures.Future[_Packed | errors.SgmeError]] = []
    syncing: dict[str, concurrent.futures.Future[errors.SgmeError | None]] = {}
    paths = store.CheckedDirs(data_dir)  # under the batch's locks: each directory checked once

    def pack(row: tables.FileRow) -> _Packed | errors.SgmeError:
        try:
            packed = _pack(paths, row, options, fault, opened)
        except errors.SgmeError as exc:
            return exc
        # Its fsync starts now: the wait overlaps the packing of the batch's other files.
        syncing[row.file_id] = syncers.submit(_sync, packed)
        return packed

    try:
        with file_locks.hold_many(file_ids) as (locked, busy):
            outcomes.update(busy)  # a busy file waits for the next run
            with db.reading() as conn:
                rows = {f: index.get_file(conn, f) for f in locked}
            ready = []
            for file_id, row in rows.items():
                try:
                    if row is None:
                        raise errors.NotFound(f"no file {file_id}")
                    if _eligible(data_dir, row):
                        ready.append(row)
                    else:
                        outcomes[file_id] = None
                except errors.SgmeError as exc:
                    outcomes[file_id] = exc
            # Largest first: the batch waits for its slowest file, and a large one started
            # last would keep one worker busy while the others wait with nothing to do.
            ready.sort(key=lambda row: row.flushed_bytes, reverse=True)
            packing.extend(packers.submit(pack, row) for row in ready)
            packed = []
            for row, future in zip(ready, packing, strict=True):
                result = future.result()
                if isinstance(result, errors.SgmeError):
                    outcomes[row.file_id] = result
                else:
                    packed.append(result)
            placed = []
            # Every temp file is on stable storage before it is renamed: its fsync is waited
            # for here (they run in parallel, sharing the filesystem's journal commits).
            for p in packed:
                try:
                    failed = syncing[p.row.file_id].result()
                    if failed is not None:
                        raise failed
                    store.rename(p.temp, p.final, durable=False)
                    placed.append(p)
                except errors.SgmeError as exc:
                    outcomes[p.row.file_id] = exc
            for folder in {p.final.parent for p in placed}:
                store.fsync_dir(folder)
            fault("renamed")
            now = db.now()
            placed.sort(key=lambda p: p.row.file_id)  # the order of every group's row locks
            mark = functools.partial(_mark_all, packed=placed, now=now)
            updated = db.commit(mark, key=placed[0].row.file_id) if placed else []
            for p, ok in zip(placed, updated, strict=True):
                try:
                    outcomes[p.row.file_id] = _settle(p, ok, fault)
                except errors.SgmeError as exc:  # archived; finish_interrupted deletes it later
                    outcomes[p.row.file_id] = exc
    except errors.SgmeError as exc:  # the batch's own step failed: its files wait for a retry
        for file_id in file_ids:
            outcomes.setdefault(file_id, exc)
    finally:
        # Nothing may still write or fsync a temp file when it is closed (a crash of one
        # file's packing leaves the others' running).
        concurrent.futures.wait(packing)
        concurrent.futures.wait(list(syncing.values()))
        for written in opened:
            written.close()
    return [(file_id, outcomes[file_id]) for file_id in file_ids]


@dataclasses.dataclass
class Report:
    """What one archiving run did."""

    cleaned_up: int = 0
    unrefined_flagged: int = 0
    files: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    failed: list[tuple[str, str]] = dataclasses.field(default_factory=list)

    @property
    def ratio(self) -> float | None:
        """Compression ratio of the files archived in this run."""
        return round(self.bytes_before / self.bytes_after, 2) if self.bytes_after else None


def archive_cold(
    db: database.Database,
    file_locks: locks.FileLocks,
    data_dir: Path,
    options: Archive = Archive(),  # noqa: B008 - a frozen value
    *,
    older_than_days: float | None = None,
    progress: Callable[[int], None] | None = None,
) -> Report:
    """The daily job: finish interrupted runs, flag cold unrefined files, archive cold ones
    (unchanged for ``older_than_days``, by default ``options.after_days``).

    Idempotent, and safe when two run at once: each file is archived under its lock and the
    index update is fenced. A file that fails gets an ``archive_failed`` anomaly.
    """
    days = options.after_days if older_than_days is None else older_than_days
    report = Report(
        cleaned_up=finish_interrupted(db, file_locks, data_dir),
        unrefined_flagged=len(flag_unrefined(db, older_than_days=days)),
    )
    cold = cold_files(db, older_than_days=days, limit=1_000_000)
    for file_id, outcome in compress_many(db, file_locks, data_dir, cold, options):
        if isinstance(outcome, errors.SgmeError):
            report.failed.append((file_id, outcome.detail))
            with db.transaction() as conn:
                anomalies.record(conn, file_id, Kind.ARCHIVE_FAILED, outcome.detail, now=db.now())
        elif outcome is not None:
            report.files += 1
            report.bytes_before += outcome.bytes_before
            report.bytes_after += outcome.bytes_after
        if progress:
            progress(1)
    return report


def _finish(data_dir: Path, row: tables.FileRow) -> None:
    """An archived row whose original survived a crash: delete it once the archive verifies."""
    original = store.checked(data_dir, live_relative_path(row))
    if not store.exists(original):
        return
    archived_sha, size = _digest(_decompressed_chunks(store.checked(data_dir, row.path)))
    with store.reader(original) as src:
        original_sha, _ = _digest(_chunks(src, row.flushed_bytes))
    if archived_sha == original_sha and size == row.flushed_bytes:
        store.remove(original)


def finish_interrupted(db: database.Database, file_locks: locks.FileLocks, data_dir: Path) -> int:
    """Clean up after crashes: delete originals of archived rows (verified first). Returns how
    many were removed."""
    removed = 0
    for subdir in store.SUBDIRS.values():
        folder = store.checked_dir(data_dir, f"raw/{subdir}")
        if not folder.is_dir():
            continue
        names = [p.stem for p in folder.glob("*.md")]
        for start in range(0, len(names), 500):
            batch = names[start : start + 500]
            with db.reading() as conn:
                archived = index.archived_among(conn, batch)
            for file_id in archived:
                with file_locks.holding(file_id) as row:
                    if row.status == Status.ARCHIVED:
                        _finish(data_dir, row)
                        removed += 1
    return removed


# ---------------------------------------------------------------------------------------------
# restore


def restore(
    db: database.Database, file_locks: locks.FileLocks, data_dir: Path, file_id: str
) -> bool:
    """Move an archived file back to its live place; False if it was not archived."""
    with file_locks.holding(file_id) as row:
        if row.status != Status.ARCHIVED:
            return False
        restore_locked(db, data_dir, row)
        return True


def restore_locked(db: database.Database, data_dir: Path, row: tables.FileRow) -> tables.FileRow:
    """:func:`restore` for a caller that holds the file's lock; returns the updated row."""
    data = read_archived(data_dir, row)
    head, count = document.chain(data)
    if head.hex() != row.chain_head or count != row.flushed_seq:
        raise errors.FileDamaged(f"archive of {row.file_id} fails its hash chain; not restoring")
    live = store.checked(data_dir, live_relative_path(row))
    if store.exists(live):
        # A crash after the index update left the original: it is the same bytes or garbage.
        with store.reader(live) as handle:
            if handle.read() != data:
                raise errors.FileDamaged(
                    f"{live.name} exists and differs from the archive; resolve by hand"
                )
    else:
        temp = live.with_name(f".{live.name}.tmp")
        store.remove(temp)
        with store.exclusive_writer(temp) as handle:
            handle.write(data)
        store.rename(temp, live)
    with db.transaction() as conn:
        restored = index.mark_restored(
            conn, row.file_id, path=live_relative_path(row), now=db.now()
        )
    assert restored is not None
    store.remove(store.checked(data_dir, row.path))
    return restored
