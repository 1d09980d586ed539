"""Appends in batches (pipeline.batches): the plain appends of a batch share their statements,
and every append still gets the answer it would have got alone — its seqs in its session's
order, its own refusal — on both databases; on PostgreSQL the batch locks its sessions' rows
in file order, as every group takes its locks."""

from __future__ import annotations

import dataclasses
import sqlite3
import threading
from pathlib import Path
from typing import Any

import helpers
import pytest
import sqlalchemy as sa

from pipeline import batches, database, errors, index, ingest, service, validation
from pipeline.settings import Backlog, Settings

AGENT = "batch"
#: the statements counted through SQLite's trace callback
SQLITE_ONLY = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
POSTGRES_ONLY = pytest.mark.parametrize("database_url", ["postgres"], indirect=True)


def _body(session: str, text: str, **extra: Any) -> dict[str, Any]:
    return {
        "agent_id": AGENT,
        "session_key": session,
        "messages": [{"role": "user", "content": text}],
        **extra,
    }


def _service(db: database.Database, data_dir: Path, database_url: str) -> service.Service:
    settings = Settings(
        data_dir=data_dir,
        database_url=database_url,
        backlog=Backlog(max_file_messages=3),
    )
    return helpers.service(db, settings, helpers.RecordingQueue())


def _batch(svc: service.Service, bodies: list[dict[str, Any]]) -> list[Any]:
    return svc.append_many([validation.parse_append(b, svc.settings.limits) for b in bodies])


def _texts(svc: service.Service, file_id: str) -> list[str]:
    svc.flush(file_id)
    return [m.content for m in svc.messages(file_id)]


