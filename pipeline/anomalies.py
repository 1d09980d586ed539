"""Anomalies: what went wrong, recorded once per (file, kind, key) and then counted, as
named queries that take a Connection and the caller's ``now``. The kinds are
:class:`pipeline.tables.Kind`; docs/operations.md lists what each means."""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Sequence

import sqlalchemy as sa

from pipeline import database, tables


def record(
    conn: sa.Connection,
    file_id: str | None,
    kind: str,
    detail: str,
    *,
    key: str = "",
    now: dt.datetime,
) -> int:
    """Record an anomaly, once per (file, kind, key): a repeat only counts (the first detail
    stays). Without a file, once per (kind, key) when a key is given (a session that has no
    file yet names itself in the key), and each time when not (an event). Returns the count
    (1 the first time)."""
    key = key[:100]
    a = tables.anomalies.c
    if file_id is None and key:
        # The unique index cannot cover a NULL file_id (NULLs are distinct): look it up, under
        # a lock on the key, so that two transactions recording it at once count one row.
        database.transaction_lock(conn, f"anomaly\x1f{kind}\x1f{key}")
        found = conn.execute(
            sa.update(tables.anomalies)
            .where(a.file_id.is_(None), a.kind == kind, a.key == key)
            .values(count=a.count + 1, last_seen_at=now)
            .returning(a.count)
        ).first()
        if found is not None:
            return int(found[0])
    stmt = database.insert(conn, tables.anomalies).values(
        file_id=file_id, kind=kind, key=key, detail=detail, created_at=now, count=1
    )
    if file_id is not None:
        stmt = stmt.on_conflict_do_update(
            index_elements=["file_id", "kind", "key"],
            set_={"count": a.count + 1, "last_seen_at": now},
        )
    return int(conn.execute(stmt.returning(a.count)).scalar_one())


def listed(
    conn: sa.Connection, *, file_id: str | None = None, kinds: Sequence[str] | None = None
) -> list[tables.Anomaly]:
    """Anomalies, oldest first."""
    query = sa.select(tables.anomalies).order_by(tables.anomalies.c.id)
    if file_id is not None:
        query = query.where(tables.anomalies.c.file_id == file_id)
    if kinds:
        query = query.where(tables.anomalies.c.kind.in_(list(kinds)))
    return [tables.Anomaly.from_row(row) for row in conn.execute(query)]


def count_by_kind(conn: sa.Connection, *, agents: Collection[str] | None = None) -> dict[str, int]:
    """``{kind: count}``, repeats counted (of ``agents``' files only, when given: the
    anomalies of no file, events of the whole store, are then left out)."""
    query = sa.select(tables.anomalies.c.kind, sa.func.sum(tables.anomalies.c.count)).group_by(
        tables.anomalies.c.kind
    )
    if agents is not None:
        query = query.where(of_agents(agents))
    return {kind: int(count) for kind, count in conn.execute(query)}


def of_agents(agents: Collection[str]) -> sa.ColumnElement[bool]:
    """The anomalies of ``agents``' files (a condition on ``anomalies``)."""
    files = sa.select(tables.raw_files.c.file_id).where(
        tables.raw_files.c.agent_id.in_(sorted(agents))
    )
    return tables.anomalies.c.file_id.in_(files)
