"""Live capture run after every write an agent makes, against the API of a test's own index
(SQLite and PostgreSQL, in this process): transcripts in Claude Code's and Codex's formats
written record by record and byte by byte across a record, with a rewind, a compaction, a
sub-agent, bad lines in the middle, a Stop hook that runs before the last records are written
and the server down for three runs. What is stored is, message for message and in order, what
``sgme import`` makes of the final files, and importing them afterwards writes nothing. A run
meets a server that hangs, a missing or refused token, a spool that cannot be written, a
device in place of a transcript: it keeps to its budget, says why, and loses nothing."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from agents import ClaudeTranscript, CodexRollout
from api_client import Api

from pipeline import client, database, validation
from pipeline.capture import config, hooks, runner
from pipeline.importers import claude_code, codex, convention, source
from pipeline.importers import runner as importer

URL = "http://testserver"  #: the TestClient's host, which the app allows
Stored = dict[str, list[tuple[str, str, str | None]]]


class Network(httpx.BaseTransport):
    """The way from a hook to the app: ``up``, ``down`` (connection refused) or ``hanging``
    (every request takes its whole timeout, then times out)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner  # the TestClient's transport (Starlette's own httpx)
        self.mode = "up"
        self.requests = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.requests += 1
        if self.mode == "down":
            raise httpx.ConnectError("connection refused", request=request)
        if self.mode == "hanging":
            waited = request.extensions.get("timeout", {}).get("read") or 5.0
            time.sleep(waited)  # a server that never answers costs the client its timeout
            raise httpx.ReadTimeout("timed out", request=request)
        answer = self.inner.handle_request(request)
        # the TestClient's answer as an httpx one (its stream is Starlette's own)
        return httpx.Response(answer.status_code, headers=answer.headers, content=answer.read())


@pytest.fixture
def app(db: database.Database, data_dir: Path, database_url: str) -> Iterator[Api]:
    found = Api(db, data_dir, database_url, validation.DEFAULT_LIMITS)
    yield found
    found.close()


@pytest.fixture
def network(app: Api) -> Network:
    return Network(app.client._transport)


def agent(kind: str, tmp_path: Path, **env: str) -> config.Agent:
    return config.agent(
        kind,
        {
            "SGME_URL": URL,
            "SGME_SPOOL_DIR": str(tmp_path / "spool"),
            "XDG_CONFIG_HOME": str(tmp_path / "config"),
            "SGME_CAPTURE_SECONDS": "10",
            **env,
        },
    )


def stored(app: Api, agent_id: str) -> Stored:
    """Every session of ``agent_id`` as /messages shows it, once its files are written."""
    files = app.client.get("/v1/files", params={"agent_id": agent_id, "limit": 1000}).json()
    out: Stored = {}
    for row in files["files"]:
        app.flush(row["file_id"])
        found: list[tuple[str, str, str | None]] = []
        while page := app.messages(row["file_id"], after_seq=len(found), limit=1000):
            found += [
                (m["role"], m["content"], m["tool_name"] if m["role"] == "tool" else None)
                for m in page
            ]
        out[row["session_key"]] = found
    return out


def imported(reader: source.Reader, path: Path) -> Stored:
    """What ``sgme import`` makes of the files under ``path``: each session's messages."""
    out: Stored = {}
    for file in reader.files(path):
        for record in reader.read(file):
            if isinstance(record, source.Session):
                messages = [m for unit in record.units for m in unit.messages]
                out.setdefault(record.session_key, []).extend(
                    (m["role"], m["content"], m.get("tool_name")) for m in messages
                )
    return out


def reimport(app: Api, network: Network, name: str, path: Path) -> importer.Report:
    """``sgme import`` of the same files, over HTTP into the same store."""
    network.mode = "up"
    with client.Client(URL, transport=network, retry=client.NO_RETRY) as sgme:
        return importer.run(
            importer_reader(name), path, agent_id=name, ingest=lambda body: sgme.append(**body)
        )


def importer_reader(name: str) -> source.Reader:
    from pipeline import importers

    return importers.reader(name)


