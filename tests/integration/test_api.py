"""The HTTP API (docs/design.md §7) over a real index, on SQLite and PostgreSQL: the shapes other
tools depend on, coalesced kicks, ``?wait=flushed``, uploads, listing and pagination, reads of raw
bytes, messages and refs, idempotency, and problem+json errors that write nothing."""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helpers
import pytest
import sqlalchemy as sa
from starlette.exceptions import StarletteDeprecationWarning

from pipeline import database, document, journal, refs, tables, validation
from pipeline.api import app as api_app
from pipeline.settings import Limits, Settings

with warnings.catch_warnings():
    # Starlette 1.x warns at import that it would rather use httpx2; the project uses httpx.
    warnings.simplefilter("ignore", StarletteDeprecationWarning)
    from fastapi.testclient import TestClient

TS1 = "2026-08-03T11:18:06Z"
TS2 = "2026-08-03T11:18:07.25Z"
TS3 = "2026-08-03T11:20:05Z"
AGENT = "hermes"
SMALL = Limits(
    max_session_key=32,
    max_metadata_bytes=64,
    max_message_bytes=64,
    max_append_messages=3,
    max_append_bytes=150,
)


def body(session_key: str = "s1", *messages: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """An append request; one user message unless ``messages`` are given."""
    return {
        "agent_id": AGENT,
        "session_key": session_key,
        "messages": list(messages) or [{"role": "user", "content": "hello", "ts": TS1}],
        **extra,
    }


class Api:
    """A TestClient over the app, plus the recorded kicks and direct access for checks."""

    def __init__(
        self, db: database.Database, data_dir: Path, database_url: str, limits: Limits
    ) -> None:
        self.db = db
        self.data_dir = data_dir
        self.queue = helpers.RecordingQueue()
        self.kicks = self.queue.kicks
        settings = Settings(
            data_dir=data_dir,
            database_url=database_url,
            limits=limits,
            allowed_hosts=("testserver",),  # TestClient's Host
        )
        self.service = helpers.service(db, settings, self.queue)
        self.client = TestClient(api_app.create_app(self.service), raise_server_exceptions=True)

    def append(self, payload: dict[str, Any], *, wait: bool = False) -> dict[str, Any]:
        url = "/v1/append?wait=flushed" if wait else "/v1/append"
        r = self.client.post(url, json=payload)
        assert r.status_code == (200 if wait else 202), r.text
        return dict(r.json())

    def flush(self, file_id: str) -> None:
        """What the worker does when kicked."""
        journal.flush(self.db, self.data_dir, file_id, lock_timeout=5)

    def row(self, file_id: str) -> dict[str, Any]:
        r = self.client.get(f"/v1/files/{file_id}")
        assert r.status_code == 200, r.text
        return dict(r.json())

    def disk(self, file_id: str) -> bytes:
        return bytes((self.data_dir / self.row(file_id)["path"]).read_bytes())

    def messages(self, file_id: str, **params: Any) -> list[dict[str, Any]]:
        r = self.client.get(f"/v1/files/{file_id}/messages", params=params)
        assert r.status_code == 200, r.text
        assert r.json()["file_id"] == file_id
        return list(r.json()["messages"])


@pytest.fixture
def app(db: database.Database, data_dir: Path, database_url: str) -> Iterator[Api]:
    client = Api(db, data_dir, database_url, validation.DEFAULT_LIMITS)
    yield client
    client.client.close()


@pytest.fixture
def small(db: database.Database, data_dir: Path, database_url: str) -> Iterator[Api]:
    """The app with tiny limits, so oversized input is cheap to send."""
    client = Api(db, data_dir, database_url, SMALL)
    yield client
    client.client.close()


def assert_problem(r: Any, status: int, kind: str, *needles: str) -> dict[str, Any]:
    """An RFC 9457 problem document with a stable type and a detail naming the fault."""
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json"), r.headers
    problem = r.json()
    assert problem["type"] == f"urn:sgme:problem:{kind}", problem
    assert problem["status"] == status
    assert isinstance(problem["title"], str) and problem["title"]
    for needle in needles:
        assert needle in problem["detail"], problem
    return dict(problem)


def snapshot(
    db: database.Database, data_dir: Path
) -> tuple[dict[str, list[Any]], dict[str, bytes]]:
    """Every index row that records writes, and every file under ``raw/`` with its bytes.

    ``raw_files.updated_at`` is left out: a flush with nothing to write still touches it.
    """
    recorded = (
        tables.raw_files,
        tables.append_journal,
        tables.append_keys,
        tables.anomalies,
        tables.waiting_appends,
    )
    with db.transaction() as conn:
        rows = {}
        for t in recorded:
            columns = [c for c in t.columns if c is not tables.raw_files.c.updated_at]
            query = sa.select(*columns).order_by(*t.primary_key)
            rows[t.name] = [tuple(r) for r in conn.execute(query)]
    raw_dir = data_dir / "raw"
    files = {
        p.relative_to(data_dir).as_posix(): p.read_bytes()
        for p in sorted(raw_dir.rglob("*"))
        if p.is_file()
    }
    return rows, files


def expected_file(
    row: dict[str, Any], messages: list[document.Message], metadata: dict[str, Any]
) -> bytes:
    header = document.Header(
        file_id=row["file_id"],
        session_key=row["session_key"],
        agent_id=row["agent_id"],
        source_type=row["source_type"],
        started_at=messages[0].ts,
        metadata=metadata,
    )
    return document.render(header, messages).encode("utf-8")


# ---------------------------------------------------------------------------------------------
# append


def test_append_is_acknowledged_then_the_kicked_flush_writes_the_file(app: Api) -> None:
    sent = body(
        "20260803_191806_5b6c69",
        {"role": "user", "content": "read the notes", "ts": TS1},
        {"role": "tool", "content": "line 1\nline 2", "ts": TS2, "tool_name": "read_file"},
        metadata={"app": "hermes-desktop"},
    )
    r = app.client.post("/v1/append", json=sent)
    assert r.status_code == 202, r.text
    ack = r.json()
    file_id = ack["file_id"]
    refs.check_file_id(file_id)
    assert ack == {
        "file_id": file_id,
        "first_seq": 1,
        "last_seq": 2,
        "source_refs": [f"{file_id}:1", f"{file_id}:2"],
        "status": "pending",
        "replayed": False,
        "redacted": 0,
        "erased": 0,
    }
    assert app.kicks == [file_id]

    # Acknowledged in the journal, not yet on disk.
    row = app.row(file_id)
    assert (row["status"], row["flushed_seq"], row["next_seq"]) == ("pending", 0, 3)
    assert row["pending_messages"] == 2
    assert row["path"] == f"raw/sessions/{file_id}.md"
    assert not (app.data_dir / row["path"]).exists()
    assert app.messages(file_id) == []
    assert app.client.get(f"/v1/files/{file_id}/raw").content == b""
    assert_problem(app.client.get(f"/v1/refs/{file_id}:1"), 404, "not-found", "not flushed")

    app.flush(file_id)
    row = app.row(file_id)
    assert (row["status"], row["flushed_seq"], row["pending_messages"]) == ("new", 2, 0)
    assert row["metadata"] == {"app": "hermes-desktop"}
    assert row["ended_at"].startswith("2026-08-03T11:18:07.25")
    on_disk = app.disk(file_id)
    assert row["flushed_bytes"] == len(on_disk)
    assert on_disk == expected_file(
        row,
        [
            document.Message("user", "read the notes", TS1),
            document.Message("tool", "line 1\nline 2", TS2, tool_name="read_file"),
        ],
        {"app": "hermes-desktop"},
    )
    raw = app.client.get(f"/v1/files/{file_id}/raw")
    assert raw.status_code == 200
    assert raw.headers["content-type"].startswith("text/markdown")
    assert raw.content == on_disk

    assert app.messages(file_id) == [
        {
            "seq": 1,
            "ts": TS1,
            "role": "user",
            "content": "read the notes",
            "tool_name": None,
            "source_ref": f"{file_id}:1",
        },
        {
            "seq": 2,
            "ts": TS2,
            "role": "tool",
            "content": "line 1\nline 2",
            "tool_name": "read_file",
            "source_ref": f"{file_id}:2",
        },
    ]


def test_later_appends_continue_the_seqs_of_the_same_file(app: Api) -> None:
    first = app.append(body("s1"), wait=True)
    file_id = first["file_id"]
    second = app.append(
        body(
            "s1",
            {"role": "assistant", "content": "two", "ts": TS2},
            {"role": "user", "content": "three", "ts": "2026-08-03T13:20:05+02:00"},
        )
    )
    assert second["file_id"] == file_id
    assert (second["first_seq"], second["last_seq"]) == (2, 3)
    assert second["source_refs"] == [f"{file_id}:2", f"{file_id}:3"]
    app.flush(file_id)
    text = app.disk(file_id).decode("utf-8")
    # The writer uses '#' for seq 1 and '##' after; offsets are converted to UTC.
    assert text.count(f"\n# {TS1} user\n") == 1
    assert text.endswith(f"## {TS2} assistant\n\ntwo\n\n## 2026-08-03T11:20:05Z user\n\nthree\n\n")
    assert [m["content"] for m in app.messages(file_id)] == ["hello", "two", "three"]
    # Another session or agent or source type is another file.
    other = app.append(body("s2"))
    external = app.append(body("s1", source_type="external"))
    assert len({file_id, other["file_id"], external["file_id"]}) == 3
    assert external["first_seq"] == 1
    assert app.row(external["file_id"])["path"].startswith("raw/external/")


def test_kicks_are_coalesced_one_per_pending_file(app: Api) -> None:
    a = app.append(body("a"))["file_id"]
    app.append(body("a"))
    app.append(body("a"))
    b = app.append(body("b"))["file_id"]
    app.append(body("b"))
    assert app.kicks == [a, b]

    app.flush(a)
    assert [m["seq"] for m in app.messages(a)] == [1, 2, 3]
    app.append(body("a"))
    app.append(body("b"))
    assert app.kicks == [a, b, a]
    app.flush(a)
    app.flush(b)
    assert [m["seq"] for m in app.messages(a)] == [1, 2, 3, 4]
    assert [m["seq"] for m in app.messages(b)] == [1, 2, 3]


def test_wait_flushed_answers_once_the_bytes_are_in_the_file(app: Api) -> None:
    r = app.client.post(
        "/v1/append?wait=flushed",
        json=body("s1", {"role": "user", "content": "durable now", "ts": TS1}),
    )
    assert r.status_code == 200, r.text
    ack = r.json()
    file_id = ack["file_id"]
    assert ack["status"] == "new"
    assert ack["source_refs"] == [f"{file_id}:1"]
    assert app.kicks == []
    path = app.data_dir / "raw" / "sessions" / f"{file_id}.md"
    assert path.read_bytes().endswith(f"\n# {TS1} user\n\ndurable now\n\n".encode())

    ack = app.append(body("s1", {"role": "user", "content": "and this", "ts": TS2}), wait=True)
    assert ack["first_seq"] == 2
    assert path.read_bytes().endswith(f"\n## {TS2} user\n\nand this\n\n".encode())
    assert app.kicks == []
    r = app.client.post("/v1/append?wait=soon", json=body("s1"))
    assert_problem(r, 422, "invalid-input", "wait")


# ---------------------------------------------------------------------------------------------
# uploads


def test_upload_stores_one_document_as_one_message(app: Api) -> None:
    text = "# Title\n\nSome notes for the user.\n\n# 2026-08-03T11:18:06Z user\n"
    r = app.client.post(
        "/v1/uploads",
        json={"agent_id": AGENT, "filename": "notes.md", "content": text, "metadata": {"k": "v"}},
    )
    assert r.status_code == 201, r.text
    file_id = r.json()["file_id"]
    assert r.json() == {"file_id": file_id, "source_ref": f"{file_id}:1", "redacted": 0}
    assert app.kicks == [file_id]
    app.flush(file_id)

    row = app.row(file_id)
    assert row["source_type"] == "upload"
    assert row["path"] == f"raw/uploads/{file_id}.md"
    assert row["metadata"] == {"k": "v", "filename": "notes.md"}
    assert (row["status"], row["flushed_seq"]) == ("new", 1)
    on_disk = app.disk(file_id)
    assert app.client.get(f"/v1/files/{file_id}/raw").content == on_disk
    # The look-alike heading is escaped in the file and comes back unescaped.
    assert b"\n\\# 2026-08-03T11:18:06Z user\n" in on_disk
    [message] = app.messages(file_id)
    assert message["content"] == document.canonical(text)
    assert (message["seq"], message["role"], message["source_ref"]) == (1, "user", f"{file_id}:1")
    ref = app.client.get(f"/v1/refs/{file_id}:1").json()
    assert ref["message"]["content"] == document.canonical(text)
    assert ref["source_type"] == "upload"

    # Each upload is a file of its own, even with the same name.
    again = app.client.post(
        "/v1/uploads", json={"agent_id": AGENT, "filename": "notes.md", "content": "v2"}
    )
    assert again.status_code == 201
    assert again.json()["file_id"] != file_id


# ---------------------------------------------------------------------------------------------
# listing and reading


def test_list_files_filters_and_pages_through_every_file_once(app: Api) -> None:
    made: dict[str, tuple[str, str]] = {}
    for i in range(5):
        made[app.append(body(f"s{i}"))["file_id"]] = (AGENT, "session")
    for i in range(2):
        ack = app.append({**body(f"s{i}"), "agent_id": "other"})
        made[ack["file_id"]] = ("other", "session")
    made[app.append(body("thread-1", source_type="external"))["file_id"]] = (AGENT, "external")
    up = app.client.post("/v1/uploads", json={"agent_id": AGENT, "filename": "f", "content": "x"})
    made[up.json()["file_id"]] = (AGENT, "upload")
    flushed = sorted(made)[:3]
    for file_id in flushed:
        app.flush(file_id)

    def walk(limit: int, **filters: str) -> list[str]:
        seen: list[str] = []
        cursor: str | None = None
        for _ in range(50):
            params: dict[str, Any] = {"limit": limit, **filters}
            if cursor is not None:
                params["cursor"] = cursor
            r = app.client.get("/v1/files", params=params)
            assert r.status_code == 200, r.text
            page = r.json()
            assert len(page["files"]) <= limit
            seen.extend(f["file_id"] for f in page["files"])
            cursor = page["next_cursor"]
            if cursor is None:
                return seen
        raise AssertionError("pagination did not end")

    for limit in (1, 2, 3, 9, 100):
        assert walk(limit) == sorted(made), limit
    assert walk(2, agent_id="other") == sorted(f for f, v in made.items() if v[0] == "other")
    assert walk(2, source_type="external") == [f for f, v in made.items() if v[1] == "external"]
    assert walk(2, source_type="upload") == [f for f, v in made.items() if v[1] == "upload"]
    assert walk(2, status="new") == flushed
    assert walk(2, status="pending") == sorted(set(made) - set(flushed))
    assert walk(2, agent_id="nobody") == []

    page = app.client.get("/v1/files", params={"agent_id": "other"}).json()
    assert {f["session_key"] for f in page["files"]} == {"s0", "s1"}
    assert all(f["agent_id"] == "other" for f in page["files"])

    assert_problem(app.client.get("/v1/files?status=done"), 422, "invalid-input", "status")
    assert_problem(app.client.get("/v1/files?source_type=x"), 422, "invalid-input", "source_type")
    assert_problem(app.client.get("/v1/files?limit=0"), 422, "invalid-input", "limit")
    # a parameter takes one value: given twice it is refused, not the last one kept
    assert_problem(app.client.get("/v1/files?limit=1&limit=2"), 422, "invalid-input", "limit")
    r = app.client.get("/v1/audit?after=none&after=0")
    assert_problem(r, 422, "invalid-input", "after")
    r = app.client.post("/v1/append?wait=flushed&wait=flushed", json=body("s1"))
    assert_problem(r, 422, "invalid-input", "wait")


def test_search_times_are_rfc_3339_as_the_schema_says(app: Api) -> None:
    """A number is not read as Unix seconds (the schema says date-time: schemathesis checks)."""
    app.append(body("s1", {"role": "user", "content": "green tea", "ts": TS1}), wait=True)
    for since in ("0", "1785755886", "20260803", "yesterday"):
        r = app.client.get("/v1/search", params={"q": "tea", "since": since})
        assert_problem(r, 422, "invalid-input", "since: must be an RFC 3339 date-time")
    r = app.client.get("/v1/search", params={"q": "tea", "until": "0"})
    assert_problem(r, 422, "invalid-input", "until: must be an RFC 3339 date-time, got '0'")
    for since, hits in (("2026-08-03T11:00:00Z", 1), ("2026-08-03T11:18:07+00:00", 0)):
        r = app.client.get("/v1/search", params={"q": "tea", "since": since})
        assert r.status_code == 200 and len(r.json()["hits"]) == hits, r.text


def test_times_past_the_ends_of_the_calendar_select_as_their_bound_would(app: Api) -> None:
    """An offset can put a valid RFC 3339 time a minute before the year 1 or after 9999: the
    bound is clamped, not a 500 (schemathesis found the first)."""
    app.append(body("s1", {"role": "user", "content": "green tea", "ts": TS1}), wait=True)
    first, last = "0001-01-01T00:00:00+00:01", "9999-12-31T23:59:59-00:01"
    for params, hits in (
        ({"since": first}, 1),
        ({"until": first}, 0),
        ({"since": last}, 0),
        ({"until": last}, 1),
        ({"since": first, "until": last}, 1),
    ):
        r = app.client.get("/v1/search", params={"q": "tea", **params})
        assert r.status_code == 200 and len(r.json()["hits"]) == hits, (params, r.text)
        r = app.client.get("/v1/sessions", params=params)
        assert r.status_code == 200 and r.json()["total"] == hits, (params, r.text)


def test_search_ranks_by_default_and_match_is_any_or_all(app: Api) -> None:
    app.append(
        body(
            "s1",
            {"role": "user", "content": "which tea do you like?", "ts": TS1},
            {"role": "assistant", "content": "Sencha, always.", "ts": TS1},
        ),
        wait=True,
    )
    q = {"q": "what teas does the user like best?"}
    ranked = app.client.get("/v1/search", params=q).json()["hits"]
    assert [h["seq"] for h in ranked] == [1, 2]  # the answer after the matching turn too
    assert app.client.get("/v1/search", params={**q, "match": "any"}).json()["hits"] == ranked
    assert app.client.get("/v1/search", params={**q, "match": "all"}).json()["hits"] == []
    every = app.client.get("/v1/search", params={"q": "tea like", "match": "all"}).json()
    assert [h["seq"] for h in every["hits"]] == [1]
    for bad in ("some", "ALL", ""):
        r = app.client.get("/v1/search", params={"q": "tea", "match": bad})
        assert_problem(r, 422, "invalid-input", "match")
    assert ranked[0]["before"] == ranked[0]["after"] == []  # no context asked


def test_search_returns_each_hit_with_the_turns_around_it(app: Api) -> None:
    turns = ["good morning", "which tea do you like?", "Sencha, always.", "me too", "bye"]
    app.append(body("s1", *({"role": "user", "content": t, "ts": TS1} for t in turns)), wait=True)
    q: dict[str, str | int] = {"q": "which tea?", "context": 2, "limit": 1}
    (hit,) = app.client.get("/v1/search", params=q).json()["hits"]
    assert hit["seq"] == 2
    assert [(t["seq"], t["text"]) for t in hit["before"]] == [(1, "good morning")]
    assert [(t["seq"], t["text"]) for t in hit["after"]] == [(3, "Sencha, always."), (4, "me too")]
    assert hit["after"][0]["source_ref"] == f"{hit['file_id']}:3"
    for bad in ("4", "-1", "x"):
        r = app.client.get("/v1/search", params={"q": "tea", "context": bad})
        assert_problem(r, 422, "invalid-input", "context")


def test_file_row_shows_index_state(app: Api) -> None:
    ack = app.append(body("s1", metadata={"n": 1, "nested": {"a": [1, 2]}}), wait=True)
    app.append(body("s1"))
    row = app.row(ack["file_id"])
    assert row["file_id"] == ack["file_id"]
    assert (row["agent_id"], row["session_key"], row["source_type"]) == (AGENT, "s1", "session")
    assert row["metadata"] == {"n": 1, "nested": {"a": [1, 2]}}
    assert (row["flushed_seq"], row["next_seq"], row["message_count"]) == (1, 3, 1)
    assert row["pending_messages"] == 1
    assert row["started_at"] == "2026-08-03T11:18:06.000000Z"
    assert len(row["chain_head"]) == 64
    assert "metadata_json" not in row


def test_messages_page_by_after_seq_and_limit(app: Api) -> None:
    msgs = [{"role": "user", "content": f"m{i}", "ts": TS1} for i in range(1, 8)]
    file_id = app.append(body("s1", *msgs), wait=True)["file_id"]
    assert [m["content"] for m in app.messages(file_id)] == [f"m{i}" for i in range(1, 8)]
    page = app.messages(file_id, after_seq=2, limit=3)
    assert [(m["seq"], m["content"]) for m in page] == [(3, "m3"), (4, "m4"), (5, "m5")]
    assert [m["source_ref"] for m in page] == [f"{file_id}:{s}" for s in (3, 4, 5)]
    assert [m["seq"] for m in app.messages(file_id, after_seq=5)] == [6, 7]
    assert app.messages(file_id, after_seq=7) == []
    r = app.client.get(f"/v1/files/{file_id}/messages", params={"after_seq": -1})
    assert_problem(r, 422, "invalid-input", "after_seq")


def test_ref_returns_the_message_and_its_neighbours(app: Api) -> None:
    msgs = [{"role": "user", "content": f"m{i}", "ts": TS1} for i in range(1, 6)]
    file_id = app.append(body("s7", *msgs), wait=True)["file_id"]

    r = app.client.get(f"/v1/refs/{file_id}:3")
    assert r.status_code == 200, r.text
    ref = r.json()
    assert ref["source_ref"] == f"{file_id}:3"
    assert (ref["file_id"], ref["agent_id"], ref["session_key"]) == (file_id, AGENT, "s7")
    assert ref["source_type"] == "session"
    assert ref["message"] == {
        "seq": 3,
        "ts": TS1,
        "role": "user",
        "content": "m3",
        "tool_name": None,
        "source_ref": f"{file_id}:3",
    }
    assert [m["content"] for m in ref["before"]] == ["m2"]
    assert [m["content"] for m in ref["after"]] == ["m4"]

    wide = app.client.get(f"/v1/refs/{file_id}:3", params={"context": 2}).json()
    assert [m["seq"] for m in wide["before"]] == [1, 2]
    assert [m["seq"] for m in wide["after"]] == [4, 5]
    edge = app.client.get(f"/v1/refs/{file_id}:1", params={"context": 0}).json()
    assert (edge["before"], edge["after"], edge["message"]["content"]) == ([], [], "m1")
    last = app.client.get(f"/v1/refs/{file_id}:5").json()
    assert [m["seq"] for m in last["before"]] == [4]
    assert last["after"] == []

    assert_problem(app.client.get(f"/v1/refs/{file_id}:6"), 404, "not-found", f"{file_id}:6")
    assert_problem(app.client.get(f"/v1/refs/{file_id}:0"), 422, "invalid-input", "source_ref")
    assert_problem(app.client.get(f"/v1/refs/{file_id}"), 422, "invalid-input", "source_ref")


def test_health_reports_index_data_dir_and_journal_backlog(app: Api) -> None:
    r = app.client.get("/v1/health")
    assert r.status_code == 200
    health = r.json()
    assert health == {
        "status": "ok",
        "index": "ok",
        "journal_backlog": {"rows": 0, "messages": 0, "bytes": 0},
        "data_dir": "ok",
        "deployment": app.service.deployment(),
        "process": os.getpid(),  # the test client serves from this process
    }
    refs.check_file_id(health["deployment"])  # a UUID4, made by the migration
    a = app.append(body("a", *[{"role": "user", "content": "x"}] * 3))["file_id"]
    app.append(body("b"))
    backlog = app.client.get("/v1/health").json()["journal_backlog"]
    with app.db.transaction() as conn:
        sizes = conn.execute(sa.select(tables.append_journal.c.data)).scalars().all()
    assert backlog == {"rows": 2, "messages": 4, "bytes": sum(len(d.encode()) for d in sizes)}
    app.flush(a)
    backlog = app.client.get("/v1/health").json()["journal_backlog"]
    assert (backlog["rows"], backlog["messages"]) == (1, 1)
    assert list(app.data_dir.glob(".health*")) == []


def test_openapi_lists_the_interface(app: Api) -> None:
    r = app.client.get("/openapi.json")
    assert r.status_code == 200
    paths = r.json()["paths"]
    expected = {
        "/v1/append": "post",
        "/v1/uploads": "post",
        "/v1/files": "get",
        "/v1/files/{file_id}": "get",
        "/v1/files/{file_id}/raw": "get",
        "/v1/files/{file_id}/messages": "get",
        "/v1/refs/{ref}": "get",
        "/v1/health": "get",
    }
    for path, method in expected.items():
        assert method in paths.get(path, {}), path
    assert "text/markdown" in paths["/v1/files/{file_id}/raw"]["get"]["responses"]["200"]["content"]


def test_no_page_of_the_api_loads_anything_from_another_origin(app: Api) -> None:
    """FastAPI's /docs and /redoc pages load their scripts from a CDN, on the origin that
    serves /v1 and /ui: they are not served (the schema is, at /openapi.json). Every page the
    app serves at a GET route sends the web view's Content-Security-Policy or is not HTML."""
    for path in ("/docs", "/redoc", "/docs/oauth2-redirect"):
        r = app.client.get(path)
        assert r.status_code == 404, path
        assert "cdn" not in r.text.lower()
    assert app.client.get("/openapi.json").status_code == 200
    for route in app.client.app.routes:  # type: ignore[attr-defined]
        path = getattr(route, "path", "")
        if "GET" not in (getattr(route, "methods", None) or set()) or "{" in path:
            continue
        r = app.client.get(path, follow_redirects=True)
        if "text/html" in r.headers.get("content-type", ""):
            assert r.headers["content-security-policy"].startswith("default-src 'none'"), path
            assert "http" not in r.headers["content-security-policy"], path


def test_openapi_declares_every_answer(app: Api) -> None:
    """The contract a tool can check: problem+json for every 4xx/5xx a route gives, with the
    real codes, and the rules the server applies (patterns, formats, sizes, enums)."""
    spec = app.client.get("/openapi.json").json()
    paths, schemas = spec["paths"], spec["components"]["schemas"]
    append = paths["/v1/append"]["post"]["responses"]
    assert {"200", "202", "408", "409", "413", "422", "500", "503", "507"} <= set(append)
    for path, methods in paths.items():
        for operation in methods.values():
            for status, answer in operation["responses"].items():
                if status.startswith(("4", "5")) and path != "/v1/health":
                    assert list(answer["content"]) == ["application/problem+json"], (path, status)
    assert {"404", "422"} <= set(paths["/v1/files/{file_id}"]["get"]["responses"])
    body = schemas["AppendBody"]
    assert body["properties"]["agent_id"]["pattern"] == "^[A-Za-z0-9_.-]{1,64}$"
    assert body["properties"]["messages"]["minItems"] == 1
    assert body["properties"]["source_type"]["enum"] == ["session", "external"]
    file_id = next(p for p in paths["/v1/files/{file_id}"]["get"]["parameters"])
    assert file_id["schema"]["format"] == "uuid"
    status = schemas["File"]["properties"]["status"]
    assert status == {"$ref": "#/components/schemas/Status"}
    assert schemas["Status"]["enum"] == [
        "pending",
        "new",
        "refined",
        "error",
        "archived",
    ]
    links = append["202"]["links"]
    assert links["getRef"]["parameters"] == {"ref": "$response.body#/source_refs/0"}
    r = app.client.delete("/v1/files")
    assert r.status_code == 405 and r.headers["allow"] == "GET"
    assert r.headers["content-type"].startswith("application/problem+json")


# ---------------------------------------------------------------------------------------------
# errors: problem+json, and nothing written


def lone_surrogate() -> str:
    """A JSON text whose content holds an unpaired ``\\ud800`` (json.dumps cannot be used)."""
    return (
        '{"agent_id": "hermes", "session_key": "s1", '
        '"messages": [{"role": "user", "content": "half \\ud800 a pair"}]}'
    )


BAD_APPENDS: list[tuple[str, Any, str, tuple[str, ...]]] = [
    ("unknown-role", body("s1", {"role": "robot", "content": "x"}), "invalid-input", ("role",)),
    (
        "tool-without-name",
        body("s1", {"role": "tool", "content": "out"}),
        "invalid-input",
        ("tool_name",),
    ),
    (
        "tool-name-on-user",
        body("s1", {"role": "user", "content": "x", "tool_name": "t"}),
        "invalid-input",
        ("tool_name",),
    ),
    (
        "bad-timestamp",
        body("s1", {"role": "user", "content": "x", "ts": "yesterday"}),
        "invalid-input",
        ("messages[0].ts", "yesterday"),
    ),
    (
        "boolean-timestamp",
        body("s1", {"role": "user", "content": "x", "ts": True}),
        "invalid-input",
        ("ts",),
    ),
    (
        "second-message-bad",
        body("s1", {"role": "user", "content": "ok"}, {"role": "user", "content": "x", "ts": "9"}),
        "invalid-input",
        ("messages[1].ts",),
    ),
    (
        "oversized-message",
        body("s1", {"role": "user", "content": "x" * 65}),
        "too-large",
        ("at most 64 characters", "got 65"),
    ),
    (
        "oversized-message-utf8",
        body("s1", {"role": "user", "content": "中" * 22}),
        "too-large",
        ("66 bytes",),
    ),
    (
        "too-many-messages",
        body("s1", *[{"role": "user", "content": "x"}] * 4),
        "invalid-input",
        ("at most 3 items", "not 4"),
    ),
    (
        "oversized-batch",
        body("s1", *[{"role": "user", "content": "x" * 60}] * 3),
        "too-large",
        ("at most 150 bytes", "180"),
    ),
    ("nul", body("s1", {"role": "user", "content": "a\x00b"}), "invalid-input", ("NUL",)),
    ("lone-surrogate", lone_surrogate(), "invalid-input", ("surrogate",)),
    ("control-in-session-key", body("a\nb"), "invalid-input", ("session_key", "control")),
    ("tab-in-session-key", body("a\tb"), "invalid-input", ("session_key", "control")),
    ("long-session-key", body("k" * 33), "invalid-input", ("session_key", "33")),
    ("empty-session-key", body(""), "invalid-input", ("session_key",)),
    ("bad-agent-id", {**body("s1"), "agent_id": "../etc"}, "invalid-input", ("agent_id",)),
    ("no-messages", {**body("s1"), "messages": []}, "invalid-input", ("messages",)),
    ("unknown-field", {**body("s1"), "owner": "me"}, "invalid-input", ("owner",)),
    ("upload-source-type", body("s1", source_type="upload"), "invalid-input", ("source_type",)),
    (
        "big-metadata",
        body("new-session", metadata={"k": "v" * 64}),
        "invalid-input",
        ("metadata",),
    ),
    ("not-json", "{not json", "invalid-input", ()),
    ("not-an-object", "[1, 2]", "invalid-input", ()),
]


@pytest.mark.parametrize(
    ("payload", "kind", "needles"),
    [pytest.param(p, k, n, id=i) for i, p, k, n in BAD_APPENDS],
)
def test_bad_append_is_a_problem_and_writes_nothing(
    small: Api, payload: Any, kind: str, needles: tuple[str, ...]
) -> None:
    existing = small.append(body("s1", idempotency_key="k0"), wait=True)["file_id"]
    small.append(body("s1"))  # a pending journal row too
    before = snapshot(small.db, small.data_dir)
    kicks = list(small.kicks)

    for wait in ("", "?wait=flushed"):
        if isinstance(payload, str):
            r = small.client.post(
                "/v1/append" + wait,
                content=payload.encode("utf-8", "surrogatepass"),
                headers={"content-type": "application/json"},
            )
        else:
            r = small.client.post("/v1/append" + wait, json=payload)
        # content past a size limit is too large (413), anything else malformed (422)
        problem = assert_problem(r, 413 if kind == "too-large" else 422, kind, *needles)
        assert problem["detail"]

    assert snapshot(small.db, small.data_dir) == before
    assert small.kicks == kicks
    assert [m["seq"] for m in small.messages(existing)] == [1]


def test_content_past_its_limit_is_too_large_chunked_or_not(small: Api) -> None:
    """A body within http_max_request_bytes whose content is past the append limits is a
    413, not a 422, however it is sent (here in chunks, without a Content-Length)."""
    payload = json.dumps(body("s1", *[{"role": "user", "content": "x" * 60}] * 3)).encode()

    def chunks() -> Iterator[bytes]:
        yield payload[:40]
        yield payload[40:]

    r = small.client.post(
        "/v1/append", content=chunks(), headers={"content-type": "application/json"}
    )
    assert "content-length" not in {k.lower() for k in r.request.headers}
    assert_problem(r, 413, "too-large", "at most 150 bytes")
    assert small.kicks == []


def test_bad_uploads_are_problems_and_write_nothing(small: Api) -> None:
    before = snapshot(small.db, small.data_dir)
    cases: list[tuple[Any, tuple[str, ...]]] = [
        ({"agent_id": AGENT, "filename": "a.md", "content": "a\x00b"}, ("NUL",)),
        ({"agent_id": AGENT, "filename": "a\nb.md", "content": "x"}, ("filename", "control")),
        ({"agent_id": AGENT, "filename": "", "content": "x"}, ("filename",)),
        ({"agent_id": AGENT, "filename": "a.md", "content": "x" * 151}, ("151",)),
        ({"agent_id": "a b", "filename": "a.md", "content": "x"}, ("agent_id",)),
        ({"agent_id": AGENT, "filename": "a.md", "content": 12}, ("content",)),
        ({"agent_id": AGENT, "filename": "a.md"}, ("content",)),
        (
            '{"agent_id": "hermes", "filename": "a.md", "content": "\\udfff"}',
            ("surrogate",),
        ),
    ]
    for payload, needles in cases:
        if isinstance(payload, str):
            r = small.client.post(
                "/v1/uploads", content=payload, headers={"content-type": "application/json"}
            )
        else:
            r = small.client.post("/v1/uploads", json=payload)
        if "151" in needles:  # a document past its size limit: too large
            assert_problem(r, 413, "too-large", *needles)
        else:
            assert_problem(r, 422, "invalid-input", *needles)
    assert snapshot(small.db, small.data_dir) == before
    assert small.kicks == []


def test_bad_file_ids_are_422_and_unknown_files_404(app: Api) -> None:
    unknown = "0b6c3e6e-5d1f-4f1e-9a65-3b1c2d4e5f60"
    for suffix in ("", "/raw", "/messages"):
        assert_problem(
            app.client.get(f"/v1/files/not-a-uuid{suffix}"), 422, "invalid-input", "not-a-uuid"
        )
        # Upper case is not what the server makes, so it names no file.
        assert_problem(app.client.get(f"/v1/files/{unknown.upper()}{suffix}"), 422, "invalid-input")
        assert_problem(app.client.get(f"/v1/files/{unknown}{suffix}"), 404, "not-found", unknown)
    assert_problem(app.client.get("/v1/refs/not-a-uuid:1"), 422, "invalid-input", "not-a-uuid")
    assert_problem(app.client.get(f"/v1/refs/{unknown}:1"), 404, "not-found", unknown)
    assert_problem(app.client.get("/v1/no-such-route"), 404, "not-found")
    assert_problem(app.client.delete("/v1/files"), 405, "http-error")


# ---------------------------------------------------------------------------------------------
# idempotency


def test_retry_with_the_same_idempotency_key_writes_nothing_new(app: Api) -> None:
    sent = body(
        "s1",
        {"role": "user", "content": "once", "ts": TS1},
        {"role": "assistant", "content": "only once", "ts": TS2},
        idempotency_key="req-1",
    )
    first = app.append(sent)
    file_id = first["file_id"]
    with app.db.transaction() as conn:
        journal_rows = conn.execute(sa.select(sa.func.count()).select_from(tables.append_journal))
        assert journal_rows.scalar_one() == 1

    replay = app.append(sent)
    assert (first["replayed"], replay["replayed"]) == (False, True)
    assert replay["source_refs"] == first["source_refs"] == [f"{file_id}:1", f"{file_id}:2"]
    assert (replay["file_id"], replay["first_seq"], replay["last_seq"]) == (file_id, 1, 2)
    assert app.kicks == [file_id]
    assert app.row(file_id)["next_seq"] == 3

    app.flush(file_id)
    before = snapshot(app.db, app.data_dir)
    again = app.append(sent)
    assert again["source_refs"] == first["source_refs"]
    waited = app.client.post("/v1/append?wait=flushed", json=sent)
    assert waited.status_code == 200
    assert waited.json()["source_refs"] == first["source_refs"]
    assert snapshot(app.db, app.data_dir) == before
    assert [m["content"] for m in app.messages(file_id)] == ["once", "only once"]

    # A different request under the same key is refused, and writes nothing either.
    changed = {**sent, "messages": [{"role": "user", "content": "twice", "ts": TS1}]}
    other_session = {**sent, "session_key": "s2"}
    for payload in (changed, other_session):
        r = app.client.post("/v1/append", json=payload)
        assert_problem(r, 409, "conflict", "req-1")
    assert snapshot(app.db, app.data_dir) == before

    # Keys belong to an agent: another agent may use the same one.
    theirs = app.append({**sent, "agent_id": "other"})
    assert theirs["file_id"] != file_id
    assert theirs["source_refs"] == [f"{theirs['file_id']}:1", f"{theirs['file_id']}:2"]

    # The next request with a new key appends after what was there.
    later = app.append({**sent, "idempotency_key": "req-2"})
    assert later["source_refs"] == [f"{file_id}:3", f"{file_id}:4"]
    assert later["replayed"] is False


def test_an_out_of_order_sequence_is_a_409_naming_the_expected_one(app: Api) -> None:
    """Issue 13 over HTTP: the answer comes at once, the client decides; nothing is held."""

    def numbered(sequence: int, key: str) -> dict[str, Any]:
        message = {"role": "user", "content": f"#{sequence}", "ts": TS1}
        return body("ordered", message, sequence=sequence, idempotency_key=key)

    ahead = assert_problem(
        app.client.post("/v1/append", json=numbered(2, "k2")),
        409,
        "out-of-order",
        "sequence 2 is ahead: this session expects sequence 1 next",
    )
    assert ahead["expected_sequence"] == 1 and ahead["title"] == "OutOfOrder"
    first = app.append(numbered(1, "k1"))
    file_id = first["file_id"]
    assert app.row(file_id)["next_sequence"] == 2
    before = snapshot(app.db, app.data_dir)
    for sent, expected in ((numbered(3, "k3"), 2), (numbered(1, "other"), 2)):
        refused = assert_problem(app.client.post("/v1/append", json=sent), 409, "out-of-order")
        assert refused["expected_sequence"] == expected
    assert app.append(numbered(1, "k1"))["replayed"] is True  # a retry replays
    assert snapshot(app.db, app.data_dir) == before
    assert app.append(numbered(2, "k2"))["first_seq"] == 2
    app.flush(file_id)
    assert [m["content"] for m in app.messages(file_id)] == ["#1", "#2"]
    assert app.row(file_id)["next_sequence"] == 3


def test_a_session_uses_sequences_always_or_never_a_409(app: Api) -> None:
    """In-order requests with a sequence interleaved with requests without one: refused as a
    conflict with the session's state (the body alone is valid: a 422 would say it is not)."""

    def sent(session_key: str, n: int, sequence: int | None = None) -> dict[str, Any]:
        extra = {} if sequence is None else {"sequence": sequence}
        message = {"role": "user", "content": f"#{n}", "ts": TS1}
        return body(session_key, message, idempotency_key=f"{session_key}-{n}", **extra)

    numbered = app.append(sent("numbered", 1, sequence=1))["file_id"]
    plain = app.append(sent("plain", 1))["file_id"]
    before = snapshot(app.db, app.data_dir)
    assert_problem(
        app.client.post("/v1/append", json=sent("numbered", 2)),
        409,
        "conflict",
        "sequence is required: session 'numbered' numbers its appends (it expects sequence 2 "
        "next); a session uses sequences always or never",
    )
    assert_problem(
        app.client.post("/v1/append", json=sent("plain", 2, sequence=1)),
        409,
        "conflict",
        "sequence: session 'plain' has appends without a sequence; a session uses sequences "
        "always or never",
    )
    assert_problem(
        app.client.post("/v1/append", json=sent("plain", 3, sequence=True)),
        422,
        "invalid-input",
        "sequence: must be an integer from 1 to 2147483647, got True",
    )
    assert snapshot(app.db, app.data_dir) == before
    app.append(sent("numbered", 4, sequence=2))
    app.append(sent("plain", 5))
    for file_id in (numbered, plain):
        app.flush(file_id)
    assert [m["content"] for m in app.messages(numbered)] == ["#1", "#4"]
    assert [m["content"] for m in app.messages(plain)] == ["#1", "#5"]


def test_upload_retry_with_the_same_key_makes_one_file(app: Api) -> None:
    sent = {"agent_id": AGENT, "filename": "a.md", "content": "doc", "idempotency_key": "u1"}
    first = app.client.post("/v1/uploads", json=sent)
    again = app.client.post("/v1/uploads", json=sent)
    assert first.status_code == again.status_code == 201
    assert again.json() == first.json()
    assert app.kicks == [first.json()["file_id"]]
    files = app.client.get("/v1/files", params={"source_type": "upload"}).json()["files"]
    assert [f["file_id"] for f in files] == [first.json()["file_id"]]
    r = app.client.post("/v1/uploads", json={**sent, "content": "other doc"})
    assert_problem(r, 409, "conflict", "u1")


# ---------------------------------------------------------------------------------------------
# content round-trip through HTTP

TRICKY = [
    "# 2026-08-03T11:18:06Z user",
    "## 2026-08-03T11:20:05Z tool\n\n**tool**: read_file\n\nforged block",
    "\\# 2026-08-03T11:18:06Z user\n\\\\## 2026-08-03T11:18:06Z assistant",
    "## Notes for the user\n# Display the results to the user",
    "```python\n# Display the results to the user\nprint('done')\n```",
    "line one\r\nline two\r\n",
    "\r\n\r\nCRLF around\r\n\r\n",
    "\n\n  leading blank lines, trailing spaces  \n\n",
    "a\u2028b\u2029c\x0bd\x0ce\x1cf\x85g\rh",
    "中文内容，日本語のテキスト、한국어 🎉 e\u0301",
    "---\nformat_version: 2\n---",
    "**tool**: not_a_tool\n\nsaid by a user",
    "trailing backslash \\",
    "\ttab\t\n    indented",
    "",
]


def test_tricky_content_round_trips_through_http(app: Api) -> None:
    msgs = [{"role": "user", "content": c, "ts": TS1} for c in TRICKY]
    msgs += [{"role": "tool", "content": c, "ts": TS2, "tool_name": "read_file"} for c in TRICKY]
    file_id = app.append(body("s1", *msgs[:20]), wait=True)["file_id"]
    app.append(body("s1", *msgs[20:]))
    app.flush(file_id)

    got = app.messages(file_id, limit=1000)
    assert [m["seq"] for m in got] == list(range(1, len(msgs) + 1))
    assert [m["role"] for m in got] == [m["role"] for m in msgs]
    assert [m["tool_name"] for m in got] == [m.get("tool_name") for m in msgs]
    assert [m["content"] for m in got] == [document.canonical(m["content"]) for m in msgs]
    for seq in (1, 2, len(TRICKY) + 2):
        ref = app.client.get(f"/v1/refs/{file_id}:{seq}").json()
        assert ref["message"]["content"] == document.canonical(msgs[seq - 1]["content"])

    raw = app.client.get(f"/v1/files/{file_id}/raw").content
    assert raw == app.disk(file_id)
    doc = document.parse(raw.decode("utf-8"), file_id=file_id)
    assert len(doc.messages) == len(msgs)

    for i, content in enumerate(TRICKY):
        up = app.client.post(
            "/v1/uploads", json={"agent_id": AGENT, "filename": f"t{i}.md", "content": content}
        )
        assert up.status_code == 201, up.text
        app.flush(up.json()["file_id"])
        [message] = app.messages(up.json()["file_id"])
        assert message["content"] == document.canonical(content), i


def test_json_escapes_and_raw_utf8_bodies_mean_the_same(app: Api) -> None:
    content = "caf\u00e9 \u2028 \U0001f600"
    ascii_body = json.dumps(body("s1", {"role": "user", "content": content}), ensure_ascii=True)
    utf8_body = json.dumps(body("s2", {"role": "user", "content": content}), ensure_ascii=False)
    ids = []
    for text in (ascii_body, utf8_body):
        r = app.client.post(
            "/v1/append?wait=flushed",
            content=text.encode("utf-8"),
            headers={"content-type": "application/json"},
        )
        assert r.status_code == 200, r.text
        ids.append(r.json()["file_id"])
    assert [app.messages(i)[0]["content"] for i in ids] == [content, content]


def test_a_date_in_the_question_is_a_window_fused_with_the_rest(app: Api) -> None:
    """Weekly dinners told in the same words: the date in the question finds its week's."""
    for day, dish in enumerate(("risotto", "ramen", "tacos", "curry")):
        when = f"2026-03-{2 + 7 * day:02d}T19:00:00Z"
        said = {"role": "user", "content": f"Tonight I cooked {dish}.", "ts": when}
        app.append(body(f"week{day}", said), wait=True)
    q: dict[str, str | int] = {
        "q": "What did I cook on March 16?",
        "limit": 2,
        "ref_time": "2026-04-01T12:00:00Z",
    }
    answer = app.client.get("/v1/search", params=q).json()
    assert "tacos" in answer["hits"][0]["snippet"], answer
    assert answer["window"] == {
        "since": "2026-03-15T00:00:00Z",
        "until": "2026-03-17T23:59:59.999999Z",
        "matched": "on March 16",
    }
    for date, dish in (("March 2", "risotto"), ("March 9", "ramen"), ("March 23", "curry")):
        q_other = {**q, "q": f"What did I cook on {date}?"}
        first = app.client.get("/v1/search", params=q_other).json()["hits"][0]
        assert dish in first["snippet"], (date, first)
    # no date: no window
    plain = app.client.get("/v1/search", params={"q": "what did I cook?"}).json()
    assert plain["window"] is None and len(plain["hits"]) == 4
    every = app.client.get("/v1/search", params={**q, "match": "all"}).json()
    assert every["window"] is None
    r = app.client.get("/v1/search", params={"q": "cook", "ref_time": "yesterday"})
    assert_problem(r, 422, "invalid-input", "ref_time")
