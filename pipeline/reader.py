"""Reading raw files through the index: committed bytes, parsed documents, single messages.

Reads stop at the committed length (``flushed_bytes``), so a half-written tail that a crashed
flush left behind is never served as content.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Collection, Iterable, Iterator
from pathlib import Path
from typing import BinaryIO, TypeVar

from pipeline import (
    anomalies,
    archive,
    audit,
    catalog,
    database,
    document,
    errors,
    index,
    refs,
    store,
    tables,
)
from pipeline.tables import Kind, Status

log = logging.getLogger(__name__)
T = TypeVar("T")
CHUNK = 1 << 20  #: bytes per read while streaming a file


@dataclasses.dataclass(frozen=True)
class Ref:
    """A message found by its source_ref, with its neighbours."""

    file: tables.FileRow
    message: document.Message
    before: tuple[document.Message, ...]
    after: tuple[document.Message, ...]


def missing(file_id: str) -> errors.NotFound:
    """The one answer for a file that does not exist — and for another agent's file, which
    must be indistinguishable from it (docs/design.md §7)."""
    return errors.NotFound(f"no file {file_id}")


def visible(row: tables.FileRow, agents: Collection[str] | None) -> bool:
    """Whether a caller holding ``agents`` (None: every agent) may see the file."""
    return agents is None or row.agent_id in agents


def get_file(
    db: database.Database, file_id: str, *, agents: Collection[str] | None = None
) -> tables.FileRow:
    """The index row of ``file_id``; NotFound when there is none, or when it belongs to an
    agent not among ``agents`` (None: every agent)."""
    refs.check_file_id(file_id)
    with db.reading() as conn:
        row = index.get_file(conn, file_id)
        gone = audit.erased(conn, file_id) if row is None else None
    if gone is not None and (agents is None or gone.agent_id in agents):
        raise errors.Gone(
            f"file {file_id} was erased at {tables.iso(gone.created_at)}; it and its "
            "source_refs are gone for good"
        )
    if row is None or not visible(row, agents):
        raise missing(file_id)
    return row


def _damaged(
    db: database.Database, row: tables.FileRow, kind: Kind, detail: str
) -> errors.SgmeError:
    """Mark a file that reads show to be damaged: status ``error`` and an anomaly, once (a
    file already marked is not written to again by reads). An archived file keeps its status
    (it says where the bytes are); its anomaly is ``archive_corrupt``. A file rewritten
    while it was read (a redaction: its row changed, or its rewrite is not finished) is not
    damaged: the read is refused as transient, to be tried again."""
    with db.reading() as conn:
        now = index.get_file(conn, row.file_id)
        rewriting = audit.pending(conn, row.file_id)
    if (
        rewriting
        or now is None
        or (now.flushed_bytes, now.chain_head, now.path)
        != (
            row.flushed_bytes,
            row.chain_head,
            row.path,
        )
    ):
        return errors.StorageUnavailable(
            f"file {row.file_id} changed while it was read (a redaction); try again"
        )
    if row.status == Status.ARCHIVED:
        with db.transaction() as conn:
            anomalies.record(conn, row.file_id, Kind.ARCHIVE_CORRUPT, detail, now=db.now())
    elif row.status != Status.ERROR:
        with db.transaction() as conn:
            index.record_damage(conn, row.file_id, kind, detail, now=db.now())
    return errors.FileDamaged(f"file {row.file_id}: {detail}")


def committed(db: database.Database, data_dir: Path, row: tables.FileRow) -> bytes:
    """:func:`read_bytes`, with damage (a symlink, a short file, a corrupt archive) recorded."""
    try:
        return read_bytes(data_dir, row)
    except errors.FileDamaged as exc:
        raise _damaged(db, row, Kind.FILE_UNREADABLE, exc.detail) from None


def stream(
    db: database.Database, data_dir: Path, row: tables.FileRow, *, chunk: int = CHUNK
) -> Iterator[bytes]:
    """The committed bytes in chunks of ``chunk`` (decompressed if archived), for ``/raw``:
    the file is opened and checked before the first chunk, so a damaged file is an error the
    caller can still answer; memory does not grow with the file."""
    if row.flushed_bytes == 0:
        return iter(())
    if row.status == Status.ARCHIVED:
        return archive.stream_archived(data_dir, row, chunk=chunk)
    try:
        handle = store.open_read(store.checked(data_dir, row.path))
        size = os.fstat(handle.fileno()).st_size
        if size < row.flushed_bytes:
            handle.close()
            raise errors.FileDamaged(f"{row.path} is {size} bytes, {row.flushed_bytes} committed")
    except (errors.FileDamaged, errors.NotFound) as exc:
        raise _damaged(db, row, Kind.FILE_UNREADABLE, exc.detail) from None
    return _chunks(handle, row.flushed_bytes, chunk)


def _chunks(handle: BinaryIO, left: int, chunk: int) -> Iterator[bytes]:
    with handle:
        while left > 0:
            data = handle.read(min(chunk, left))
            if not data:
                return
            left -= len(data)
            yield data


def read_bytes(data_dir: Path, row: tables.FileRow) -> bytes:
    """The committed bytes of a file (empty while nothing is flushed), decompressed if it is
    archived."""
    if row.flushed_bytes == 0:
        return b""
    if row.status == Status.ARCHIVED:
        return archive.read_archived(data_dir, row)
    data = store.read(store.checked(data_dir, row.path), row.flushed_bytes)
    if len(data) < row.flushed_bytes:
        raise errors.FileDamaged(
            f"file {row.file_id} is {len(data)} bytes but {row.flushed_bytes} were committed"
        )
    return data


def read_document(
    db: database.Database, data_dir: Path, row: tables.FileRow
) -> document.Document | None:
    """The parsed file, or None while nothing is flushed.

    A file that no longer parses is marked ``error`` with a ``format_error`` anomaly (once:
    a file already marked is not written to again by reads).
    """
    data = committed(db, data_dir, row)
    if not data:
        return None
    try:
        return document.parse(data.decode("utf-8"), file_id=row.file_id)
    except (UnicodeDecodeError, errors.FormatError) as exc:
        detail = exc.detail if isinstance(exc, errors.FormatError) else f"not UTF-8: {exc}"
        raise _damaged(db, row, Kind.FORMAT_ERROR, detail) from None


#: no cap on the bytes a read returns (library callers that want everything)
UNBOUNDED = 2**62


def read_range(
    db: database.Database, data_dir: Path, row: tables.FileRow, offset: int, length: int
) -> bytes:
    """``length`` committed bytes of a file from ``offset``: a ``pread`` of just those bytes
    (an archive is decompressed as a stream up to them, in bounded memory). Damage is
    recorded as by :func:`committed`."""
    if offset + length > row.flushed_bytes:
        raise _damaged(
            db, row, Kind.FILE_UNREADABLE, f"catalog reaches past byte {row.flushed_bytes}"
        )
    try:
        if row.status == Status.ARCHIVED:
            return archive.read_range(data_dir, row, offset, length)
        data = store.read_range(store.checked(data_dir, row.path), offset, length)
    except (errors.FileDamaged, errors.NotFound) as exc:
        raise _damaged(db, row, Kind.FILE_UNREADABLE, exc.detail) from None
    if len(data) < length:
        raise _damaged(
            db, row, Kind.FILE_UNREADABLE, f"{row.path} ends before byte {offset + length}"
        )
    return data


def read_messages(
    db: database.Database, data_dir: Path, row: tables.FileRow, found: list[tables.MessageRow]
) -> list[document.Message]:
    """The messages of catalog rows that follow each other in the file, read in one range."""
    if not found:
        return []
    lo = found[0].byte_offset
    last = found[-1]
    data = read_range(db, data_dir, row, lo, last.byte_offset + last.byte_length - lo)
    upload_ts = document.format_ts(row.started_at) if row.source_type == "upload" else None
    try:
        return [
            document.parse_block(
                data[r.byte_offset - lo : r.byte_offset - lo + r.byte_length],
                r.seq,
                upload_ts=upload_ts,
            )
            for r in found
        ]
    except errors.FormatError as exc:
        raise _damaged(db, row, Kind.FORMAT_ERROR, exc.detail) from None


def message_text(
    db: database.Database,
    data_dir: Path,
    row: tables.FileRow,
    message: tables.MessageRow,
    *,
    cap: int,
) -> str:
    """The text of one cataloged message, from at most its first ``cap`` bytes (a snippet's
    worth: a longer message comes back cut, at a character boundary)."""
    data = read_range(db, data_dir, row, message.byte_offset, min(message.byte_length, cap))
    text = data.decode("utf-8", "ignore")
    if row.source_type == "upload":
        return document.unescape(text.strip("\r\n"))
    try:
        return document.parse_block(text.encode(), message.seq).content
    except errors.FormatError as exc:
        raise _damaged(db, row, Kind.FORMAT_ERROR, exc.detail) from None


def _cataloged(
    db: database.Database, row: tables.FileRow, after: int, upto: int
) -> list[tables.MessageRow] | None:
    """The catalog rows ``after < seq <= upto`` (``upto`` within what is flushed), or None
    when the catalog does not have them all (a store migrated without its data directory, not
    yet reindexed: the caller reads the whole file instead)."""
    upto = min(upto, row.flushed_seq)
    if upto <= after:
        return []
    with db.reading() as conn:
        found = catalog.rows(conn, row.file_id, after=after, upto=upto)
    if len(found) != upto - after:
        log.warning(
            "file %s is not fully cataloged; reading all of it (run sgme reindex)", row.file_id
        )
        return None
    return found


def _content_size(message: document.Message) -> int:
    return len(message.content.encode("utf-8"))


def _leading(found: Iterable[T], budget: int, size: Callable[[T], int]) -> list[T]:
    """The leading items whose sizes add up to at most ``budget`` (the first one always)."""
    kept: list[T] = []
    for item in found:
        budget -= size(item)
        if kept and budget < 0:
            break
        kept.append(item)
    return kept


def messages(
    db: database.Database,
    data_dir: Path,
    file_id: str,
    *,
    after_seq: int = 0,
    limit: int = 100,
    max_bytes: int = UNBOUNDED,
    agents: Collection[str] | None = None,
) -> list[document.Message]:
    """Flushed messages of a file with ``seq > after_seq``: at most ``limit`` of them, and no
    more than ``max_bytes`` of their blocks (but at least one). Only their bytes are read. A
    file of an agent not among ``agents`` is NotFound."""
    row = get_file(db, file_id, agents=agents)
    found = _cataloged(db, row, after_seq, after_seq + limit)
    if found is None:
        doc = read_document(db, data_dir, row)
        whole = doc.messages[after_seq : after_seq + limit] if doc else ()
        return _leading(whole, max_bytes, _content_size)
    return read_messages(db, data_dir, row, _leading(found, max_bytes, lambda r: r.byte_length))


def between(
    db: database.Database, data_dir: Path, row: tables.FileRow, lo: int, hi: int
) -> list[document.Message]:
    """The flushed messages ``lo < seq <= hi`` of a file (a refinement segment), read as one
    range of its bytes."""
    found = _cataloged(db, row, lo, hi)
    if found is None:
        doc = read_document(db, data_dir, row)
        return list(doc.messages[lo:hi]) if doc else []
    return read_messages(db, data_dir, row, found)


def resolve(
    db: database.Database,
    data_dir: Path,
    ref: str,
    *,
    context: int = 1,
    max_bytes: int = UNBOUNDED,
    agents: Collection[str] | None = None,
) -> Ref:
    """The message a source_ref names, plus up to ``context`` neighbours on each side, the
    nearest first, as long as their blocks fit in ``max_bytes`` with the message's (a side
    stops at the first that does not). Only those bytes are read. A file of an agent not
    among ``agents`` is NotFound."""
    file_id, seq = refs.parse(ref)
    row = get_file(db, file_id, agents=agents)
    if seq > refs.MAX_SEQ or seq >= row.next_seq:
        raise errors.NotFound(f"no message {ref}")
    if seq > row.flushed_seq:
        raise errors.NotFound(f"message {ref} is acknowledged but not flushed yet")
    found = _cataloged(db, row, max(0, seq - 1 - context), seq + context)
    if found is None:
        return _resolve_whole(db, data_dir, row, seq, context=context, max_bytes=max_bytes)
    at = seq - 1 - max(0, seq - 1 - context)
    lo = hi = at
    budget = max_bytes - found[at].byte_length
    growing = {-1: True, 1: True}  # before, after: each side stops at the first that misses
    while any(growing.values()):
        for side, on in growing.items():
            j = lo - 1 if side < 0 else hi + 1
            if on and 0 <= j < len(found) and found[j].byte_length <= budget:
                budget -= found[j].byte_length
                lo, hi = min(lo, j), max(hi, j)
            else:
                growing[side] = False
    read = read_messages(db, data_dir, row, found[lo : hi + 1])
    i = at - lo
    return Ref(file=row, message=read[i], before=tuple(read[:i]), after=tuple(read[i + 1 :]))


def _resolve_whole(
    db: database.Database,
    data_dir: Path,
    row: tables.FileRow,
    seq: int,
    *,
    context: int,
    max_bytes: int,
) -> Ref:
    doc = read_document(db, data_dir, row)
    if doc is None or seq > len(doc.messages):
        raise errors.NotFound(f"no message {row.file_id}:{seq}")
    i = seq - 1
    message = doc.messages[i]
    near = _leading(doc.messages[i + 1 : i + 1 + context], max_bytes, _content_size)
    return Ref(
        file=row,
        message=message,
        before=tuple(doc.messages[max(0, i - context) : i]),
        after=tuple(near),
    )
