"""Transcripts written the way Claude Code and Codex write them, a record at a time (or a byte
at a time), for the capture tests to play an agent: each writer also keeps the L0 messages a
reader of the file should find, so every hook run can be checked message by message.

Claude Code (``~/.claude/projects/<cwd>/<sessionId>.jsonl``): one JSON object a line with
``type``, ``uuid``, ``parentUuid``, ``sessionId``, ``timestamp``, ``cwd``, ``version``,
``gitBranch``, ``isSidechain``, ``userType``, ``message``; an assistant message is one line per
content block (thinking, text, tool_use), the lines sharing ``message.id``; tool results are
user lines of ``tool_result`` blocks; a compaction is a ``system`` ``compact_boundary`` line
(no parent, ``logicalParentUuid``) and an ``isCompactSummary`` user line; subagents write
``<sessionId>/subagents/agent-<id>.jsonl`` (``isSidechain``, ``agentId``); a resumed session is a
new file that first copies the old lines as they were.

Codex (``$CODEX_HOME/sessions/YYYY/MM/DD/rollout-<time>-<id>.jsonl``): ``{"timestamp", "type",
"payload"}`` lines — ``session_meta``, ``turn_context``, ``event_msg`` (``task_started``,
``user_message``, ``agent_message``, ``task_complete``) and ``response_item`` (``message``,
``function_call`` / ``function_call_output``, ``reasoning``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeline.importers import convention

Expected = tuple[str, str, str | None]  #: role, content, tool_name as /messages shows them


def _stamp(n: int) -> str:
    return f"2026-08-03T11:{n // 60:02d}:{n % 60:02d}.250Z"


class ClaudeTranscript:
    """A Claude Code transcript file that grows a line at a time."""

    def __init__(self, path: Path, session_id: str, *, agent_id: str | None = None) -> None:
        self.path = path
        self.session_id = session_id
        self.agent_id = agent_id
        self.lines: list[str] = []
        self.expected: list[Expected] = []
        self.last: str | None = None
        self.clock = 0
        #: called after every write (a hook after each record)
        self.after: Callable[[], None] = lambda: None
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()

    def write(self, record: dict[str, Any], *, partial: bool = False) -> None:
        """Append one line; ``partial``: only its first half, as a writer caught mid-line."""
        line = json.dumps(record, ensure_ascii=False)
        with self.path.open("a", encoding="utf-8") as out:
            if partial:
                out.write(line[: len(line) // 2])
            else:
                out.write(line + "\n")
        if not partial:
            self.lines.append(line)
        self.after()

    def bytewise(self, record: dict[str, Any], between: Callable[[], None]) -> None:
        """Append one line a byte at a time, ``between()`` after each byte (a hook that runs
        while the line is being written)."""
        data = (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")
        for i in range(len(data)):
            with self.path.open("ab") as out:
                out.write(data[i : i + 1])
            between()
        self.lines.append(json.dumps(record, ensure_ascii=False))

    def raw(self, data: bytes) -> None:
        """Append a line that is no record: damaged, not UTF-8, nested too deep."""
        with self.path.open("ab") as out:
            out.write(data + b"\n")
        self.after()

    def rewind(self, to: str) -> None:
        """Go back to an earlier record ("fork from here", an edited prompt): the next record
        goes on from ``to``; the branch after it stays in the file."""
        self.last = to

    def finish_partial(self, record: dict[str, Any]) -> None:
        """Write the rest of the half-written line."""
        line = json.dumps(record, ensure_ascii=False)
        with self.path.open("a", encoding="utf-8") as out:
            out.write(line[len(line) // 2 :] + "\n")
        self.lines.append(line)

    def record(self, kind: str, message: Any = None, **extra: Any) -> dict[str, Any]:
        self.clock += 1
        uuid = f"{self.agent_id or 'main'}-{self.session_id[:4]}-{self.clock:03d}"
        record: dict[str, Any] = {
            "type": kind,
            "uuid": uuid,
            "parentUuid": self.last,
            "sessionId": self.session_id,
            "timestamp": _stamp(self.clock),
            "cwd": "/src/app",
            "version": "2.0.55",
            "gitBranch": "main",
            "isSidechain": self.agent_id is not None,
            "userType": "external",
            **extra,
        }
        if self.agent_id is not None:
            record["agentId"] = self.agent_id
        if message is not None:
            record["message"] = message
        self.last = uuid
        return record

    def user(self, text: str) -> None:
        self.write(self.record("user", {"role": "user", "content": text}))
        self.expected.append(("user", text, None))

    def blocks(self, message_id: str, *blocks: dict[str, Any]) -> list[dict[str, Any]]:
        """An assistant message as Claude Code writes it: one line per content block."""
        records = []
        for block in blocks:
            message = {
                "id": message_id,
                "type": "message",
                "role": "assistant",
                "model": "claude-sonnet-4-5",
                "content": [block],
                "stop_reason": None,
            }
            records.append(self.record("assistant", message, requestId=f"req_{message_id}"))
        return records

    def assistant(self, message_id: str, *blocks: dict[str, Any]) -> None:
        """Write an assistant message and note what L0 shows for it: a message per block
        (thinking, text, a call), in the order written."""
        for record in self.blocks(message_id, *blocks):
            self.write(record)
        for block in blocks:
            self.expected.append(expected_block(block))

    def result_record(self, tool_use_id: str, output: str) -> dict[str, Any]:
        content = [{"type": "tool_result", "tool_use_id": tool_use_id, "content": output}]
        return self.record("user", {"role": "user", "content": content})

    def result(self, tool_use_id: str, name: str, output: str) -> None:
        self.write(self.result_record(tool_use_id, output))
        self.expect_result(tool_use_id, name, output)

    def expect_result(self, tool_use_id: str, name: str, output: str) -> None:
        self.expected.append(("tool", convention.result_body(output, tool_use_id), name))

    def compact(self, summary: str) -> None:
        """A compaction: the boundary (a new root), then the summary the model wrote."""
        before = self.last
        self.last = None
        self.write(
            self.record(
                "system",
                subtype="compact_boundary",
                content="Conversation compacted",
                logicalParentUuid=before,
                compactMetadata={"trigger": "manual", "preTokens": 120000},
            )
        )
        self.write(self.record("user", {"role": "user", "content": summary}, isCompactSummary=True))
        self.expected.append(("system", f"**compaction summary**\n\n{summary}", None))

    def resume(self, path: Path, session_id: str) -> ClaudeTranscript:
        """``claude --resume``: a new file, a summary line, the old lines copied as they were,
        then the new session's own lines (parented on the old last one)."""
        resumed = ClaudeTranscript(path, session_id)
        resumed.write({"type": "summary", "summary": "Notes and X", "leafUuid": self.last})
        with path.open("a", encoding="utf-8") as out:
            out.write("".join(line + "\n" for line in self.lines))
        resumed.lines += self.lines
        resumed.last, resumed.clock = self.last, self.clock
        return resumed


