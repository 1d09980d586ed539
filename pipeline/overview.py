"""What an operator checks first, in one read: the journal's backlog, the appends held for
their predecessor, files by status, the refinement lag, and the latest anomalies — the web
view's status page (``/ui/status``) and the numbers ``/metrics`` also exports."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Collection

import sqlalchemy as sa

from pipeline import anomalies, database, ledger, tables
from pipeline.tables import Status

RECENT_ANOMALIES = 50  #: anomalies the overview lists, newest first


@dataclasses.dataclass(frozen=True)
class Overview:
    """The state of the store at one moment."""

    at: dt.datetime  #: when it was read (naive UTC, the index's clock)
    journal_rows: int
    journal_messages: int
    journal_bytes: int
    held_appends: int
    files_by_status: dict[str, int]
    lag_messages: int  #: flushed messages not yet refined, over every refinable file
    lag_worst: int  #: the most any one file waits with
    oldest_unrefined: dt.datetime | None  #: flush time of the longest-waiting unrefined file
    anomalies_by_kind: dict[str, int]
    recent_anomalies: list[tables.Anomaly]


def _of(agents: Collection[str] | None) -> tuple[sa.ColumnElement[bool], ...]:
    """The condition that keeps ``agents``' files (None: every file)."""
    return () if agents is None else (tables.raw_files.c.agent_id.in_(sorted(agents)),)


def count_files_by_status(
    conn: sa.Connection, *, agents: Collection[str] | None = None
) -> dict[str, int]:
    """``{status: count}`` (of ``agents``' files only, when given)."""
    r = tables.raw_files.c
    query = sa.select(r.status, sa.func.count()).where(*_of(agents)).group_by(r.status)
    return {status: int(count) for status, count in conn.execute(query)}


def refinement_lag(
    conn: sa.Connection, *, agents: Collection[str] | None = None
) -> tuple[int, int]:
    """``(sum, max)`` of ``flushed_seq - last_refined_seq`` over files that can be refined
    (``agents``' only, when given)."""
    r = tables.raw_files.c
    lag = r.flushed_seq - r.last_refined_seq
    query = sa.select(sa.func.coalesce(sa.func.sum(lag), 0), sa.func.coalesce(sa.func.max(lag), 0))
    total, worst = conn.execute(query.where(r.status != Status.ARCHIVED, *_of(agents))).one()
    return int(total), int(worst)


def read(
    db: database.Database, *, recent: int = RECENT_ANOMALIES, agents: Collection[str] | None = None
) -> Overview:
    """The overview, from one read-only snapshot of the index: of ``agents``' files only when
    given (an admin token's agents, as the API scopes it), whose anomalies are then only those
    of their files (not the store's events, which belong to no file)."""
    r = tables.raw_files.c
    waiting = sa.select(sa.func.min(r.flushed_at)).where(
        r.flushed_seq > r.last_refined_seq, r.status.in_(tables.REFINABLE)
    )
    latest = (
        sa.select(tables.anomalies)
        .order_by(
            sa.func.coalesce(tables.anomalies.c.last_seen_at, tables.anomalies.c.created_at).desc()
        )
        .limit(recent)
    )
    waiting = waiting.where(*_of(agents))
    if agents is not None:
        latest = latest.where(anomalies.of_agents(agents))
    with db.reading() as conn:
        rows, messages, size = ledger.journal_backlog(conn, agents=agents)
        held, _ = ledger.waiting_backlog(conn, agents=agents)
        lag, worst = refinement_lag(conn, agents=agents)
        return Overview(
            at=db.now(),
            journal_rows=rows,
            journal_messages=messages,
            journal_bytes=size,
            held_appends=held,
            files_by_status=count_files_by_status(conn, agents=agents),
            lag_messages=lag,
            lag_worst=worst,
            oldest_unrefined=conn.execute(waiting).scalar_one(),
            anomalies_by_kind=anomalies.count_by_kind(conn, agents=agents),
            recent_anomalies=[tables.Anomaly.from_row(a) for a in conn.execute(latest)],
        )
