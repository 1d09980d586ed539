"""Redaction and erasure over the HTTP API and the ``sgme`` command (docs/design.md §13), on SQLite
and PostgreSQL: a tombstone naming when and why in place of the body, every other message and every
source_ref intact, the catalog, search terms and L1 items that came from the message gone and the
file refined again, an audit row with the sha256 of the body and never the body; erasure answering
410 Gone afterwards; fsck clean through it all."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helpers
import pytest
import sqlalchemy as sa
from api_client import Api, assert_problem
from conftest import Sgme, assert_one_line_error

from pipeline import (
    auth,
    catalog,
    database,
    integrity,
    journal,
    l1,
    locks,
    refine,
    rewrite,
    search,
    tables,
    terms,
    validation,
)
from pipeline.settings import Settings

AGENT = "hermes"
SECRET_WORD = "zanzibarquokka"  # a word no other message has: search finds only this one


def _messages(n: int, secret_at: int) -> list[dict[str, Any]]:
    """``n`` turns the builtin refiner makes an item of each; turn ``secret_at`` (0-based)
    names :data:`SECRET_WORD`."""
    found = []
    for i in range(n):
        role = "user" if i % 2 == 0 else "assistant"
        what = SECRET_WORD if i == secret_at else f"plan {i}"
        text = f"I prefer the {what} option." if role == "user" else f"We decided on {what}."
        found.append({"role": role, "content": text, "ts": f"2026-08-03T11:18:{i:02d}Z"})
    return found


@pytest.fixture
def app(db: database.Database, data_dir: Path, database_url: str) -> Iterator[Api]:
    client = Api(db, data_dir, database_url, validation.DEFAULT_LIMITS)
    yield client
    client.close()


def _refined(api: Api, file_id: str) -> None:
    """Refine the whole file now, with the builtin refiner (one item per message)."""
    helpers.service(api.db, Settings(data_dir=api.data_dir)).refine_now(file_id)


def _items(db: database.Database, file_id: str) -> list[tables.L1Item]:
    with db.reading() as conn:
        return l1.list_items(conn, file_id=file_id, limit=10_000)


def _search(db: database.Database, word: str) -> list[str]:
    with db.reading() as conn:
        hits = catalog.find(conn, terms.parse_query(word), catalog.Filters(), limit=50)
    return [f"{h.message.file_id}:{h.message.seq}" for h in hits]


def _ranked(db: database.Database, data_dir: Path, q: str) -> list[str]:
    """The ranked search's hits, BM25 alone (its context terms: the 2 turns before each)."""
    return [h.source_ref for h in search.search(db, data_dir, q, neighbours="none", limit=50)]