def test_claude_code_written_record_by_record_and_byte_by_byte(
    app: Api, network: Network, tmp_path: Path
) -> None:
    env = agent("claude-code", tmp_path)
    project = tmp_path / "projects" / "-src-app"
    sid = "5b6c69aa-0000-4000-8000-000000000001"
    main = ClaudeTranscript(project / f"{sid}.jsonl", sid)
    runs: list[runner.Summary] = []

    def fire(event: str = "Stop", **extra: Any) -> None:
        payload = {"session_id": sid, "transcript_path": str(main.path), "hook_event_name": event}
        payload.update(extra)
        targets = hooks.claude_code_targets(payload)
        seconds = hooks.claude_code_seconds(payload, env.seconds)
        runs.append(runner.capture(env, targets, seconds=seconds, transport=network))

    main.after = fire  # a hook after every line the agent writes
    main.user("Read notes.md")
    main.assistant(
        "msg_1",
        {"type": "thinking", "thinking": "The user wants the file.", "signature": "c2ln"},
        {"type": "text", "text": "Reading it."},
        {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"file_path": "notes.md"}},
    )
    main.result("toolu_1", "Read", "hi there")
    main.assistant("msg_2", {"type": "text", "text": "It says hi there."})
    answered = main.last
    assert answered is not None
    # bad lines in the middle: not JSON, not UTF-8, nested too deep
    main.raw(b'{"type": "user", "uuid": "cut-off"')
    main.raw(b'{"type": "user", "text": "caf\xe9"}')
    main.raw(b"[" * 150 + b"]" * 150)
    main.user("Now write it to out.md")
    main.assistant("msg_3", {"type": "text", "text": "Written."})
    # a rewind: the prompt edited, the conversation goes on from the answer before it
    main.rewind(answered)
    main.user("Now copy it to out.md")
    main.assistant("msg_4", {"type": "text", "text": "Copied."})
    # a sub-agent, its transcript written record by record, SubagentStop after each line
    main.user("Ask a helper about X")
    main.assistant(
        "msg_5", {"type": "tool_use", "id": "toolu_2", "name": "Task", "input": {"prompt": "X?"}}
    )
    helper = ClaudeTranscript(
        project / sid / "subagents" / "agent-ab12.jsonl", sid, agent_id="ab12"
    )
    helper.after = lambda: fire(
        "SubagentStop", agent_id="ab12", agent_transcript_path=str(helper.path)
    )
    helper.user("X?")
    helper.assistant("sub_1", {"type": "text", "text": "X is 42."})
    main.result("toolu_2", "Task", "X is 42.")
    main.assistant("msg_6", {"type": "text", "text": "The helper says 42."})
    # a compaction, then the server down for three runs
    fire("PreCompact", trigger="manual")
    main.compact("Summary: read notes.md, copied it, asked a helper about X.")
    network.mode = "down"
    main.user("And now?")
    main.assistant("msg_7", {"type": "text", "text": "Nothing else."})
    main.user("Sure?")
    assert [r.spooled for r in runs[-3:]] == [1, 1, 1] and not runs[-1].delivered
    assert "away" in (runs[-1].failure or "")
    network.mode = "up"
    # a record written a byte at a time, a hook after every byte
    main.after = lambda: None
    record = main.blocks("msg_8", {"type": "text", "text": "Sure: ü, 中文, ✓."})[0]
    main.bytewise(record, fire)
    # Claude Code runs Stop before the turn's last record is in the transcript: the run waits
    # for the answer the hook names, which is written meanwhile
    main.user("One more thing")
    late = main.blocks("msg_9", {"type": "text", "text": "Done, all of it."})[0]
    writer = threading.Timer(0.3, lambda: main.write(late))
    writer.start()
    fire("Stop", last_assistant_message="Done, all of it.")
    writer.join()
    assert runs[-1].lagging == [] and runs[-1].sent >= 2
    fire("SessionEnd", reason="exit")

    final = imported(claude_code, tmp_path / "projects")
    assert set(final) == {sid, f"{sid}/agent-ab12"}
    assert stored(app, "claude-code") == final
    kinds = [convention.kind(role, content) for role, content, _ in final[sid]]
    assert kinds.count("rewound") == 1 and kinds.count("summary") == 1
    marker = next(c for r, c, _ in final[sid] if convention.kind(r, c) == "rewound")
    assert convention.rewound_places(marker) == [1, 2]  # "Now write it…" and "Written."
    assert all(not r.problems or "not" in r.problems[0] or "nested" in r.problems[0] for r in runs)
    assert not list((tmp_path / "spool").glob("*.jsonl"))
    again = reimport(app, network, "claude-code", tmp_path / "projects")
    assert (again.messages, again.errors[:0], again.unreadable) == (0, [], 3)
    assert again.replayed == sum(len(messages) for messages in final.values())


