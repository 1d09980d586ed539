"""Reading raw files through the index: committed bytes, parsed documents, single messages.

Reads stop at the committed length (``flushed_bytes``), so a half-written tail that a crashed
flush left behind is never served as content.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Collection, Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

import sqlalchemy as sa

from pipeline import archive, database, document, errors, index, store, tables, validation

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
    must be indistinguishable from it (DESIGN §6)."""
    return errors.NotFound(f"no file {file_id}")


def visible(row: tables.FileRow, agents: Collection[str] | None) -> bool:
    """Whether a caller holding ``agents`` (None: every agent) may see the file."""
    return agents is None or row.agent_id in agents


def get_file(
    engine: sa.Engine, file_id: str, *, agents: Collection[str] | None = None
) -> tables.FileRow:
    """The index row of ``file_id``; NotFound when there is none, or when it belongs to an
    agent not among ``agents`` (None: every agent)."""
    validation.check_file_id(file_id)
    with database.transaction(engine) as conn:
        row = index.get_file(conn, file_id)
    if row is None or not visible(row, agents):
        raise missing(file_id)
    return row


def _damaged(engine: sa.Engine, row: tables.FileRow, kind: str, detail: str) -> errors.FileDamaged:
    """Mark a file that reads show to be damaged: status ``error`` and an anomaly, once (a
    file already marked is not written to again by reads). An archived file keeps its status
    (it says where the bytes are); its anomaly is ``archive_corrupt``."""
    if row.status == "archived":
        with database.transaction(engine) as conn:
            index.record_anomaly(conn, row.file_id, "archive_corrupt", detail)
    elif row.status != "error":
        with database.transaction(engine) as conn:
            index.record_damage(conn, row.file_id, kind, detail)
    return errors.FileDamaged(f"file {row.file_id}: {detail}")


def committed(engine: sa.Engine, data_dir: Path, row: tables.FileRow) -> bytes:
    """:func:`read_bytes`, with damage (a symlink, a short file, a corrupt archive) recorded."""
    try:
        return read_bytes(data_dir, row)
    except errors.FileDamaged as exc:
        raise _damaged(engine, row, "file_unreadable", exc.detail) from None


def stream(
    engine: sa.Engine, data_dir: Path, row: tables.FileRow, *, chunk: int = CHUNK
) -> Iterator[bytes]:
    """The committed bytes in chunks of ``chunk`` (decompressed if archived), for ``/raw``:
    the file is opened and checked before the first chunk, so a damaged file is an error the
    caller can still answer; memory does not grow with the file."""
    if row.flushed_bytes == 0:
        return iter(())
    if row.status == "archived":
        return archive.stream_archived(data_dir, row, chunk=chunk)
    try:
        handle = store.open_read(store.checked(data_dir, row.path))
        size = os.fstat(handle.fileno()).st_size
        if size < row.flushed_bytes:
            handle.close()
            raise errors.FileDamaged(f"{row.path} is {size} bytes, {row.flushed_bytes} committed")
    except (errors.FileDamaged, errors.NotFound) as exc:
        raise _damaged(engine, row, "file_unreadable", exc.detail) from None
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
    if row.status == "archived":
        return archive.read_archived(data_dir, row)
    data = store.read(store.checked(data_dir, row.path), row.flushed_bytes)
    if len(data) < row.flushed_bytes:
        raise errors.FileDamaged(
            f"file {row.file_id} is {len(data)} bytes but {row.flushed_bytes} were committed"
        )
    return data


def read_document(
    engine: sa.Engine, data_dir: Path, row: tables.FileRow
) -> document.Document | None:
    """The parsed file, or None while nothing is flushed.

    A file that no longer parses is marked ``error`` with a ``format_error`` anomaly (once:
    a file already marked is not written to again by reads).
    """
    data = committed(engine, data_dir, row)
    if not data:
        return None
    try:
        return document.parse(data.decode("utf-8"), file_id=row.file_id)
    except (UnicodeDecodeError, errors.FormatError) as exc:
        detail = exc.detail if isinstance(exc, errors.FormatError) else f"not UTF-8: {exc}"
        raise _damaged(engine, row, "format_error", detail) from None


#: no cap on the bytes a read returns (library callers that want everything)
UNBOUNDED = 2**62


def _within(found: Iterable[document.Message], budget: int) -> list[document.Message]:
    """The leading messages whose content fits in ``budget`` bytes (the first one always)."""
    kept: list[document.Message] = []
    for m in found:
        budget -= len(m.content.encode("utf-8"))
        if kept and budget < 0:
            break
        kept.append(m)
    return kept


def messages(
    engine: sa.Engine,
    data_dir: Path,
    file_id: str,
    *,
    after_seq: int = 0,
    limit: int = 100,
    max_bytes: int = UNBOUNDED,
    agents: Collection[str] | None = None,
) -> list[document.Message]:
    """Flushed messages of a file with ``seq > after_seq``: at most ``limit`` of them, and no
    more than ``max_bytes`` of content (but at least one). A file of an agent not among
    ``agents`` is NotFound."""
    doc = read_document(engine, data_dir, get_file(engine, file_id, agents=agents))
    if doc is None:
        return []
    return _within(doc.messages[after_seq : after_seq + limit], max_bytes)


def resolve(
    engine: sa.Engine,
    data_dir: Path,
    ref: str,
    *,
    context: int = 1,
    max_bytes: int = UNBOUNDED,
    agents: Collection[str] | None = None,
) -> Ref:
    """The message a source_ref names, plus up to ``context`` neighbours on each side, the
    nearest first, as long as their content fits in ``max_bytes`` with the message's (a file
    of an agent not among ``agents`` is NotFound)."""
    file_id, seq = validation.parse_ref(ref)
    row = get_file(engine, file_id, agents=agents)
    if seq > validation.MAX_SEQ:
        raise errors.NotFound(f"no message {ref}")
    doc = read_document(engine, data_dir, row)
    if doc is None or seq > len(doc.messages):
        if seq < row.next_seq:
            raise errors.NotFound(f"message {ref} is acknowledged but not flushed yet")
        raise errors.NotFound(f"no message {ref}")
    i = seq - 1
    message = doc.messages[i]
    budget = max_bytes - len(message.content.encode("utf-8"))
    before: list[document.Message] = []
    after: list[document.Message] = []
    for distance in range(1, context + 1):
        for side, j in ((before, i - distance), (after, i + distance)):
            if 0 <= j < len(doc.messages):
                size = len(doc.messages[j].content.encode("utf-8"))
                if size <= budget:
                    budget -= size
                    side.append(doc.messages[j])
    return Ref(file=row, message=message, before=tuple(reversed(before)), after=tuple(after))