def test_redact_replaces_the_body_keeps_every_ref_and_forgets_what_came_from_it(
    app: Api, db: database.Database, data_dir: Path
) -> None:
    ack = app.append({"agent_id": AGENT, "session_key": "s", "messages": _messages(6, 2)})
    file_id = ack["file_id"]
    app.flush(file_id)
    _refined(app, file_id)
    before = app.messages(file_id)
    raw_before = app.disk(file_id)
    assert _search(db, SECRET_WORD) == [f"{file_id}:3"]
    # ranked, the two turns after it hold it in their context terms
    assert _ranked(db, data_dir, SECRET_WORD) == [f"{file_id}:{s}" for s in (3, 4, 5)]
    assert any(f"{file_id}:3" in json.loads(i.source_refs) for i in _items(db, file_id))

    r = app.client.post(f"/v1/refs/{file_id}:3/redact", json={"reason": "home address"})
    assert r.status_code == 200, r.text
    answer = r.json()
    tomb = answer["message"]
    assert answer["source_ref"] == f"{file_id}:3"
    assert tomb["seq"] == 3 and tomb["role"] == before[2]["role"] and tomb["ts"] == before[2]["ts"]
    assert tomb["content"].startswith("[REDACTED:message] removed ")
    assert tomb["content"].endswith(": home address")
    record = answer["redaction"]
    body = before[2]["content"].encode()
    assert record["removed_sha256"] == hashlib.sha256(body).hexdigest()
    assert record["removed_bytes"] == len(body) and record["finished_at"]
    assert record["actor"] == "api (auth off)" and record["reason"] == "home address"

    # every other message byte for byte; every ref resolves; the secret is nowhere on disk
    after = app.messages(file_id)
    assert [m["seq"] for m in after] == [1, 2, 3, 4, 5, 6]
    assert [m for i, m in enumerate(after) if i != 2] == [m for i, m in enumerate(before) if i != 2]
    for seq in range(1, 7):
        assert app.client.get(f"/v1/refs/{file_id}:{seq}").status_code == 200
    raw = app.disk(file_id)
    assert SECRET_WORD.encode() in raw_before and SECRET_WORD.encode() not in raw
    assert app.row(file_id)["flushed_bytes"] == len(raw)
    assert _search(db, SECRET_WORD) == []
    # gone from its neighbours' context too, which holds the tombstone's words instead
    assert _ranked(db, data_dir, SECRET_WORD) == []
    assert _ranked(db, data_dir, '"home address"') == [f"{file_id}:{s}" for s in (3, 4, 5)]
    # L1: nothing cites it; refinement restarts before it and, run again, covers the rest
    assert all(f"{file_id}:3" not in i.source_refs for i in _items(db, file_id))
    assert app.row(file_id)["last_refined_seq"] <= 2
    _refined(app, file_id)
    refs = {r for i in _items(db, file_id) for r in json.loads(i.source_refs)}
    assert {f"{file_id}:{s}" for s in (1, 2, 4, 5, 6)} <= refs
    assert not any(SECRET_WORD in i.content for i in _items(db, file_id))
    assert integrity.fsck(db, data_dir) == []

    # an append after it continues the file at the new length
    app.append({"agent_id": AGENT, "session_key": "s", "messages": _messages(1, -1)})
    app.flush(file_id)
    assert [m["seq"] for m in app.messages(file_id)] == [1, 2, 3, 4, 5, 6, 7]
    assert integrity.fsck(db, data_dir) == []

    # again: nothing changes, the first redaction is the answer
    again = app.client.post(f"/v1/refs/{file_id}:3/redact", json={"reason": "twice"})
    assert again.status_code == 200 and again.json()["redaction"]["id"] == record["id"]
    trail = app.client.get("/v1/audit", params={"file_id": file_id}).json()["records"]
    assert [t["id"] for t in trail] == [record["id"]]
    assert SECRET_WORD not in json.dumps(trail)


def test_redact_an_unflushed_message_and_an_upload(app: Api, db: database.Database) -> None:
    ack = app.append({"agent_id": AGENT, "session_key": "s", "messages": _messages(3, 0)})
    file_id = ack["file_id"]  # not flushed: the redaction writes the journal first
    r = app.client.post(f"/v1/refs/{file_id}:1/redact", json={"reason": "x"})
    assert r.status_code == 200, r.text
    assert SECRET_WORD.encode() not in app.disk(file_id)
    assert app.messages(file_id)[0]["content"].startswith("[REDACTED:message]")

    up = app.client.post(
        "/v1/uploads",
        json={"agent_id": AGENT, "filename": "notes.md", "content": f"# {SECRET_WORD}\nnotes"},
    )
    assert up.status_code == 201, up.text
    ref = up.json()["source_ref"]
    app.flush(ref.split(":")[0])
    r = app.client.post(f"/v1/refs/{ref}/redact", json={"reason": "private notes"})
    assert r.status_code == 200, r.text
    assert r.json()["message"]["content"].endswith(": private notes")
    assert SECRET_WORD.encode() not in app.disk(ref.split(":")[0])
    assert _search(db, SECRET_WORD) == []
    assert integrity.fsck(db, app.data_dir) == []


def test_redact_refusals(app: Api) -> None:
    ack = app.append({"agent_id": AGENT, "session_key": "s", "messages": _messages(2, 0)})
    file_id = ack["file_id"]
    assert_problem(app.client.post(f"/v1/refs/{file_id}:1/redact", json={}), 422, "invalid-input")
    bad = app.client.post(f"/v1/refs/{file_id}:1/redact", json={"reason": "a\nb"})
    assert_problem(bad, 422, "invalid-input", "control character")
    missing = app.client.post(f"/v1/refs/{file_id}:9/redact", json={"reason": "x"})
    assert_problem(missing, 404, "not-found")
    assert_problem(
        app.client.post("/v1/refs/nope:1/redact", json={"reason": "x"}), 422, "invalid-input"
    )
    app.flush(file_id)
    assert SECRET_WORD in app.messages(file_id)[0]["content"]  # refused: nothing changed


