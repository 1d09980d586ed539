"""The index: every rule about ``raw_files`` and anomalies, as named functions that take a
Connection (the schema is :mod:`pipeline.tables`; the journal, idempotency records and held
appends are :mod:`pipeline.ledger`'s, the message catalog :mod:`pipeline.catalog`'s).

No file access here, and no engines, transactions or clocks: the caller's transaction and the
caller's ``now`` (:mod:`pipeline.database`). The fences that keep the protocols safe live here
and nowhere else: the flush fence (``flushed_seq = :old``), the refinement claim and its
epoch/lease fence (docs/design.md §4), the archive fence (docs/design.md §5).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from pipeline import anomalies, database, errors, tables
from pipeline.tables import Kind, Status


def _bind(name: str) -> Any:
    """A bind parameter typed like the ``raw_files`` column it sets."""
    return sa.bindparam(f"set_{name}", type_=tables.raw_files.c[name].type)


# ---------------------------------------------------------------------------------------------
# raw_files: lookups and listings

# The statements of the append and flush paths are prepared: run on the driver, without
# SQLAlchemy's per-execution cost (database.Prepared).
_R = tables.raw_files.c
_GET_FILE = sa.select(tables.raw_files).where(_R.file_id == sa.bindparam("file_id"))
_GET = database.Prepared(_GET_FILE)
_GET_FOR_UPDATE = database.Prepared(_GET_FILE.with_for_update())
_FIND = database.Prepared(
    sa.select(tables.raw_files)
    .where(
        _R.agent_id == sa.bindparam("agent_id"),
        _R.source_type == sa.bindparam("source_type"),
        _R.session_key == sa.bindparam("session_key"),
    )
    .with_for_update(key_share=True)  # FOR NO KEY UPDATE: docs/design.md §3, lock order
)
_UPDATE_FILE: dict[tuple[str, ...], sa.Update] = {}  #: _update's statements by column set
_INSERT_FILE: dict[tuple[str, ...], database.Prepared] = {}  #: by dialect and column set


def get_file(
    conn: sa.Connection, file_id: str, *, for_update: bool = False
) -> tables.FileRow | None:
    """The row of ``file_id``, or None."""
    row = (_GET_FOR_UPDATE if for_update else _GET).first(conn, {"file_id": file_id})
    return tables.FileRow.of(row) if row else None


def find_file(
    conn: sa.Connection, agent_id: str, source_type: str, session_key: str
) -> tables.FileRow | None:
    """The file of one session, locked for this transaction (the append path), or None."""
    params = {"agent_id": agent_id, "source_type": source_type, "session_key": session_key}
    row = _FIND.first(conn, params)
    return tables.FileRow.of(row) if row else None


def list_files(
    conn: sa.Connection,
    *,
    agents: Collection[str] | None = None,
    status: str | None = None,
    source_type: str | None = None,
    after: str | None = None,
    limit: int = 100,
) -> list[tables.FileRow]:
    """Rows of ``agents`` (None: all) ordered by file_id, starting after the cursor ``after``."""
    query = sa.select(tables.raw_files).order_by(tables.raw_files.c.file_id).limit(limit)
    if agents is not None:
        query = query.where(tables.raw_files.c.agent_id.in_(list(agents)))
    if status is not None:
        query = query.where(tables.raw_files.c.status == status)
    if source_type is not None:
        query = query.where(tables.raw_files.c.source_type == source_type)
    if after is not None:
        query = query.where(tables.raw_files.c.file_id > after)
    return [tables.FileRow.from_row(row) for row in conn.execute(query)]


# ---------------------------------------------------------------------------------------------
# raw_files: the append protocol (docs/design.md §3)


def _inserting(dialect: str, columns: Sequence[str]) -> Any:
    """An INSERT into ``raw_files`` of ``columns`` (bound by name) that does nothing when the
    row is there, on ``dialect``."""
    module = postgresql if dialect == "postgresql" else sqlite
    values = {k: sa.bindparam(k, type_=_R[k].type) for k in columns}
    return module.insert(tables.raw_files).values(values).on_conflict_do_nothing()


def insert_file(conn: sa.Connection, *, now: dt.datetime, **values: Any) -> bool:
    """Insert a row unless its session already has one; True when inserted (prepared per
    column set: compiled on every call, it was 1 ms of a session's first append)."""
    values.setdefault("created_at", now)
    values.setdefault("updated_at", now)
    key = (conn.dialect.name, *sorted(values))
    if (found := _INSERT_FILE.get(key)) is None:
        stmt = _inserting(key[0], key[1:]).returning(_R.file_id)
        found = _INSERT_FILE[key] = database.Prepared(stmt)
    # RETURNING, not rowcount: psycopg reports -1 for an INSERT … ON CONFLICT DO NOTHING
    return found.first(conn, values) is not None


def _update(conn: sa.Connection, file_id: str, *, now: dt.datetime, **values: Any) -> int:
    """Set plain values on one row (statements cached per column set); the rowcount."""
    values.setdefault("updated_at", now)
    keys = tuple(sorted(values))
    cached = _UPDATE_FILE.get(keys)
    if cached is None:
        cached = _UPDATE_FILE[keys] = (
            sa.update(tables.raw_files)
            .where(tables.raw_files.c.file_id == sa.bindparam("where_file_id"))
            .values({k: _bind(k) for k in keys})
        )
    params = {f"set_{k}": v for k, v in values.items()}
    params["where_file_id"] = file_id
    return int(conn.execute(cached, params).rowcount)


_RECORD_APPEND = database.Prepared(
    sa.update(tables.raw_files)
    .where(_R.file_id == sa.bindparam("file_id"))
    .values(next_seq=_bind("next_seq"), flush_pending=True, updated_at=_bind("updated_at"))
)


def record_append(conn: sa.Connection, file_id: str, *, next_seq: int, now: dt.datetime) -> None:
    """An append took seqs up to ``next_seq - 1``: a flush is now pending."""
    params = {"file_id": file_id, "set_next_seq": next_seq, "set_updated_at": now}
    _RECORD_APPEND.execute(conn, params)


def _record_appends(n: int) -> Any:
    """Each file's ``next_seq``, a flush pending, for ``n`` files in one statement."""
    ids = [sa.bindparam(f"file_id_{i}", type_=_R.file_id.type) for i in range(n)]
    seqs = [sa.bindparam(f"next_seq_{i}", type_=_R.next_seq.type) for i in range(n)]
    return (
        sa.update(tables.raw_files)
        .where(_R.file_id.in_(ids))
        .values(
            next_seq=sa.case(*zip((_R.file_id == f for f in ids), seqs, strict=True)),
            flush_pending=True,
            updated_at=sa.bindparam("updated_at_0", type_=_R.updated_at.type),
        )
    )


_RECORD_APPENDS = database.Sized(_record_appends)


def record_appends(conn: sa.Connection, next_seqs: dict[str, int], *, now: dt.datetime) -> None:
    """:func:`record_append` for many files at once (a batch of appends): file id -> its
    ``next_seq``."""
    files = [{"file_id": f, "next_seq": n, "updated_at": now} for f, n in next_seqs.items()]
    _RECORD_APPENDS.execute(conn, files)


_OLD_SEQUENCE = sa.bindparam("old_sequence", type_=sa.Integer)
_RECORD_SEQUENCED = database.Prepared(
    sa.update(tables.raw_files)
    .where(
        _R.file_id == sa.bindparam("file_id"), _R.next_sequence.is_not_distinct_from(_OLD_SEQUENCE)
    )
    .values(
        next_seq=_bind("next_seq"),
        next_sequence=_bind("next_sequence"),
        flush_pending=True,
        updated_at=_bind("updated_at"),
    )
    .returning(_R.file_id)
)


def record_sequenced(
    conn: sa.Connection,
    file_id: str,
    *,
    next_seq: int,
    old_sequence: int | None,
    sequence: int,
    now: dt.datetime,
) -> bool:
    """:func:`record_append` for an append numbered ``sequence`` by its sender: the session
    expects ``sequence + 1`` next — only if it still expected ``old_sequence`` (None: the
    session had none yet). False when it did not: someone else moved it meanwhile."""
    params = {
        "file_id": file_id,
        "old_sequence": old_sequence,
        "set_next_seq": next_seq,
        "set_next_sequence": sequence + 1,
        "set_updated_at": now,
    }
    return _RECORD_SEQUENCED.first(conn, params) is not None


def record_damage(
    conn: sa.Connection, file_id: str, kind: str, detail: str, *, now: dt.datetime
) -> bool:
    """A file that no longer matches what was committed: status ``error`` and an anomaly.
    True the first time this damage is recorded."""
    mark_error(conn, file_id, now=now)
    return anomalies.record(conn, file_id, kind, detail, now=now) == 1


def mark_error(conn: sa.Connection, file_id: str, *, now: dt.datetime) -> bool:
    """Status ``error`` (the file is damaged or could not be refined); False if it already
    was."""
    f = tables.raw_files.c
    stmt = (
        sa.update(tables.raw_files)
        .where(f.file_id == file_id, f.status != Status.ERROR)
        .values(status=Status.ERROR, updated_at=now)
    )
    return bool(conn.execute(stmt).rowcount)


_ENDED_AT = _bind("ended_at")
_NEW_SEQ = _bind("flushed_seq")
_ADVANCE_FLUSHED = database.Prepared(
    sa.update(tables.raw_files)
    .where(_R.file_id == sa.bindparam("where_file_id"), _R.flushed_seq == sa.bindparam("old_seq"))
    .values(
        flushed_seq=_NEW_SEQ,
        flushed_bytes=_bind("flushed_bytes"),
        chain_head=_bind("chain_head"),
        status=sa.case((_R.status == Status.ARCHIVED, Status.ARCHIVED), else_=Status.NEW),
        # The latest message time seen; an append may carry older timestamps than the last.
        ended_at=sa.case(
            (sa.or_(_R.ended_at.is_(None), _R.ended_at < _ENDED_AT), _ENDED_AT),
            else_=_R.ended_at,
        ),
        # Pending until everything acknowledged so far is written (the flusher goes on).
        flush_pending=_R.next_seq - 1 > _NEW_SEQ,
        flushed_at=_bind("flushed_at"),
        updated_at=_bind("updated_at"),
    )
    .returning(_R.next_seq)
)


def advance_flushed(
    conn: sa.Connection,
    file_id: str,
    *,
    old_seq: int,
    flushed_seq: int,
    flushed_bytes: int,
    chain_head: str,
    ended_at: dt.datetime,
    now: dt.datetime,
) -> int | None:
    """Record a flush, if nobody advanced ``flushed_seq`` past ``old_seq`` meanwhile (None
    then): the status becomes ``new`` (an archived file stays ``archived``), and the flush is
    no longer pending if everything acknowledged is now written. Returns ``next_seq``: more
    is waiting when it is past ``flushed_seq + 1``."""
    params = {
        "where_file_id": file_id,
        "old_seq": old_seq,
        "set_flushed_seq": flushed_seq,
        "set_flushed_bytes": flushed_bytes,
        "set_chain_head": chain_head,
        "set_ended_at": ended_at,
        "set_flushed_at": now,
        "set_updated_at": now,
    }
    row = _ADVANCE_FLUSHED.first(conn, params)
    return None if row is None else int(row["next_seq"])


_SETTLE = database.Prepared(
    sa.update(tables.raw_files)
    .where(
        _R.file_id == sa.bindparam("file_id"),
        _R.flush_pending.is_(True),
        _R.next_seq - 1 == _R.flushed_seq,
    )
    .values(flush_pending=False)
)


def settle_flush(conn: sa.Connection, file_id: str) -> bool:
    """A flush found nothing to write: the file is no longer pending, unless an append came
    meanwhile (its seqs are past ``flushed_seq``). Whether it settled: when not, the append's
    ingest saw the file pending and did not kick it, so the caller must."""
    return bool(_SETTLE.execute(conn, {"file_id": file_id}).rowcount == 1)


# ---------------------------------------------------------------------------------------------
# raw_files: refinement (docs/design.md §4)

_LEASE = {"refine_lease_until": _bind("refine_lease_until"), "updated_at": _bind("updated_at")}
_REFINABLE = (  # flushed messages past ``last_refined_seq``, not leased to a running job
    _R.flushed_seq > _R.last_refined_seq,
    sa.or_(*(_R.status == status for status in tables.REFINABLE)),
    sa.or_(_R.refine_lease_until.is_(None), _R.refine_lease_until < sa.bindparam("now")),
)
_DUE = (  # ... where ``min_messages`` wait, or quiet since ``idle_before``
    *_REFINABLE,
    sa.or_(
        _R.flushed_seq - _R.last_refined_seq >= sa.bindparam("min_messages"),
        _R.flushed_at <= sa.bindparam("idle_before", type_=_R.flushed_at.type),
    ),
)
_DUE_FILES = database.Prepared(
    sa.select(_R.file_id).where(*_DUE).order_by(_R.flushed_at).limit(sa.bindparam("limit"))
)
_DUE_FILE = database.Prepared(
    sa.select(_R.file_id, _R.flushed_at).where(_R.file_id == sa.bindparam("file_id"), *_DUE)
)
_CLAIM = database.Prepared(
    sa.update(tables.raw_files)
    .where(_R.file_id == sa.bindparam("file_id"), *_REFINABLE)
    .values(refine_epoch=_R.refine_epoch + 1, **_LEASE)
    .returning(_R.last_refined_seq, _R.flushed_seq, _R.refine_epoch)
)
_OF_CLAIM = (_R.file_id == sa.bindparam("file_id"), _R.refine_epoch == sa.bindparam("epoch"))
_RENEW = database.Prepared(
    sa.update(tables.raw_files)
    .where(*_OF_CLAIM, _R.refine_lease_until.is_not(None))
    .values(**_LEASE)
)
_COMMIT_SEGMENT = database.Prepared(
    sa.update(tables.raw_files)
    .where(*_OF_CLAIM, _R.last_refined_seq == sa.bindparam("lo"))
    .values(
        last_refined_seq=sa.bindparam("hi"),
        refined_at=_bind("updated_at"),
        refine_lease_until=None,
        status=sa.case(
            (_R.status == Status.ARCHIVED, Status.ARCHIVED),
            (_R.flushed_seq > sa.bindparam("hi"), Status.NEW),
            else_=Status.REFINED,
        ),
        updated_at=_bind("updated_at"),
    )
)


def due_files(
    conn: sa.Connection,
    *,
    min_messages: int,
    idle_seconds: float,
    limit: int,
    file_ids: Sequence[str] | None = None,
    now: dt.datetime,
) -> list[str]:
    """Refinable files where ``min_messages`` wait or that were quiet ``idle_seconds``, the
    longest flushed first (a reindexed file has no ``flushed_at``: first), at most ``limit``."""
    idle_before = now - dt.timedelta(seconds=idle_seconds)
    params = {"now": now, "min_messages": min_messages, "idle_before": idle_before}
    if file_ids is None:
        return [row["file_id"] for row in _DUE_FILES.rows(conn, {**params, "limit": limit})]
    found = [_DUE_FILE.first(conn, {**params, "file_id": f}) for f in dict.fromkeys(file_ids)]
    due = sorted(filter(None, found), key=lambda r: r["flushed_at"] or dt.datetime.min)
    return [row["file_id"] for row in due[:limit]]


def _lease(file_id: str, lease_seconds: float, now: dt.datetime) -> dict[str, Any]:
    until = now + dt.timedelta(seconds=lease_seconds)
    return {"file_id": file_id, "now": now, "set_refine_lease_until": until, "set_updated_at": now}


def claim_segment(
    conn: sa.Connection, file_id: str, *, lease_seconds: float, now: dt.datetime
) -> tuple[int, int, int] | None:
    """Bump the epoch and lease the unrefined segment: ``(lo, hi, epoch)``, or None when the
    file is leased to another job, has nothing to refine, or cannot be refined."""
    row = _CLAIM.first(conn, _lease(file_id, lease_seconds, now))
    return (row["last_refined_seq"], row["flushed_seq"], row["refine_epoch"]) if row else None


def renew_lease(
    conn: sa.Connection, file_id: str, *, epoch: int, lease_seconds: float, now: dt.datetime
) -> bool:
    """Extend a running job's lease; False when the claim no longer holds (the job should
    stop: another claim or a full re-refine replaced it)."""
    return _RENEW.rowcount(conn, {**_lease(file_id, lease_seconds, now), "epoch": epoch}) > 0


def commit_segment(
    conn: sa.Connection, file_id: str, *, epoch: int, lo: int, hi: int, now: dt.datetime
) -> bool:
    """Advance ``last_refined_seq`` to ``hi`` and free the lease — only if the claim
    ``(epoch, lo)`` still holds. The file becomes ``refined``, or ``new`` when more messages
    were flushed meanwhile (an archived file stays ``archived``)."""
    params = {"file_id": file_id, "epoch": epoch, "lo": lo, "hi": hi, "set_updated_at": now}
    return _COMMIT_SEGMENT.rowcount(conn, params) > 0


def fail_segment(conn: sa.Connection, file_id: str, *, epoch: int, now: dt.datetime) -> bool:
    """Give up on a claim after its last retry: the file becomes ``error``, its lease is
    freed. False when the claim was replaced meanwhile (nothing changes)."""
    f = tables.raw_files.c
    stmt = (
        sa.update(tables.raw_files)
        .where(f.file_id == file_id, f.refine_epoch == epoch)
        .values(status=Status.ERROR, refine_lease_until=None, updated_at=now)
    )
    return bool(conn.execute(stmt).rowcount)


def restart_refinement(conn: sa.Connection, file_id: str, *, now: dt.datetime) -> None:
    """Full re-refine: ``last_refined_seq = 0``, the lease freed, the epoch bumped so that a
    job still running for the old claim commits nothing; an ``error`` file becomes ``new``."""
    f = tables.raw_files.c
    stmt = (
        sa.update(tables.raw_files)
        .where(f.file_id == file_id)
        .values(
            last_refined_seq=0,
            refine_epoch=f.refine_epoch + 1,
            refine_lease_until=None,
            status=sa.case((f.status == Status.ARCHIVED, Status.ARCHIVED), else_=Status.NEW),
            updated_at=now,
        )
    )
    conn.execute(stmt)


def rewind_refinement(conn: sa.Connection, file_id: str, *, after: int, now: dt.datetime) -> None:
    """Refine a file again from ``after`` (``last_refined_seq`` lowered to it if higher),
    fencing out a job that still runs for an older claim (the epoch moves on, the lease
    goes). A fully refined file becomes ``new``; an archived one stays archived (it is
    refined again when an append brings it back)."""
    f = tables.raw_files.c
    lowered = sa.case((f.last_refined_seq > after, after), else_=f.last_refined_seq)
    conn.execute(
        sa.update(tables.raw_files)
        .where(f.file_id == file_id)
        .values(
            last_refined_seq=lowered,
            refine_epoch=f.refine_epoch + 1,
            refine_lease_until=None,
            status=sa.case(
                (sa.and_(f.status == Status.REFINED, f.flushed_seq > lowered), Status.NEW),
                else_=f.status,
            ),
            updated_at=now,
        )
    )


def move_rewritten(
    conn: sa.Connection,
    file_id: str,
    *,
    old_chain_head: str | None,
    old_size: int | None,
    new_chain_head: str | None,
    new_size: int | None,
    now: dt.datetime,
) -> bool:
    """A rewritten file (a redaction, :mod:`pipeline.rewrite`) took the place of the one
    whose length and chain head were ``old_*``: record its new ones. False when the row no
    longer holds the old ones (someone changed the file under its lock: a bug)."""
    moved = conn.execute(
        sa.update(tables.raw_files)
        .where(
            _R.file_id == file_id,
            _R.chain_head == old_chain_head,
            _R.flushed_bytes == old_size,
        )
        .values(flushed_bytes=new_size, chain_head=new_chain_head, updated_at=now)
    ).rowcount
    return bool(moved == 1)


def delete_file(conn: sa.Connection, file_id: str) -> None:
    """Forget a file's row (an erasure, :mod:`pipeline.erasure`, once everything that
    points at it is gone)."""
    conn.execute(sa.delete(tables.raw_files).where(_R.file_id == file_id))


# ---------------------------------------------------------------------------------------------
# raw_files: the cold archive (docs/design.md §5)


def _cold(cutoff: dt.datetime) -> Any:
    f = tables.raw_files.c
    return sa.func.coalesce(f.flushed_at, f.ended_at) <= cutoff


def cold_files(conn: sa.Connection, *, cutoff: dt.datetime, limit: int) -> list[str]:
    """Fully refined files with nothing pending, unchanged since ``cutoff``."""
    f = tables.raw_files.c
    query = (
        sa.select(f.file_id)
        .where(
            f.status == Status.REFINED,
            f.last_refined_seq == f.flushed_seq,
            f.next_seq == f.flushed_seq + 1,
            f.flush_pending.is_(False),
            _cold(cutoff),
        )
        .order_by(f.file_id)
        .limit(limit)
    )
    return [row[0] for row in conn.execute(query)]


def cold_unrefined(conn: sa.Connection, *, cutoff: dt.datetime) -> list[tables.FileRow]:
    """Files unchanged since ``cutoff`` that were never fully refined and have no
    ``unrefined_cold`` anomaly yet."""
    f = tables.raw_files.c
    a = tables.anomalies.c
    flagged = sa.select(a.file_id).where(a.kind == Kind.UNREFINED_COLD, a.file_id.is_not(None))
    query = sa.select(tables.raw_files).where(
        f.status.in_((Status.NEW, Status.ERROR)),
        f.flushed_seq > f.last_refined_seq,
        _cold(cutoff),
        f.file_id.not_in(flagged),
    )
    return [tables.FileRow.from_row(row) for row in conn.execute(query)]


_MARK_ARCHIVED = database.Prepared(  # one per archived file: built once, not per call
    sa.update(tables.raw_files)
    .where(
        tables.raw_files.c.file_id == sa.bindparam("where_file_id"),
        tables.raw_files.c.status == Status.REFINED,
        tables.raw_files.c.next_seq == sa.bindparam("where_next_seq"),
        tables.raw_files.c.flushed_seq == sa.bindparam("where_flushed_seq"),
    )
    .values(status=Status.ARCHIVED, path=_bind("path"), archived_at=_bind("archived_at"))
    .values(updated_at=_bind("updated_at"))
)


def mark_archived(conn: sa.Connection, row: tables.FileRow, *, path: str, now: dt.datetime) -> bool:
    """Point the index at the archive — only if nothing changed since ``row`` was read (an
    append or a re-refine meanwhile keeps the original)."""
    where = {"file_id": row.file_id, "next_seq": row.next_seq, "flushed_seq": row.flushed_seq}
    sets = {"set_path": path, "set_archived_at": now, "set_updated_at": now}
    return bool(
        _MARK_ARCHIVED.rowcount(conn, {**sets, **{f"where_{k}": v for k, v in where.items()}})
    )


def mark_restored(
    conn: sa.Connection, file_id: str, *, path: str, now: dt.datetime
) -> tables.FileRow | None:
    """Point the index back at the live file of an archived row; the updated row."""
    f = tables.raw_files.c
    stmt = (
        sa.update(tables.raw_files)
        .where(f.file_id == file_id, f.status == Status.ARCHIVED)
        .values(
            status=sa.case((f.last_refined_seq < f.flushed_seq, Status.NEW), else_=Status.REFINED),
            path=path,
            archived_at=None,
            updated_at=now,
        )
    )
    conn.execute(stmt)
    return get_file(conn, file_id)


def archived_among(conn: sa.Connection, file_ids: Sequence[str]) -> list[str]:
    """The ids in ``file_ids`` whose rows say ``archived``."""
    f = tables.raw_files.c
    query = sa.select(f.file_id).where(f.file_id.in_(list(file_ids)), f.status == Status.ARCHIVED)
    return [row[0] for row in conn.execute(query)]


# ---------------------------------------------------------------------------------------------
# raw_files: reindex (the files are the truth)


def reindex_file(
    conn: sa.Connection, file_id: str, *, archived: bool, now: dt.datetime, **values: Any
) -> bool:
    """Set a row's file-derived columns (``values``: path, header fields, flushed_seq, …) from
    its file; True when the row was new. Refinement state is kept, clamped to the file's
    message count; an archived file was fully refined before it was archived."""
    count = int(values["flushed_seq"])
    row = get_file(conn, file_id, for_update=True)
    if row is None:
        insert_file(
            conn,
            now=now,
            file_id=file_id,
            status=Status.ARCHIVED if archived else Status.NEW,
            last_refined_seq=count if archived else 0,
            next_seq=count + 1,
            flush_pending=False,
            **values,
        )
        return True
    refined = count if archived else min(row.last_refined_seq, count)
    fresh = Status.REFINED if refined == count else Status.NEW
    _update(
        conn,
        file_id,
        now=now,
        next_seq=max(row.next_seq, count + 1),
        last_refined_seq=refined,
        status=Status.ARCHIVED if archived else fresh,
        flush_pending=False,
        **values,
    )
    return False


_REINDEX_COLUMNS = (
    *("path", "source_type", "agent_id", "session_key", "metadata_json", "started_at"),
    *("ended_at", "flushed_seq", "flushed_bytes", "chain_head", "file_id", "status"),
    *("last_refined_seq", "next_seq", "flush_pending", "created_at", "updated_at"),
)
_REINDEX_INSERT = {
    d: database.Prepared(_inserting(d, _REINDEX_COLUMNS)) for d in ("postgresql", "sqlite")
}


def reindex_files(
    conn: sa.Connection, files: Sequence[tuple[str, bool, dict[str, Any]]], *, now: dt.datetime
) -> int:
    """:func:`reindex_file` over many ``(file_id, archived, values)``: the rows that are new in
    one executemany; how many were new."""
    ids = [file_id for file_id, _, _ in files]
    known = set(conn.execute(sa.select(_R.file_id).where(_R.file_id.in_(ids))).scalars())
    new = []
    for file_id, archived, values in files:
        if file_id in known:
            reindex_file(conn, file_id, archived=archived, now=now, **values)
            continue
        count = int(values["flushed_seq"])
        new.append(
            {
                **values,
                "file_id": file_id,
                "status": Status.ARCHIVED if archived else Status.NEW,
                "last_refined_seq": count if archived else 0,
                "next_seq": count + 1,
                "flush_pending": False,
                "created_at": now,
                "updated_at": now,
            }
        )
    if new:
        _REINDEX_INSERT[conn.dialect.name].many(conn, new)
    return len(new)


# ---------------------------------------------------------------------------------------------
# the deployment


def deployment_id(conn: sa.Connection) -> str:
    """This store's identity (made by the migration that added it)."""
    found = conn.execute(sa.select(tables.deployment.c.id).limit(1)).scalar()
    if found is None:
        raise errors.Misconfigured("the index has no deployment row: run `sgme migrate`")
    return str(found)
