"""Removing what a user regrets (docs/design.md §13), as the API, the ``sgme`` command and the beat
call it: redact messages by ``source_ref`` (:mod:`pipeline.rewrite` does the file), erase files,
sessions or agents (:mod:`pipeline.erasure`), finish what a crash interrupted, and check the audit
trail against the files (``fsck``)."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Collection, Sequence
from pathlib import Path

import sqlalchemy as sa

from pipeline import (
    audit,
    database,
    erasure,
    errors,
    flush,
    index,
    locks,
    purge,
    redactor,
    refs,
    rewrite,
    store,
    tables,
)

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def check_reason(reason: object, *, required: bool = True) -> str:
    """A reason as it may be kept: one line of at most :data:`rewrite.MAX_REASON`
    characters, its own secrets redacted (a reason is written into the file)."""
    if reason is None:
        reason = ""
    if not isinstance(reason, str):
        raise errors.InvalidInput(f"reason must be a string, not {type(reason).__name__}")
    reason = reason.strip()
    if required and not reason:
        raise errors.InvalidInput("reason is required: say why (it is kept in the audit trail)")
    if len(reason) > rewrite.MAX_REASON:
        raise errors.InvalidInput(
            f"reason: at most {rewrite.MAX_REASON} characters, got {len(reason)}"
        )
    bad = _CONTROL.search(reason)
    if bad:
        raise errors.InvalidInput(f"reason: control character {bad.group()!r} is not allowed")
    return redactor.redact(reason).text


def check(
    db: database.Database, ref: str, *, agents: Collection[str] | None = None
) -> tables.FileRow:
    """That ``ref`` names a message :func:`redact` can redact: a source_ref
    (:class:`errors.InvalidInput`) of a message of a file of ``agents`` (NotFound; Gone when
    the file was erased); its file's row. Nothing is changed."""
    file_id, seq = refs.parse(ref)
    row = _visible(db, file_id, agents)
    if seq > refs.MAX_SEQ or seq >= row.next_seq:
        raise errors.NotFound(f"no message {ref}")
    return row


def redact_all(
    db: database.Database,
    file_locks: locks.FileLocks,
    data_dir: Path,
    found: Sequence[str],
    who: rewrite.Who,
    agents: Collection[str] | None = None,
) -> list[tables.AuditRow]:
    """:func:`redact` each ref, in order, once every one is checked (:func:`check`): when one
    names no message the caller may redact, none is redacted, and the error (the first
    fault's class) names every ref at fault, not only the first."""
    faults: list[errors.SgmeError] = []
    for ref in found:
        try:
            check(db, ref, agents=agents)
        except errors.PermanentError as exc:
            faults.append(exc)
    if faults:
        detail = "; ".join(fault.detail for fault in faults)
        if len(found) > 1:
            detail = f"nothing was redacted: {detail}"
        raise type(faults[0])(detail)
    return [redact(db, file_locks, data_dir, ref, who, agents=agents) for ref in found]


def redact(
    db: database.Database,
    file_locks: locks.FileLocks,
    data_dir: Path,
    ref: str,
    who: rewrite.Who,
    *,
    agents: Collection[str] | None = None,
    fault: rewrite.FaultHook = rewrite._no_fault,
) -> tables.AuditRow:
    """Redact the message ``ref`` names (``file_id:seq``): its body becomes a tombstone, its
    file is rewritten, what the index derived from it goes. Redacting a message again
    answers with its first redaction and changes nothing. A file of an agent not among
    ``agents`` is NotFound; an erased one Gone."""
    row = check(db, ref, agents=agents)
    file_id, seq = refs.parse(ref)
    with db.reading() as conn:
        done = audit.redaction(conn, file_id, seq)
    if done is not None:
        return done
    if seq > row.flushed_seq:  # acknowledged, still in the journal: into the file first
        flush.flush(db, file_locks, data_dir, file_id)
    with file_locks.holding(file_id):
        rewrite.settle_locked(db, data_dir, file_id)
        with db.reading() as conn:
            row = _row(conn, file_id)
            done = audit.redaction(conn, file_id, seq)
        if done is not None:  # a concurrent request redacted it first
            return done
        if seq > row.flushed_seq:
            raise errors.Conflict(f"message {ref} is not in its file yet; retry in a moment")
        return rewrite.redact_locked(db, data_dir, row, seq, who, fault=fault)


def _row(conn: sa.Connection, file_id: str) -> tables.FileRow:
    row = index.get_file(conn, file_id)
    if row is None:
        raise errors.NotFound(f"no file {file_id}")
    return row


