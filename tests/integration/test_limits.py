"""Bounds on what one client can make the service do (issue: hardening), on SQLite and
PostgreSQL: request bodies past a size, metadata past a depth, integer and text parameters
out of range, pages past a byte budget, a journal backlog past its limits and a disk that
cannot take more — each a precise problem+json, nothing written, nothing broken for others."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helpers
import pytest
from starlette.exceptions import StarletteDeprecationWarning

from pipeline import database, journal, ledger, store
from pipeline.api import app as api_app
from pipeline.service import Service
from pipeline.settings import Backlog, Http, Settings

with warnings.catch_warnings():
    warnings.simplefilter("ignore", StarletteDeprecationWarning)
    from fastapi.testclient import TestClient

FILE_ID = "0b6c3e6e-5d1f-4f1e-9a65-3b1c2d4e5f60"


def body(session_key: str = "s1", *contents: str, **extra: Any) -> dict[str, Any]:
    messages = [{"role": "user", "content": c} for c in contents or ("hello",)]
    return {"agent_id": "hermes", "session_key": session_key, "messages": messages, **extra}


def _service(db: database.Database, data_dir: Path, database_url: str, **changes: Any) -> Service:
    base = Settings(data_dir=data_dir, database_url=database_url, allowed_hosts=("testserver",))
    return helpers.service(db, dataclasses.replace(base, **changes), helpers.RecordingQueue())


@pytest.fixture
def make(db: database.Database, data_dir: Path, database_url: str) -> Iterator[Any]:
    """``make(**settings)``: a TestClient and the service behind it."""
    clients: list[TestClient] = []

    def build(**changes: Any) -> tuple[TestClient, Service]:
        service = _service(db, data_dir, database_url, **changes)
        client = TestClient(api_app.create_app(service))
        clients.append(client)
        return client, service

    yield build
    for client in clients:
        client.close()


def _problem(r: Any, status: int, kind: str, *needles: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    problem = dict(r.json())
    assert problem["type"] == f"urn:sgme:problem:{kind}"
    for needle in needles:
        assert needle in problem["detail"], problem
    return problem


def _journal(db: database.Database) -> tuple[int, int, int]:
    with db.transaction() as conn:
        return ledger.journal_backlog(conn)


# ---------------------------------------------------------------------------------------------
# request bodies


def test_a_body_over_the_limit_is_413_before_it_is_parsed(make: Any, db: database.Database) -> None:
    client, _ = make(http=Http(max_request_bytes=1000))
    big = body("s1", "x" * 2000)
    _problem(client.post("/v1/append", json=big), 413, "too-large", "1000 bytes")

    def chunked() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
        yield b'{"agent_id": "hermes", "session_key": "s1", "messages": ['
        for _ in range(50):
            yield b'{"role": "user", "content": "' + b"y" * 100 + b'"},'
        yield b'{"role": "user", "content": "end"}]}'

    r = client.post("/v1/append", content=chunked(), headers={"content-type": "application/json"})
    _problem(r, 413, "too-large")
    _problem(
        client.post("/v1/uploads", json={"agent_id": "a", "filename": "f", "content": "z" * 2000}),
        413,
        "too-large",
    )
    assert _journal(db) == (0, 0, 0)
    assert client.post("/v1/append", json=body("s1", "small")).status_code == 202


def test_metadata_too_deep_is_422_and_listings_keep_working(make: Any) -> None:
    client, _ = make()

    def nested(depth: int) -> dict[str, Any]:
        value: dict[str, Any] = {"leaf": 1}
        for _ in range(depth - 1):
            value = {"x": value}
        return value

    r = client.post("/v1/append", json=body("deep", metadata=nested(100)))
    _problem(r, 422, "invalid-input", "metadata is nested more than 16 levels deep")
    r = client.post("/v1/append", json=body("deeper", metadata=nested(330)))
    _problem(r, 422, "invalid-input", "Invalid JSON: recursion limit exceeded")
    ok = nested(16)
    file_id = client.post("/v1/append?wait=flushed", json=body("ok", metadata=ok)).json()["file_id"]
    assert client.get("/v1/files").status_code == 200
    assert client.get(f"/v1/files/{file_id}").json()["metadata"] == ok


# ---------------------------------------------------------------------------------------------
# parameters


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        ("/v1/l1?after=9223372036854775808", "after"),
        ("/v1/l1?after=-1", "after"),
        ("/v1/l1?limit=1001", "limit"),
        ("/v1/files?limit=0", "limit"),
        (f"/v1/files/{FILE_ID}/messages?after_seq=2147483648", "after_seq"),
        ("/v1/files?cursor=%00", "not a file_id"),
        ("/v1/files?agent_id=a%00b", "agent_id"),
        ("/v1/l1?agent_id=%00", "agent_id"),
        ("/v1/l1?file_id=x%00", "not a file_id"),
        (f"/v1/refs/{FILE_ID}:%C2%B2", "source_ref"),  # ²
        (f"/v1/refs/{FILE_ID}:%D9%A3", "source_ref"),  # Arabic-Indic 3
        (f"/v1/refs/{FILE_ID}:01", "source_ref"),
        (f"/v1/refs/{FILE_ID}:0", "source_ref"),
        (f"/v1/refs/{FILE_ID}:99999999999", "source_ref"),  # 11 digits
        ("/v1/files?status=lost", "status"),
        ("/v1/refs/x?context=51", "context"),
    ],
)
def test_parameters_out_of_range_are_422(make: Any, url: str, needle: str) -> None:
    client, _ = make()
    _problem(client.get(url), 422, "invalid-input", needle)


def test_retry_that_spells_out_defaults_replays(make: Any, db: database.Database) -> None:
    client, _ = make()
    first = client.post("/v1/append", json=body("s", idempotency_key="k1"))
    assert first.status_code == 202
    extras: list[dict[str, Any]] = [
        {"source_type": "session"},
        {"metadata": None},
        {"metadata": {}},
    ]
    for extra in extras:
        again = client.post("/v1/append", json=body("s", idempotency_key="k1", **extra))
        assert again.status_code == 202, again.text
        assert again.json()["source_refs"] == first.json()["source_refs"]
    assert _journal(db)[0] == 1


def test_year_one_times_have_four_digit_years_in_json(make: Any) -> None:
    client, _ = make()
    one = {"role": "user", "content": "old", "ts": "0001-01-01T00:00:00Z"}
    r = client.post("/v1/append?wait=flushed", json={**body("old"), "messages": [one]})
    assert r.status_code == 200, r.text
    row = client.get(f"/v1/files/{r.json()['file_id']}").json()
    assert row["started_at"] == "0001-01-01T00:00:00.000000Z"
    assert row["ended_at"] == "0001-01-01T00:00:00.000000Z"
    messages = client.get(f"/v1/files/{r.json()['file_id']}/messages").json()["messages"]
    assert messages[0]["ts"] == "0001-01-01T00:00:00Z"


def test_health_does_not_race_with_itself(make: Any, data_dir: Path) -> None:
    client, _ = make()
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        codes = list(pool.map(lambda _: client.get("/v1/health").status_code, range(800)))
    assert codes == [200] * 800
    assert list(data_dir.glob(".health*")) == []


# ---------------------------------------------------------------------------------------------
# reads


def test_pages_stop_at_the_byte_budget(make: Any) -> None:
    # 100 bytes of content: blocks of about 140 bytes with their heading lines
    client, _ = make(http=Http(max_page_bytes=300))
    contents = [f"{i:03d}" + "m" * 96 for i in range(10)]
    r = client.post("/v1/append?wait=flushed", json=body("p", *contents))
    file_id = r.json()["file_id"]
    pages, after = [], 0
    while True:
        page = client.get(f"/v1/files/{file_id}/messages", params={"after_seq": after}).json()
        if not page["messages"]:
            assert page["next_after_seq"] is None
            break
        pages.append([m["seq"] for m in page["messages"]])
        after = page["next_after_seq"]
    assert pages == [[1, 2], [3, 4], [5, 6], [7, 8], [9, 10]]
    ref = client.get(f"/v1/refs/{file_id}:5", params={"context": 50}).json()
    assert [m["seq"] for m in ref["before"]] == [4]  # the nearest that fit: three blocks > 300
    assert [m["seq"] for m in ref["after"]] == []
    huge = "h" * 1000  # one message larger than a page still comes, alone
    client.post("/v1/append?wait=flushed", json=body("p", huge))
    page = client.get(f"/v1/files/{file_id}/messages", params={"after_seq": 10}).json()
    assert [m["content"] for m in page["messages"]] == [huge]


def test_raw_streams_the_committed_bytes(make: Any, data_dir: Path) -> None:
    client, _ = make()
    contents = ["z" * 300_000, "second"]
    file_id = client.post("/v1/append?wait=flushed", json=body("r", *contents)).json()["file_id"]
    row = client.get(f"/v1/files/{file_id}").json()
    with client.stream("GET", f"/v1/files/{file_id}/raw") as r:
        assert r.status_code == 200
        assert r.headers["content-length"] == str(row["flushed_bytes"])
        chunks = list(r.iter_raw())
    data = b"".join(chunks)
    assert data == (data_dir / row["path"]).read_bytes()
    assert len(data) == row["flushed_bytes"]


# ---------------------------------------------------------------------------------------------
# the backlog and the disk


def test_a_file_backlog_past_its_limit_is_503_with_retry_after(
    make: Any, db: database.Database
) -> None:
    client, service = make(backlog=Backlog(max_file_messages=5, retry_after=7))
    first = client.post("/v1/append", json=body("b", "1", "2", "3"))
    assert first.status_code == 202
    r = client.post("/v1/append", json=body("b", "4", "5", "6"))
    problem = _problem(r, 503, "overloaded", "3 messages of this session wait", "at most 5")
    assert r.headers["retry-after"] == "7"
    assert problem["status"] == 503
    assert client.post("/v1/append", json=body("other", "1", "2", "3")).status_code == 202
    service.flush(first.json()["file_id"])
    assert client.post("/v1/append", json=body("b", "4", "5", "6")).status_code == 202


def test_a_total_backlog_past_its_limit_is_503(make: Any, db: database.Database) -> None:
    client, service = make(backlog=Backlog(max_total_bytes=5000))
    service.admission.REFRESH = 0  # measure at every append
    acked = 0
    for i in range(30):
        r = client.post("/v1/append", json=body(f"s{i}", "x" * 300))
        if r.status_code != 202:
            _problem(r, 503, "overloaded", "backlog_max_total_bytes")
            assert "retry-after" in r.headers
            break
        acked += 1
    assert 5 <= acked < 30
    assert _journal(db)[2] <= 5000


def test_no_append_is_acknowledged_that_the_disk_cannot_hold(
    make: Any, monkeypatch: pytest.MonkeyPatch, db: database.Database
) -> None:
    client, service = make(backlog=Backlog(min_free_bytes=1000, retry_after=3))
    service.admission.REFRESH = 0
    free = {"bytes": 10_000}
    monkeypatch.setattr(store, "free_bytes", lambda _path: free["bytes"])
    assert client.post("/v1/append", json=body("d", "x" * 4000)).status_code == 202
    r = client.post("/v1/append", json=body("d", "y" * 6000))  # 4 KB waiting + 6 KB > 9 KB
    _problem(r, 507, "insufficient-storage", "backlog_min_free_bytes")
    assert r.headers["retry-after"] == "3"
    free["bytes"] = 100_000  # room again: accepted at once
    assert client.post("/v1/append", json=body("d", "y" * 6000)).status_code == 202
    assert _journal(db)[0] == 2


def test_a_slow_backlog_count_holds_up_no_other_append(
    make: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Counting the journal reads all of it (a deep backlog: seconds). One append measures;
    the others go on with the last figures instead of queueing behind it."""
    client, service = make()
    admission = service.admission
    assert client.post("/v1/append", json=body("first")).status_code == 202  # measured once
    entered, release = threading.Event(), threading.Event()
    counted = ledger.journal_backlog

    def slow(conn: Any) -> tuple[int, int, int]:
        entered.set()
        assert release.wait(30)
        return counted(conn)

    monkeypatch.setattr(ledger, "journal_backlog", slow)
    admission._measured -= admission.REFRESH + 1  # the figures are stale: the next one counts
    measuring = threading.Thread(target=admission.check, args=(100,))
    measuring.start()
    try:
        assert entered.wait(10)
        other = threading.Thread(target=admission.check, args=(100,))
        other.start()
        other.join(5)
        assert not other.is_alive(), "an append waited for another one's count of the backlog"
        assert client.post("/v1/append", json=body("second")).status_code == 202
    finally:
        release.set()
        measuring.join(10)
    assert not measuring.is_alive()
    assert admission._measure()[0] > 0  # the new figures were kept


def test_a_flush_writes_a_large_backlog_in_bounded_chunks(
    db: database.Database, data_dir: Path
) -> None:
    file_id = ""
    for i in range(40):
        file_id = journal.ingest(db, body("big", f"{i:02d}" + "c" * 5000)).file_id
    steps: list[str] = []
    result = journal.flush(db, data_dir, file_id, chunk_bytes=50_000, fault=steps.append)
    assert result.flushed_seq == 40 and result.messages == 40
    assert steps.count("written") == steps.count("committed") >= 4  # ~5 KB rows, 50 KB chunks
    path = data_dir / f"raw/sessions/{file_id}.md"
    assert result.bytes == path.stat().st_size
    from pipeline import integrity

    assert integrity.fsck(db, data_dir) == []
    assert _journal(db) == (0, 0, 0)
