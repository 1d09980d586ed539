"""Hostile and awkward inputs to the importers: a record nested 100,000 deep is reported and the
rest imported (every importer, a Hermes state.db's content and tool_calls too); two files whose
records share an id stay two sessions; metadata that is not valid is dropped and the turn kept;
a Latin-1 file is reported, never imported as replacement characters; a UTF-8 BOM is fine;
symlinks out of the tree are not followed; a session whose every turn is refused is not
counted as a file; records with nothing in them are counted, not errors."""

from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from test_importers import FakeServer, run, write_jsonl

from pipeline import errors
from pipeline.importers import convention, reader, runner

DEEP = "[" * 100_000 + "]" * 100_000
CHAT = {
    "id": "c",
    "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}],
}


def claude_line(uuid: str, parent: str | None, role: str, text: str) -> dict[str, Any]:
    return {
        "type": role,
        "uuid": uuid,
        "parentUuid": parent,
        "sessionId": "s",
        "timestamp": "2026-08-03T11:18:06Z",
        "message": {"id": uuid, "role": role, "content": [{"type": "text", "text": text}]},
    }


CODEX = [
    {"timestamp": "2026-08-03T11:18:06Z", "type": "session_meta", "payload": {"id": "x"}},
    {
        "timestamp": "2026-08-03T11:18:07Z",
        "type": "event_msg",
        "payload": {"type": "task_started", "turn_id": "t"},
    },
    {
        "timestamp": "2026-08-03T11:18:07Z",
        "type": "event_msg",
        "payload": {"type": "user_message", "message": "hi"},
    },
    {
        "timestamp": "2026-08-03T11:18:08Z",
        "type": "response_item",
        "payload": {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "yo"}],
        },
    },
    {
        "timestamp": "2026-08-03T11:18:09Z",
        "type": "event_msg",
        "payload": {"type": "task_complete", "turn_id": "t"},
    },
]


@pytest.mark.parametrize(
    ("source", "records"),
    [
        ("openai", [CHAT, DEEP, {**CHAT, "id": "d"}]),
        ("sharegpt", [{"id": "c", "conversations": [{"from": "human", "value": "hi"}]}, DEEP]),
        (
            "claude-code",
            [
                claude_line("u1", None, "user", "hi"),
                DEEP,
                claude_line("a1", "u1", "assistant", "yo"),
            ],
        ),
        ("codex", [*CODEX[:2], DEEP, *CODEX[2:]]),
    ],
)
def test_a_record_nested_100000_deep_is_reported_and_the_rest_imported(
    tmp_path: Path, source: str, records: list[Any]
) -> None:
    path = write_jsonl(tmp_path / "in.jsonl", records)
    server = FakeServer()
    report = run(source, path, server)
    assert [(p.line, p.detail) for p in report.errors] == [
        (records.index(DEEP) + 1, "nested more than 100 levels deep")
    ]
    assert report.messages >= 1


def test_a_json_document_nested_100000_deep_is_reported(tmp_path: Path) -> None:
    (tmp_path / "deep.json").write_text(DEEP)
    (tmp_path / "good.json").write_text(json.dumps([CHAT]))
    server = FakeServer()
    report = run("openai", tmp_path, server)
    assert [(Path(p.file).name, p.detail) for p in report.errors] == [
        ("deep.json", "nested more than 100 levels deep")
    ]
    assert report.messages == 2


