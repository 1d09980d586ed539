"""Integrity: ``fsck`` (recompute every file's hash chain, length and message count against the
index) and ``reindex`` (rebuild ``raw_files`` from the files alone — the files are the truth).

fsck only reports; each problem is also written as an anomaly whose kind starts ``fsck_``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import json
import logging
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import sqlalchemy as sa

from pipeline import (
    anomalies,
    archive,
    audit,
    catalog,
    database,
    document,
    errors,
    flush,
    index,
    ledger,
    locks,
    overview,
    recovery,
    redaction,
    store,
    tables,
)
from pipeline.settings import Reindex
from pipeline.tables import Status

log = logging.getLogger(__name__)
Progress = Callable[[int], None]  #: called with the number of files just finished


class Finding(enum.StrEnum):
    """What fsck (and reindex) can find wrong with a file; recorded as the anomaly
    ``fsck_<finding>`` (``reindex_<finding>``)."""

    TRUNCATED = "truncated"  #: the file is shorter than its committed length
    UNCOMMITTED_TAIL = "uncommitted_tail"  #: bytes past the committed length
    FORMAT_ERROR = "format_error"  #: the committed bytes do not parse
    MESSAGE_COUNT = "message_count"  #: another number of messages than committed
    CHAIN_MISMATCH = "chain_mismatch"  #: the hash chain differs: changed behind the store's back
    HEADER_MISMATCH = "header_mismatch"  #: the frontmatter names another agent, source or session
    CATALOG_MISMATCH = "catalog_mismatch"  #: a catalog row does not describe its message's block
    SEARCH_INDEX_MISSING = "search_index_missing"  #: a cataloged message has no search terms
    MISSING = "missing"  #: an indexed file is gone
    ARCHIVE_CORRUPT = "archive_corrupt"  #: an archive fails to decompress or verify
    UNREADABLE = "unreadable"  #: the file cannot be read
    NOT_INDEXED = "not_indexed"  #: a raw file the index does not know
    SYMLINKED_DIR = "symlinked_dir"  #: a directory under raw/ is a symlink (never followed)
    MISPLACED = "misplaced"  #: a file in the directory of another source type
    REMOVAL_UNFINISHED = "removal_unfinished"  #: a redaction or erasure a crash interrupted
    REDACTION_MISMATCH = "redaction_mismatch"  #: a recorded tombstone is not in its file
    ERASED_FILE_PRESENT = "erased_file_present"  #: an erased file is still on disk


@dataclasses.dataclass(frozen=True)
class Problem:
    """One thing fsck found wrong with one file."""

    file_id: str
    kind: Finding
    detail: str

    def to_json(self) -> dict[str, str]:
        """As ``sgme fsck --json`` prints it."""
        return dataclasses.asdict(self)


def check_bytes(row: tables.FileRow, data: bytes) -> list[Problem]:
    """Compare a file's bytes with what the index committed for it."""
    problems: list[Problem] = []

    def problem(kind: Finding, detail: str) -> None:
        problems.append(Problem(row.file_id, kind, detail))

    committed = row.flushed_bytes
    if len(data) < committed:
        problem(Finding.TRUNCATED, f"{len(data)} bytes on disk, {committed} committed")
    elif len(data) > committed:
        problem(
            Finding.UNCOMMITTED_TAIL, f"{len(data) - committed} bytes past the committed length"
        )
    body = data[:committed]
    try:
        head, blocks = document.chain(body)
    except errors.FormatError as exc:
        problem(Finding.FORMAT_ERROR, exc.detail)
        return problems
    if blocks != row.flushed_seq:
        problem(
            Finding.MESSAGE_COUNT, f"{blocks} messages in the file, {row.flushed_seq} committed"
        )
    if head.hex() != row.chain_head:
        problem(Finding.CHAIN_MISMATCH, "hash chain differs: the file was changed behind our back")
    try:
        doc = document.parse(body.decode("utf-8"), file_id=row.file_id)
    except UnicodeDecodeError as exc:
        problem(Finding.FORMAT_ERROR, f"not UTF-8 at byte {exc.start}")
        return problems
    except errors.FormatError as exc:
        problem(Finding.FORMAT_ERROR, exc.detail)
        return problems
    header = doc.header
    expected = (row.agent_id, row.source_type, row.session_key)
    if (header.agent_id, header.source_type, header.session_key) != expected:
        problem(
            Finding.HEADER_MISMATCH,
            "frontmatter agent_id/source_type/session_key differ from the index",
        )
    return problems


