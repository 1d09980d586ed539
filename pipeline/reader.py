"""Reading raw files through the index: committed bytes, parsed documents, single messages.

Reads stop at the committed length (``flushed_bytes``), so a half-written tail that a crashed
flush left behind is never served as content.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from pathlib import Path

import sqlalchemy as sa

from pipeline import archive, database, document, errors, index, store, tables, validation


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


def read_bytes(data_dir: Path, row: tables.FileRow) -> bytes:
    """The committed bytes of a file (empty while nothing is flushed), decompressed if it is
    archived."""
    if row.flushed_bytes == 0:
        return b""
    if row.status == "archived":
        return archive.read_archived(data_dir, row)
    data = store.read(data_dir / row.path, row.flushed_bytes)
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
    data = read_bytes(data_dir, row)
    if not data:
        return None
    try:
        return document.parse(data.decode("utf-8"), file_id=row.file_id)
    except (UnicodeDecodeError, errors.FormatError) as exc:
        detail = exc.detail if isinstance(exc, errors.FormatError) else f"not UTF-8: {exc}"
        if row.status != "error":
            with database.transaction(engine) as conn:
                index.record_damage(conn, row.file_id, "format_error", detail)
        raise errors.FileDamaged(f"file {row.file_id}: {detail}") from None


def messages(
    engine: sa.Engine,
    data_dir: Path,
    file_id: str,
    *,
    after_seq: int = 0,
    limit: int = 100,
    agents: Collection[str] | None = None,
) -> list[document.Message]:
    """Flushed messages of a file with ``seq > after_seq``, at most ``limit`` of them (a file
    of an agent not among ``agents`` is NotFound)."""
    doc = read_document(engine, data_dir, get_file(engine, file_id, agents=agents))
    if doc is None:
        return []
    return list(doc.messages[after_seq : after_seq + limit])


def resolve(
    engine: sa.Engine,
    data_dir: Path,
    ref: str,
    *,
    context: int = 1,
    agents: Collection[str] | None = None,
) -> Ref:
    """The message a source_ref names, plus ``context`` neighbours on each side (a file of an
    agent not among ``agents`` is NotFound)."""
    file_id, seq = validation.parse_ref(ref)
    row = get_file(engine, file_id, agents=agents)
    doc = read_document(engine, data_dir, row)
    if doc is None or seq > len(doc.messages):
        if seq < row.next_seq:
            raise errors.NotFound(f"message {ref} is acknowledged but not flushed yet")
        raise errors.NotFound(f"no message {ref}")
    i = seq - 1
    return Ref(
        file=row,
        message=doc.messages[i],
        before=doc.messages[max(0, i - context) : i],
        after=doc.messages[i + 1 : i + 1 + context],
    )
