"""The index's rules about ``raw_files`` and anomalies (:mod:`pipeline.index`): the fences, and
anomalies recorded once."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import sqlalchemy as sa

from pipeline import anomalies, audit, database, index, tables
from pipeline.tables import Kind, Status


def _insert(db: database.Database) -> str:
    file_id = str(uuid.uuid4())
    with db.transaction() as conn:
        index.insert_file(
            conn,
            now=db.now(),
            file_id=file_id,
            path=f"raw/sessions/{file_id}.md",
            source_type="session",
            agent_id="a",
            session_key=file_id,
            started_at=db.now(),
            status=Status.PENDING,
            next_seq=3,
        )
    return file_id


def test_an_anomaly_is_recorded_once_per_file_kind_and_key(db: database.Database) -> None:
    file_id = _insert(db)
    with db.transaction() as conn:
        counts = [
            anomalies.record(conn, file_id, Kind.FILE_SHRUNK, "first", now=db.now()),
            anomalies.record(conn, file_id, Kind.FILE_SHRUNK, "second", now=db.now()),
            anomalies.record(conn, file_id, Kind.FILE_SHRUNK, "other key", key="7", now=db.now()),
        ]
        found = anomalies.listed(conn, file_id=file_id)
    assert counts == [1, 2, 1]
    assert [(a.kind, a.key, a.detail, a.count) for a in found] == [
        ("file_shrunk", "", "first", 2),
        ("file_shrunk", "7", "other key", 1),
    ]


def test_without_a_file_a_keyed_anomaly_is_counted_and_an_unkeyed_one_is_an_event(
    db: database.Database,
) -> None:
    with db.transaction() as conn:
        for _ in range(3):
            anomalies.record(conn, None, Kind.SEQUENCE_DUPLICATE, "d", key="s#5", now=db.now())
            anomalies.record(conn, None, Kind.APPEND_TASK_REJECTED, "e", now=db.now())
        found = anomalies.listed(conn)
    assert sorted((a.kind, a.count) for a in found) == [
        ("append_task_rejected", 1),
        ("append_task_rejected", 1),
        ("append_task_rejected", 1),
        ("sequence_duplicate", 3),
    ]


def test_a_flush_advances_only_from_the_seq_it_read(db: database.Database) -> None:
    file_id = _insert(db)
    ended = dt.datetime(2026, 8, 3, 11, 18, 6)
    advance: dict[str, Any] = {
        "flushed_seq": 2,
        "flushed_bytes": 100,
        "chain_head": "00" * 32,
        "ended_at": ended,
        "now": db.now(),
    }
    with db.transaction() as conn:
        assert index.advance_flushed(conn, file_id, old_seq=0, **advance) == 3
        # a second flush that read flushed_seq 0 too is fenced off
        assert index.advance_flushed(conn, file_id, old_seq=0, **advance) is None
        row = index.get_file(conn, file_id)
    assert row is not None
    assert (row.flushed_seq, row.status, row.flush_pending) == (2, "new", False)


def test_a_damaged_file_becomes_error_once(db: database.Database) -> None:
    file_id = _insert(db)
    with db.transaction() as conn:
        first = index.record_damage(conn, file_id, Kind.FILE_MISSING, "gone", now=db.now())
        again = index.record_damage(conn, file_id, Kind.FILE_MISSING, "gone", now=db.now())
        status = conn.execute(
            sa.select(tables.raw_files.c.status).where(tables.raw_files.c.file_id == file_id)
        ).scalar()
    assert (first, again, status) == (True, False, "error")


def test_an_appends_lock_on_its_row_lets_a_flush_catalog_the_file(
    postgres_db: database.Database,
) -> None:
    """The append path locks its session's row against other appends and flushes' updates of
    it (``FOR NO KEY UPDATE``), not against the rows that only refer to it: a flush's
    catalog rows (their foreign key) go in while an append of the file is uncommitted."""
    db = postgres_db
    file_id = _insert(db)
    row = {
        "file_id": file_id,
        "seq": 1,
        "byte_offset": 0,
        "byte_length": 10,
        "ts": db.now(),
        "role": "user",
    }
    with db.transaction() as conn:
        assert index.find_file(conn, "a", "session", file_id) is not None  # locked till the end
        with db.engine.connect() as other, other.begin():
            other.exec_driver_sql("SET LOCAL lock_timeout = '2s'")  # FOR UPDATE: it times out
            other.execute(sa.insert(tables.messages).values(row))
    with db.reading() as conn:
        assert conn.scalar(sa.select(sa.func.count()).select_from(tables.messages)) == 1


def test_a_flush_reads_its_files_row_and_unfinished_removal_at_once(
    db: database.Database,
) -> None:
    """``audit.file_and_pending``: the row and whether a removal in the file is unfinished,
    as ``get_file`` and ``audit.pending`` say them; and for a file whose row is gone too."""
    file_id, other = _insert(db), _insert(db)
    gone = str(uuid.uuid4())  # an erased file: no row, its removal unfinished
    with db.transaction() as conn:
        for target in (file_id, gone):
            audit.record(
                conn, now=db.now(), action=audit.ERASE, file_id=target, agent_id="a", actor="t"
            )
    with db.reading() as conn:
        found = {f: audit.file_and_pending(conn, f) for f in (file_id, other, gone)}
        rows = {f: index.get_file(conn, f) for f in (file_id, other)}
    assert found == {
        file_id: (rows[file_id], True),
        other: (rows[other], False),
        gone: (None, True),
    }
    with db.transaction() as conn:
        for row in audit.unfinished(conn):
            audit.finish(conn, row.id, now=db.now())
    with db.reading() as conn:
        assert audit.file_and_pending(conn, file_id) == (rows[file_id], False)
        assert audit.file_and_pending(conn, gone) == (None, False)