def expected_block(block: dict[str, Any]) -> Expected:
    """What L0 shows for one assistant content block."""
    if block["type"] == "thinking":
        return ("assistant", f"**thinking**\n\n{block['thinking']}", None)
    if block["type"] == "tool_use":
        arguments = json.dumps(block["input"], ensure_ascii=False)
        body = convention.call_body(block["name"], arguments, block["id"])
        return ("assistant", body, block["name"])
    return ("assistant", block["text"], None)


class CodexRollout:
    """A Codex rollout file that grows a record at a time."""

    def __init__(self, home: Path, thread_id: str) -> None:
        self.path = home / "sessions" / "2026" / "08" / "03"
        self.path = self.path / f"rollout-2026-08-03T11-18-00-{thread_id}.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.thread_id = thread_id
        self.clock = 0
        self.expected: list[Expected] = []
        #: called after every write (a hook after each record)
        self.after: Callable[[], None] = lambda: None
        self.write(
            "session_meta",
            {
                "id": thread_id,
                "cwd": "/src/app",
                "originator": "codex_cli_rs",
                "cli_version": "0.46.0",
                "source": "cli",
            },
        )

    def write(self, kind: str, payload: dict[str, Any]) -> None:
        self.clock += 1
        line = {"timestamp": _stamp(self.clock), "type": kind, "payload": payload}
        with self.path.open("a", encoding="utf-8") as out:
            out.write(json.dumps(line) + "\n")
        self.after()

    def raw(self, data: bytes) -> None:
        """Append a line that is no record: damaged, not UTF-8, nested too deep."""
        with self.path.open("ab") as out:
            out.write(data + b"\n")
        self.after()

    def bytewise(self, kind: str, payload: dict[str, Any], between: Callable[[], None]) -> None:
        """Append one record a byte at a time, ``between()`` after each byte."""
        self.clock += 1
        line = {"timestamp": _stamp(self.clock), "type": kind, "payload": payload}
        data = (json.dumps(line) + "\n").encode("utf-8")
        for i in range(len(data)):
            with self.path.open("ab") as out:
                out.write(data[i : i + 1])
            between()

    def compact(self, summary: str) -> None:
        """Codex's compaction: the summary it continues from, as a ``compacted`` record."""
        self.write("compacted", {"message": summary, "replacement_history": []})
        self.expected.append(("system", f"**compaction summary**\n\n{summary}", None))

    def turn(self, turn_id: str, question: str, *, complete: bool = True) -> None:
        """One turn with a shell call; ``complete`` also writes ``task_complete``."""
        self.write("event_msg", {"type": "task_started", "turn_id": turn_id})
        self.write("turn_context", {"turn_id": turn_id, "model": "gpt-5-codex", "cwd": "/src"})
        self.write("event_msg", {"type": "user_message", "message": question, "kind": "plain"})
        self.write("response_item", {"type": "reasoning", "summary": [], "encrypted_content": "x"})
        call_id = f"call_{turn_id}"
        arguments = json.dumps({"command": ["ls", turn_id]})
        self.write(
            "response_item",
            {"type": "function_call", "name": "shell", "arguments": arguments, "call_id": call_id},
        )
        self.write(
            "response_item",
            {"type": "function_call_output", "call_id": call_id, "output": f"{turn_id}.txt"},
        )
        answer = f"Found {turn_id}.txt."
        self.write(
            "response_item",
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": answer}],
            },
        )
        self.expected += [
            ("user", question, None),
            ("assistant", convention.call_body("shell", arguments, call_id), "shell"),
            ("tool", convention.result_body(f"{turn_id}.txt", call_id), "shell"),
            ("assistant", answer, None),
        ]
        if complete:
            self.complete(turn_id, answer)

    def complete(self, turn_id: str, answer: str = "") -> None:
        self.write(
            "event_msg",
            {"type": "task_complete", "turn_id": turn_id, "last_agent_message": answer},
        )
