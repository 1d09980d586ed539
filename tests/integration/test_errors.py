"""Errors sorted by what the caller should do (issue: architecture pass), on SQLite and
PostgreSQL: a bug is a 500 that is logged once and never retried; a lost connection or a busy
database is a 503 that is retried; a race between two bodies for one key is a clean 409. And
the API's failure paths: a kick that cannot be sent, a flush that cannot get its lock under
``?wait=flushed``, a damaged file read again and again."""

from __future__ import annotations

import concurrent.futures
import logging
import sqlite3
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helpers
import pytest
import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from starlette.exceptions import StarletteDeprecationWarning

from pipeline import anomalies, database, errors, index, journal, tables
from pipeline.api import app as api_app
from pipeline.service import Service
from pipeline.settings import Settings

with warnings.catch_warnings():
    warnings.simplefilter("ignore", StarletteDeprecationWarning)
    from fastapi.testclient import TestClient

TS = "2026-08-03T11:18:06Z"


def body(session_key: str = "s1", content: str = "hello", **extra: Any) -> dict[str, Any]:
    return {
        "agent_id": "hermes",
        "session_key": session_key,
        "messages": [{"role": "user", "content": content, "ts": TS}],
        **extra,
    }


@pytest.fixture
def service(db: database.Database, data_dir: Path, database_url: str) -> Service:
    settings = Settings(
        data_dir=data_dir,
        database_url=database_url,
        lock_timeout=0.3,
        allowed_hosts=("testserver",),  # TestClient's Host
    )
    return helpers.service(db, settings, helpers.RecordingQueue())


@pytest.fixture
def client(service: Service) -> Iterator[TestClient]:
    with TestClient(api_app.create_app(service), raise_server_exceptions=False) as c:
        yield c


