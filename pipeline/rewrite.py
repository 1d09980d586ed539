"""Redacting one message of a file in place (docs/design.md §13): its body becomes a tombstone
naming when and why; its seq and every other message stay, so every ``source_ref`` still resolves.

The file is rewritten under its lock, and the index follows, in steps that are each durable
before the next (``REDACT_STEPS`` names them for the crash tests):

1. **temp_written** — the new bytes (the message's block replaced by the tombstone's) are
   written to a temp file beside the file and fsynced; an archived file's new bytes are
   compressed and verified first. Nothing else has changed.
2. **recorded** — one index transaction: the audit row (who, when, why, the sha256 of the
   removed body, the old and new chain heads and lengths, the tombstone) is written
   *unfinished*; the message's search terms and the L1 items that cite it go, and the file's
   refinement restarts before it (a running job's claim is fenced out). From here on the
   redaction is only ever finished, never undone.
3. **renamed** — the temp file replaces the file (``rename``, then the directory fsynced).
4. **committed** — one index transaction: the file's length and chain head become the new
   ones, the message's catalog row is replaced by the tombstone's, later messages' byte
   offsets move by the difference, the refinement restart is repeated (for a claim made
   between the two commits) and the audit row is finished.

A crash between 2 and 4 leaves an unfinished audit row: :func:`settle_locked` finishes it
from what is on disk — the new file (renamed) or the old one (rebuilt from the recorded
tombstone, checked against the recorded chain head) — and is called by every flush before it
writes, so an append never lands in a file whose rewrite is half done. Before step 2 a crash
leaves the old file and a stray temp file, removed by the next attempt.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
from collections.abc import Callable
from pathlib import Path

import sqlalchemy as sa
import zstandard

from pipeline import (
    archive,
    audit,
    catalog,
    database,
    document,
    errors,
    index,
    purge,
    store,
    tables,
)
from pipeline.tables import Status

REDACT_STEPS = ("temp_written", "recorded", "renamed", "committed")
FaultHook = Callable[[str], None]
MAX_REASON = 500  #: characters of a redaction's reason


def _no_fault(step: str) -> None:
    return None


@dataclasses.dataclass(frozen=True)
class Who:
    """Who asks for a removal, and why (kept in the audit row)."""

    actor: str
    reason: str
    token_id: str | None = None


def tombstone_text(when: str, reason: str) -> str:
    """The body a redacted message is left with."""
    return f"[REDACTED:message] removed {when}: {reason}"


# ---------------------------------------------------------------------------------------------
# bytes


def _read_whole(data_dir: Path, row: tables.FileRow) -> bytes:
    """Everything on disk for a file (decompressed when archived)."""
    path = store.checked(data_dir, row.path)
    return archive.read_path(path) if row.status == Status.ARCHIVED else store.read(path)


def _located(row: tables.FileRow, data: bytes) -> list[document.Located]:
    upload_ts = document.format_ts(row.started_at) if row.source_type == "upload" else None
    return document.locate(data, upload_ts=upload_ts)


def _chain_hex(data: bytes) -> str:
    return document.chain(data)[0].hex()


def _replace_block(data: bytes, located: document.Located, block: bytes) -> bytes:
    return data[: located.offset] + block + data[located.offset + located.length :]


def _tombstone_block(row: tables.FileRow, located: document.Located, text: str) -> bytes:
    """The block that replaces ``located``'s: its heading (time, role, tool) kept and its body
    the tombstone; an upload's one block keeps the line breaks it started with."""
    if row.source_type == "upload":
        return document.render_upload(text).encode("utf-8")
    tomb = dataclasses.replace(located.message, content=text)
    return document.render_block(tomb, first=located.message.seq == 1).encode("utf-8")


def _temp(path: Path) -> Path:
    return path.with_name(f".{path.name}.redact")