def test_admin_scope_and_agents_are_required(
    db: database.Database, data_dir: Path, database_url: str
) -> None:
    reader = auth.create(db, agent_ids=["*"], scopes=["read", "append"], name="r").secret
    other = auth.create(db, agent_ids=["other"], scopes=["admin"], name="o").secret
    admin = auth.create(db, agent_ids=[AGENT], scopes=["admin"], name="ops").secret
    app = Api(db, data_dir, database_url, validation.DEFAULT_LIMITS)
    body = {"agent_id": AGENT, "session_key": "s", "messages": _messages(2, 0)}
    r = app.client.post("/v1/append", json=body, headers={"Authorization": f"Bearer {reader}"})
    file_id = r.json()["file_id"]

    def post(token: str) -> Any:
        return app.client.post(
            f"/v1/refs/{file_id}:1/redact",
            json={"reason": "x"},
            headers={"Authorization": f"Bearer {token}"},
        )

    assert_problem(post(reader), 403, "forbidden", "admin")
    assert_problem(post(other), 404, "not-found")  # another agent's file: as if it did not exist
    gone = app.client.delete(f"/v1/files/{file_id}", headers={"Authorization": f"Bearer {reader}"})
    assert_problem(gone, 403, "forbidden")
    done = post(admin)
    assert done.status_code == 200, done.text
    assert done.json()["redaction"]["actor"].endswith("(ops)")


def test_erase_a_file_answers_410_and_keeps_only_the_audit_row(
    app: Api, db: database.Database, data_dir: Path, file_locks: locks.FileLocks
) -> None:
    ack = app.append(
        {
            "agent_id": AGENT,
            "session_key": "s",
            "idempotency_key": "k1",
            "messages": _messages(4, 1),
        }
    )
    file_id = ack["file_id"]
    app.flush(file_id)
    _refined(app, file_id)
    kept = app.append({"agent_id": AGENT, "session_key": "other", "messages": _messages(2, -1)})
    app.flush(kept["file_id"])
    app.append({"agent_id": AGENT, "session_key": "s", "messages": _messages(1, 0)})  # journal

    r = app.client.delete(f"/v1/files/{file_id}", params={"reason": "user asked"})
    assert r.status_code == 204, r.text
    assert r.content == b""
    for path in (
        f"/v1/files/{file_id}",
        f"/v1/files/{file_id}/raw",
        f"/v1/refs/{file_id}:1",
        f"/v1/files/{file_id}/messages",
    ):
        assert_problem(app.client.get(path), 410, "gone", "erased")
    assert_problem(app.client.delete(f"/v1/files/{file_id}"), 410, "gone")
    assert not list((data_dir / "raw").rglob(f"{file_id}*"))
    with db.reading() as conn:
        for table in (tables.messages, tables.l1_items, tables.append_journal, tables.raw_files):
            left = conn.execute(sa.select(sa.func.count()).where(table.c.file_id == file_id))
            assert left.scalar() == 0, table.name
        # the key stays as the erasure's tombstone: no digest of what it held, no answer
        k = tables.append_keys.c
        keys = conn.execute(sa.select(k.idempotency_key, k.request_hash, k.response_json)).all()
        assert [tuple(row) for row in keys] == [("k1", "erased", json.dumps({"erased": file_id}))]
    assert _search(db, SECRET_WORD) == []
    assert _ranked(db, data_dir, SECRET_WORD) == []
    (record,) = app.client.get("/v1/audit", params={"file_id": file_id}).json()["records"]
    assert record["action"] == "erase" and record["reason"] == "user asked"
    assert record["messages"] == 5 and record["finished_at"] and record["keys"] == 1
    # the other session is untouched; the erased key writes nothing, whatever it holds now
    assert len(app.messages(kept["file_id"])) == 2
    for held in (_messages(4, 1), _messages(1, -1)):
        erased = app.append(
            {"agent_id": AGENT, "session_key": "s", "idempotency_key": "k1", "messages": held}
        )
        assert (erased["erased"], erased["source_refs"], erased["replayed"]) == (
            len(held),
            [],
            False,
        )
    with db.reading() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(tables.raw_files)).scalar() == 1
    # a new append to the erased session starts a new file
    again = app.append(
        {
            "agent_id": AGENT,
            "session_key": "s",
            "idempotency_key": "k2",
            "messages": _messages(1, -1),
        }
    )
    assert again["file_id"] != file_id and again["first_seq"] == 1 and not again["replayed"]
    assert again["erased"] == 0
    app.flush(again["file_id"])
    assert integrity.fsck(db, data_dir) == []
    assert integrity.reindex(db, file_locks, data_dir).failed == []


