"""Forgetting what the index derived from messages that are redacted or erased: their search
terms, their catalog rows, their vectors, the L1 items that cite them — and, on SQLite, the
pages and index segments that still held them.

The search index keeps terms, not text, but terms are the words of the text: a redacted
secret must leave it. On PostgreSQL a message's terms are one row (a long message's also its
segments' rows, :data:`pipeline.catalog.PARTS`), deleted by id. On SQLite
they are in a contentless FTS5 table, from which a row can only be deleted by handing back
the very terms and tags it was indexed with (FTS5 has no other way for a contentless table):
:func:`forget_terms` recomputes them from the message's text exactly as
:func:`pipeline.catalog.add` made them — this module is the one place that knows it.
Deleted terms stay in FTS5's older segments until they are merged, and freed pages keep
their bytes unless ``secure_delete`` is on: :func:`compact` merges the segments and
truncates the write-ahead log (docs/privacy.md says what PostgreSQL needs instead).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence

import sqlalchemy as sa

from pipeline import catalog, database, document, errors, tables

log = logging.getLogger(__name__)
_M = tables.messages.c
_L = tables.l1_items.c
_V = tables.message_vectors.c
_E = tables.embed_marks.c
_FTS_DELETE = sa.text(
    "INSERT INTO message_terms (message_terms, rowid, terms, tags, context) "
    "VALUES ('delete', :id, :terms, :tags, :context)"
)


def forget_terms(
    conn: sa.Connection,
    owner: catalog.Owner,
    messages: Sequence[document.Message],
    ids: Mapping[int, int],
    *,
    before: Sequence[str] = (),
) -> None:
    """Delete the search terms of the cataloged messages among ``messages`` (consecutive in
    their file, as indexed; ``ids``: ``{seq: catalog id}``, a message without one is passed
    over); ``before``: the texts of the messages before the first, as
    :func:`pipeline.catalog.ready` took them (their context terms are made from them)."""
    if not any(m.seq in ids for m in messages):
        return
    if database.is_postgres(conn):
        found = [ids[m.seq] for m in messages if m.seq in ids]
        # a long message's segments too (catalog.PARTS)
        conn.execute(sa.text("DELETE FROM message_term_parts WHERE id = ANY(:ids)"), {"ids": found})
        conn.execute(sa.text("DELETE FROM message_terms WHERE id = ANY(:ids)"), {"ids": found})
        return
    who, own, context = catalog.term_lists(owner, messages, before)
    conn.execute(
        _FTS_DELETE,
        [
            {
                "id": ids[m.seq],
                "terms": " ".join(t),
                "tags": catalog._tags(owner, m.role, p),
                "context": " ".join(c),
            }
            for m, p, t, c in zip(messages, who, own, context, strict=True)
            if m.seq in ids
        ],
    )


def forget_file_terms(conn: sa.Connection, file_id: str) -> bool:
    """Delete the terms of every cataloged message of a file without their text (it could not
    be read): possible on PostgreSQL (by id); on SQLite False — the terms stay, unreachable
    (their catalog rows go), until ``sgme reindex`` rebuilds the index."""
    if not database.is_postgres(conn):
        return False
    for table in ("message_term_parts", "message_terms"):
        conn.execute(
            sa.text(
                f"DELETE FROM {table} WHERE id IN (SELECT id FROM messages WHERE file_id = :f)"
            ),
            {"f": file_id},
        )
    return True


def catalog_ids(conn: sa.Connection, file_id: str, *, seq: int | None = None) -> dict[int, int]:
    """``{seq: catalog id}`` of a file's messages (of one seq when given)."""
    query = sa.select(_M.seq, _M.id).where(_M.file_id == file_id)
    if seq is not None:
        query = query.where(_M.seq == seq)
    return {int(s): int(i) for s, i in conn.execute(query)}


def forget_rows(conn: sa.Connection, file_id: str, *, seq: int | None = None) -> None:
    """Delete catalog rows of a file (one seq, or all); their terms must be gone first."""
    query = sa.delete(tables.messages).where(_M.file_id == file_id)
    if seq is not None:
        query = query.where(_M.seq == seq)
    conn.execute(query)