def test_a_state_db_whose_content_or_calls_nest_100000_deep(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    conn = sqlite3.connect(path)
    conn.executescript(
        "CREATE TABLE sessions (id TEXT PRIMARY KEY, source TEXT, started_at REAL, ended_at REAL);"
        "CREATE TABLE messages (id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT, role TEXT,"
        " content TEXT, tool_call_id TEXT, tool_calls TEXT, tool_name TEXT, timestamp REAL);"
        "INSERT INTO sessions VALUES ('s', 'cli', 1, 2);"
    )
    rows = [
        ("user", "hi", None),
        ("assistant", "\x00json:" + DEEP, None),
        ("assistant", None, DEEP),
        ("assistant", "yo", None),
    ]
    conn.executemany(
        "INSERT INTO messages (session_id, role, content, tool_calls, timestamp)"
        " VALUES ('s', ?, ?, ?, 1)",
        rows,
    )
    conn.commit()
    conn.close()
    server = FakeServer()
    report = run("hermes", path, server)
    assert [p.detail for p in report.errors] == [
        "session 's' message id 2: bad JSON content: nested more than 100 levels deep",
        "session 's' message id 3: bad tool_calls JSON: nested more than 100 levels deep",
    ]
    assert server.contents("s") == [("user", "hi"), ("assistant", "yo")]


def test_two_files_whose_records_share_an_id_stay_two_sessions(tmp_path: Path) -> None:
    for name, text in (("train.json", "from train"), ("test.json", "from test")):
        record = {"id": 1, "conversations": [{"from": "human", "value": text}]}
        (tmp_path / name).write_text(json.dumps([record]))
    server = FakeServer()
    report = run("sharegpt", tmp_path, server)
    assert report.files == 2
    assert server.contents("train.json#1") == [("user", "from train")]
    assert server.contents("test.json#1") == [("user", "from test")]
    assert server.metadata["test.json#1"]["file"] == "test.json"


def test_metadata_that_is_not_valid_is_dropped_and_the_turn_kept(tmp_path: Path) -> None:
    nested: Any = "x"
    for _ in range(30):
        nested = {"n": nested}
    path = tmp_path / "chats.jsonl"
    path.write_text(
        json.dumps({**CHAT, "model": math.nan})
        + "\n"
        + json.dumps({**CHAT, "id": "e", "model": nested})
        + "\n"
    )
    server = FakeServer()
    report = run("openai", path, server)
    assert report.errors == []
    for key in ("chats.jsonl#c", "chats.jsonl#e"):
        assert server.contents(key) == [("user", "hi"), ("assistant", "yo")]
        assert "model" not in server.metadata[key]


def test_a_turn_the_server_refuses_for_its_metadata_is_sent_again_without_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "chat.json"
    path.write_text(json.dumps(CHAT))
    server = FakeServer()

    def picky(body: dict[str, Any]) -> object:
        if "metadata" in body:
            raise errors.InvalidInput("metadata is nested more than 16 levels deep")
        return server(body)

    report = runner.run(reader("openai"), path, agent_id="me", ingest=picky)
    assert (report.messages, report.errors) == (2, [])


def test_a_latin1_file_is_reported_not_imported_garbled(tmp_path: Path) -> None:
    path = tmp_path / "chats.jsonl"
    latin = json.dumps(
        {"id": "l", "messages": [{"role": "user", "content": "café naïve"}]}, ensure_ascii=False
    )
    path.write_bytes(json.dumps(CHAT).encode() + b"\n" + latin.encode("latin-1") + b"\n")
    server = FakeServer()
    report = run("openai", path, server)
    [problem] = report.errors
    assert problem.line == 2 and problem.detail.startswith("not UTF-8: byte 0xe9")
    assert "Latin-1" in problem.detail and "iconv" in problem.detail
    assert "\ufffd" not in json.dumps(server.files, ensure_ascii=False)
    whole = tmp_path / "whole.json"
    whole.write_bytes(("[" + latin + "]").encode("latin-1"))
    assert run("openai", whole, FakeServer()).errors[0].detail.startswith("not UTF-8")


@pytest.mark.parametrize("name", ["chats.jsonl", "chats.json"])
def test_a_utf8_byte_order_mark_is_accepted(tmp_path: Path, name: str) -> None:
    text = json.dumps(CHAT) + "\n" if name.endswith("l") else json.dumps([CHAT])
    path = tmp_path / name
    path.write_bytes(b"\xef\xbb\xbf" + text.encode())
    server = FakeServer()
    report = run("openai", path, server)
    assert (report.errors, report.messages) == ([], 2)


def test_symlinks_out_of_the_tree_are_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.jsonl").write_text(json.dumps({**CHAT, "id": "secret"}) + "\n")
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "mine.jsonl").write_text(json.dumps(CHAT) + "\n")
    (tree / "link.jsonl").symlink_to(outside / "secret.jsonl")
    (tree / "again.jsonl").symlink_to(tree / "sub" / "mine.jsonl")  # inside: read once
    (tree / "dir").symlink_to(outside, target_is_directory=True)
    assert [p.relative_to(tree).as_posix() for p in reader("openai").files(tree)] == ["again.jsonl"]
    server = FakeServer()
    run("openai", tree, server)
    assert set(server.files) == {"again.jsonl#c"}


