"""The ledger's queries (:mod:`pipeline.ledger`): journal rows read back in bounded batches, in
seq order, and what the sweeper asks for."""

from __future__ import annotations

import datetime as dt
import uuid

from pipeline import database, index, ledger
from pipeline.tables import Status


def _file(db: database.Database) -> str:
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
        )
    return file_id


def _journal(
    db: database.Database, file_id: str, *sizes: int, at: dt.datetime, seq: int = 1
) -> None:
    with db.transaction() as conn:
        for size in sizes:
            ledger.add_journal(
                conn,
                file_id=file_id,
                first_seq=seq,
                last_seq=seq,
                last_ts="2026-08-03T11:18:06Z",
                data="x" * size,
                size=size,
                created_at=at,
            )
            seq += 1


def test_a_batch_stays_within_its_budget_but_holds_one_row_at_least(
    db: database.Database,
) -> None:
    file_id = _file(db)
    _journal(db, file_id, 40, 40, 40, 500, 40, at=db.now())
    with db.reading() as conn:
        batches = [
            [r.first_seq for r in ledger.journal_batch(conn, file_id, after, 100)]
            for after in (0, 3, 4)
        ]
        upto = [r.first_seq for r in ledger.journal_batch(conn, file_id, 0, 10_000, upto=2)]
    assert batches == [[1, 2, 3], [4], [5]]
    assert upto == [1, 2]


def test_stale_files_are_those_whose_rows_waited_long_enough(db: database.Database) -> None:
    old, new = _file(db), _file(db)
    now = db.now()
    _journal(db, old, 10, at=now - dt.timedelta(seconds=10))
    _journal(db, new, 10, at=now)
    with db.reading() as conn:
        assert ledger.stale_journal_files(conn, now - dt.timedelta(seconds=5)) == [old]
        assert sorted(ledger.stale_journal_files(conn, None)) == sorted([old, new])
        assert ledger.journal_backlog(conn) == (2, 2, 20)


def test_a_file_is_as_old_as_its_first_waiting_row(db: database.Database) -> None:
    """The sweeper's age of a file is its first journal row's (no index of the creation times:
    a file's first row is its oldest), whatever its later rows' ages."""
    waited, fresh = _file(db), _file(db)
    now = db.now()
    _journal(db, waited, 10, at=now - dt.timedelta(seconds=10), seq=4)
    _journal(db, waited, 10, 10, at=now, seq=5)
    _journal(db, fresh, 10, 10, at=now, seq=1)
    with db.reading() as conn:
        assert ledger.stale_journal_files(conn, now - dt.timedelta(seconds=5)) == [waited]
        assert ledger.stale_journal_files(conn, now - dt.timedelta(seconds=20)) == []
        assert sorted(ledger.stale_journal_files(conn, now)) == sorted([waited, fresh])
        assert sorted(ledger.stale_journal_files(conn, None)) == sorted([waited, fresh])