def test_codex_written_record_by_record_and_byte_by_byte(
    app: Api, network: Network, tmp_path: Path
) -> None:
    env = agent("codex", tmp_path)
    home = tmp_path / "codex"
    thread = "0199a213-81c0-7800-8aa1-bbab2a035a53"
    rollout = CodexRollout(home, thread)
    runs: list[runner.Summary] = []

    def fire(said: str | None = None, *, notify: bool = False) -> None:
        if notify:  # notify: the thread id names the rollout
            payload: dict[str, Any] = {"type": "agent-turn-complete", "thread-id": thread}
        else:
            payload = {"session_id": thread, "transcript_path": str(rollout.path)}
        if said is not None:
            payload["last_assistant_message"] = said
        runs.append(
            runner.capture(env, hooks.codex_targets(payload, home), seconds=10, transport=network)
        )

    rollout.after = fire
    rollout.turn("t1", "list t1")
    rollout.raw(b"{broken")
    rollout.raw(b'{"timestamp": "2026-08-03T11:00:00Z", "type": "event_msg", "x": "\xff"}')
    rollout.turn("t2", "list t2", complete=False)
    rollout.write("event_msg", {"type": "turn_aborted", "turn_id": "t2", "reason": "interrupted"})
    rollout.compact("Summary: listed t1 and t2.")
    rollout.after = lambda: fire(notify=True)
    network.mode = "down"
    rollout.turn("t3", "list t3")
    assert not runs[-1].delivered and runs[-1].spooled == 0  # nothing new in the last line
    network.mode = "up"
    rollout.after = lambda: None
    rollout.write("event_msg", {"type": "task_started", "turn_id": "t4"})
    rollout.bytewise(
        "event_msg", {"type": "user_message", "message": "list t4, ü 中文", "kind": "plain"}, fire
    )
    fire("Found t4.txt.")  # a Stop hook: nothing more is coming, it waits its 2 s and goes

    final = imported(codex, home / "sessions")
    assert stored(app, "codex") == final
    assert [c for r, c, _ in final[thread] if r == "user"] == [
        "list t1",
        "list t2",
        "list t3",
        "list t4, ü 中文",
    ]
    assert runs[-1].lagging == [str(rollout.path)]
    again = reimport(app, network, "codex", home / "sessions")
    assert (again.messages, again.unreadable) == (0, 2)
    assert again.replayed == len(final[thread])


def test_a_hanging_server_with_a_thousand_waiting_costs_the_budget_and_loses_nothing(
    app: Api, network: Network, tmp_path: Path
) -> None:
    env = agent("claude-code", tmp_path)
    sid = "aaaaaaaa-0000-4000-8000-000000000003"
    transcript = ClaudeTranscript(tmp_path / "p" / f"{sid}.jsonl", sid)
    payload = {"session_id": sid, "transcript_path": str(transcript.path)}
    network.mode = "down"
    for n in range(500):  # 1,000 appends waiting in the spool
        transcript.user(f"question {n}")
        transcript.assistant(f"m{n}", {"type": "text", "text": f"answer {n}"})
    first = runner.capture(env, hooks.claude_code_targets(payload), seconds=10, transport=network)
    assert first.spooled == 1000 and len(list((tmp_path / "spool").glob("*.jsonl"))) == 1
    network.mode = "hanging"
    transcript.user("one more")
    for event, budget in (("Stop", 2.0), ("SessionEnd", 1.0)):
        started = time.monotonic()
        found = runner.capture(
            env,
            hooks.claude_code_targets({**payload, "hook_event_name": event}),
            seconds=budget,
            transport=network,
        )
        took = time.monotonic() - started
        assert took < budget + 0.5, f"{event} took {took:.2f} s of a {budget} s budget"
        assert found.failure is not None and "away" in found.failure
    network.mode = "up"
    done = runner.capture(env, hooks.claude_code_targets(payload), seconds=30, transport=network)
    assert done.delivered and done.sent == 1001
    assert stored(app, "claude-code") == imported(claude_code, tmp_path / "p")


