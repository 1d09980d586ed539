"""The audit trail of what was removed on purpose (``audit_log``): one row per redacted message
and per erased file — who, when, why, and the sha256 of what went, never the text — and one per
erasure whose tombstone was let go on purpose (``release``).

A row is written before anything is removed and *finished* once the removal is complete; an
unfinished row is the record a crash left of a rewrite or a removal to finish
(:mod:`pipeline.rewrite`, :mod:`pipeline.erasure`). Rows are never deleted: an erased file's
row is what answers its ``source_ref``s with 410 Gone. Functions take a Connection.
"""

from __future__ import annotations

import datetime as dt
import getpass
import json
import socket
from typing import Any

import sqlalchemy as sa

from pipeline import database, tables

REDACT = "redact"
ERASE = "erase"
RELEASE = "release"  #: an erasure's tombstone let go (erasure.release)
_A = tables.audit_log.c
_UNFINISHED = database.Prepared(
    sa.select(_A.id).where(_A.file_id == sa.bindparam("file_id"), _A.finished_at.is_(None)).limit(1)
)


def record(conn: sa.Connection, *, now: dt.datetime, **values: Any) -> tables.AuditRow:
    """Write an unfinished row (``values``: action, file_id, agent_id, actor, …)."""
    values.setdefault("created_at", now)
    found = conn.execute(
        sa.insert(tables.audit_log).values(**values).returning(*tables.audit_log.c)
    ).one()
    return tables.AuditRow.from_row(found)


def finish(conn: sa.Connection, audit_id: int, *, now: dt.datetime) -> None:
    """The removal a row records is complete."""
    conn.execute(
        sa.update(tables.audit_log)
        .where(_A.id == audit_id, _A.finished_at.is_(None))
        .values(finished_at=now)
    )


def pending(conn: sa.Connection, file_id: str) -> bool:
    """Whether a removal in ``file_id`` is unfinished (a cheap check, made by every flush)."""
    return _UNFINISHED.first(conn, {"file_id": file_id}) is not None


_R = tables.raw_files.c
_FILE_AND_PENDING = database.Prepared(
    sa.select(
        tables.raw_files,
        sa.exists()
        .where(_A.file_id == _R.file_id, _A.finished_at.is_(None))
        .label("removal_unfinished"),
    ).where(_R.file_id == sa.bindparam("file_id"))
)


def file_and_pending(conn: sa.Connection, file_id: str) -> tuple[tables.FileRow | None, bool]:
    """The row of ``file_id`` (None if there is none) and :func:`pending`, in one statement:
    every flush asks both."""
    found = _FILE_AND_PENDING.first(conn, {"file_id": file_id})
    if found is None:  # an erased file's removal may be unfinished all the same
        return None, pending(conn, file_id)
    unfinished = bool(found.pop("removal_unfinished"))
    return tables.FileRow.of(found), unfinished


def unfinished(
    conn: sa.Connection, *, file_id: str | None = None, before: dt.datetime | None = None
) -> list[tables.AuditRow]:
    """Unfinished rows, oldest first (of one file, or all; begun before ``before``)."""
    query = sa.select(tables.audit_log).where(_A.finished_at.is_(None)).order_by(_A.id)
    if file_id is not None:
        query = query.where(_A.file_id == file_id)
    if before is not None:
        query = query.where(_A.created_at < before)
    return [tables.AuditRow.from_row(r) for r in conn.execute(query)]


def redaction(conn: sa.Connection, file_id: str, seq: int) -> tables.AuditRow | None:
    """The finished redaction of message ``file_id:seq``, or None."""
    query = sa.select(tables.audit_log).where(
        _A.file_id == file_id, _A.seq == seq, _A.action == REDACT, _A.finished_at.is_not(None)
    )
    row = conn.execute(query.order_by(_A.id.desc()).limit(1)).first()
    return None if row is None else tables.AuditRow.from_row(row)


def redactions(conn: sa.Connection, file_id: str) -> list[tables.AuditRow]:
    """The finished redactions of a file, in the order they were made."""
    query = sa.select(tables.audit_log).where(
        _A.file_id == file_id, _A.action == REDACT, _A.finished_at.is_not(None)
    )
    return [tables.AuditRow.from_row(r) for r in conn.execute(query.order_by(_A.id))]


def erased(conn: sa.Connection, file_id: str) -> tables.AuditRow | None:
    """The erasure of ``file_id``, or None when it was never erased."""
    query = sa.select(tables.audit_log).where(_A.file_id == file_id, _A.action == ERASE)
    row = conn.execute(query.order_by(_A.id).limit(1)).first()
    return None if row is None else tables.AuditRow.from_row(row)


def erased_ids(conn: sa.Connection) -> set[str]:
    """The ids of every file ever erased (``reindex`` never brings one back)."""
    return {r[0] for r in conn.execute(sa.select(_A.file_id).where(_A.action == ERASE))}


def listed(
    conn: sa.Connection,
    *,
    agents: frozenset[str] | None = None,
    file_id: str | None = None,
    after: int = 0,
    limit: int = 100,
) -> list[tables.AuditRow]:
    """Rows after the id ``after``, oldest first (of ``agents``: None for all)."""
    query = sa.select(tables.audit_log).where(_A.id > after).order_by(_A.id).limit(limit)
    if agents is not None:
        query = query.where(_A.agent_id.in_(sorted(agents)))
    if file_id is not None:
        query = query.where(_A.file_id == file_id)
    return [tables.AuditRow.from_row(r) for r in conn.execute(query)]


def paths(row: tables.AuditRow) -> list[str]:
    """The paths an erasure still has to remove."""
    found = json.loads(row.paths_json or "[]")
    assert isinstance(found, list)
    return [str(p) for p in found]


# ---------------------------------------------------------------------------------------------
# who


def token_actor(conn: sa.Connection, token_id: str | None) -> str:
    """Who a request acts as, for the audit row: the token's name and id, or that no token
    was needed (auth off: a server on loopback with no token made)."""
    if token_id is None:
        return "api (auth off)"
    t = tables.api_tokens.c
    name = conn.execute(sa.select(t.name).where(t.token_id == token_id)).scalar()
    return f"token {token_id}" + (f" ({name})" if name else "")


def local_actor() -> str:
    """Who runs the ``sgme`` command: the system user and host (it acts on the store
    directly, with the data directory's permissions)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"cli {user}@{socket.gethostname()}"