def check_catalog(
    row: tables.FileRow,
    data: bytes,
    cataloged: list[tables.MessageRow],
    unindexed: list[int],
    segmented: Mapping[int, int] | None = None,
) -> list[Problem]:
    """Compare the catalog's rows of a file with the blocks of its committed bytes; with
    ``segmented`` (:func:`catalog.segment_counts`, PostgreSQL), the terms of its messages
    whose ``tsvector`` is empty with their text: a long message must have each segment."""
    try:
        found = locate_file(
            data[: row.flushed_bytes], source_type=row.source_type, started_at=row.started_at
        )
    except (UnicodeDecodeError, errors.SgmeError):
        return []  # check_bytes already reports why the file does not parse
    problems = []
    on_disk = [
        (
            f.message.seq,
            f.offset,
            f.length,
            document.parse_ts(f.message.ts).replace(tzinfo=None),
            f.message.role,
            f.message.tool_name,
        )
        for f in found
    ]
    in_index = [(r.seq, r.byte_offset, r.byte_length, r.ts, r.role, r.tool_name) for r in cataloged]
    if on_disk != in_index:
        wrong = next(
            (d[0] for d, i in zip(on_disk, in_index, strict=False) if d != i),
            min(len(on_disk), len(in_index)) + 1,
        )
        problems.append(
            Problem(
                row.file_id,
                Finding.CATALOG_MISMATCH,
                f"the message catalog has {len(in_index)} rows for {len(on_disk)} messages; "
                f"first difference at seq {wrong} (run sgme reindex)",
            )
        )
    if unindexed:
        problems.append(
            Problem(
                row.file_id,
                Finding.SEARCH_INDEX_MISSING,
                f"{len(unindexed)} messages have no search terms (run sgme reindex)",
            )
        )
    if segmented and on_disk == in_index:
        owner = catalog.Owner.of(row)
        by_id = {r.id: f.message for r, f in zip(cataloged, found, strict=True)}
        # every id here has an empty tsvector and n segments
        short = sorted(
            by_id[i].seq
            for i, n in segmented.items()
            if catalog.pg_layout(owner, by_id[i]) != (True, n)
        )
        if short:
            problems.append(
                Problem(
                    row.file_id,
                    Finding.SEARCH_INDEX_MISSING,
                    f"{len(short)} messages lack search terms, first at seq {short[0]} "
                    "(run sgme reindex)",
                )
            )
    return problems


def check_file(
    data_dir: Path, row: tables.FileRow, db: database.Database | None = None
) -> list[Problem]:
    """fsck of one indexed file: its bytes against the index row, and (given ``db``) its
    messages against the catalog and the search index."""
    if row.flushed_bytes == 0:
        return []
    path = store.checked(data_dir, row.path)
    try:
        data = (
            archive.read_archived(data_dir, row)
            if row.status == Status.ARCHIVED
            else store.read(path)
        )
    except errors.NotFound:
        return [Problem(row.file_id, Finding.MISSING, f"{row.path} does not exist")]
    except errors.FileDamaged as exc:
        kind = Finding.ARCHIVE_CORRUPT if row.status == Status.ARCHIVED else Finding.UNREADABLE
        return [Problem(row.file_id, kind, exc.detail)]
    except errors.SgmeError as exc:
        return [Problem(row.file_id, Finding.UNREADABLE, exc.detail)]
    problems = check_bytes(row, data)
    # The catalog describes the committed file: only an intact file can show it to be wrong.
    if db is not None and not problems:
        with db.reading() as conn:
            cataloged = catalog.rows(conn, row.file_id, after=0, upto=row.flushed_seq)
            unindexed = catalog.unindexed(conn, [r.id for r in cataloged])
            segmented = catalog.segment_counts(conn, [r.id for r in cataloged])
        problems += check_catalog(row, data, cataloged, unindexed, segmented)
    return problems


def _all_rows(db: database.Database) -> Iterator[tables.FileRow]:
    after: str | None = None
    while True:
        with db.reading() as conn:
            rows = index.list_files(conn, after=after, limit=500)
        yield from rows
        if len(rows) < 500:
            return
        after = rows[-1].file_id


def locate_file(
    data: bytes, *, source_type: str, started_at: dt.datetime
) -> list[document.Located]:
    """Every message of a whole file's bytes and where its block is. A heading whose date does
    not exist is a :class:`errors.FormatError` (:func:`recovery.checked_ts`): the file does
    not parse, and its messages are neither cataloged nor compared with the catalog."""
    upload_ts = document.format_ts(started_at) if source_type == "upload" else None
    found = document.locate(data, upload_ts=upload_ts)
    for located in found:
        recovery.checked_ts(located.message.ts, f"message {located.message.seq}")
    return found