def _write_temp(data_dir: Path, row: tables.FileRow, data: bytes) -> tuple[Path, Path]:
    """``(temp, final)``: the new bytes durable under a temp name beside the file. A temp
    file left by a crash before its redaction was recorded is removed first (live or
    archived: the file may have moved since)."""
    final = store.checked(data_dir, row.path)
    temp = _temp(final)
    for relative in (archive.live_relative_path(row), archive.archive_relative_path(row)):
        store.remove(_temp(store.checked(data_dir, relative)), durable=False)
    if row.status == Status.ARCHIVED:
        packed = zstandard.ZstdCompressor(level=10, write_checksum=True).compress(data)
        with store.exclusive_writer(temp) as handle:
            handle.write(packed)
        if archive.read_path(temp) != data:
            store.remove(temp)
            raise errors.StorageUnavailable(
                f"the rewritten archive of {row.file_id} did not verify"
            )
    else:
        with store.exclusive_writer(temp) as handle:
            handle.write(data)
    return temp, final


# ---------------------------------------------------------------------------------------------
# the protocol


def redact_locked(
    db: database.Database,
    data_dir: Path,
    row: tables.FileRow,
    seq: int,
    who: Who,
    *,
    fault: FaultHook = _no_fault,
) -> tables.AuditRow:
    """Redact message ``seq`` of the locked, flushed file ``row`` (the module docstring's
    steps); the finished audit row."""
    data = _read_whole(data_dir, row)
    if len(data) < row.flushed_bytes:
        raise errors.FileDamaged(f"file {row.file_id} is shorter than committed; run sgme fsck")
    data = data[: row.flushed_bytes]  # a torn tail past it was never acknowledged
    if _chain_hex(data) != row.chain_head:
        raise errors.FileDamaged(f"file {row.file_id} fails its hash chain; run sgme fsck")
    found = _located(row, data)
    target = found[seq - 1]
    when = document.format_ts(db.now().replace(microsecond=0))
    lead = data[target.offset : target.offset + target.length]
    block = _tombstone_block(row, target, tombstone_text(when, who.reason))
    if row.source_type == "upload":
        block = lead[: len(lead) - len(lead.lstrip(b"\r\n"))] + block
    new = _replace_block(data, target, block)
    new_head = _chain_hex(new)
    temp, final = _write_temp(data_dir, row, new)
    fault("temp_written")
    body = target.message.content.encode("utf-8")
    owner = catalog.Owner.of(row)
    with db.transaction() as conn:
        recorded = audit.record(
            conn,
            now=db.now(),
            action=audit.REDACT,
            file_id=row.file_id,
            agent_id=row.agent_id,
            seq=seq,
            reason=who.reason,
            actor=who.actor,
            token_id=who.token_id,
            removed_sha256=hashlib.sha256(body).hexdigest(),
            removed_bytes=len(body),
            messages=1,
            tombstone=block.decode("utf-8"),
            old_chain_head=row.chain_head,
            new_chain_head=new_head,
            old_size=len(data),
            new_size=len(new),
        )
        # the message's terms, and its neighbours' whose context holds its words (made again
        # from the new file by _commit)
        ids = purge.catalog_ids(conn, row.file_id)
        after = [f.message for f in found[seq - 1 : seq + catalog.CONTEXT_TURNS]]
        purge.forget_terms(conn, owner, after, ids, before=_texts_before(found, seq))
        _refine_again(conn, row.file_id, seq, db.now())
        purge.forget_message_vectors(conn, row.file_id, seq)
    fault("recorded")
    store.rename(temp, final)
    fault("renamed")
    _commit(db, row, recorded, new)
    fault("committed")
    with db.reading() as conn:
        done = audit.redaction(conn, row.file_id, seq)
    assert done is not None
    return done


def _texts_before(found: list[document.Located], seq: int) -> list[str]:
    """The texts of the messages a message's context terms are made of (those before ``seq``)."""
    return [f.message.content for f in found[max(0, seq - 1 - catalog.CONTEXT_TURNS) : seq - 1]]


