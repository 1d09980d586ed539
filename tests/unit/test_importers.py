"""Importers on fixtures written here from each format's documented shape (no downloads):
what lands, in what order, under which keys; reruns write nothing; malformed records are
reported with their file and line and skipped."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import zstandard

from pipeline import errors
from pipeline.importers import SOURCES, convention, reader, runner

T0 = 1785755886.0  # 2026-08-03T11:18:06Z


class FakeServer:
    """What /v1/append promises about keys: the same key and body replays, the same key with
    another body is a Conflict; a recorded ``legacy_key`` replays; an erased key (a tombstone)
    answers ``erased``; metadata is taken from the append that creates the file."""

    def __init__(self) -> None:
        self.bodies: dict[tuple[str, str], str] = {}
        self.files: dict[str, list[dict[str, Any]]] = {}
        self.metadata: dict[str, Any] = {}
        self.erased: set[tuple[str, str]] = set()
        self.calls = 0

    def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        self.calls += 1
        assert set(body) <= set(runner_fields())
        assert len(body["idempotency_key"]) <= 200 and len(body["messages"]) <= 1000
        key = (body["agent_id"], body["idempotency_key"])
        legacy = (body["agent_id"], body.get("legacy_key"))
        if key in self.erased or legacy in self.erased:
            return {"file_id": body["session_key"], "erased": len(body["messages"])}
        encoded = json.dumps({k: v for k, v in body.items() if k != "legacy_key"}, sort_keys=True)
        if key in self.bodies:
            if self.bodies[key] != encoded:
                raise errors.Conflict(f"idempotency_key {key[1]!r} used with another body")
            return {"file_id": body["session_key"], "replayed": True}
        if legacy in self.bodies:
            return {"file_id": body["session_key"], "replayed": True}
        self.bodies[key] = encoded
        if body["session_key"] not in self.files:
            self.files[body["session_key"]] = []
            self.metadata[body["session_key"]] = body.get("metadata")
        self.files[body["session_key"]].extend(body["messages"])
        return {"file_id": body["session_key"]}

    def contents(self, session_key: str) -> list[tuple[str, str]]:
        return [(m["role"], m["content"]) for m in self.files[session_key]]


def runner_fields() -> tuple[str, ...]:
    return (
        "agent_id",
        "session_key",
        "source_type",
        "metadata",
        "idempotency_key",
        "legacy_key",
        "messages",
    )


def run(name: str, path: Path, server: FakeServer, **kwargs: Any) -> runner.Report:
    return runner.run(reader(name), path, agent_id="me", ingest=server, **kwargs)


def write_jsonl(path: Path, records: list[Any], *, compress: bool = False) -> Path:
    text = "".join(
        (r if isinstance(r, str) else json.dumps(r, ensure_ascii=False)) + "\n" for r in records
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    data = text.encode()
    path.write_bytes(zstandard.ZstdCompressor().compress(data) if compress else data)
    return path


def call(name: str, arguments: str, identifier: str | None = None) -> str:
    return convention.call_body(name, arguments, identifier)


def result(output: str, identifier: str | None = None) -> str:
    return convention.result_body(output, identifier)


def test_every_source_has_a_reader() -> None:
    for name in SOURCES:
        module = reader(name)
        assert callable(module.files) and callable(module.read)
    with pytest.raises(errors.InvalidInput, match="unknown import source 'mbox'"):
        reader("mbox")


def test_missing_path_is_not_found(tmp_path: Path) -> None:
    with pytest.raises(errors.NotFound, match="nope"):
        run("openai", tmp_path / "nope", FakeServer())


# ---------------------------------------------------------------------------------------------
# OpenAI and ShareGPT

OPENAI_CHAT = {
    "id": "chat-1",
    "messages": [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"city": "Paris"}'},
                },
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "clock", "arguments": "{}"},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
        {"role": "tool", "tool_call_id": "call_2", "name": "clock", "content": "noon"},
        {"role": "assistant", "content": "18C at noon."},
        {"role": "user", "content": "Thanks"},
        {"role": "assistant", "content": "**tool call**: just text"},
    ],
}

OPENAI_EXPECTED = [
    ("system", "Be brief."),
    ("user", "Weather in Paris?"),
    ("assistant", "Checking."),
    ("assistant", call("weather", '{"city": "Paris"}', "call_1")),
    ("assistant", call("clock", "{}", "call_2")),
    ("tool", result("18C", "call_1")),
    ("tool", result("noon", "call_2")),
    ("assistant", "18C at noon."),
    ("user", "Thanks"),
    ("assistant", "\\**tool call**: just text"),
]


def test_openai_json_list(tmp_path: Path) -> None:
    path = tmp_path / "chats.json"
    path.write_text(json.dumps([OPENAI_CHAT, {"messages": [{"role": "user", "content": "x"}]}]))
    server = FakeServer()
    report = run("openai", path, server)
    assert server.contents("chats.json#chat-1") == OPENAI_EXPECTED
    tools = [m["tool_name"] for m in server.files["chats.json#chat-1"] if m["role"] == "tool"]
    assert tools == ["weather", "clock"]
    assert server.metadata["chats.json#chat-1"] == {
        "importer": "openai",
        "file": "chats.json",
        "record": 0,
    }
    hashed = [key for key in server.files if key.startswith("openai-")]
    assert len(hashed) == 1  # a record without an id gets a content hash
    assert (report.files, report.messages, report.errors) == (2, 11, [])
    keys = [k for _, k in server.bodies if k.startswith("openai:chats.json#chat-1:")]
    assert len(keys) == 3  # the system prompt, then one per user turn


def test_openai_jsonl_rerun_writes_nothing_and_bad_lines_are_reported(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "chats.jsonl",
        [OPENAI_CHAT, "{not json", {"no": "messages"}, {"id": "c2", "messages": []}],
    )
    server = FakeServer()
    first = run("openai", path, server)
    assert [(p.line, p.detail[:8]) for p in first.errors] == [(2, "not JSON"), (3, "record 2")]
    assert (first.empty, first.records) == (1, 4)  # {"messages": []} has nothing to import
    assert str(first.errors[0]).startswith(f"{path}:2: not JSON")
    written = sum(len(v) for v in server.files.values())
    second = run("openai", path, server)
    assert (second.messages, second.replayed) == (0, written)
    assert sum(len(v) for v in server.files.values()) == written


def test_an_interrupted_import_completes_without_duplicates(tmp_path: Path) -> None:
    path = tmp_path / "chats.json"
    path.write_text(json.dumps([OPENAI_CHAT]))
    server = FakeServer()

    def dies_after_two(body: dict[str, Any]) -> object:
        if server.calls == 2:
            raise errors.IndexUnavailable("index went away")
        return server(body)

    with pytest.raises(errors.IndexUnavailable):
        runner.run(reader("openai"), path, agent_id="me", ingest=dies_after_two)
    run("openai", path, server)
    assert server.contents("chats.json#chat-1") == OPENAI_EXPECTED


def test_dry_run_sends_nothing(tmp_path: Path) -> None:
    path = tmp_path / "chats.json"
    path.write_text(json.dumps(OPENAI_CHAT))
    server = FakeServer()
    report = run("openai", path, server, dry_run=True)
    assert (server.calls, report.messages, report.files) == (0, len(OPENAI_EXPECTED), 1)


def test_a_turn_larger_than_an_append_is_split_under_one_key_each(tmp_path: Path) -> None:
    messages = [{"role": "user", "content": "go"}] + [
        {"role": "assistant", "content": f"step {i}"} for i in range(25)
    ]
    path = tmp_path / "long.json"
    path.write_text(json.dumps({"id": "long", "messages": messages}))
    server = FakeServer()
    runner.run(reader("openai"), path, agent_id="me", ingest=server, max_messages=10)
    assert len(server.files["long.json#long"]) == 26
    assert sorted(k.rsplit("/", 1)[1] for _, k in server.bodies) == ["0", "1", "2"]


def test_sharegpt(tmp_path: Path) -> None:
    record = {
        "id": "sg-1",
        "conversations": [
            {"from": "system", "value": "You can call tools."},
            {"from": "human", "value": "Find cats"},
            {"from": "function_call", "value": '{"name": "search", "arguments": {"q": "cats"}}'},
            {"from": "observation", "value": "3 cats"},
            {"from": "gpt", "value": "Found 3."},
            {"from": "alien", "value": "??"},
        ],
    }
    path = write_jsonl(tmp_path / "sg.jsonl", [record, {"conversations": "nope"}])
    server = FakeServer()
    report = run("sharegpt", path, server)
    assert server.contents("sg.jsonl#sg-1") == [
        ("system", "You can call tools."),
        ("user", "Find cats"),
        ("assistant", call("search", '{"q": "cats"}')),
        ("tool", "3 cats"),
        ("assistant", "Found 3."),
    ]
    assert server.files["sg.jsonl#sg-1"][3]["tool_name"] == "search"
    assert report.skipped == 1 and [p.line for p in report.errors] == [2]


# ---------------------------------------------------------------------------------------------
# Codex


def codex_rollout(session_id: str = "0199a213-81c0-7800-8aa1-bbab2a035a53") -> list[Any]:
    def line(second: int, kind: str, payload: dict[str, Any]) -> dict[str, Any]:
        return {"timestamp": f"2026-08-03T11:18:{second:02d}.5Z", "type": kind, "payload": payload}

    return [
        line(
            0,
            "session_meta",
            {
                "id": session_id,
                "cwd": "/src/app",
                "originator": "codex_cli_rs",
                "cli_version": "0.46.0",
                "source": "cli",
                "git": {"branch": "main", "commit_hash": "abc"},
            },
        ),
        line(1, "event_msg", {"type": "task_started", "turn_id": "t1"}),
        line(
            1,
            "response_item",
            {
                "type": "message",
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "<environment_context>x</environment_context>"}
                ],
            },
        ),
        line(
            1,
            "response_item",
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "ls"}]},
        ),
        line(1, "event_msg", {"type": "user_message", "message": "ls", "kind": "plain"}),
        line(2, "turn_context", {"turn_id": "t1", "model": "gpt-5-codex", "cwd": "/src/app"}),
        line(3, "response_item", {"type": "reasoning", "summary": [], "encrypted_content": "gA"}),
        line(
            4,
            "response_item",
            {
                "type": "function_call",
                "name": "shell",
                "arguments": '{"command":["ls"]}',
                "call_id": "c1",
            },
        ),
        line(
            5,
            "response_item",
            {"type": "function_call_output", "call_id": "c1", "output": "a.txt\n"},
        ),
        line(
            6,
            "response_item",
            {
                "type": "custom_tool_call",
                "name": "apply_patch",
                "input": "*** Begin Patch",
                "call_id": "c2",
            },
        ),
        line(
            6, "response_item", {"type": "custom_tool_call_output", "call_id": "c2", "output": "ok"}
        ),
        line(7, "event_msg", {"type": "agent_message", "message": "One file."}),
        line(
            7,
            "response_item",
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "One file."}],
            },
        ),
        line(
            8,
            "event_msg",
            {"type": "task_complete", "turn_id": "t1", "last_agent_message": "One file."},
        ),
        line(9, "event_msg", {"type": "task_started", "turn_id": "t2"}),
        line(9, "event_msg", {"type": "user_message", "message": "abandon this"}),
        line(10, "event_msg", {"type": "turn_aborted", "turn_id": "t2", "reason": "interrupted"}),
        line(11, "event_msg", {"type": "task_started", "turn_id": "t3"}),
        line(11, "event_msg", {"type": "user_message", "message": "still running"}),
    ]


CODEX_TURN_1 = [
    ("user", "ls"),
    ("assistant", call("shell", '{"command":["ls"]}', "c1")),
    ("tool", result("a.txt\n", "c1")),
    ("assistant", call("apply_patch", "*** Begin Patch", "c2")),
    ("tool", result("ok", "c2")),
    ("assistant", "One file."),
]


CODEX_REST = [("user", "abandon this"), ("user", "still running")]


def test_codex_every_item_in_file_order_under_its_turn_and_place(tmp_path: Path) -> None:
    sid = "0199a213-81c0-7800-8aa1-bbab2a035a53"
    path = write_jsonl(tmp_path / f"rollout-2026-08-03T11-18-00-{sid}.jsonl", codex_rollout())
    server = FakeServer()
    report = run("codex", path, server)
    # the aborted turn and the one still running are what was said: kept
    assert server.contents(sid) == CODEX_TURN_1 + CODEX_REST
    assert [m["tool_name"] for m in server.files[sid] if m["role"] == "tool"] == [
        "shell",
        "apply_patch",
    ]
    assert server.files[sid][0]["ts"] == "2026-08-03T11:18:01.5Z"
    assert server.metadata[sid] == {
        "importer": "codex",
        "cwd": "/src/app",
        "originator": "codex_cli_rs",
        "cli_version": "0.46.0",
        "source": "cli",
        "git_branch": "main",
        "git_commit": "abc",
        "started_at": "2026-08-03T11:18:00.5Z",
        "model": "gpt-5-codex",
    }
    assert [k for _, k in server.bodies] == [
        *(f"codex:{sid}:t1:{n}" for n in range(6)),
        f"codex:{sid}:t2:0",
        f"codex:{sid}:t3:0",
    ]
    assert report.skipped == 1  # the reasoning

    # the running turn goes on and completes: the next run appends just what it gained
    more = [
        *codex_rollout(),
        {
            "timestamp": "2026-08-03T11:18:12Z",
            "type": "response_item",
            "payload": {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "done"}],
            },
        },
        {
            "timestamp": "2026-08-03T11:18:13Z",
            "type": "event_msg",
            "payload": {"type": "task_complete", "turn_id": "t3"},
        },
    ]
    write_jsonl(path, more)
    again = run("codex", path, server)
    assert (again.messages, again.replayed) == (1, 8)
    assert server.contents(sid)[-2:] == [("user", "still running"), ("assistant", "done")]
    assert list(server.bodies)[-1] == ("me", f"codex:{sid}:t3:1")


def test_codex_turns_an_earlier_version_stored_whole_are_not_stored_again(
    tmp_path: Path,
) -> None:
    """An earlier version keyed a completed turn by its id and a hash of what it said; the
    items of that turn carry its key, and the server answers them as stored."""
    sid = "0199a213-81c0-7800-8aa1-bbab2a035a53"
    path = write_jsonl(tmp_path / f"rollout-2026-08-03T11-18-00-{sid}.jsonl", codex_rollout())
    earlier = FakeServer()
    turn = [
        {"role": role, "content": content, "ts": f"2026-08-03T11:18:0{second}.5Z"}
        for (role, content), second in zip(CODEX_TURN_1, (1, 4, 5, 6, 6, 7), strict=True)
    ]
    for message in turn:
        if message["role"] == "tool":
            message["tool_name"] = "shell" if "c1" in message["content"] else "apply_patch"
    earlier.bodies[("me", convention.key("codex", sid, "t1", turn))] = "{}"
    earlier.files[sid] = list(turn)
    report = run("codex", path, earlier)
    assert (report.messages, report.replayed) == (2, 6)
    assert earlier.contents(sid) == CODEX_TURN_1 + CODEX_REST


def test_codex_sessions_directory_with_zstd_and_a_malformed_line(tmp_path: Path) -> None:
    sessions = tmp_path / "sessions"
    plain = codex_rollout("11111111-1111-4111-8111-111111111111")
    packed = codex_rollout("22222222-2222-4222-8222-222222222222")
    write_jsonl(sessions / "2026/08/03/rollout-a-11111111-1111-4111-8111-111111111111.jsonl", plain)
    write_jsonl(
        sessions / "2026/08/04/rollout-b-22222222-2222-4222-8222-222222222222.jsonl.zst",
        [*packed[:3], "{broken", *packed[3:]],
        compress=True,
    )
    (sessions / "notes.txt").write_text("not a rollout")
    server = FakeServer()
    seen: list[tuple[int, int]] = []
    report = runner.run(
        reader("codex"),
        sessions,
        agent_id="me",
        ingest=server,
        progress=lambda p: seen.append((p.files_done, p.report.records)),
    )
    # after each record (the second file's malformed line is one), and after each file
    assert seen == [(0, 1), (1, 1), (1, 2), (1, 3), (2, 3)]
    assert set(server.files) == {
        "11111111-1111-4111-8111-111111111111",
        "22222222-2222-4222-8222-222222222222",
    }
    assert server.contents("22222222-2222-4222-8222-222222222222") == CODEX_TURN_1 + CODEX_REST
    assert report.unreadable == 1
    assert [(Path(p.file).name, p.line) for p in report.errors] == [
        ("rollout-b-22222222-2222-4222-8222-222222222222.jsonl.zst", 4)
    ]


def test_codex_rollout_from_before_the_envelope(tmp_path: Path) -> None:
    records = [
        {"id": "old-session", "timestamp": "2025-05-01T10:00:00Z", "instructions": None},
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "<user_instructions>x</user_instructions>"}],
        },
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        {"record_type": "state"},
        {"type": "function_call", "name": "shell", "arguments": "{}", "call_id": "c"},
        {
            "type": "function_call_output",
            "call_id": "c",
            "output": {"content": "out", "success": True},
        },
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "hello"}],
        },
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "more?"}]},
    ]
    path = write_jsonl(tmp_path / "rollout-old.jsonl", records)
    server = FakeServer()
    report = run("codex", path, server)
    assert server.contents("old-session") == [
        ("user", "hi"),
        ("assistant", call("shell", "{}", "c")),
        ("tool", result("out", "c")),
        ("assistant", "hello"),
        ("user", "more?"),  # the next turn: a user message after another
    ]
    assert server.files["old-session"][0]["ts"] == "2025-05-01T10:00:00Z"
    assert [k for _, k in server.bodies][-1] == "codex:old-session:n2:0"
    assert report.skipped == 0


# ---------------------------------------------------------------------------------------------
# Claude Code


class ClaudeLog:
    """Builds a transcript the way Claude Code writes one: each record names its parent."""

    def __init__(self, session_id: str = "5b6c69aa-0000-4000-8000-000000000001") -> None:
        self.session_id = session_id
        self.records: list[Any] = []
        self.n = 0

    def add(self, kind: str, parent: str | None, message: Any = None, **extra: Any) -> str:
        self.n += 1
        uuid = f"u{self.n:03d}"
        record = {
            "type": kind,
            "uuid": uuid,
            "parentUuid": parent,
            "sessionId": self.session_id,
            "timestamp": f"2026-08-03T11:{self.n // 60:02d}:{self.n % 60:02d}Z",
            "cwd": "/src/app",
            "gitBranch": "main",
            "version": "2.0.55",
            "isSidechain": False,
            "userType": "external",
            **extra,
        }
        if message is not None:
            record["message"] = message
        self.records.append(record)
        return uuid

    def user(self, parent: str | None, content: Any, **extra: Any) -> str:
        return self.add("user", parent, {"role": "user", "content": content}, **extra)

    def assistant(self, parent: str | None, message_id: str, block: dict[str, Any]) -> str:
        message = {
            "id": message_id,
            "role": "assistant",
            "model": "claude-sonnet-4-5",
            "content": [block],
            "stop_reason": None,
        }
        return self.add("assistant", parent, message, requestId=f"req-{message_id}")


def test_claude_code_rewind_compaction_and_meta(tmp_path: Path) -> None:
    log = ClaudeLog()
    caveat = log.user(None, "<local-command-caveat>x</local-command-caveat>", isMeta=True)
    u1 = log.user(caveat, "Read a.txt please")
    a1 = log.assistant(u1, "msg_1", {"type": "thinking", "thinking": "hmm"})
    a2 = log.assistant(a1, "msg_1", {"type": "text", "text": "Reading it."})
    a3 = log.assistant(
        a2,
        "msg_1",
        {"type": "tool_use", "id": "tu_1", "name": "Read", "input": {"file_path": "a.txt"}},
    )
    r1 = log.user(a3, [{"type": "tool_result", "tool_use_id": "tu_1", "content": "hello"}])
    a4 = log.assistant(r1, "msg_2", {"type": "text", "text": "It says hello."})
    # a rewind: the user went back to a4 and asked again; the old branch stays in the file
    old = log.user(a4, "Now delete it")
    log.assistant(old, "msg_3", {"type": "text", "text": "Deleted."})
    new = log.user(a4, "Now copy it")
    a5 = log.assistant(
        new,
        "msg_4",
        {"type": "tool_use", "id": "tu_2", "name": "Bash", "input": {"command": "cp a b"}},
    )
    r2 = log.user(
        a5,
        [
            {
                "type": "tool_result",
                "tool_use_id": "tu_2",
                "content": [{"type": "text", "text": "copied"}],
                "is_error": False,
            }
        ],
    )
    a6 = log.assistant(r2, "msg_5", {"type": "text", "text": "Copied."})
    # a compaction: a new root that points back to the last message before it
    boundary = log.add(
        "system",
        None,
        subtype="compact_boundary",
        logicalParentUuid=a6,
        content="Conversation compacted",
        compactMetadata={"trigger": "manual", "preTokens": 1},
    )
    summary = log.user(boundary, "This session is being continued…", isCompactSummary=True)
    u2 = log.user(
        summary, [{"type": "text", "text": "And after that?"}, {"type": "image", "source": {}}]
    )
    log.assistant(u2, "msg_6", {"type": "text", "text": "Nothing else."})
    log.records.insert(3, "{truncated")
    log.records.append({"type": "summary", "summary": "Copying a file", "leafUuid": a6})
    log.records.append({"type": "file-history-snapshot", "messageId": "m", "snapshot": {}})
    path = write_jsonl(tmp_path / "project" / f"{log.session_id}.jsonl", log.records)

    server = FakeServer()
    report = run("claude-code", path, server)
    rewound = convention.rewound([1, 2], None)["content"]
    assert rewound.startswith("**rewound**: 1-2\n\n")
    assert server.contents(log.session_id) == [
        ("user", "Read a.txt please"),
        ("assistant", "**thinking**\n\nhmm"),
        ("assistant", "Reading it."),
        ("assistant", call("Read", '{"file_path": "a.txt"}', "tu_1")),
        ("tool", result("hello", "tu_1")),
        ("assistant", "It says hello."),
        # the branch a rewind left is kept, and the marker says which messages it holds
        ("user", "Now delete it"),
        ("assistant", "Deleted."),
        ("system", rewound),
        ("user", "Now copy it"),
        ("assistant", call("Bash", '{"command": "cp a b"}', "tu_2")),
        ("tool", result("copied", "tu_2")),
        ("assistant", "Copied."),
        ("system", "**compaction summary**\n\nThis session is being continued…"),
        ("user", "And after that?\n[image]"),
        ("assistant", "Nothing else."),
    ]
    assert convention.kind("system", rewound) == "rewound"
    assert convention.rewound_places(rewound) == [1, 2]
    tools = [m["tool_name"] for m in server.files[log.session_id] if m["role"] == "tool"]
    assert tools == ["Read", "Bash"]
    assert server.metadata[log.session_id] == {
        "importer": "claude-code",
        "title": "Copying a file",
        "cwd": "/src/app",
        "git_branch": "main",
        "version": "2.0.55",
        "model": "claude-sonnet-4-5",
    }
    keys = [k for _, k in server.bodies]
    assert keys[:2] == [f"claude-code:{log.session_id}:{u1}", f"claude-code:{log.session_id}:{a1}"]
    assert f"claude-code:{log.session_id}:{new}:rewound" in keys
    assert [p.line for p in report.errors] == [4] and report.unreadable == 1
    assert report.skipped == 1  # the meta record
    assert run("claude-code", path, server).messages == 0


def test_claude_code_turns_an_earlier_version_stored_whole_are_not_stored_again(
    tmp_path: Path,
) -> None:
    """An earlier version cut the transcript into turns (an assistant message merged from the
    records of its message.id, at the time of its first record) and keyed each turn by its
    first record and a hash of what it said; each record of such a turn carries that key."""
    log = ClaudeLog()
    u1 = log.user(None, "Read a.txt please")
    a1 = log.assistant(u1, "msg_1", {"type": "thinking", "thinking": "hmm"})
    a2 = log.assistant(a1, "msg_1", {"type": "text", "text": "Reading it."})
    tool = {"type": "tool_use", "id": "tu_1", "name": "Read", "input": {"file_path": "a.txt"}}
    a3 = log.assistant(a2, "msg_1", tool)
    r1 = log.user(a3, [{"type": "tool_result", "tool_use_id": "tu_1", "content": "hello"}])
    a4 = log.assistant(r1, "msg_2", {"type": "text", "text": "It says hello."})
    u2 = log.user(a4, "Thanks")
    log.assistant(u2, "msg_3", {"type": "text", "text": "You are welcome."})
    path = write_jsonl(tmp_path / f"{log.session_id}.jsonl", log.records)
    when = [r["timestamp"].replace(":", ":") for r in log.records]
    merged = when[1]  # msg_1's thinking, text and call all took its first record's time
    turn = [
        {"role": "user", "content": "Read a.txt please", "ts": when[0]},
        {"role": "assistant", "content": "**thinking**\n\nhmm", "ts": merged},
        {"role": "assistant", "content": "Reading it.", "ts": merged},
        {
            "role": "assistant",
            "content": call("Read", '{"file_path": "a.txt"}', "tu_1"),
            "ts": merged,
        },
        {"role": "tool", "content": result("hello", "tu_1"), "ts": when[4], "tool_name": "Read"},
        {"role": "assistant", "content": "It says hello.", "ts": when[5]},
    ]
    earlier = FakeServer()
    earlier.bodies[("me", convention.key("claude-code", log.session_id, u1, turn))] = "{}"
    earlier.files[log.session_id] = list(turn)
    report = run("claude-code", path, earlier)
    assert (report.messages, report.replayed) == (2, 6)
    assert earlier.contents(log.session_id)[-2:] == [
        ("user", "Thanks"),
        ("assistant", "You are welcome."),
    ]


def test_claude_code_subagents_are_sessions_and_every_record_is_taken(tmp_path: Path) -> None:
    main = ClaudeLog()
    u1 = main.user(None, "Research X")
    main.assistant(
        u1, "m1", {"type": "tool_use", "id": "t1", "name": "Task", "input": {"prompt": "X"}}
    )
    sub = ClaudeLog(main.session_id)
    s1 = sub.add("user", None, {"role": "user", "content": "X"}, isSidechain=True, agentId="a7f3")
    sub.add(
        "assistant",
        s1,
        {"id": "sm1", "role": "assistant", "content": [{"type": "text", "text": "X is y."}]},
        isSidechain=True,
        agentId="a7f3",
    )
    project = tmp_path / "projects" / "-src-app"
    write_jsonl(project / f"{main.session_id}.jsonl", main.records)
    write_jsonl(project / main.session_id / "subagents" / "agent-a7f3.jsonl", sub.records)

    server = FakeServer()
    report = run("claude-code", tmp_path / "projects", server)
    key = f"{main.session_id}/agent-a7f3"
    assert set(server.files) == {main.session_id, key}
    # the call awaiting its result is what was said so far: a record is taken as it is
    assert server.contents(main.session_id) == [
        ("user", "Research X"),
        ("assistant", call("Task", '{"prompt": "X"}', "t1")),
    ]
    assert server.contents(key) == [("user", "X"), ("assistant", "X is y.")]
    assert server.metadata[key]["parent_session"] == main.session_id
    assert report.skipped == 0


# ---------------------------------------------------------------------------------------------
# Hermes state.db (an older schema made here; the real SessionDB one is tested with Hermes)


def hermes_db(path: Path, *, with_flags: bool) -> Path:
    conn = sqlite3.connect(path)
    flags = ", active INTEGER NOT NULL DEFAULT 1, compacted INTEGER NOT NULL DEFAULT 0"
    conn.executescript(
        "CREATE TABLE sessions (id TEXT PRIMARY KEY, source TEXT NOT NULL, model TEXT,"
        " parent_session_id TEXT, started_at REAL NOT NULL, ended_at REAL);"
        "CREATE TABLE messages (id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL,"
        " role TEXT NOT NULL, content TEXT, tool_call_id TEXT, tool_calls TEXT, tool_name TEXT,"
        f" timestamp REAL NOT NULL{flags if with_flags else ''});"
    )
    conn.execute("INSERT INTO sessions VALUES ('s2', 'cli', 'm', 's1', ?, NULL)", (T0 + 100,))
    conn.execute("INSERT INTO sessions VALUES ('s1', 'telegram', 'm', NULL, ?, ?)", (T0, T0 + 50))

    def add(session: str, role: str, content: str | None, t: float, **extra: Any) -> None:
        names = ["session_id", "role", "content", "timestamp", *extra]
        conn.execute(
            f"INSERT INTO messages ({', '.join(names)}) VALUES ({', '.join('?' * len(names))})",
            (session, role, content, T0 + t, *extra.values()),
        )

    calls = json.dumps(
        [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "terminal", "arguments": '{"cmd": "ls"}'},
            }
        ]
    )
    add("s1", "session_meta", None, 0)
    add("s1", "user", "\x00json:" + json.dumps([{"type": "text", "text": "list files"}]), 1)
    add("s1", "assistant", None, 2, tool_calls=calls)
    add("s1", "tool", "a.txt", 3, tool_call_id="c1")
    add("s1", "assistant", "One file.", 4)
    add("s1", "user", "\x00json:{broken", 5)
    add("s2", "user", "hello", 101)
    add("s2", "assistant", "hi", 102)
    add("s2", "user", "waiting", 103)
    conn.commit()
    conn.close()
    return path


def test_hermes_older_schema_without_flags(tmp_path: Path) -> None:
    path = hermes_db(tmp_path / "state.db", with_flags=False)
    before = path.read_bytes()
    server = FakeServer()
    report = run("hermes", tmp_path, server)  # a Hermes home works too
    assert list(server.files) == ["s1", "s2"]  # by started_at
    assert server.contents("s1") == [
        ("user", "list files"),
        ("assistant", call("terminal", '{"cmd": "ls"}', "c1")),
        ("tool", result("a.txt", "c1")),
        ("assistant", "One file."),
    ]
    assert server.files["s1"][2]["tool_name"] == "terminal"
    assert server.files["s1"][0]["ts"] == "2026-08-03T11:18:07Z"
    assert server.metadata["s1"] == {"importer": "hermes", "source": "telegram", "model": "m"}
    # the provider's key for the same turn: numbered by its user message, hashed without times
    first = [m for _, k in server.bodies if k.startswith("hermes:s1:1:") for m in [k]]
    assert first == [convention.hermes_key("s1", 1, server.files["s1"])]
    assert server.metadata["s2"]["parent_session"] == "s1"
    # s2 has not ended and its last turn has no answer yet
    assert server.contents("s2") == [("user", "hello"), ("assistant", "hi")]
    assert report.skipped == 1
    assert [p.detail.split(":")[0] for p in report.errors] == ["session 's1' message id 6"]
    assert path.read_bytes() == before  # opened read-only


def test_hermes_inactive_rows(tmp_path: Path) -> None:
    path = hermes_db(tmp_path / "state.db", with_flags=True)
    conn = sqlite3.connect(path)
    # s1's first turn was compacted away; s2's last exchange was rewound
    conn.execute("UPDATE messages SET active = 0, compacted = 1 WHERE session_id='s1' AND id<=5")
    conn.execute(
        "INSERT INTO messages (session_id, role, content, timestamp) VALUES"
        " ('s1', 'user', 'Summary of earlier turns', ?), ('s1', 'assistant', 'ok', ?)",
        (T0 + 10, T0 + 11),
    )
    # s2's unanswered question was taken back by /undo, and another turn followed
    conn.execute("UPDATE messages SET active = 0 WHERE session_id = 's2' AND id >= 9")
    conn.execute(
        "INSERT INTO messages (session_id, role, content, timestamp) VALUES"
        " ('s2', 'user', 'again', ?), ('s2', 'assistant', 'yes', ?)",
        (T0 + 110, T0 + 111),
    )
    conn.commit()
    conn.close()
    server = FakeServer()
    report = run("hermes", path, server)
    assert server.contents("s1") == [("user", "Summary of earlier turns"), ("assistant", "ok")]
    assert server.contents("s1#compacted") == [
        ("user", "list files"),
        ("assistant", call("terminal", '{"cmd": "ls"}', "c1")),
        ("tool", result("a.txt", "c1")),
        ("assistant", "One file."),
    ]
    assert server.metadata["s1#compacted"]["compacted_from"] == "s1"
    # the question taken back was never answered (the provider never had it): left out, and
    # nothing stored was taken back, so there is no rewind marker
    assert server.contents("s2") == [
        ("user", "hello"),
        ("assistant", "hi"),
        ("user", "again"),
        ("assistant", "yes"),
    ]
    assert [k.rsplit(":", 1)[0] for _, k in server.bodies if k.startswith("hermes:s2:")] == [
        "hermes:s2:1",
        "hermes:s2:2",
    ]
    assert report.skipped == 1  # that question
    assert len(report.errors) == 1  # the broken row, live in s1


def test_hermes_rewound_turns_into_a_store_of_an_earlier_version(tmp_path: Path) -> None:
    """An earlier version imported only the live turns: importing again adds the rewound turn
    (it was said) but no rewind marker after the turn it belongs before (that turn is stored
    already, so the marker, its legacy_key that turn's key, would land out of place); a fresh
    store gets the marker in its place."""
    path = hermes_db(tmp_path / "state.db", with_flags=True)
    conn = sqlite3.connect(path)
    conn.execute("DELETE FROM messages WHERE session_id = 's2' AND id = 9")  # 'waiting'
    conn.execute(
        "INSERT INTO messages (session_id, role, content, timestamp, active) VALUES"
        " ('s2', 'user', 'undone', ?, 0), ('s2', 'assistant', 'taken back', ?, 0),"
        " ('s2', 'user', 'again', ?, 1), ('s2', 'assistant', 'yes', ?, 1)",
        (T0 + 104, T0 + 105, T0 + 110, T0 + 111),
    )
    conn.commit()
    conn.close()
    fresh = FakeServer()
    run("hermes", path, fresh)
    marker = convention.rewound([1, 2], None)["content"]
    assert fresh.contents("s2") == [
        ("user", "hello"),
        ("assistant", "hi"),
        ("user", "undone"),
        ("assistant", "taken back"),
        ("system", marker),
        ("user", "again"),
        ("assistant", "yes"),
    ]

    earlier = tmp_path / "earlier" / "state.db"  # what the earlier version read: live rows
    earlier.parent.mkdir()
    earlier.write_bytes(path.read_bytes())
    conn = sqlite3.connect(earlier)
    conn.execute("DELETE FROM messages WHERE active = 0")
    conn.commit()
    conn.close()
    store = FakeServer()
    run("hermes", earlier, store)
    assert store.contents("s2") == [
        ("user", "hello"),
        ("assistant", "hi"),
        ("user", "again"),
        ("assistant", "yes"),
    ]
    again = run("hermes", path, store)
    assert store.contents("s2") == [
        ("user", "hello"),
        ("assistant", "hi"),
        ("user", "again"),
        ("assistant", "yes"),
        ("user", "undone"),
        ("assistant", "taken back"),
    ]
    assert again.messages == 2
    assert run("hermes", path, store).messages == 0