def shift_offsets(conn: sa.Connection, file_id: str, *, after_seq: int, delta: int) -> None:
    """Move the byte offsets of a file's messages after ``after_seq`` by ``delta`` (a block
    before them changed length)."""
    if delta:
        conn.execute(
            sa.update(tables.messages)
            .where(_M.file_id == file_id, _M.seq > after_seq)
            .values(byte_offset=_M.byte_offset + delta)
        )


def forget_items(conn: sa.Connection, file_id: str, seq: int) -> tuple[int, int | None]:
    """Delete the L1 items that cite ``file_id:seq`` and every item refined from a segment
    that reached it or came after it (their segments are refined again): ``(items deleted,
    the seq refinement must restart after)`` — the start of the earliest such segment, or
    None when no segment reached it."""
    reached = sa.select(_L.id, _L.segment_lo, _L.source_refs).where(
        _L.file_id == file_id, _L.segment_hi >= seq
    )
    found = list(conn.execute(reached).all())
    ref = json.dumps(f"{file_id}:{seq}")
    # an item citing the message comes from a segment that holds it: counted above; any
    # other (there should be none) is found by its refs
    citing = sa.select(_L.id, _L.segment_lo, _L.source_refs).where(
        _L.file_id == file_id, _L.source_refs.contains(ref)
    )
    found += [r for r in conn.execute(citing).all() if r.id not in {f.id for f in found}]
    if not found:
        return 0, None
    conn.execute(sa.delete(tables.l1_items).where(_L.id.in_([r.id for r in found])))
    return len(found), min(int(r.segment_lo) for r in found)


def forget_vectors(conn: sa.Connection, file_id: str) -> None:
    """Drop a file's vectors and its embedding watermark (an erasure). A job holding a claim
    on the file commits nothing: its fence finds no mark."""
    conn.execute(sa.delete(tables.message_vectors).where(_V.file_id == file_id))
    conn.execute(sa.delete(tables.embed_marks).where(_E.file_id == file_id))


def forget_message_vectors(conn: sa.Connection, file_id: str, seq: int) -> None:
    """Drop the blocks that hold a vector made with message ``seq``'s text — its own and the
    :data:`~pipeline.tables.VECTOR_CONTEXT` turns' after it (redacted: no vector may keep
    the secret's meaning) — and move the file's watermark back to the first one's start, so
    those messages are embedded again, ``seq`` from its redacted text (the blocks after them
    stay until their re-embedding replaces them). The epoch moves on: a job that read the
    old text commits nothing (:mod:`pipeline.vectors`)."""
    # the message's own vector, and those of the turns after it that it is averaged into
    holding = sa.and_(_V.file_id == file_id, _V.lo < seq + tables.VECTOR_CONTEXT, _V.hi >= seq)
    start = conn.execute(sa.select(sa.func.min(_V.lo)).where(holding)).scalar()
    back = seq - 1 if start is None else min(int(start), seq - 1)
    conn.execute(sa.delete(tables.message_vectors).where(holding))
    conn.execute(
        sa.update(tables.embed_marks)
        .where(_E.file_id == file_id)
        .values(
            embedded_seq=sa.case((_E.embedded_seq > back, back), else_=_E.embedded_seq),
            epoch=_E.epoch + 1,
            lease_until=None,
        )
    )


def compact(db: database.Database) -> None:
    """On SQLite, make what was deleted unreadable in the database files: merge the search
    index's segments (deleted terms are dropped only then) and checkpoint and truncate the
    write-ahead log (freed pages are zeroed by ``secure_delete``). Best effort: a busy
    database leaves it to the next redaction or erasure. Nothing on PostgreSQL (VACUUM is
    the operator's: docs/privacy.md)."""
    if db.postgres:
        return
    try:
        with db.transaction() as conn:
            conn.execute(sa.text("INSERT INTO message_terms (message_terms) VALUES ('optimize')"))
        # outside any transaction (SQLAlchemy would begin one): on the driver's connection
        raw = db.engine.raw_connection()
        try:
            driver = raw.driver_connection
            assert driver is not None
            driver.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        finally:
            raw.close()
    except (errors.SgmeError, sa.exc.SQLAlchemyError) as exc:
        log.warning("could not compact the index after a removal: %s", exc)