def _refine_again(conn: sa.Connection, file_id: str, seq: int, now: dt.datetime) -> None:
    """The L1 items that stand on message ``seq`` go, and refinement restarts before it."""
    _, lo = purge.forget_items(conn, file_id, seq)
    after = seq - 1 if lo is None else min(lo, seq - 1)
    index.rewind_refinement(conn, file_id, after=after, now=now)


def _commit(
    db: database.Database, row: tables.FileRow, recorded: tables.AuditRow, new: bytes
) -> None:
    """Step 4: the index follows the renamed file, and the audit row is finished."""
    assert recorded.seq is not None
    seq = recorded.seq
    found = _located(row, new)
    tomb = found[seq - 1]
    delta = int(recorded.new_size or 0) - int(recorded.old_size or 0)
    with db.transaction() as conn:
        now = db.now()
        moved = index.move_rewritten(
            conn,
            row.file_id,
            old_chain_head=recorded.old_chain_head,
            old_size=recorded.old_size,
            new_chain_head=recorded.new_chain_head,
            new_size=recorded.new_size,
            now=now,
        )
        if not moved:
            raise errors.InternalError(
                f"file {row.file_id} changed under its lock during a redaction of seq {seq}"
            )
        purge.forget_rows(conn, row.file_id, seq=seq)
        purge.shift_offsets(conn, row.file_id, after_seq=seq, delta=delta)
        owner = catalog.Owner.of(row)
        catalog.add(conn, owner, [tomb], before=_texts_before(found, seq))
        after = [f.message for f in found[seq : seq + catalog.CONTEXT_TURNS]]
        ids = purge.catalog_ids(conn, row.file_id)
        catalog.add_terms(conn, owner, after, ids, before=_texts_before(found, seq + 1))
        _refine_again(conn, row.file_id, seq, now)
        # again: a round may have embedded the old text from the file before the rename
        purge.forget_message_vectors(conn, row.file_id, seq)
        audit.finish(conn, recorded.id, now=now)


def settle_locked(db: database.Database, data_dir: Path, file_id: str) -> int:
    """Finish the redactions of ``file_id`` a crash left unfinished (the caller holds the
    file's lock; every flush calls this before it writes); how many there were."""
    with db.reading() as conn:
        if not audit.pending(conn, file_id):
            return 0
        rows = [r for r in audit.unfinished(conn, file_id=file_id) if r.action == audit.REDACT]
        row = index.get_file(conn, file_id)
    for recorded in rows:
        if row is None:  # erased meanwhile: nothing left to rewrite
            with db.transaction() as conn:
                audit.finish(conn, recorded.id, now=db.now())
            continue
        row = _finish(db, data_dir, row, recorded)
    return len(rows)


def _finish(
    db: database.Database, data_dir: Path, row: tables.FileRow, recorded: tables.AuditRow
) -> tables.FileRow:
    """Finish one unfinished redaction from what is on disk: the renamed new file, or the old
    one with the recorded tombstone put in (and renamed into place)."""
    assert recorded.seq is not None and recorded.tombstone is not None
    data = _read_whole(data_dir, row)
    new_size = int(recorded.new_size or 0)
    if len(data) >= new_size and _chain_hex(data[:new_size]) == recorded.new_chain_head:
        new = data[:new_size]  # renamed: only the index is behind
    else:
        old = data[: int(recorded.old_size or 0)]
        if _chain_hex(old) != recorded.old_chain_head:
            raise errors.FileDamaged(
                f"file {row.file_id} is neither the one before nor the one after the "
                f"unfinished redaction of seq {recorded.seq}; run sgme fsck"
            )
        target = _located(row, old)[recorded.seq - 1]
        new = _replace_block(old, target, recorded.tombstone.encode("utf-8"))
        if _chain_hex(new) != recorded.new_chain_head:
            raise errors.InternalError(f"redaction {recorded.id} cannot be rebuilt as recorded")
        temp, final = _write_temp(data_dir, row, new)
        store.rename(temp, final)
    _commit(db, row, recorded, new)
    with db.reading() as conn:
        found = index.get_file(conn, row.file_id)
    assert found is not None
    return found