def _visible(db: database.Database, file_id: str, agents: Collection[str] | None) -> tables.FileRow:
    """The file's row, or NotFound (another agent's: the same answer) or Gone (erased)."""
    with db.reading() as conn:
        row = index.get_file(conn, file_id)
        gone = audit.erased(conn, file_id) if row is None else None
    if gone is not None and (agents is None or gone.agent_id in agents):
        raise erasure.erased_error(gone)
    if row is None or (agents is not None and row.agent_id not in agents):
        raise errors.NotFound(f"no file {file_id}")
    return row


def compact(db: database.Database) -> None:
    """After removals: make the database files forget them (:func:`purge.compact`)."""
    purge.compact(db)


# ---------------------------------------------------------------------------------------------
# crashes


FINISH_AFTER = 60.0  #: seconds an unfinished removal is left to the process that began it


def finish_interrupted(
    db: database.Database,
    file_locks: locks.FileLocks,
    data_dir: Path,
    *,
    age: float = FINISH_AFTER,
) -> int:
    """Finish every redaction and erasure a crash left unfinished, begun more than ``age``
    seconds ago (0: all of them; the beat's sweep runs this): erasures' files are unlinked,
    redactions finished under their file's lock. How many were finished; a file whose lock
    is busy waits for the next run."""
    before = None if age <= 0 else db.now() - dt.timedelta(seconds=age)
    finished = erasure.finish_pending(db, data_dir, before=before)
    with db.reading() as conn:
        begun = audit.unfinished(conn, before=before)
        file_ids = sorted({r.file_id for r in begun if r.action == audit.REDACT})
    for file_id in file_ids:
        try:
            with file_locks.holding(file_id):
                finished += rewrite.settle_locked(db, data_dir, file_id)
        except (errors.NotFound, errors.LockTimeout):  # erased meanwhile, or busy: next run
            continue
    return finished


# ---------------------------------------------------------------------------------------------
# fsck


def problems(db: database.Database, data_dir: Path) -> list[tuple[str, str, str]]:
    """What ``fsck`` finds wrong with the audit trail, as ``(file_id, kind, detail)``: a
    removal a crash left unfinished, a recorded redaction whose tombstone is not in its file
    (the file changed afterwards), an erased file still on disk."""
    found: list[tuple[str, str, str]] = []
    with db.reading() as conn:
        unfinished = audit.unfinished(conn)
        a = tables.audit_log.c
        redacted = conn.execute(
            sa.select(a.file_id).where(a.action == audit.REDACT).group_by(a.file_id)
        ).all()
        erased = [
            tables.AuditRow.from_row(r)
            for r in conn.execute(sa.select(tables.audit_log).where(a.action == audit.ERASE))
        ]
    for row in unfinished:
        what = f"the redaction of seq {row.seq}" if row.action == audit.REDACT else "the erasure"
        found.append(
            (
                row.file_id,
                "removal_unfinished",
                f"{what} begun at {tables.iso(row.created_at)} was interrupted; the file's next "
                "flush, the beat's sweep or the next sgme redact/erase finishes it",
            )
        )
    for (file_id,) in redacted:
        found += _check_tombstones(db, data_dir, file_id)
    for row in erased:
        present = [p for p in audit.paths(row) if store.exists(store.checked(data_dir, p))]
        if present and row.finished_at is not None:
            found.append((row.file_id, "erased_file_present", f"{present[0]} is still on disk"))
    return found


def _check_tombstones(
    db: database.Database, data_dir: Path, file_id: str
) -> list[tuple[str, str, str]]:
    with db.reading() as conn:
        row = index.get_file(conn, file_id)
        records = audit.redactions(conn, file_id) if row is not None else []
    if row is None or not records:
        return []
    try:
        data = rewrite._read_whole(data_dir, row)[: row.flushed_bytes]
        blocks = rewrite._located(row, data)
    except (UnicodeDecodeError, errors.SgmeError):
        return []  # fsck's own check of the file says why it cannot be read
    found = []
    for record in records:
        assert record.seq is not None
        block = blocks[record.seq - 1] if record.seq <= len(blocks) else None
        raw = b"" if block is None else data[block.offset : block.offset + block.length]
        if raw != (record.tombstone or "").encode("utf-8"):
            found.append(
                (
                    file_id,
                    "redaction_mismatch",
                    f"seq {record.seq} is not the tombstone its redaction (audit {record.id}) "
                    "recorded",
                )
            )
    return found