def test_a_session_whose_every_turn_is_refused_is_not_a_file(tmp_path: Path) -> None:
    path = tmp_path / "chats.jsonl"
    path.write_text(json.dumps(CHAT) + "\n" + json.dumps({**CHAT, "id": "bad"}) + "\n")
    server = FakeServer()

    def refuses_bad(body: dict[str, Any]) -> object:
        if body["session_key"].endswith("#bad"):
            raise errors.InvalidInput("no")
        return server(body)

    report = runner.run(reader("openai"), path, agent_id="me", ingest=refuses_bad)
    assert (report.files, report.messages, len(report.errors)) == (1, 2, 1)


def test_empty_records_are_counted_not_errors(tmp_path: Path) -> None:
    empty = [{"id": i, "messages": []} for i in range(15)]
    blank = {"id": "blank", "messages": [{"role": "user", "content": "  "}]}
    path = write_jsonl(tmp_path / "chats.jsonl", [CHAT, *empty, blank])
    report = run("openai", path, FakeServer())
    assert (report.errors, report.empty, report.messages, report.records) == ([], 16, 2, 17)
    assert report.to_json()["empty"] == 16


def test_a_tool_call_message_carries_its_tool_name() -> None:
    """/messages and /v1/refs show a call's tool name (document.Message.to_json)."""
    from pipeline import document

    body = convention.call_body("read_file", '{"p": 1}', "c1")
    message = document.Message("assistant", body, "2026-08-03T11:18:06Z", seq=3)
    assert message.to_json("f")["tool_name"] == "read_file"
    escaped = convention.text_message("assistant", "**tool call**: joke", None)["content"]
    assert (
        document.Message("assistant", escaped, "2026-08-03T11:18:06Z").to_json("f")["tool_name"]
        is None
    )
    assert document.Message("user", body, "2026-08-03T11:18:06Z").to_json("f")["tool_name"] is None


def test_claude_code_records_are_taken_in_file_order(tmp_path: Path) -> None:
    """``…06.5Z`` sorts after ``…06.51Z`` as text; the file's order is the order said."""
    first = claude_line("u1", None, "user", "hi")
    answer = {**claude_line("a1", "u1", "assistant", "yo"), "timestamp": "2026-08-03T11:18:06.500Z"}
    more = {**claude_line("u2", "a1", "user", "more"), "timestamp": "2026-08-03T11:18:06.510Z"}
    last = {**claude_line("a2", "u2", "assistant", "done"), "timestamp": "2026-08-03T11:18:06.512Z"}
    path = write_jsonl(tmp_path / "s.jsonl", [first, answer, more, last])
    server = FakeServer()
    run("claude-code", path, server)
    assert server.contents("s") == [
        ("user", "hi"),
        ("assistant", "yo"),
        ("user", "more"),
        ("assistant", "done"),
    ]