def catalog_all(conn: sa.Connection, data_dir: Path) -> tuple[int, int]:
    """Catalog every flushed message of every file from the file itself (the migration that
    makes the catalog, and ``reindex``): ``(files cataloged, files that could not be read)``.
    Reads only the columns it needs, so it works at any later schema too."""
    f = tables.raw_files.c
    query = sa.select(
        f.file_id,
        f.path,
        f.status,
        f.flushed_bytes,
        f.agent_id,
        f.session_key,
        f.source_type,
        f.started_at,
        f.metadata_json,
    ).where(f.flushed_bytes > 0)
    done = failed = 0
    for row in conn.execute(query).all():
        try:
            path = store.checked(data_dir, row.path)
            if row.status == Status.ARCHIVED:
                data = archive.read_path(path)[: row.flushed_bytes]
            else:
                data = store.read(path, row.flushed_bytes)
            found = locate_file(data, source_type=row.source_type, started_at=row.started_at)
        except (UnicodeDecodeError, errors.SgmeError) as exc:
            log.warning("cannot catalog %s: %s", row.file_id, exc)
            failed += 1
            continue
        metadata = json.loads(row.metadata_json or "{}")
        owner = catalog.Owner.made(row.file_id, row.agent_id, row.session_key, metadata)
        catalog.add(conn, owner, found)
        done += 1
    return done, failed


def migrate(engine: sa.Engine, *, data_dir: Path) -> None:
    """Bring the index schema to the newest revision, and make again from the files in
    ``data_dir`` what the revisions that ran asked for (the message catalog and its terms:
    :func:`refill`), in the same transaction, with this version's code at this version's
    schema."""
    database.migrate(engine, refill=lambda conn, asked: refill(conn, data_dir, asked))


def refill(conn: sa.Connection, data_dir: Path, asked: frozenset[str]) -> None:
    """Make again what migrations asked for by name: ``catalog`` — every message's catalog
    row and search terms, from the files."""
    unknown = asked - {"catalog"}
    if unknown:
        raise errors.InternalError(f"a migration asked to refill {sorted(unknown)}: unknown")
    catalog.clear(conn)
    done, failed = catalog_all(conn, data_dir)
    log.info("catalog: %d files read again (%d could not be read: see sgme fsck)", done, failed)


def count_files(db: database.Database) -> int:
    """How many files the index holds (for progress bars)."""
    with db.reading() as conn:
        return sum(overview.count_files_by_status(conn).values())


def _disk_files(data_dir: Path) -> Iterator[tuple[str, Path]]:
    """``(source_type or "archive", path)`` of every raw file on disk (a directory that is a
    symlink is not entered: :func:`refused_dirs` names it)."""
    for source_type, subdir in store.SUBDIRS.items():
        folder = data_dir / "raw" / subdir
        if folder.is_dir() and not folder.is_symlink():
            # by name: the same order as by path in one folder, and much cheaper to compare
            for path in sorted(folder.glob("*.md"), key=_name):
                yield source_type, path
    folder = data_dir / "raw" / "archive"
    if folder.is_dir() and not folder.is_symlink():
        for month in sorted(folder.iterdir()):
            if month.is_dir() and not month.is_symlink():
                for path in sorted(month.glob("*.md.zst"), key=_name):
                    yield "archive", path


def _name(path: Path) -> str:
    return path.name


def refused_dirs(data_dir: Path) -> list[Problem]:
    """Directories under ``raw/`` that are symlinks: never followed, always reported."""
    found = []
    candidates = [f"raw/{subdir}" for subdir in (*store.SUBDIRS.values(), "archive")]
    archive_dir = data_dir / "raw" / "archive"
    if archive_dir.is_dir() and not archive_dir.is_symlink():
        candidates += [f"raw/archive/{p.name}" for p in sorted(archive_dir.iterdir())]
    for relative in ["raw", *candidates]:
        try:
            store.checked_dir(data_dir, relative)
        except errors.FileDamaged as exc:
            found.append(Problem(relative, Finding.SYMLINKED_DIR, exc.detail))
    return list({p.file_id: p for p in found}.values())


def _file_id(path: Path) -> str:
    return path.name.split(".", 1)[0]