def test_why_a_run_cannot_deliver_a_token_it_lacks_or_a_spool_it_cannot_write(
    app: Api, network: Network, tmp_path: Path, db: database.Database
) -> None:
    from pipeline import auth

    secret = auth.create(db, name="hook", agent_ids=["claude-code"], scopes=["append"]).secret
    reader = auth.create(db, name="test", agent_ids=["claude-code"], scopes=["read"]).secret
    app.client.headers["Authorization"] = f"Bearer {reader}"
    sid = "aaaaaaaa-0000-4000-8000-000000000004"
    transcript = ClaudeTranscript(tmp_path / "p" / f"{sid}.jsonl", sid)
    payload = {"session_id": sid, "transcript_path": str(transcript.path)}
    transcript.user("hello")
    without = runner.capture(
        agent("claude-code", tmp_path),
        hooks.claude_code_targets(payload),
        seconds=5,
        transport=network,
    )
    assert without.spooled == 1
    assert "asks for a token and the hook has none" in (without.failure or "")
    # a token file others may read is refused, and said so
    token = tmp_path / "config" / "sgme" / "token"
    token.parent.mkdir(parents=True)
    token.write_text(secret + "\n")
    token.chmod(0o644)
    env = agent("claude-code", tmp_path)
    assert env.token is None and "chmod 600" in (env.token_problem or "")
    token.chmod(0o600)
    env = agent("claude-code", tmp_path)
    assert (env.token, env.token_source) == (secret, str(token))
    transcript.assistant("m1", {"type": "text", "text": "hi"})
    found = runner.capture(env, hooks.claude_code_targets(payload), seconds=5, transport=network)
    assert found.delivered and found.sent == 2
    transcript.user("after")
    refused = runner.capture(
        agent("claude-code", tmp_path, SGME_TOKEN="sgme_wrong"),
        hooks.claude_code_targets(payload),
        seconds=5,
        transport=network,
    )
    assert "refuses the token from SGME_TOKEN (401)" in (refused.failure or "")
    # a spool that is a file: what the server takes goes straight, nothing is kept
    blocked = tmp_path / "blocked"
    blocked.write_text("not a directory")
    straight = agent("claude-code", tmp_path, SGME_SPOOL_DIR=str(blocked))
    transcript.assistant("m2", {"type": "text", "text": "after it"})
    run = runner.capture(straight, hooks.claude_code_targets(payload), seconds=5, transport=network)
    assert run.sent >= 2 and any("cannot keep the capture's state" in p for p in run.problems)
    done = runner.capture(env, hooks.claude_code_targets(payload), seconds=5, transport=network)
    assert done.delivered
    assert stored(app, "claude-code") == imported(claude_code, tmp_path / "p")


def test_a_device_is_not_read_and_two_runs_at_once_take_turns(
    app: Api, network: Network, tmp_path: Path
) -> None:
    env = agent("claude-code", tmp_path)
    started = time.monotonic()
    found = runner.capture(
        env, hooks.claude_code_targets({"transcript_path": os.devnull}), seconds=5
    )
    zero = runner.capture(
        env, hooks.claude_code_targets({"transcript_path": "/dev/zero"}), seconds=5
    )
    assert time.monotonic() - started < 2
    assert [p.endswith("not a regular file: not read") for p in found.problems + zero.problems] == [
        True,
        True,
    ]
    sid = "aaaaaaaa-0000-4000-8000-000000000005"
    transcript = ClaudeTranscript(tmp_path / "p" / f"{sid}.jsonl", sid)
    for n in range(20):
        transcript.user(f"question {n}")
        transcript.assistant(f"m{n}", {"type": "text", "text": f"answer {n}"})
    payload = {"session_id": sid, "transcript_path": str(transcript.path)}
    summaries: list[runner.Summary] = []

    def run() -> None:
        summaries.append(
            runner.capture(env, hooks.claude_code_targets(payload), seconds=10, transport=network)
        )

    both = [threading.Thread(target=run) for _ in range(2)]
    for thread in both:
        thread.start()
    for thread in both:
        thread.join()
    assert sorted(s.sent for s in summaries) == [0, 40]  # the second found it all taken
    assert stored(app, "claude-code") == imported(claude_code, tmp_path / "p")


def test_what_was_erased_is_not_captured_again(app: Api, network: Network, tmp_path: Path) -> None:
    sid = "aaaaaaaa-0000-4000-8000-000000000006"
    transcript = ClaudeTranscript(tmp_path / "p" / f"{sid}.jsonl", sid)
    transcript.user("a secret plan")
    transcript.assistant("m1", {"type": "text", "text": "noted"})
    payload = {"session_id": sid, "transcript_path": str(transcript.path)}
    runner.capture(
        agent("claude-code", tmp_path),
        hooks.claude_code_targets(payload),
        seconds=5,
        transport=network,
    )
    [row] = app.client.get("/v1/files", params={"agent_id": "claude-code"}).json()["files"]
    assert app.client.delete(f"/v1/files/{row['file_id']}").status_code == 204
    # a capture that has forgotten what it took (another machine, a lost state) reads it all
    again = runner.capture(
        agent("claude-code", tmp_path, SGME_SPOOL_DIR=str(tmp_path / "other-spool")),
        hooks.claude_code_targets(payload),
        seconds=5,
        transport=network,
    )
    assert (again.erased, again.sent) == (2, 2)
    assert stored(app, "claude-code") == {}
    report = reimport(app, network, "claude-code", tmp_path / "p")
    assert (report.messages, report.erased, report.files) == (0, 2, 0)
    assert stored(app, "claude-code") == {}
    # what comes after the erasure is a new file
    transcript.user("a new question")
    runner.capture(
        agent("claude-code", tmp_path),
        hooks.claude_code_targets(payload),
        seconds=5,
        transport=network,
    )
    assert stored(app, "claude-code") == {sid: [("user", "a new question", None)]}