def test_a_dataset_list_with_one_bad_record_imports_the_rest(tmp_path: Path) -> None:
    """A JSON list of 1,000 conversations, one nested 101 deep: 999 imported, the bad one
    reported by its line; so for one that is not JSON and one that is not UTF-8."""
    records = [
        json.dumps({"id": n, "conversations": [{"from": "human", "value": f"question {n}"}]})
        for n in range(1000)
    ]
    records[500] = '{"id": 500, "conversations": ' + "[" * 101 + "]" * 101 + "}"
    records[700] = '{"id": 700, "conversations": [{"from": "human", "value": nope}]}'
    text = "[\n" + ",\n".join(records) + "\n]\n"
    data = text.encode().replace(b"question 900", b"question 9\xe90")
    path = tmp_path / "dataset.json"
    path.write_bytes(data)
    server = FakeServer()
    report = run("sharegpt", path, server)
    assert [(p.line, p.detail.split(":")[0]) for p in report.errors] == [
        (502, "nested more than 100 levels deep"),
        (702, "not JSON"),
        (902, "not UTF-8"),
    ]
    assert (report.unreadable, report.messages, len(server.files)) == (3, 997, 997)
    assert server.contents("dataset.json#999") == [("user", "question 999")]
    assert "dataset.json#500" not in server.files


def test_a_json_list_that_breaks_off_keeps_what_came_before(tmp_path: Path) -> None:
    path = tmp_path / "cut.json"
    other = json.dumps({**CHAT, "id": "d"})
    path.write_text("[" + json.dumps(CHAT) + ", " + other[:-1] + ", [1")
    report = run("openai", path, FakeServer())
    assert report.messages == 2 and report.unreadable == 1
    assert report.errors[0].detail.startswith("not JSON")


def where(item: Any) -> int | None:
    """A line's number, read or not."""
    from pipeline.importers import source

    return item.number if isinstance(item, source.Line) else item.line


def test_lines_are_read_from_an_offset_on_to_a_deadline(tmp_path: Path) -> None:
    from pipeline.importers import source

    path = tmp_path / "t.jsonl"
    path.write_bytes(b'{"a": 1}\n\n{"a": 2}\nnot json\n{"a": 3}')
    found = list(source.lines(path))
    assert [(where(x), getattr(x, "value", None)) for x in found] == [
        (1, {"a": 1}),
        (3, {"a": 2}),
        (4, None),
        (5, {"a": 3}),  # a last line without its newline that parses: whole
    ]
    assert isinstance(found[2], source.Problem) and found[2].end == 28
    live = list(source.lines(path, live=True))
    assert [where(x) for x in live] == [1, 3, 4]
    first = found[0]
    assert isinstance(first, source.Line) and first.end == 9
    rest = list(source.lines(path, offset=first.end, number=first.number))
    assert [where(x) for x in rest] == [3, 4, 5]
    assert list(source.lines(path, deadline=0.0)) == []  # a deadline passed: nothing read
    path.write_bytes(b'{"a": 1}\n{"a": ')
    [cut] = [x for x in source.lines(path) if isinstance(x, source.Problem)]
    assert cut.detail.startswith("unterminated last line (still being written?)")


def test_a_device_is_not_read_and_a_line_past_the_bound_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pipeline.importers import source

    [zero] = list(source.lines(Path("/dev/zero")))
    assert isinstance(zero, source.Problem) and zero.detail == "not a regular file: not read"
    monkeypatch.setattr(source, "MAX_LINE", 10)
    monkeypatch.setattr(source, "CHUNK", 4)
    path = tmp_path / "t.jsonl"
    path.write_bytes(b'{"a": 1}\n' + b'{"b": "' + b"x" * 50 + b'"}\n{"c": 3}\n')
    found = list(source.lines(path))
    assert [type(x).__name__ for x in found] == ["Line", "Problem", "Line"]
    assert isinstance(found[1], source.Problem)
    assert found[1].line == 2 and "longer than 10 bytes" in found[1].detail
    assert isinstance(found[2], source.Line) and found[2].value == {"c": 3}
