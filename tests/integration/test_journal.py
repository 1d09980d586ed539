"""The append protocol (docs/design.md §3) against a real index: ingest, flush, idempotency, refusal
of bad input, torn tails, shrunk files and reads — on SQLite and PostgreSQL."""

from __future__ import annotations

import datetime as dt
import hashlib
from pathlib import Path
from typing import Any

import helpers
import pytest
import sqlalchemy as sa

from pipeline import (
    anomalies,
    database,
    document,
    errors,
    flush,
    integrity,
    journal,
    ledger,
    reader,
    refs,
    tables,
)
from pipeline.settings import Limits

TS1 = "2026-08-03T11:18:06Z"
TS2 = "2026-08-03T11:18:07.25Z"
TS3 = "2026-08-03T11:20:05Z"


def append_body(session_key: str = "s1", *messages: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """An append request; one plain user message unless ``messages`` are given."""
    body: dict[str, Any] = {
        "agent_id": "hermes",
        "session_key": session_key,
        "messages": list(messages) or [{"role": "user", "content": "hello", "ts": TS1}],
    }
    body.update(extra)
    return body


def file_bytes(db: database.Database, data_dir: Path, file_id: str) -> bytes:
    return (data_dir / helpers.file_row(db, file_id).path).read_bytes()


def journal_rows(db: database.Database, file_id: str) -> list[tables.JournalRow]:
    with db.transaction() as conn:
        return ledger.journal_after(conn, file_id, 0)


def table_counts(db: database.Database) -> dict[str, int]:
    with db.transaction() as conn:
        return {
            table.name: conn.execute(sa.select(sa.func.count()).select_from(table)).scalar_one()
            for table in (tables.raw_files, tables.append_journal, tables.append_keys)
        }


def anomaly_kinds(db: database.Database, file_id: str) -> list[str]:
    with db.transaction() as conn:
        return [a.kind for a in anomalies.listed(conn, file_id=file_id)]


def disk_files(data_dir: Path) -> list[Path]:
    return sorted((data_dir / "raw").rglob("*.md")) if (data_dir / "raw").exists() else []


def sha_chain(prefix: bytes, blocks: list[bytes]) -> str:
    """The hash chain of docs/design.md §3, computed here without pipeline.document."""
    head = hashlib.sha256(prefix).digest()
    for block in blocks:
        head = hashlib.sha256(head + block).digest()
    return head.hex()


# ---------------------------------------------------------------------------------------------
# ingest + flush write exactly the expected bytes


def test_ingest_then_flush_writes_exact_bytes(db: database.Database, data_dir: Path) -> None:
    first = journal.ingest(
        db,
        append_body(
            "0123",
            {"role": "user", "content": "hello", "ts": TS1},
            # an offset is converted to UTC; a heading-like body line is escaped
            {
                "role": "assistant",
                "content": "\n\nsee:\n# 2026-01-01T00:00:00Z user\nend\n\n",
                "ts": "2026-08-03T13:18:07.250+02:00",
            },
            metadata={"app": "hermes-desktop"},
        ),
    )
    fid = first.file_id
    assert refs.check_file_id(fid) == fid
    assert (first.first_seq, first.last_seq) == (1, 2)
    assert first.source_refs == (f"{fid}:1", f"{fid}:2")
    assert first.status == "pending"
    assert first.kick is True
    # acknowledged, not yet on disk
    assert disk_files(data_dir) == []
    assert helpers.file_row(db, fid).next_seq == 3

    result = journal.flush(db, data_dir, fid)
    assert (result.messages, result.flushed_seq) == (2, 2)

    frontmatter = (
        "---\n"
        "format_version: 1\n"
        f'file_id: "{fid}"\n'
        'session_key: "0123"\n'
        'agent_id: "hermes"\n'
        'source_type: "session"\n'
        f'started_at: "{TS1}"\n'
        "metadata:\n"
        '  "app": "hermes-desktop"\n'
        "---\n"
        "\n"
    ).encode()
    block1 = f"# {TS1} user\n\nhello\n\n".encode()
    block2 = f"## {TS2} assistant\n\nsee:\n\\# 2026-01-01T00:00:00Z user\nend\n\n".encode()
    path = data_dir / "raw" / "sessions" / f"{fid}.md"
    assert disk_files(data_dir) == [path]
    assert path.read_bytes() == frontmatter + block1 + block2

    second = journal.ingest(
        db,
        append_body(
            "0123",
            {"role": "tool", "tool_name": "read_file", "content": "line\r\n  indented", "ts": TS3},
            metadata={"ignored": "only the creating append's metadata counts"},
        ),
    )
    assert second.file_id == fid
    assert (second.first_seq, second.last_seq) == (3, 3)
    assert second.source_refs == (f"{fid}:3",)
    assert second.status == "new"
    assert journal.flush(db, data_dir, fid).flushed_seq == 3

    block3 = f"## {TS3} tool\n\n**tool**: read_file\n\nline\r\n  indented\n\n".encode()
    data = path.read_bytes()
    assert data == frontmatter + block1 + block2 + block3
    # '#' only for seq 1, '##' for every later block
    assert [line for line in data.split(b"\n") if line.startswith(b"#")] == [
        f"# {TS1} user".encode(),
        f"## {TS2} assistant".encode(),
        f"## {TS3} tool".encode(),
    ]

    row = helpers.file_row(db, fid)
    assert (row.status, row.next_seq, row.flushed_seq) == ("new", 4, 3)
    assert row.flushed_bytes == len(data)
    assert row.chain_head == sha_chain(frontmatter, [block1, block2, block3])
    assert row.flush_pending is False
    assert row.ended_at == dt.datetime(2026, 8, 3, 11, 20, 5)
    assert row.metadata == {"app": "hermes-desktop"}
    assert journal_rows(db, fid) == []

    doc = document.parse(data.decode(), file_id=fid)
    assert [(m.seq, m.role, m.content, m.tool_name) for m in doc.messages] == [
        (1, "user", "hello", None),
        (2, "assistant", "see:\n# 2026-01-01T00:00:00Z user\nend", None),
        (3, "tool", "line\r\n  indented", "read_file"),
    ]
    assert integrity.fsck(db, data_dir) == []


def test_seqs_continue_across_many_appends(db: database.Database, data_dir: Path) -> None:
    refs: list[str] = []
    for batch in range(6):
        messages = [
            {"role": "user", "content": f"b{batch} m{i}", "ts": TS1} for i in range(batch % 3 + 1)
        ]
        result = journal.ingest(db, append_body("s", *messages))
        refs.extend(result.source_refs)
        if batch % 2:  # flush every other append: one flush writes several journal rows
            journal.flush(db, data_dir, result.file_id)
    fid = refs[0].split(":")[0]
    assert refs == [f"{fid}:{seq}" for seq in range(1, len(refs) + 1)]
    journal.flush(db, data_dir, fid)
    doc = document.parse(file_bytes(db, data_dir, fid).decode(), file_id=fid)
    assert [m.content for m in doc.messages] == [
        f"b{b} m{i}" for b in range(6) for i in range(b % 3 + 1)
    ]
    assert helpers.file_row(db, fid).flushed_seq == len(refs) == 12


def test_sessions_are_keyed_by_agent_source_type_and_session_key(
    db: database.Database, data_dir: Path
) -> None:
    a = journal.ingest(db, append_body("k"))
    b = journal.ingest(db, {**append_body("k"), "agent_id": "other"})
    c = journal.ingest(db, append_body("k", source_type="external"))
    d = journal.ingest(db, append_body("k"))
    assert len({a.file_id, b.file_id, c.file_id}) == 3
    assert d.file_id == a.file_id and d.first_seq == 2
    for result in (a, b, c):
        journal.flush(db, data_dir, result.file_id)
    assert helpers.file_row(db, c.file_id).path == f"raw/external/{c.file_id}.md"
    assert (data_dir / "raw" / "external" / f"{c.file_id}.md").is_file()
    assert len(disk_files(data_dir)) == 3


def test_a_sessions_first_append_compiles_no_statement(
    db: database.Database, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new session's row is inserted by a statement compiled once (index.insert_file), not
    by SQLAlchemy compiling an INSERT on every first append (1 ms of the append's 1.4)."""
    journal.ingest(db, append_body("warm"))  # the statements of this database, compiled once
    compiled: list[str] = []
    real = sa.sql.compiler.SQLCompiler.__init__

    def counting(self: Any, *args: Any, **kwargs: Any) -> None:
        real(self, *args, **kwargs)
        compiled.append(type(self.statement).__name__)

    monkeypatch.setattr(sa.sql.compiler.SQLCompiler, "__init__", counting)
    made = [journal.ingest(db, append_body(f"new-{i}")) for i in range(3)]
    monkeypatch.undo()
    assert compiled == []
    assert len({result.file_id for result in made}) == 3
    for result in made:
        assert helpers.file_row(db, result.file_id).session_key.startswith("new-")


def test_ended_at_is_the_latest_time_not_the_largest_string(
    db: database.Database, data_dir: Path
) -> None:
    # "…:06Z" sorts after "…:06.5Z" as a string although it is half a second earlier
    result = journal.ingest(
        db,
        append_body(
            "s",
            {"role": "user", "content": "a", "ts": "2026-08-03T11:18:06.5Z"},
            {"role": "user", "content": "b", "ts": "2026-08-03T11:18:06Z"},
        ),
    )
    journal.flush(db, data_dir, result.file_id)
    assert helpers.file_row(db, result.file_id).ended_at == dt.datetime(
        2026, 8, 3, 11, 18, 6, 500000
    )


def test_ended_at_never_moves_back(db: database.Database, data_dir: Path) -> None:
    first = journal.ingest(
        db, append_body("s", {"role": "user", "content": "a", "ts": "2026-08-03T12:00:00Z"})
    )
    journal.flush(db, data_dir, first.file_id)
    late = journal.ingest(
        db, append_body("s", {"role": "user", "content": "b", "ts": "2026-08-01T09:00:00Z"})
    )
    journal.flush(db, data_dir, late.file_id)
    assert helpers.file_row(db, first.file_id).ended_at == dt.datetime(2026, 8, 3, 12, 0, 0)


# ---------------------------------------------------------------------------------------------
# coalesced kicks


def test_kick_is_coalesced_until_a_flush_starts(db: database.Database, data_dir: Path) -> None:
    first = journal.ingest(db, append_body("s"))
    second = journal.ingest(db, append_body("s"))
    other = journal.ingest(db, append_body("other"))
    assert (first.kick, second.kick) == (True, False)
    assert other.kick is True  # pending flags are per file
    assert helpers.file_row(db, first.file_id).flush_pending is True

    journal.flush(db, data_dir, first.file_id)
    assert helpers.file_row(db, first.file_id).flush_pending is False
    third = journal.ingest(db, append_body("s"))
    assert third.kick is True
    fourth = journal.ingest(db, append_body("s"))
    assert fourth.kick is False


def test_append_during_a_flush_is_left_to_the_next_flush(
    db: database.Database, data_dir: Path
) -> None:
    first = journal.ingest(db, append_body("s"))
    fid = first.file_id
    during: list[journal.AppendResult] = []

    def hook(step: str) -> None:
        if step == "read" and not during:
            # the flush has read its rows: this append finds the flush pending (no kick of
            # its own), and the flush says there is more when it commits
            during.append(journal.ingest(db, append_body("s", {"role": "user", "content": "late"})))

    result = journal.flush(db, data_dir, fid, fault=hook)
    assert (result.flushed_seq, result.more) == (1, True)
    assert [r.kick for r in during] == [False]
    assert during[0].first_seq == 2
    row = helpers.file_row(db, fid)
    assert (row.flushed_seq, row.next_seq, row.flush_pending) == (1, 3, True)
    assert [(j.first_seq, j.last_seq) for j in journal_rows(db, fid)] == [(2, 2)]

    again = journal.flush(db, data_dir, fid)
    assert (again.flushed_seq, again.more) == (2, False)
    assert helpers.file_row(db, fid).flush_pending is False
    assert journal.ingest(db, append_body("s")).kick is True  # caught up: kicks again
    doc = document.parse(file_bytes(db, data_dir, fid).decode(), file_id=fid)
    assert [m.content for m in doc.messages] == ["hello", "late"]


def test_flush_with_nothing_pending_writes_nothing(db: database.Database, data_dir: Path) -> None:
    result = journal.ingest(db, append_body("s"))
    journal.flush(db, data_dir, result.file_id)
    before = file_bytes(db, data_dir, result.file_id)
    again = journal.flush(db, data_dir, result.file_id)
    assert (again.messages, again.bytes, again.flushed_seq) == (0, 0, 1)
    assert file_bytes(db, data_dir, result.file_id) == before


def test_flush_of_unknown_file_is_not_found(db: database.Database, data_dir: Path) -> None:
    with pytest.raises(errors.NotFound):
        journal.flush(db, data_dir, "00000000-0000-4000-8000-000000000000")


# ---------------------------------------------------------------------------------------------
# idempotency


def test_retry_with_same_idempotency_key_writes_nothing(
    db: database.Database, data_dir: Path
) -> None:
    body = append_body(
        "s",
        {"role": "user", "content": "one", "ts": TS1},
        {"role": "assistant", "content": "two", "ts": TS2},
        idempotency_key="req-1",
    )
    original = journal.ingest(db, body)
    assert original.replayed is False

    # a retry before the flush: still one journal row
    retry = journal.ingest(db, dict(body))
    assert retry.replayed is True
    assert retry.kick is False
    assert (retry.file_id, retry.source_refs) == (original.file_id, original.source_refs)
    assert (retry.first_seq, retry.last_seq) == (1, 2)
    assert len(journal_rows(db, original.file_id)) == 1
    assert helpers.file_row(db, original.file_id).next_seq == 3

    journal.flush(db, data_dir, original.file_id)
    before = file_bytes(db, data_dir, original.file_id)
    counts = table_counts(db)

    # a retry after the flush: same answer, nothing new anywhere
    retry = journal.ingest(db, dict(body))
    assert retry.replayed is True
    assert retry.source_refs == original.source_refs
    assert table_counts(db) == counts
    assert journal.flush(db, data_dir, original.file_id).messages == 0
    assert file_bytes(db, data_dir, original.file_id) == before
    assert helpers.file_row(db, original.file_id).next_seq == 3

    # the key is spent for this agent only; a new key appends
    other_agent = journal.ingest(db, {**body, "agent_id": "someone-else"})
    assert other_agent.replayed is False and other_agent.file_id != original.file_id
    fresh = journal.ingest(db, {**body, "idempotency_key": "req-2"})
    assert fresh.source_refs == (f"{original.file_id}:3", f"{original.file_id}:4")


@pytest.mark.parametrize(
    "change",
    [
        {"messages": [{"role": "user", "content": "ONE", "ts": TS1}]},
        {"session_key": "a-different-session"},
        {"metadata": {"x": "y"}},
    ],
    ids=["content", "new-session", "metadata"],
)
def test_same_key_different_body_is_a_conflict(
    db: database.Database, data_dir: Path, change: dict[str, Any]
) -> None:
    body = append_body("s", {"role": "user", "content": "one", "ts": TS1}, idempotency_key="k")
    original = journal.ingest(db, body)
    journal.flush(db, data_dir, original.file_id)
    before = file_bytes(db, data_dir, original.file_id)
    counts = table_counts(db)

    with pytest.raises(errors.Conflict, match="idempotency_key"):
        journal.ingest(db, {**body, **change})

    # nothing written — not even the raw_files row a new session would have created
    assert table_counts(db) == counts
    assert helpers.file_row(db, original.file_id).next_seq == 2
    assert journal.flush(db, data_dir, original.file_id).messages == 0
    assert file_bytes(db, data_dir, original.file_id) == before
    assert len(disk_files(data_dir)) == 1


# ---------------------------------------------------------------------------------------------
# invalid input: refused, nothing written

SMALL = Limits(max_message_bytes=16, max_append_messages=3, max_append_bytes=40)
OK = {"role": "user", "content": "fine", "ts": TS1}


def _bad(**fields: Any) -> dict[str, Any]:
    return {**append_body("new-session", OK), "idempotency_key": "k-bad", **fields}


def _bad_message(message: dict[str, Any]) -> dict[str, Any]:
    # the bad message comes second: the good one before it must not be half-written either
    return _bad(messages=[OK, message])


INVALID_BODIES: dict[str, Any] = {
    "unknown-role": _bad_message({"role": "robot", "content": "x"}),
    "missing-role": _bad_message({"content": "x"}),
    "tool-without-tool_name": _bad_message({"role": "tool", "content": "x"}),
    "tool-blank-tool_name": _bad_message({"role": "tool", "content": "x", "tool_name": "  "}),
    "tool_name-with-newline": _bad_message({"role": "tool", "content": "x", "tool_name": "a\nb"}),
    "tool_name-on-user": _bad_message({"role": "user", "content": "x", "tool_name": "t"}),
    "bad-timestamp": _bad_message({"role": "user", "content": "x", "ts": "yesterday"}),
    "bad-timestamp-out-of-range-fields": _bad_message(
        {"role": "user", "content": "x", "ts": "2026-13-45T99:00:00Z"}
    ),
    "bad-timestamp-bool": _bad_message({"role": "user", "content": "x", "ts": True}),
    "bad-timestamp-nan": _bad_message({"role": "user", "content": "x", "ts": float("nan")}),
    # 9 characters, 18 bytes: the limit is on bytes
    "oversized-message": _bad_message({"role": "user", "content": "é" * 9}),
    "too-many-messages": _bad(messages=[OK, OK, OK, OK]),
    "oversized-batch": _bad(messages=[{"role": "user", "content": "x" * 15}] * 3),
    "nul-in-content": _bad_message({"role": "user", "content": "a\x00b"}),
    "lone-surrogate-in-content": _bad_message({"role": "user", "content": "a\ud800b"}),
    "lone-surrogate-in-tool_name": _bad_message(
        {"role": "tool", "content": "x", "tool_name": "t\udfff"}
    ),
    "content-not-a-string": _bad_message({"role": "user", "content": 5}),
    "message-not-an-object": _bad(messages=[OK, "hello"]),
    "unknown-message-field": _bad_message({"role": "user", "content": "x", "name": "bob"}),
    "session_key-newline": _bad(session_key="a\nb"),
    "session_key-tab": _bad(session_key="a\tb"),
    "session_key-del": _bad(session_key="a\x7fb"),
    "session_key-c1-control": _bad(session_key="a\x85b"),
    "session_key-line-separator": _bad(session_key="a\u2028b"),
    "session_key-empty": _bad(session_key=""),
    "session_key-too-long": _bad(session_key="k" * 513),
    "session_key-not-a-string": _bad(session_key=123),
    "session_key-lone-surrogate": _bad(session_key="a\ud800"),
    "agent_id-slash": _bad(agent_id="a/b"),
    "agent_id-dotdot-path": _bad(agent_id="../etc"),
    "agent_id-empty": _bad(agent_id=""),
    "agent_id-too-long": _bad(agent_id="a" * 65),
    "agent_id-missing": {k: v for k, v in _bad().items() if k != "agent_id"},
    "agent_id-unicode": _bad(agent_id="agént"),
    "unknown-field": _bad(extra=1),
    "empty-messages": _bad(messages=[]),
    "missing-messages": {k: v for k, v in _bad().items() if k != "messages"},
    "messages-not-a-list": _bad(messages="hello"),
    "source_type-upload": _bad(source_type="upload"),
    "source_type-unknown": _bad(source_type="chat"),
    "metadata-not-an-object": _bad(metadata=[1, 2]),
    "metadata-too-large": _bad(metadata={"k": "x" * 9000}),
    "idempotency_key-too-long": _bad(idempotency_key="k" * 201),
    "idempotency_key-not-a-string": _bad(idempotency_key=7),
    "body-not-an-object": [OK],
}


@pytest.mark.parametrize("body", INVALID_BODIES.values(), ids=INVALID_BODIES.keys())
def test_invalid_append_is_refused_and_writes_nothing(
    db: database.Database, data_dir: Path, body: Any
) -> None:
    counts = table_counts(db)
    assert counts == {"raw_files": 0, "append_journal": 0, "append_keys": 0}
    with pytest.raises(errors.InvalidInput) as caught:
        journal.ingest(db, body, limits=SMALL)
    assert caught.value.detail  # a clear message, not an empty one
    assert table_counts(db) == counts
    assert flush.stale_files(db, age=0) == []
    assert disk_files(data_dir) == []

    # the refused request did not spend its idempotency key
    good = journal.ingest(db, _bad(), limits=SMALL)
    assert good.replayed is False and good.source_refs == (f"{good.file_id}:1",)


def test_invalid_append_to_an_existing_session_writes_nothing(
    db: database.Database, data_dir: Path
) -> None:
    first = journal.ingest(db, append_body("s"))
    journal.flush(db, data_dir, first.file_id)
    before = file_bytes(db, data_dir, first.file_id)
    counts = table_counts(db)
    for bad in (
        {"role": "user", "content": "x", "ts": "not a time"},
        {"role": "tool", "content": "x"},
        {"role": "user", "content": "x" * 17},
        {"role": "user", "content": "\x00"},
    ):
        with pytest.raises(errors.InvalidInput):
            journal.ingest(db, append_body("s", OK, bad), limits=SMALL)
    assert table_counts(db) == counts
    assert helpers.file_row(db, first.file_id).next_seq == 2
    assert journal.flush(db, data_dir, first.file_id).messages == 0
    assert file_bytes(db, data_dir, first.file_id) == before


def test_limits_are_inclusive(db: database.Database, data_dir: Path) -> None:
    # exactly at every limit is accepted: 3 messages, one of 16 bytes, 40 bytes in all
    messages = [
        {"role": "user", "content": "é" * 8},  # 16 bytes
        {"role": "user", "content": "x" * 12},
        {"role": "user", "content": "y" * 12},
    ]
    result = journal.ingest(db, append_body("s", *messages), limits=SMALL)
    assert result.last_seq == 3
    journal.flush(db, data_dir, result.file_id)
    doc = document.parse(file_bytes(db, data_dir, result.file_id).decode())
    assert [m.content for m in doc.messages] == ["é" * 8, "x" * 12, "y" * 12]


# ---------------------------------------------------------------------------------------------
# uploads


def test_upload_is_one_message_holding_the_document(db: database.Database, data_dir: Path) -> None:
    content = (
        "Title\n\n# 2026-08-03T11:18:06Z user\n## not a heading\n\\# already escaped user\r\n\n"
    )
    result = journal.ingest_upload(
        db,
        {
            "agent_id": "hermes",
            "filename": "notes.md",
            "content": content,
            "metadata": {"author": "ann"},
        },
    )
    fid = result.file_id
    assert result.source_refs == (f"{fid}:1",)
    assert (result.first_seq, result.last_seq, result.kick) == (1, 1, True)
    journal.flush(db, data_dir, fid)

    row = helpers.file_row(db, fid)
    assert row.path == f"raw/uploads/{fid}.md"
    assert (row.source_type, row.session_key, row.flushed_seq, row.next_seq) == (
        "upload",
        fid,
        1,
        2,
    )
    assert row.metadata == {"author": "ann", "filename": "notes.md"}
    started = document.format_ts(row.started_at)
    expected = (
        "---\n"
        "format_version: 1\n"
        f'file_id: "{fid}"\n'
        f'session_key: "{fid}"\n'
        'agent_id: "hermes"\n'
        'source_type: "upload"\n'
        f'started_at: "{started}"\n'
        "metadata:\n"
        '  "author": "ann"\n'
        '  "filename": "notes.md"\n'
        "---\n"
        "\n"
        "Title\n\n\\# 2026-08-03T11:18:06Z user\n## not a heading\n\\\\# already escaped user\n"
    ).encode()
    data = (data_dir / row.path).read_bytes()
    assert data == expected
    assert row.flushed_bytes == len(data)

    ref = reader.resolve(db, data_dir, f"{fid}:1")
    assert ref.message.content == document.canonical(content)
    assert (ref.message.role, ref.message.ts, ref.message.seq) == ("user", started, 1)
    assert ref.before == () and ref.after == ()
    assert integrity.fsck(db, data_dir) == []


def test_upload_idempotency_and_refusals(db: database.Database, data_dir: Path) -> None:
    body = {"agent_id": "hermes", "filename": "a.txt", "content": "text", "idempotency_key": "u1"}
    first = journal.ingest_upload(db, body)
    again = journal.ingest_upload(db, dict(body))
    assert again.replayed is True
    assert (again.file_id, again.source_refs) == (first.file_id, first.source_refs)
    assert table_counts(db) == {"raw_files": 1, "append_journal": 1, "append_keys": 1}
    with pytest.raises(errors.Conflict):
        journal.ingest_upload(db, {**body, "content": "other text"})

    small = Limits(max_append_bytes=8)
    for bad in (
        {**body, "content": b"bytes"},
        {**body, "content": "a\x00b"},
        {**body, "content": "\udc80"},
        {**body, "content": "123456789"},  # 9 bytes > 8
        {**body, "filename": "a\nb"},
        {**body, "filename": ""},
        {**body, "agent_id": "a b"},
        {**body, "unknown": True},
        {**body, "messages": []},
    ):
        with pytest.raises(errors.InvalidInput):
            journal.ingest_upload(db, {**bad, "idempotency_key": "u2"}, limits=small)
    assert table_counts(db) == {"raw_files": 1, "append_journal": 1, "append_keys": 1}


# ---------------------------------------------------------------------------------------------
# flush against a file that changed behind the index's back


def _two_flushed_one_pending(db: database.Database, data_dir: Path) -> tuple[str, bytes, bytes]:
    """A file with 2 flushed messages and a third acknowledged one: (file_id, bytes, block)."""
    first = journal.ingest(
        db,
        append_body(
            "s",
            {"role": "user", "content": "one", "ts": TS1},
            {"role": "assistant", "content": "two", "ts": TS2},
        ),
    )
    journal.flush(db, data_dir, first.file_id)
    journal.ingest(db, append_body("s", {"role": "user", "content": "three", "ts": TS3}))
    block = f"## {TS3} user\n\nthree\n\n".encode()
    return first.file_id, file_bytes(db, data_dir, first.file_id), block


def test_flush_truncates_a_torn_tail(db: database.Database, data_dir: Path) -> None:
    fid, committed, block = _two_flushed_one_pending(db, data_dir)
    path = data_dir / helpers.file_row(db, fid).path
    with path.open("ab") as handle:  # what a flush killed mid-write leaves behind
        handle.write(block[:9])

    assert journal.flush(db, data_dir, fid).flushed_seq == 3
    assert path.read_bytes() == committed + block
    assert anomaly_kinds(db, fid) == ["torn_tail_truncated"]
    row = helpers.file_row(db, fid)
    assert (row.flushed_seq, row.flushed_bytes, row.status) == (3, len(committed + block), "new")
    assert journal_rows(db, fid) == []
    assert integrity.fsck(db, data_dir) == []


def test_flush_truncates_a_torn_first_write(db: database.Database, data_dir: Path) -> None:
    """A flush killed between creating the file and committing leaves a file the index says is
    empty; the next flush starts it over."""
    result = journal.ingest(db, append_body("s"))
    row = helpers.file_row(db, result.file_id)
    path = data_dir / row.path
    path.parent.mkdir(parents=True)
    path.write_bytes(b'---\nformat_version: 1\nfile_id: "')

    journal.flush(db, data_dir, result.file_id)
    data = path.read_bytes()
    assert data.startswith(b"---\nformat_version: 1\n")
    assert data.endswith(f"---\n\n# {TS1} user\n\nhello\n\n".encode())
    assert data.count(b"format_version") == 1
    assert anomaly_kinds(db, result.file_id) == ["torn_tail_truncated"]
    assert integrity.fsck(db, data_dir) == []


def test_flush_refuses_a_file_shorter_than_committed(db: database.Database, data_dir: Path) -> None:
    fid, committed, _ = _two_flushed_one_pending(db, data_dir)
    path = data_dir / helpers.file_row(db, fid).path
    path.write_bytes(committed[:-5])

    with pytest.raises(errors.FileDamaged, match="bytes but"):
        journal.flush(db, data_dir, fid)

    assert path.read_bytes() == committed[:-5]  # nothing written past the hole
    row = helpers.file_row(db, fid)
    assert row.status == "error"
    assert (row.flushed_seq, row.flushed_bytes) == (2, len(committed))
    assert anomaly_kinds(db, fid) == ["file_shrunk"]
    assert [(j.first_seq, j.last_seq) for j in journal_rows(db, fid)] == [(3, 3)]
    # still refused on a retry: the acknowledged message waits in the journal, and the
    # sweeper's re-kicks do not pile up anomalies
    for _ in range(3):
        with pytest.raises(errors.FileDamaged):
            journal.flush(db, data_dir, fid)
    assert path.read_bytes() == committed[:-5]
    assert anomaly_kinds(db, fid) == ["file_shrunk"]


def test_flush_refuses_a_missing_file(db: database.Database, data_dir: Path) -> None:
    fid, _, _ = _two_flushed_one_pending(db, data_dir)
    path = data_dir / helpers.file_row(db, fid).path
    path.unlink()
    with pytest.raises(errors.FileDamaged):
        journal.flush(db, data_dir, fid)
    assert not path.exists()  # not recreated with only the later blocks
    assert helpers.file_row(db, fid).status == "error"
    assert anomaly_kinds(db, fid) == ["file_missing"]


# ---------------------------------------------------------------------------------------------
# reads


def test_resolve_returns_the_message_with_its_neighbours(
    db: database.Database, data_dir: Path
) -> None:
    messages = [{"role": "user", "content": f"m{i}", "ts": TS1} for i in range(1, 6)]
    result = journal.ingest(db, append_body("s", *messages))
    fid = result.file_id
    journal.flush(db, data_dir, fid)
    pending = journal.ingest(db, append_body("s", {"role": "user", "content": "m6"}))

    ref = reader.resolve(db, data_dir, f"{fid}:3")
    assert (ref.message.seq, ref.message.content) == (3, "m3")
    assert [m.content for m in ref.before] == ["m2"]
    assert [m.content for m in ref.after] == ["m4"]
    assert ref.file.file_id == fid

    ref = reader.resolve(db, data_dir, f"{fid}:1", context=2)
    assert ref.before == () and [m.seq for m in ref.after] == [2, 3]
    ref = reader.resolve(db, data_dir, f"{fid}:5", context=3)
    assert [m.seq for m in ref.before] == [2, 3, 4] and ref.after == ()
    ref = reader.resolve(db, data_dir, f"{fid}:4", context=0)
    assert ref.before == () and ref.after == ()

    with pytest.raises(errors.NotFound, match="not flushed"):
        reader.resolve(db, data_dir, pending.source_refs[0])
    with pytest.raises(errors.NotFound):
        reader.resolve(db, data_dir, f"{fid}:7")
    with pytest.raises(errors.NotFound):
        reader.resolve(db, data_dir, "00000000-0000-4000-8000-000000000000:1")
    for bad in (f"{fid}:0", f"{fid}:x", fid, "../../etc/passwd:1", f"{fid}:-1"):
        with pytest.raises(errors.InvalidInput):
            reader.resolve(db, data_dir, bad)

    assert [m.content for m in reader.messages(db, data_dir, fid, after_seq=1, limit=2)] == [
        "m2",
        "m3",
    ]

    journal.flush(db, data_dir, fid)
    ref = reader.resolve(db, data_dir, pending.source_refs[0])
    assert ref.message.content == "m6" and [m.content for m in ref.before] == ["m5"]


def test_reads_stop_at_flushed_bytes(db: database.Database, data_dir: Path) -> None:
    fid, committed, _ = _two_flushed_one_pending(db, data_dir)
    path = data_dir / helpers.file_row(db, fid).path
    with path.open("ab") as handle:  # a complete-looking block nobody acknowledged
        handle.write(f"## {TS3} user\n\nghost\n\n".encode())

    row = helpers.file_row(db, fid)
    assert reader.read_bytes(data_dir, row) == committed
    assert [m.content for m in reader.messages(db, data_dir, fid)] == ["one", "two"]
    assert reader.resolve(db, data_dir, f"{fid}:2").after == ()
    with pytest.raises(errors.NotFound, match="not flushed"):
        reader.resolve(db, data_dir, f"{fid}:3")


def test_concurrent_upload_retries_with_one_key_get_one_answer(
    db: database.Database, data_dir: Path
) -> None:
    import concurrent.futures

    body = {"agent_id": "hermes", "filename": "a.txt", "content": "doc", "idempotency_key": "u1"}
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda _: journal.ingest_upload(db, dict(body)), range(8)))
    assert len({a.file_id for a in answers}) == 1
    with db.engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(tables.raw_files)).scalar() == 1
