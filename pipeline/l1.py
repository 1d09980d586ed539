"""L1 items: what refinement produced, each with the source_refs it stands on."""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Sequence
from typing import Any

import sqlalchemy as sa

from pipeline import database, tables

#: the insert of items, by dialect name (prepared: database.Prepared)
_ADD: dict[str, database.Prepared] = {}


def add_items(conn: sa.Connection, items: Sequence[dict[str, Any]], *, now: dt.datetime) -> None:
    """Insert items, skipping any the file already has (same ``item_hash``)."""
    if not items:
        return
    stmt = _ADD.get(conn.dialect.name)
    if stmt is None:
        stmt = _ADD[conn.dialect.name] = database.Prepared(
            database.insert(conn, tables.l1_items)
            .values(database.binds(tables.l1_items))
            .on_conflict_do_nothing(index_elements=["file_id", "item_hash"])
        )
    stmt.many(conn, [{**item, "created_at": now} for item in items])


_DELETE = database.Prepared(
    sa.delete(tables.l1_items).where(tables.l1_items.c.file_id == sa.bindparam("file_id"))
)


def delete_items(conn: sa.Connection, file_id: str) -> None:
    """Drop a file's items (before a full re-refine)."""
    _DELETE.execute(conn, {"file_id": file_id})


def list_items(
    conn: sa.Connection,
    *,
    file_id: str | None = None,
    agents: Collection[str] | None = None,
    after: int = 0,
    limit: int = 100,
) -> list[tables.L1Item]:
    """Items of ``agents`` (None: all) in insertion order, after the id ``after``."""
    query = (
        sa.select(tables.l1_items)
        .where(tables.l1_items.c.id > after)
        .order_by(tables.l1_items.c.id)
        .limit(limit)
    )
    if file_id is not None:
        query = query.where(tables.l1_items.c.file_id == file_id)
    if agents is not None:
        query = query.where(tables.l1_items.c.agent_id.in_(list(agents)))
    return [tables.L1Item.from_row(row) for row in conn.execute(query)]