def test_cli_redact_erase_audit_and_policy(sgme: Sgme, data_dir: Path) -> None:
    body = {"agent_id": AGENT, "session_key": "s", "messages": _messages(3, 1)}
    ack = sgme("append", stdin=json.dumps(body)).json()
    file_id = ack["file_id"]
    ref = f"{file_id}:2"

    with pytest.raises(SystemExit):  # argparse: --reason is required
        sgme("redact", ref)
    done = sgme("redact", ref, f"{file_id}:3", "--reason", "cleanup", "--json")
    assert done.code == 0, done.err
    records = done.json()
    assert [r["source_ref"] for r in records] == [ref, f"{file_id}:3"]
    assert records[0]["actor"].startswith("cli ")
    shown = sgme("ref", ref, "--json").json()["message"]
    assert shown["content"].startswith("[REDACTED:message]")
    assert sgme("fsck").code == 0

    assert_one_line_error(sgme("erase", "--file-id", file_id), "--yes")
    assert_one_line_error(sgme("erase", "--yes"), "exactly one")
    erased = sgme("erase", "--agent-id", AGENT, "--yes", "--json")
    assert erased.code == 0, erased.err
    summary = erased.json()
    assert summary["files"] == 1 and summary["messages"] == 3
    assert_one_line_error(sgme("ref", ref), "erased")
    trail = sgme("audit", "--json").json()
    assert [t["action"] for t in trail] == ["redact", "redact", "erase"]

    policy = sgme("secrets", "policy", AGENT, "--redact", "off", "--json")
    assert policy.code == 0, policy.err
    assert policy.json()["redact_secrets"] is False and policy.json()["source"] == "agent"
    key = "AKIA" + "Q3EGRT5KZ7NYH2VB"
    body = {"agent_id": AGENT, "session_key": "t", "messages": [{"role": "user", "content": key}]}
    kept = sgme("append", stdin=json.dumps(body)).json()
    assert kept["redacted"] == 0
    assert key.encode() in sgme("cat", kept["file_id"]).out
    assert sgme("secrets", "policy", AGENT, "--redact", "default").code == 0
    body["session_key"] = "u"
    redacted = sgme("append", stdin=json.dumps(body)).json()
    assert redacted["redacted"] == 1
    assert key.encode() not in sgme("cat", redacted["file_id"]).out


def test_cli_redact_checks_every_ref_before_it_redacts_any(sgme: Sgme) -> None:
    """``sgme redact A:1 A:99 A:2``: A:99 names no message, so nothing is redacted — not A:1
    before it, not A:2 after it — and the one-line error names every ref at fault."""
    body = {"agent_id": AGENT, "session_key": "s", "messages": _messages(3, 1)}
    file_id = sgme("append", stdin=json.dumps(body)).json()["file_id"]
    other = "0b6c3e6e-5d1f-4f1e-9a65-3b1c2d4e5f60"
    before = sgme("cat", file_id).out
    refs = [f"{file_id}:1", f"{file_id}:99", f"{file_id}:2", f"{other}:1", "nonsense"]
    run = sgme("redact", *refs, "--reason", "cleanup")
    assert_one_line_error(
        run,
        "nothing was redacted",
        f"no message {file_id}:99",
        f"no file {other}",
        "'nonsense'",
    )
    assert f"{file_id}:1 " not in run.err and f"{file_id}:2 " not in run.err
    assert sgme("cat", file_id).out == before
    assert sgme("audit", "--json").json() == []
    done = sgme("redact", f"{file_id}:1", f"{file_id}:2", "--reason", "cleanup", "--json")
    assert done.code == 0, done.err
    assert [r["source_ref"] for r in done.json()] == [f"{file_id}:1", f"{file_id}:2"]


def test_a_claim_made_before_a_redaction_commits_nothing(
    db: database.Database, data_dir: Path
) -> None:
    """A running job's claim made before the redaction commits nothing (the epoch moved)."""
    body = {"agent_id": AGENT, "session_key": "s", "messages": _messages(4, 1)}
    file_id = journal.ingest(db, body).file_id
    journal.flush(db, data_dir, file_id)
    claim = refine.claim(db, file_id, lease_seconds=60)
    assert claim is not None
    service = helpers.service(db, Settings(data_dir=data_dir))
    service.removals.redact([f"{file_id}:2"], rewrite.Who("test", "r"))
    stale = [refine.Item("fact", f"about {SECRET_WORD}", (f"{file_id}:2",))]
    assert refine.commit(db, claim, stale, refiner="test") is False
    assert _items(db, file_id) == []