def test_a_batch_answers_each_append_as_it_would_alone(
    db: database.Database, data_dir: Path, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    svc = _service(db, data_dir, database_url)
    a = helpers.append(svc, _body("a", "a1")).result.file_id
    helpers.append(svc, _body("a", "a2"))
    svc.flush(a)
    numbered = helpers.append(svc, _body("num", "n1", sequence=1)).result.file_id
    batched: list[int] = []
    apply = batches.apply_batch

    def counted(conn: Any, **kw: Any) -> Any:
        batched.append(len(kw["appends"]))
        return apply(conn, **kw)

    monkeypatch.setattr(batches, "apply_batch", counted)
    answers = _batch(
        svc,
        [
            _body("a", "a3"),
            _body("new", "new1"),
            _body("a", "a4"),
            _body("num", "plain to a numbered session"),
            _body("new", "new2"),
            _body("a", "a5"),
            _body("a", "a6: one past backlog_max_file_messages"),
            _body("keyed", "k1", idempotency_key="k-1"),
            _body("num", "n2", sequence=2),
        ],
    )
    # the plain ones go together; "num" has a numbered append in the batch, so its plain one
    # goes alone (and is refused there). On PostgreSQL the group runs first without
    # savepoints, and that refusal runs it again: with the batch in it a second time when the
    # batch came first (the group's order is its pieces' files', made at random here)
    assert batched in ([[6], [6, 6]] if db.postgres else [[6]])
    done = [x.result if isinstance(x, service.Appended) else x for x in answers]
    a3, new1, a4, plain_num, new2, a5, a6, k1, n2 = done
    assert isinstance(a3, ingest.AppendResult) and (a3.file_id, a3.first_seq) == (a, 3)
    assert a3.kick and a3.source_refs == (f"{a}:3",)
    assert isinstance(a4, ingest.AppendResult) and (a4.first_seq, a4.kick) == (4, False)
    assert isinstance(a5, ingest.AppendResult) and (a5.first_seq, a5.last_seq) == (5, 5)
    assert isinstance(a6, errors.Overloaded) and "3 messages of this session wait" in a6.detail
    assert isinstance(new1, ingest.AppendResult) and (new1.first_seq, new1.kick) == (1, True)
    assert isinstance(new2, ingest.AppendResult)
    assert (new2.file_id, new2.first_seq, new2.kick) == (new1.file_id, 2, False)
    assert isinstance(plain_num, errors.Conflict) and "sequence is required" in str(
        plain_num.detail
    )
    assert isinstance(k1, ingest.AppendResult) and k1.first_seq == 1
    assert isinstance(n2, ingest.AppendResult) and (n2.file_id, n2.first_seq) == (numbered, 2)

    assert _texts(svc, a) == ["a1", "a2", "a3", "a4", "a5"]
    assert _texts(svc, new1.file_id) == ["new1", "new2"]
    assert _texts(svc, numbered) == ["n1", "n2"]
    row = helpers.file_row(db, a)
    assert (row.next_seq, row.flushed_seq, row.flush_pending) == (6, 5, False)
    # the key was remembered: a retry replays
    again = _batch(svc, [_body("keyed", "k1", idempotency_key="k-1"), _body("a", "a7")])
    assert again[0].result.replayed and again[0].result.first_seq == 1
    assert again[1].result.first_seq == 6


@SQLITE_ONLY
def test_a_batch_of_plain_appends_makes_one_statement_of_each_kind(
    db: database.Database, data_dir: Path, database_url: str
) -> None:
    svc = _service(db, data_dir, database_url)
    for session in ("s1", "s2", "s3"):
        helpers.append(svc, _body(session, "first"))
    held = db._committer
    assert held is not None
    raw = held.conn.connection.dbapi_connection
    assert isinstance(raw, sqlite3.Connection)
    sql: list[str] = []
    raw.set_trace_callback(sql.append)
    try:
        answers = _batch(svc, [_body(f"s{1 + i % 3}", f"m{i}") for i in range(6)])
    finally:
        raw.set_trace_callback(None)
    assert [x.result.first_seq for x in answers] == [2, 2, 2, 3, 3, 3]
    kinds = [s.split()[0].upper() for s in sql]
    assert kinds.count("INSERT") == 1 and kinds.count("UPDATE") == 1, sql
    assert sum(s.startswith("SELECT") and "FROM raw_files" in s for s in sql) == 1, sql
    assert not any(s.startswith("SAVEPOINT") for s in sql), sql  # one piece: no savepoint


def test_a_batch_whose_statements_fail_runs_its_appends_one_by_one(
    db: database.Database, data_dir: Path, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    svc = _service(db, data_dir, database_url)
    a = helpers.append(svc, _body("a", "a1")).result.file_id
    b = helpers.append(svc, _body("b", "b1")).result.file_id
    failures = []

    @dataclasses.dataclass
    class Failing:
        inner: Any

        def execute(self, conn: Any, rows: Any) -> None:
            self.inner.execute(conn, rows)  # written, then the statement "fails"
            failures.append(len(rows))
            raise errors.InternalError("the batch's statement failed")

    monkeypatch.setattr(index, "_RECORD_APPENDS", Failing(index._RECORD_APPENDS))
    answers = _batch(svc, [_body("a", "a2"), _body("b", "b2"), _body("a", "a3")])
    assert failures == [2]
    assert [(x.result.file_id, x.result.first_seq) for x in answers] == [(a, 2), (b, 2), (a, 3)]
    assert _texts(svc, a) == ["a1", "a2", "a3"]  # nothing of the failed batch stayed
    assert _texts(svc, b) == ["b1", "b2"]


@POSTGRES_ONLY
def test_a_batch_locks_its_sessions_rows_in_file_order(
    db: database.Database, data_dir: Path, database_url: str
) -> None:
    """While another transaction holds the middle one of three sessions' rows, a batch of
    appends to all three has locked the first (in file order) and waits, the last untouched:
    it takes the rows as every group of every process takes its locks (no wait in a circle
    with a flush round, which locks its files in the same order)."""
    svc = _service(db, data_dir, database_url)
    files = {helpers.append(svc, _body(s, "first")).result.file_id: s for s in ("x", "y", "z")}
    lo, mid, hi = sorted(files)
    done: list[Any] = []
    with db.engine.connect() as holder, holder.begin():
        holder.exec_driver_sql(
            "SELECT 1 FROM raw_files WHERE file_id = %(f)s FOR UPDATE", {"f": mid}
        )
        appending = threading.Thread(
            target=lambda: done.extend(_batch(svc, [_body(s, "second") for s in "zyx"])),
            daemon=True,
        )
        appending.start()

        def locked(file_id: str) -> bool:
            with db.engine.connect() as probe, probe.begin():
                sql = "SELECT 1 FROM raw_files WHERE file_id = %(f)s FOR UPDATE NOWAIT"
                try:
                    probe.exec_driver_sql(sql, {"f": file_id})
                except sa.exc.OperationalError:
                    return True
                return False

        helpers.wait_for(lambda: locked(lo), what="the batch's lock on the first row")
        assert not locked(hi)  # it waits for the middle one before it takes the last
        assert appending.is_alive() and not done
    appending.join(30)
    assert not appending.is_alive()
    assert [(x.result.file_id, x.result.first_seq) for x in done] == [
        (f, 2) for f in sorted(files, key=lambda f: files[f], reverse=True)
    ]
    # a table this small is scanned in whatever order; the statement asks for the file order
    sql = str(batches._lock_sessions(3).compile(dialect=db.engine.dialect))
    assert sql.endswith("ORDER BY raw_files.file_id FOR NO KEY UPDATE"), sql