def _problem(r: Any, status: int, kind: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    problem = dict(r.json())
    assert problem["type"] == f"urn:sgme:problem:{kind}"
    return problem


# ---------------------------------------------------------------------------------------------
# database errors, classified


def test_a_typo_in_sql_is_a_bug_not_an_outage(db: database.Database) -> None:
    with pytest.raises(errors.InternalError) as info, db.transaction() as conn:
        conn.execute(sa.text("SELECT no_such_column FROM raw_files"))
    assert not info.value.retry and info.value.status == 500
    assert "no_such_column" in info.value.detail


def test_a_lost_connection_is_transient(db: database.Database) -> None:
    if db.postgres:
        with pytest.raises(errors.IndexUnavailable) as info, db.transaction() as c:
            c.execute(sa.text("SELECT pg_terminate_backend(pg_backend_pid())"))
            c.execute(sa.text("SELECT 1"))
    else:
        # Another process holding SQLite's write lock past the busy timeout.
        path = db.engine.url.database
        assert path
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        busy = database.Database.from_url(str(db.engine.url), busy_timeout=0.1)
        try:
            with pytest.raises(errors.IndexUnavailable) as info, busy.transaction():
                pass
        finally:
            other.execute("ROLLBACK")
            other.close()
            busy.dispose()
    assert info.value.retry and info.value.status == 503


def test_a_constraint_is_a_conflict() -> None:
    integrity = sa_exc.IntegrityError("INSERT", {}, Exception("duplicate key"))
    assert isinstance(database.map_error(integrity), errors.ConstraintViolation)
    data = sa_exc.DataError("SELECT", {}, Exception("out of range"))
    assert isinstance(database.map_error(data), errors.InternalError)
    timeout = sa_exc.TimeoutError("QueuePool limit reached")
    assert isinstance(database.map_error(timeout), errors.IndexUnavailable)


def test_a_bug_answers_500_and_is_logged_once(
    client: TestClient, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(conn: sa.Connection, **_: Any) -> list[tables.FileRow]:
        conn.execute(sa.text("SELECT no_such_column FROM raw_files"))
        return []

    monkeypatch.setattr(index, "list_files", broken)
    with caplog.at_level(logging.WARNING):
        problem = _problem(client.get("/v1/files"), 500, "internal")
    assert "no_such_column" in problem["detail"]
    logged = [r for r in caplog.records if "no_such_column" in r.getMessage()]
    assert len(logged) == 1 and logged[0].levelno == logging.ERROR


def test_a_lost_connection_answers_503(
    client: TestClient, db: database.Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    def lost(conn: sa.Connection, **_: Any) -> list[tables.FileRow]:
        if database.is_postgres(conn):
            conn.execute(sa.text("SELECT pg_terminate_backend(pg_backend_pid())"))
            conn.execute(sa.text("SELECT 1"))
        # SQLite: the error the driver raises when another writer holds the lock (a reader
        # takes none, so one connection holds it and a second is refused).
        path = str(db.engine.url.database)
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        other = sqlite3.connect(path, timeout=0.05, isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as busy:
            raise sa_exc.OperationalError("BEGIN IMMEDIATE", {}, busy) from busy
        finally:
            other.close()
            holder.execute("ROLLBACK")
            holder.close()
        raise AssertionError("the second writer was not refused")

    monkeypatch.setattr(index, "list_files", lost)
    _problem(client.get("/v1/files"), 503, "index-unavailable")


def test_same_key_different_bodies_at_once_get_a_clean_conflict(db: database.Database) -> None:
    """Racing requests that share an idempotency key but not a body: one is stored, every
    other one is told plainly (no constraint names, no rows)."""
    barrier = threading.Barrier(6)

    def one(i: int) -> str:
        barrier.wait()
        try:
            journal.ingest(db, body(f"s{i}", f"body {i}", idempotency_key="shared"))
            return "stored"
        except errors.Conflict as exc:
            return exc.detail

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(one, range(6)))
    assert answers.count("stored") == 1
    refused = [a for a in answers if a != "stored"]
    assert refused == ["idempotency_key 'shared' was already used with a different body"] * 5
    with db.transaction() as conn:
        count = conn.execute(sa.select(sa.func.count()).select_from(tables.raw_files)).scalar()
    assert count == 1


# ---------------------------------------------------------------------------------------------
# the API's failure paths


def test_a_kick_that_fails_still_acknowledges_and_the_sweeper_heals(
    client: TestClient, service: Service, data_dir: Path
) -> None:
    queue = service.queue
    assert isinstance(queue, helpers.RecordingQueue)
    queue.broken = True
    r = client.post("/v1/append", json=body())
    assert r.status_code == 202, r.text
    file_id = r.json()["file_id"]
    assert queue.kicks == []
    queue.broken = False
    assert service.sweep(age=0) == [file_id]
    assert queue.kicks == [file_id]
    service.flush(file_id)
    assert client.get(f"/v1/files/{file_id}").json()["flushed_seq"] == 1
    assert b"hello" in (data_dir / f"raw/sessions/{file_id}.md").read_bytes()


def test_wait_flushed_with_the_lock_held_answers_202_and_kicks(
    client: TestClient, service: Service, data_dir: Path
) -> None:
    first = client.post("/v1/append?wait=flushed", json=body())
    assert first.status_code == 200, first.text
    file_id = first.json()["file_id"]
    queue = service.queue
    assert isinstance(queue, helpers.RecordingQueue)
    with service.file_locks.hold(file_id):
        r = client.post("/v1/append?wait=flushed", json=body(content="second"))
    assert r.status_code == 202, r.text  # acknowledged: a client must not retry it
    assert r.json()["source_refs"] == [f"{file_id}:2"]
    assert queue.kicks == [file_id]  # the queue finishes the flush
    service.flush(file_id)
    assert client.get(f"/v1/files/{file_id}").json()["flushed_seq"] == 2


def test_a_damaged_file_read_twice_is_one_anomaly(
    client: TestClient, db: database.Database, data_dir: Path
) -> None:
    file_id = client.post("/v1/append?wait=flushed", json=body()).json()["file_id"]
    path = data_dir / f"raw/sessions/{file_id}.md"
    data = path.read_bytes()
    # same length, heading line broken: reads go to the block by its offset and find no heading
    path.write_bytes(data.replace(b"\n# 2026", b"\nX 2026"))
    for _ in range(3):
        _problem(client.get(f"/v1/files/{file_id}/messages"), 409, "file-damaged")
    with db.transaction() as conn:
        found = anomalies.listed(conn, file_id=file_id)
        row = index.get_file(conn, file_id)
    assert [(a.kind, a.count) for a in found] == [("format_error", 1)]
    assert row is not None and row.status == "error"
