"""``sgme import`` on SQLite and PostgreSQL: through the service's append (the API's validation
and admission), each file written as it goes, a malformed record reported with its file and
line and skipped, nothing written the second time, a changed session title counted as already
imported, an interrupted import completed by the next run, ``--dry-run`` and ``--json``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import Run, Sgme, assert_one_line_error

from pipeline import document, errors, service
from pipeline.importers import convention

CHATS = [
    {
        "id": "chat-1",
        "model": "gpt-x",
        "messages": [
            {"role": "user", "content": "I prefer green tea.", "timestamp": 1785755886},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "c1", "function": {"name": "note", "arguments": '{"a": 1}'}}],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "noted"},
            {"role": "assistant", "content": "Noted."},
        ],
    },
    {
        "id": "chat-2",
        "messages": [
            {"role": "user", "content": "# not a heading", "timestamp": 1785755900},
            {"role": "assistant", "content": "Right."},
        ],
    },
]


def write_chats(path: Path, chats: list[dict[str, Any]], *, malformed: bool = True) -> Path:
    """JSON Lines: the first chat, a malformed line (line 2) when asked, the rest."""
    lines = [json.dumps(chats[0])]
    if malformed:
        lines.append('{"id": "broken", "messages": [')
    lines += [json.dumps(chat) for chat in chats[1:]]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def summary(run: Run) -> dict[str, Any]:
    """The ``--json`` summary: the last line of stdout, one line."""
    last = run.out.decode("utf-8").rstrip("\n").splitlines()[-1]
    found: dict[str, Any] = json.loads(last)
    return found


def stored(sgme: Sgme, data_dir: Path) -> dict[str, tuple[dict[str, Any], bytes]]:
    """Each imported file by session_key: its index row and its bytes on disk."""
    listed = sgme("ls", "--agent-id", "openai", "--json")
    assert listed.code == 0, listed.err
    return {
        row["session_key"]: (row, (data_dir / row["path"]).read_bytes()) for row in listed.json()
    }


def test_import_writes_each_file_once_and_reports_the_malformed_line(
    sgme: Sgme, data_dir: Path, tmp_path: Path
) -> None:
    path = write_chats(tmp_path / "chats.jsonl", CHATS)
    first = sgme("import", "openai", str(path), "--json")
    assert first.code == 1, first.err  # done, with a record reported
    report = summary(first)
    assert (report["files"], report["messages"], report["skipped"], report["replayed"]) == (
        2,
        6,
        0,
        0,
    )
    [problem] = report["errors"]
    assert (problem["file"], problem["line"]) == (str(path), 2)
    assert problem["detail"].startswith("not JSON")

    files = stored(sgme, data_dir)
    assert set(files) == {"chats.jsonl#chat-1", "chats.jsonl#chat-2"}
    row, data = files["chats.jsonl#chat-1"]
    # written by the import itself (no worker runs here): flushed, nothing pending
    assert (row["flushed_seq"], row["pending_messages"], row["agent_id"]) == (4, 0, "openai")
    assert row["metadata"] == {
        "importer": "openai",
        "file": "chats.jsonl",
        "record": 0,
        "model": "gpt-x",
    }
    doc = document.parse(data.decode("utf-8"), file_id=row["file_id"])
    assert [(m.role, m.content, m.tool_name) for m in doc.messages] == [
        ("user", "I prefer green tea.", None),
        ("assistant", '**tool call**: note\n**call id**: c1\n\n```json\n{"a": 1}\n```', None),
        ("tool", "**call id**: c1\n\nnoted", "note"),
        ("assistant", "Noted.", None),
    ]
    assert doc.messages[0].ts == "2026-08-03T11:18:06Z"
    second_doc = document.parse(
        files["chats.jsonl#chat-2"][1].decode("utf-8"),
        file_id=files["chats.jsonl#chat-2"][0]["file_id"],
    )
    assert second_doc.messages[0].content == "# not a heading"

    again = sgme("import", "openai", str(path), "--json")
    assert again.code == 1
    assert {k: v for k, v in summary(again).items() if k != "errors"} == {
        "files": 2,
        "messages": 0,
        "skipped": 0,
        "unreadable": 1,
        "erased": 0,
        "empty": 0,
        "replayed": 6,
    }
    assert stored(sgme, data_dir) == files  # not a byte more


def test_the_plain_summary_and_the_problems_on_stderr(sgme: Sgme, tmp_path: Path) -> None:
    path = write_chats(tmp_path / "chats.jsonl", CHATS)
    run = sgme("import", "openai", str(path), "--agent-id", "importer")
    assert run.code == 1
    assert run.out.decode("utf-8") == (
        "imported 6 messages into 2 files (0 already imported, 0 erased, 0 skipped on purpose, "
        "0 empty records, 1 unreadable record, 0 refused)\n"
    )
    assert f"sgme import: {path}:2: not JSON" in run.err
    (tmp_path / "other").mkdir()
    clean = write_chats(tmp_path / "other" / "chats.jsonl", CHATS, malformed=False)
    assert sgme("import", "openai", str(clean), "--agent-id", "importer").out.decode() == (
        "imported 0 messages into 2 files (6 already imported, 0 erased, 0 skipped on purpose, "
        "0 empty records, 0 unreadable records, 0 refused)\n"
    )
    listed = sgme("ls", "--agent-id", "importer", "--json").json()
    # keyed by their file's name as well as their id: clean.jsonl's are other sessions
    assert sorted(row["session_key"] for row in listed) == [
        "chats.jsonl#chat-1",
        "chats.jsonl#chat-2",
    ]


def test_a_session_whose_metadata_changed_is_already_imported(
    sgme: Sgme, data_dir: Path, tmp_path: Path
) -> None:
    path = write_chats(tmp_path / "chats.jsonl", CHATS, malformed=False)
    assert sgme("import", "openai", str(path)).code == 0
    before = stored(sgme, data_dir)
    renamed = [dict(CHATS[0], model="gpt-y"), *CHATS[1:]]
    # The first append of chat-1 now carries other metadata: the server answers its key with a
    # conflict, and that is "already imported", not an error.
    run = sgme("import", "openai", str(write_chats(path, renamed, malformed=False)), "--json")
    assert run.code == 0, run.err
    assert summary(run) == {
        "files": 2,
        "messages": 0,
        "skipped": 0,
        "unreadable": 0,
        "erased": 0,
        "empty": 0,
        "errors": [],
        "replayed": 6,
    }
    assert stored(sgme, data_dir) == before
    assert before["chats.jsonl#chat-1"][0]["metadata"]["model"] == "gpt-x"  # the first import's


def test_a_dry_run_reads_and_reports_but_sends_nothing(sgme: Sgme, tmp_path: Path) -> None:
    path = write_chats(tmp_path / "chats.jsonl", CHATS)
    run = sgme("import", "openai", str(path), "--dry-run", "--json")
    assert run.code == 1
    report = summary(run)
    assert (report["files"], report["messages"], len(report["errors"])) == (2, 6, 1)
    assert sgme("ls", "--json").json() == []
    # no index is needed either
    fresh = tmp_path / "fresh"
    dry = sgme("import", "openai", str(path), "--dry-run", "--data-dir", str(fresh), common=False)
    assert dry.out.decode().startswith("would import 6 messages into 2 files")
    assert not (fresh / "index.sqlite3").exists()


def test_an_import_stopped_between_appends_and_flushes_is_completed_by_the_next_run(
    sgme: Sgme, data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_chats(tmp_path / "chats.jsonl", CHATS, malformed=False)

    def stuck(self: service.Service, file_id: str) -> None:
        raise errors.LockTimeout(f"lock of {file_id} not acquired within 30 s")

    with monkeypatch.context() as patch:
        patch.setattr(service.Service, "flush", stuck)
        stopped = sgme("import", "openai", str(path))
    assert_one_line_error(stopped, "not acquired", "run the same import again to continue")
    [row] = sgme("ls", "--json").json()  # acknowledged, never written
    assert (row["session_key"], row["pending_messages"], row["flushed_seq"]) == (
        "chats.jsonl#chat-1",
        4,
        0,
    )

    again = sgme("import", "openai", str(path), "--json")
    assert again.code == 0, again.err
    assert summary(again)["messages"] == 2  # chat-2; chat-1's turns replay...
    files = stored(sgme, data_dir)
    row, data = files["chats.jsonl#chat-1"]
    assert (row["pending_messages"], row["flushed_seq"]) == (0, 4)  # ...and are written now
    assert data.count(b"I prefer green tea.") == 1


def test_the_import_is_admitted_like_an_api_append(
    sgme: Sgme, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_chats(tmp_path / "chats.jsonl", CHATS, malformed=False)
    monkeypatch.setenv("SGME_BACKLOG_MIN_FREE_BYTES", str(2**62))  # no disk is that large
    run = sgme("import", "openai", str(path))
    assert_one_line_error(run, "backlog_min_free_bytes", "run the same import again")
    monkeypatch.delenv("SGME_BACKLOG_MIN_FREE_BYTES")
    assert sgme("ls", "--json").json() == []


def test_bad_arguments_are_one_line_errors(sgme: Sgme, tmp_path: Path) -> None:
    assert_one_line_error(
        sgme("import", "codex", str(tmp_path / "missing")), "no such file or directory"
    )
    path = write_chats(tmp_path / "chats.jsonl", CHATS)
    assert_one_line_error(
        sgme("import", "openai", str(path), "--agent-id", "a b"), "agent_id must match"
    )


def test_progress_in_records_and_empty_records_are_not_errors(
    sgme: Sgme, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pipeline.cli import imports

    monkeypatch.setattr(imports, "PLAIN_EVERY", 0.0)  # a line at every record (not a terminal)
    empty: list[dict[str, Any]] = [{"id": f"e{i}", "messages": []} for i in range(15)]
    chats = [*CHATS, *empty]
    run = sgme(
        "import", "openai", str(write_chats(tmp_path / "chats.jsonl", chats, malformed=False))
    )
    assert run.code == 0, run.err
    assert "15 empty records, 0 unreadable records, 0 refused" in run.out.decode()
    lines = [line for line in run.err.splitlines() if line.startswith("sgme import openai: ")]
    assert lines[0].startswith("sgme import openai: 1 records, 0/1 files")
    assert lines[-1].startswith("sgme import openai: 17 records, 1/1 files, 6 messages new")


def test_control_characters_in_file_names_are_escaped(sgme: Sgme, tmp_path: Path) -> None:
    path = tmp_path / "evil\x1b]0;owned\x07\x1b[2J.jsonl"
    write_chats(path, CHATS)
    run = sgme("import", "openai", str(path))
    assert run.code == 1
    assert "\x1b" not in run.err and "\x07" not in run.err
    assert "evil\\x1b]0;owned\\x07\\x1b[2J.jsonl:2: not JSON" in run.err


def test_a_store_an_earlier_version_filled_and_an_erased_session(
    sgme: Sgme, tmp_path: Path
) -> None:
    """An earlier version stored a Claude Code turn whole under its turn key; importing the
    transcript now writes only what is new. Erasing the session, then importing again, writes
    nothing: its keys are the erasure's tombstone; --release lets the next import store it."""
    sid = "5b6c69aa-0000-4000-8000-000000000001"

    def record(uuid: str, parent: str | None, role: str, text: str, second: int) -> str:
        message: dict[str, Any] = {"role": role, "content": text}
        if role == "assistant":
            message = {"id": f"m-{uuid}", "role": role, "content": [{"type": "text", "text": text}]}
        return json.dumps(
            {
                "type": role,
                "uuid": uuid,
                "parentUuid": parent,
                "sessionId": sid,
                "timestamp": f"2026-08-03T11:18:{second:02d}Z",
                "message": message,
            }
        )

    path = tmp_path / f"{sid}.jsonl"
    path.write_text(
        "\n".join(
            [
                record("u1", None, "user", "Read notes.md", 1),
                record("a1", "u1", "assistant", "It says hi.", 2),
                record("u2", "a1", "user", "And now?", 3),
            ]
        )
        + "\n"
    )
    turn = [
        {"role": "user", "content": "Read notes.md", "ts": "2026-08-03T11:18:01Z"},
        {"role": "assistant", "content": "It says hi.", "ts": "2026-08-03T11:18:02Z"},
    ]
    earlier = {
        "agent_id": "claude-code",
        "session_key": sid,
        "idempotency_key": convention.key("claude-code", sid, "u1", turn),
        "messages": turn,
    }
    assert sgme("append", stdin=json.dumps(earlier)).code == 0
    first = summary(sgme("import", "claude-code", str(path), "--json"))
    assert (first["messages"], first["replayed"], first["files"]) == (1, 2, 1)
    [row] = sgme("ls", "--agent-id", "claude-code", "--json").json()
    assert row["flushed_seq"] == 3

    erased = sgme("erase", "--file-id", row["file_id"], "--yes", "--json").json()
    assert erased["keys"] == 2  # the earlier version's turn key and the new record's
    again = summary(sgme("import", "claude-code", str(path), "--json"))
    assert (again["messages"], again["erased"], again["files"]) == (0, 3, 0)
    assert sgme("ls", "--agent-id", "claude-code", "--json").json() == []
    plain = sgme("import", "claude-code", str(path)).out.decode()
    assert "imported 0 messages into 0 files (0 already imported, 3 erased," in plain

    released = sgme("erase", "--release", "--file-id", row["file_id"], "--yes", "--json")
    assert released.code == 0, released.err
    assert (released.json()["action"], released.json()["keys"]) == ("release", 2)
    back = summary(sgme("import", "claude-code", str(path), "--json"))
    assert (back["messages"], back["erased"], back["files"]) == (3, 0, 1)
    [new] = sgme("ls", "--agent-id", "claude-code", "--json").json()
    assert new["file_id"] != row["file_id"] and new["flushed_seq"] == 3
    trail = sgme("audit", "--file-id", row["file_id"], "--json").json()
    assert [(r["action"], r["keys"]) for r in trail] == [("erase", 2), ("release", 2)]
    assert sgme("erase", "--release", "--file-id", new["file_id"], "--yes").code == 2