def fsck(
    db: database.Database, data_dir: Path, *, progress: Progress | None = None
) -> list[Problem]:
    """Check every indexed file and look for files the index does not know."""
    problems: list[Problem] = []
    known: set[str] = set()
    for row in _all_rows(db):
        known.add(row.path)
        problems.extend(check_file(data_dir, row, db))
        if progress:
            progress(1)
    problems.extend(refused_dirs(data_dir))
    # the audit trail: removals left unfinished, tombstones changed, erased files still there
    problems.extend(Problem(f, Finding(kind), d) for f, kind, d in redaction.problems(db, data_dir))
    for _, path in _disk_files(data_dir):
        relative = path.relative_to(data_dir).as_posix()
        if relative not in known:
            problems.append(
                Problem(_file_id(path), Finding.NOT_INDEXED, f"{relative} is not in the index")
            )
    _record(db, problems, "fsck")
    return problems


def _record(db: database.Database, problems: list[Problem], prefix: str) -> None:
    """Keep what a check found as anomalies — best effort: the report is what matters, and a
    full disk or a read-only index must not stop it from being printed."""
    if not problems:
        return
    try:
        now = db.now()
        with db.transaction() as conn:
            for p in problems:
                anomalies.record(conn, p.file_id, f"{prefix}_{p.kind}", p.detail, now=now)
    except errors.SgmeError as exc:
        log.warning("could not record %d %s problem(s): %s", len(problems), prefix, exc.detail)


@dataclasses.dataclass(frozen=True)
class ReindexReport:
    """What ``reindex`` did."""

    scanned: int
    inserted: int
    updated: int
    failed: list[Problem]


def reindex(
    db: database.Database,
    file_locks: locks.FileLocks,
    data_dir: Path,
    options: Reindex = Reindex(),  # noqa: B008 - a frozen value
    *,
    progress: Progress | None = None,
) -> ReindexReport:
    """Rebuild ``raw_files`` and the message catalog (with the search index) from the files.

    Pending journal rows are flushed first, so the files hold everything acknowledged. For each
    file the file-derived columns (path, header fields, message count, committed length, chain
    head, ended_at) are set from the file; refinement state is kept where a row exists and
    clamped to the file's message count. The catalog is dropped and made again.

    The files are read and parsed by ``options.workers`` processes (:mod:`pipeline.recovery`)
    while this one writes them ``options.batch_files`` to a durable commit; every commit is on
    stable storage when it returns, so what the report counts is kept.
    """
    with db.reading() as conn:
        pending = ledger.stale_journal_files(conn, None)
    for file_id in pending:
        flush.flush(db, file_locks, data_dir, file_id)
    with db.transaction() as conn:
        catalog.clear(conn)
    scanned = inserted = updated = 0
    failed: list[Problem] = []
    live = {_file_id(path) for kind, path in _disk_files(data_dir) if kind != "archive"}
    with db.reading() as conn:
        erased = audit.erased_ids(conn)
    skipped = 0  # files passed over since the last progress report

    def wanted() -> Iterator[tuple[str, Path]]:
        nonlocal scanned, skipped
        for source_type, path in _disk_files(data_dir):
            scanned += 1
            file_id = _file_id(path)
            # Erased on purpose: never brought back (fsck names it). An archive whose live
            # file is there too: a crash between restore steps left both; the live one is it.
            if file_id in erased or (source_type == "archive" and file_id in live):
                skipped += 1
                continue
            yield source_type, path

    batch: list[recovery.Read] = []

    def write() -> None:
        nonlocal inserted, updated, skipped
        files = [(r.file_id, r.archived, r.values) for r in batch]
        with db.transaction() as conn:
            new = index.reindex_files(conn, files, now=db.now())
            catalog.add_ready(conn, [r.cataloged for r in batch if r.cataloged is not None])
        inserted += new
        updated += len(batch) - new
        if progress:
            progress(len(batch) + skipped)
        skipped = 0
        batch.clear()

    # a pool pays for its start (a second or so) only over more than a batch of files
    workers = options.workers if len(live) > options.batch_files else 0
    # the workers read a batch ahead: they go on while this process commits one
    reads = recovery.read_all(
        data_dir, wanted(), postgres=db.postgres, workers=workers, ahead_files=options.batch_files
    )
    for read in reads:
        if read.unreadable is not None:
            failed.append(Problem(read.file_id, Finding.UNREADABLE, read.unreadable))
            skipped += 1
            continue
        if read.misplaced is not None:
            failed.append(Problem(read.file_id, Finding.MISPLACED, read.misplaced))
        batch.append(read)
        if len(batch) >= options.batch_files:
            write()
    write()
    _record(db, failed, "reindex")
    return ReindexReport(scanned, inserted, updated, failed)
