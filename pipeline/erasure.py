"""Erasing a file, a session or an agent (docs/design.md §13): the files (live and archived), every
index row derived from them — catalog, search terms, journal rows, waiting appends, L1 items,
idempotency records, anomalies, the file's row — go; one audit row per file stays, and from then on
the file and every ``source_ref`` into it answer 410 Gone.

**The tombstone.** The idempotency keys the session's appends were recorded under stay, without
the digest of what they held and without their answer (:func:`idempotency.tombstone`), and
the audit row counts them: an import, a capture or a provider that sends the same units again
(they key them the same way) is answered ``erased`` and writes nothing, so what was erased
stays erased. :func:`release` lets them be written again, on purpose (audited). An upload's key
goes with it (an upload is a document given once, not a source read again).

Per file, under its lock: one index transaction removes every row and writes the audit row
*unfinished*, naming the paths still to unlink (step **recorded**); the paths are unlinked
and their directory fsynced (**unlinked**); the audit row is finished. A crash in between
leaves files that no row points at: :func:`finish_pending` (run by the beat's sweep and by
every erasure) unlinks them, and ``reindex`` never brings an erased file back.

An append to the session after its erasure starts a new file (a new file_id); the ingest
transaction and the erasure's take the same session lock, so an append is either erased with
the file or kept in the new one — never lost without a trace.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import hashlib
import json
import logging
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from pipeline import (
    archive,
    audit,
    catalog,
    database,
    document,
    errors,
    idempotency,
    index,
    ledger,
    locks,
    ordering,
    purge,
    refs,
    rewrite,
    store,
    tables,
    validation,
)

log = logging.getLogger(__name__)
ERASE_STEPS = ("recorded", "unlinked")
FaultHook = Callable[[str], None]


def _no_fault(step: str) -> None:
    return None


@dataclasses.dataclass(frozen=True)
class Erased:
    """What erasing one file removed."""

    record: tables.AuditRow
    #: on SQLite, the search terms of a file whose text could not be read stay (unreachable:
    #: their catalog rows are gone) until ``sgme reindex``
    terms_left: bool = False

    def to_json(self) -> dict[str, Any]:
        """As ``sgme erase --json`` shows it."""
        return {**self.record.to_json(), "terms_left": self.terms_left}


def _paths(row: tables.FileRow) -> list[str]:
    """Every path the file may have on disk: live, archived, and their temp names."""
    live = store.relative_path(row.source_type, row.file_id)
    archived = archive.archive_relative_path(row)
    found = []
    for relative in dict.fromkeys((row.path, live, archived)):
        folder, _, name = relative.rpartition("/")
        found += [relative, f"{folder}/.{name}.tmp", f"{folder}/.{name}.redact"]
    return found


def _readable(data_dir: Path, row: tables.FileRow) -> tuple[bytes, list[document.Located] | None]:
    """The file's committed bytes and its messages, or None for the messages when it cannot
    be read (erasing a damaged file must still work)."""
    try:
        data = rewrite._read_whole(data_dir, row)[: row.flushed_bytes]
        return data, rewrite._located(row, data) if data else []
    except (UnicodeDecodeError, errors.SgmeError) as exc:
        log.warning("erasing %s, which cannot be read: %s", row.file_id, exc)
        return b"", None


def _delete_rows(conn: sa.Connection, row: tables.FileRow) -> int:
    """Every row of the file but the catalog and its terms (done before: they need the text);
    its idempotency records become its tombstone (an upload's go): how many."""
    file_id = row.file_id
    for table in (tables.l1_items, tables.append_journal, tables.full_refines):
        conn.execute(sa.delete(table).where(table.c.file_id == file_id))
    conn.execute(sa.delete(tables.anomalies).where(tables.anomalies.c.file_id == file_id))
    purge.forget_vectors(conn, file_id)
    k = tables.append_keys.c
    mine = sa.and_(
        k.agent_id == row.agent_id,
        k.response_json.contains(file_id),
        k.request_hash != idempotency.ERASED,
    )
    kept = 0
    if row.source_type == "upload":
        conn.execute(sa.delete(tables.append_keys).where(mine))
    else:
        tombstone = json.dumps(idempotency.tombstone(file_id))
        values = {"request_hash": idempotency.ERASED, "response_json": tombstone}
        kept = int(conn.execute(sa.update(tables.append_keys).where(mine).values(values)).rowcount)
    w = tables.waiting_appends.c
    conn.execute(
        sa.delete(tables.waiting_appends).where(
            w.agent_id == row.agent_id,
            w.source_type == row.source_type,
            w.session_key == row.session_key,
        )
    )
    index.delete_file(conn, file_id)
    return kept


def erase_file(
    db: database.Database,
    file_locks: locks.FileLocks,
    data_dir: Path,
    file_id: str,
    who: rewrite.Who,
    *,
    agents: Collection[str] | None = None,
    fault: FaultHook = _no_fault,
) -> Erased:
    """Erase one file (the module docstring's steps). A file of an agent not among ``agents``
    is NotFound, as one that does not exist; one erased before is Gone."""
    refs.check_file_id(file_id)
    with db.reading() as conn:
        row = index.get_file(conn, file_id)
        gone = audit.erased(conn, file_id) if row is None else None
    if gone is not None and (agents is None or gone.agent_id in agents):
        finish_pending(db, data_dir)
        raise erased_error(gone)
    if row is None or (agents is not None and row.agent_id not in agents):
        raise errors.NotFound(f"no file {file_id}")
    with file_locks.holding(file_id) as row:
        data, found = _readable(data_dir, row)
        owner = catalog.Owner.of(row)
        terms_left = False
        with db.transaction() as conn:
            now = db.now()
            ordering.lock(conn, ledger.Session(row.agent_id, row.source_type, row.session_key))
            current = index.find_file(conn, row.agent_id, row.source_type, row.session_key)
            if current is None or current.file_id != file_id:
                raise errors.NotFound(f"no file {file_id}")
            ids = purge.catalog_ids(conn, file_id)
            if found is not None:
                purge.forget_terms(conn, owner, [f.message for f in found], ids)
            else:
                terms_left = not purge.forget_file_terms(conn, file_id)
            purge.forget_rows(conn, file_id)
            pending = sum(e.size for e in ledger.journal_after(conn, file_id, 0))
            kept = _delete_rows(conn, current)
            for unfinished in audit.unfinished(conn, file_id=file_id):
                audit.finish(conn, unfinished.id, now=now)  # a redaction made moot
            recorded = audit.record(
                conn,
                now=now,
                action=audit.ERASE,
                file_id=file_id,
                agent_id=row.agent_id,
                reason=who.reason,
                actor=who.actor,
                token_id=who.token_id,
                removed_sha256=hashlib.sha256(data).hexdigest(),
                removed_bytes=len(data) + pending,
                messages=current.next_seq - 1,
                paths_json=json.dumps(_paths(row)),
                keys=kept,
            )
        fault("recorded")
        _unlink(data_dir, recorded)
        fault("unlinked")
    with db.transaction() as conn:
        audit.finish(conn, recorded.id, now=db.now())
        done = audit.erased(conn, file_id)
    assert done is not None
    return Erased(done, terms_left=terms_left)


def _unlink(data_dir: Path, recorded: tables.AuditRow) -> None:
    folders = set()
    for relative in audit.paths(recorded):
        path = store.checked(data_dir, relative)
        if store.exists(path):
            store.remove(path, durable=False)
            folders.add(path.parent)
    for folder in folders:
        store.fsync_dir(folder)


def erase_session(
    db: database.Database,
    file_locks: locks.FileLocks,
    data_dir: Path,
    agent_id: str,
    who: rewrite.Who,
    *,
    session_key: str | None = None,
    progress: Callable[[int], None] | None = None,
) -> tuple[list[Erased], int]:
    """Erase every file of an agent (of one of its sessions with ``session_key``), then its
    appends still waiting for their order and its idempotency records (not the tombstones):
    ``(the files erased, the rows of those removed)``."""
    validation.check_agent_id(agent_id)
    f = tables.raw_files.c
    query = sa.select(f.file_id).where(f.agent_id == agent_id).order_by(f.file_id)
    if session_key is not None:
        query = query.where(f.session_key == session_key)
    with db.reading() as conn:
        file_ids = [r[0] for r in conn.execute(query)]
    done = []
    for file_id in file_ids:
        with contextlib.suppress(errors.NotFound, errors.Gone):  # erased meanwhile
            done.append(erase_file(db, file_locks, data_dir, file_id, who))
        if progress:
            progress(1)
    w, k = tables.waiting_appends.c, tables.append_keys.c
    with db.transaction() as conn:
        waiting = sa.delete(tables.waiting_appends).where(w.agent_id == agent_id)
        keys = sa.delete(tables.append_keys).where(
            k.agent_id == agent_id, k.request_hash != idempotency.ERASED
        )
        if session_key is not None:
            waiting = waiting.where(w.session_key == session_key)
            # a key's recorded answer names its file, all of which were erased above
            keys = keys.where(sa.false())
        removed = conn.execute(waiting).rowcount + conn.execute(keys).rowcount
    return done, int(removed)


def count_files(db: database.Database, agent_id: str, session_key: str | None = None) -> int:
    """How many files :func:`erase_session` would erase (for progress bars)."""
    f = tables.raw_files.c
    query = sa.select(sa.func.count()).where(f.agent_id == agent_id)
    if session_key is not None:
        query = query.where(f.session_key == session_key)
    with db.reading() as conn:
        return int(conn.execute(query).scalar_one())


def finish_pending(
    db: database.Database, data_dir: Path, *, before: dt.datetime | None = None
) -> int:
    """Unlink what erasures a crash interrupted left on disk (those begun before ``before``:
    None for all); how many were finished."""
    with db.reading() as conn:
        rows = [r for r in audit.unfinished(conn, before=before) if r.action == audit.ERASE]
    for recorded in rows:
        _unlink(data_dir, recorded)
        with db.transaction() as conn:
            audit.finish(conn, recorded.id, now=db.now())
    return len(rows)


def release(
    db: database.Database,
    file_id: str,
    who: rewrite.Who,
    *,
    agents: Collection[str] | None = None,
) -> tables.AuditRow:
    """Let go of the tombstone an erasure of ``file_id`` left, so that an import, a capture or
    a provider may write its units again (a new file): on purpose, and audited (action
    ``release``, with the keys let go). An erasure of an agent not among ``agents``, or a file
    never erased, is NotFound."""
    refs.check_file_id(file_id)
    k = tables.append_keys.c
    with db.transaction() as conn:
        gone = audit.erased(conn, file_id)
        if gone is None or (agents is not None and gone.agent_id not in agents):
            raise errors.NotFound(f"no erased file {file_id}")
        released = conn.execute(
            sa.delete(tables.append_keys).where(
                k.agent_id == gone.agent_id,
                k.request_hash == idempotency.ERASED,
                k.response_json == json.dumps(idempotency.tombstone(file_id)),
            )
        ).rowcount
        now = db.now()
        recorded = audit.record(
            conn,
            now=now,
            action=audit.RELEASE,
            file_id=file_id,
            agent_id=gone.agent_id,
            reason=who.reason,
            actor=who.actor,
            token_id=who.token_id,
            keys=int(released),
        )
        audit.finish(conn, recorded.id, now=now)
    return dataclasses.replace(recorded, finished_at=now)


def erased_error(recorded: tables.AuditRow) -> errors.Gone:
    """The answer for a file that was erased."""
    return errors.Gone(
        f"file {recorded.file_id} was erased at {tables.iso(recorded.created_at)}; it and its "
        "source_refs are gone for good"
    )