def test_a_session_an_earlier_version_stored_is_not_captured_twice(
    app: Api, network: Network, tmp_path: Path
) -> None:
    """An earlier version imported the turn whole under its turn key; this version's capture
    meets the transcript for the first time (a resumed session, say)."""
    sid = "aaaaaaaa-0000-4000-8000-000000000007"
    transcript = ClaudeTranscript(tmp_path / "p" / f"{sid}.jsonl", sid)
    transcript.user("Read notes.md")
    transcript.assistant("m1", {"type": "text", "text": "It says hi."})
    first = json.loads(transcript.lines[0])
    turn = [
        {"role": "user", "content": "Read notes.md", "ts": convention.ts(first["timestamp"])},
        {
            "role": "assistant",
            "content": "It says hi.",
            "ts": convention.ts(json.loads(transcript.lines[1])["timestamp"]),
        },
    ]
    app.append(
        {
            "agent_id": "claude-code",
            "session_key": sid,
            "idempotency_key": convention.key("claude-code", sid, first["uuid"], turn),
            "messages": turn,
        }
    )
    transcript.user("And now?")
    payload = {"session_id": sid, "transcript_path": str(transcript.path)}
    found = runner.capture(
        agent("claude-code", tmp_path),
        hooks.claude_code_targets(payload),
        seconds=5,
        transport=network,
    )
    assert found.sent == 3
    assert stored(app, "claude-code") == {
        sid: [
            ("user", "Read notes.md", None),
            ("assistant", "It says hi.", None),
            ("user", "And now?", None),
        ]
    }


def test_a_unit_refused_for_its_metadata_is_sent_without_it(
    db: database.Database, data_dir: Path, database_url: str, tmp_path: Path
) -> None:
    from pipeline.settings import Limits

    strict = Api(db, data_dir, database_url, Limits(max_metadata_bytes=32))
    try:
        sid = "aaaaaaaa-0000-4000-8000-000000000008"
        transcript = ClaudeTranscript(tmp_path / "p" / f"{sid}.jsonl", sid)
        transcript.user("hello")
        payload = {"session_id": sid, "transcript_path": str(transcript.path)}
        found = runner.capture(
            agent("claude-code", tmp_path),
            hooks.claude_code_targets(payload),
            seconds=5,
            transport=Network(strict.client._transport),
        )
        assert (found.sent, found.spooled, found.failure) == (1, 0, None)
        assert not (tmp_path / "spool" / "rejected").exists()
        assert stored(strict, "claude-code") == {sid: [("user", "hello", None)]}
    finally:
        strict.close()


def test_a_long_transcript_read_for_the_first_time_keeps_to_the_budget(
    app: Api, network: Network, tmp_path: Path
) -> None:
    """What the run cannot send in its budget it spools, keeping back the time that takes;
    the next runs deliver it and read on: everything lands once, in order."""
    env = agent("claude-code", tmp_path)
    sid = "aaaaaaaa-0000-4000-8000-000000000009"
    transcript = ClaudeTranscript(tmp_path / "p" / f"{sid}.jsonl", sid)
    text = "words of a turn " * 200
    for n in range(1500):
        transcript.user(f"question {n}: {text}")
        transcript.assistant(f"m{n}", {"type": "text", "text": f"answer {n}: {text}"})
    payload = {"session_id": sid, "transcript_path": str(transcript.path)}
    started = time.monotonic()
    first = runner.capture(env, hooks.claude_code_targets(payload), seconds=1.5, transport=network)
    took = time.monotonic() - started
    assert took < 2.0, f"the run took {took:.2f} s of a 1.5 s budget"
    assert first.sent + first.spooled > 0
    for _ in range(20):
        found = runner.capture(
            env, hooks.claude_code_targets(payload), seconds=30, transport=network
        )
        if found.delivered and found.unchanged:
            break
    assert stored(app, "claude-code") == imported(claude_code, tmp_path / "p")
