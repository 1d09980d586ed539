"""Codex CLI rollouts: ``$CODEX_HOME/sessions/YYYY/MM/DD/rollout-…-<id>.jsonl`` (or
``.jsonl.zst``), one session per file.

Each line is ``{"timestamp", "type", "payload"}``:

- ``session_meta`` — the session id (the session_key), cwd, originator, cli_version, source,
  git — the metadata;
- ``event_msg`` ``user_message`` — what the user typed. User messages among the
  ``response_item`` records also carry injected context (environment, AGENTS.md), so they
  are used only by files that have no ``user_message`` events;
- ``response_item`` ``message`` (role assistant) — assistant text; ``function_call`` /
  ``custom_tool_call`` (and any other ``*_call``) — a tool call in the convention, with its
  ``arguments`` (or ``input``) exactly as recorded and its ``call_id``; ``*_call_output`` — the
  tool result, named after its call, with the id it answers; ``reasoning`` (encrypted, or a
  summary of it) is left out;
- ``event_msg`` ``task_started`` / ``task_complete`` / ``turn_aborted`` — turn boundaries with
  a ``turn_id``. Only completed turns are imported: a turn still running (or aborted) is left
  for the next run. Files from before these events existed count a turn as complete when
  another user message follows it or it ends with assistant text.

Rollouts written before the envelope (until 2025-09) hold a bare session record (``id``,
``timestamp``, ``instructions``) on the first line and bare response items after it; they are
read the same way. Keys: ``codex:{session id}:{turn id}:{hash}``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from pipeline.importers import convention, source

SOURCE = "codex"
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.I)
#: a user "message" that is one injected block, e.g. ``<environment_context>…</…>``
_INJECTED = re.compile(r"\s*<([A-Za-z_][\w-]*)[^>]*>.*</\1>\s*", re.S)
_INJECTED_PREFIXES = ("# AGENTS.md instructions", "<user_instructions>", "<environment_context>")


def files(path: Path) -> list[Path]:
    """``path``, or every rollout (``.jsonl``, ``.jsonl.zst``) under a sessions directory."""
    return source.walk(path, (".jsonl", ".jsonl.zst"))


class _Turn:
    def __init__(self, turn_id: str | None, line: int) -> None:
        self.turn_id = turn_id
        self.line = line
        self.messages: list[convention.Message] = []
        self.complete = False
        self.has_user = False


def _injected(text: str) -> bool:
    return text.lstrip().startswith(_INJECTED_PREFIXES) or bool(_INJECTED.fullmatch(text))


def _output_text(output: Any) -> str:
    """A call output: a string as recorded; ``{"content": …}`` (some versions) by its content."""
    if isinstance(output, Mapping) and "content" in output:
        return convention.content_text(output["content"])
    if isinstance(output, str):
        return convention.clean_text(output)
    return convention.arguments_text(output)


class _Reader:
    """The state of reading one rollout."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.session_id: str | None = None
        self.meta: dict[str, Any] = {}
        self.turns: list[_Turn] = []
        self.current: _Turn | None = None
        self.calls: dict[str, str] = {}  # call_id -> tool name
        self.skipped = 0
        self.explicit = False  # the file marks turn ends (task_complete)
        self.user_events = False  # the file has event_msg user_message records
        self.last_ts: str | None = None

    def open_turn(self, turn_id: str | None, line: int) -> _Turn:
        self.close_turn()
        self.current = _Turn(turn_id, line)
        return self.current

    def close_turn(self) -> None:
        if self.current is not None and self.current.messages:
            self.turns.append(self.current)
        self.current = None

    def turn(self, line: int) -> _Turn:
        return self.current if self.current is not None else self.open_turn(None, line)

    def add(self, message: convention.Message, line: int) -> None:
        self.turn(line).messages.append(message)

    def user(self, text: str, when: str | None, line: int) -> None:
        turn = self.current
        if turn is None or (turn.has_user and not self.explicit):
            # without turn events, a user message starts the next turn
            turn = self.open_turn(None, line)
        turn.has_user = True
        turn.messages.append(convention.text_message("user", text, when))

    def item(self, payload: Mapping[str, Any], when: str | None, line: int) -> None:
        """One response item (a message, a call, a call's output)."""
        kind = str(payload.get("type", ""))
        if kind == "message":
            role = payload.get("role")
            text = convention.content_text(payload.get("content"))
            if role == "assistant" and text.strip():
                self.add(convention.text_message("assistant", text, when), line)
            elif role == "user" and not self.user_events and text.strip() and not _injected(text):
                self.user(text, when, line)
        elif kind.endswith("_call_output"):
            answered = payload.get("call_id")
            name = self.calls.get(str(answered), kind.removesuffix("_output"))
            output = _output_text(payload.get("output"))
            self.add(convention.tool_result(name, output, when, answered), line)
        elif kind.endswith("_call"):
            name = convention.tool_name(payload.get("name"), default=kind.removesuffix("_call"))
            arguments = next(
                (payload[f] for f in ("arguments", "input", "action") if f in payload), None
            )
            call_id = payload.get("call_id")
            if isinstance(call_id, str):
                self.calls[call_id] = name
            self.add(convention.tool_call(name, arguments, when, call_id), line)

    def event(self, payload: Mapping[str, Any], when: str | None, line: int) -> None:
        kind = payload.get("type")
        turn_id = payload.get("turn_id")
        turn_id = turn_id if isinstance(turn_id, str) and turn_id else None
        if kind == "task_started":
            self.open_turn(turn_id, line)
        elif kind == "user_message":
            text = convention.content_text(payload.get("message"))
            if text.strip():
                self.user(text, when, line)
        elif kind == "task_complete":
            turn = self.turn(line)
            turn.turn_id = turn.turn_id or turn_id
            turn.complete = True
            self.close_turn()
        elif kind == "turn_aborted":
            if self.current is not None:
                self.skipped += len(self.current.messages)
            self.current = None

    def session_meta(self, payload: Mapping[str, Any], when: str | None) -> None:
        if self.session_id is not None:
            return  # a resumed or forked rollout repeats its ancestors' meta after its own
        session_id = payload.get("id")
        if isinstance(session_id, str) and session_id:
            self.session_id = session_id
        git = payload.get("git")
        self.meta = {
            "importer": SOURCE,
            "cwd": payload.get("cwd"),
            "originator": payload.get("originator"),
            "cli_version": payload.get("cli_version"),
            "source": payload.get("source") if isinstance(payload.get("source"), str) else None,
            "git_branch": git.get("branch") if isinstance(git, Mapping) else None,
            "git_commit": git.get("commit_hash") if isinstance(git, Mapping) else None,
            "repository_url": git.get("repository_url") if isinstance(git, Mapping) else None,
            "started_at": when,
        }

    def record(self, value: Any, line: int) -> str | None:
        """Take one line; a problem's detail when it is not a rollout record."""
        if not isinstance(value, Mapping):
            return "not a JSON object"
        if "payload" in value and "type" in value:
            when = convention.ts(value.get("timestamp")) or self.last_ts
            self.last_ts = when
            kind, payload = value["type"], value["payload"]
            if not isinstance(payload, Mapping):
                return f"{kind} record without an object payload"
            if kind == "session_meta":
                self.session_meta(payload, when)
            elif kind == "response_item":
                self.item(payload, when, line)
            elif kind == "event_msg":
                self.event(payload, when, line)
            elif kind == "turn_context":
                model = payload.get("model")
                if isinstance(model, str):
                    self.meta.setdefault("model", model)
                turn_id = payload.get("turn_id")
                if self.current is not None and self.current.turn_id is None:
                    self.current.turn_id = turn_id if isinstance(turn_id, str) else None
            return None
        # before the envelope: a bare session record, state records, bare response items
        if "record_type" in value:
            return None
        if "type" not in value and "id" in value and self.session_id is None:
            self.session_meta(value, convention.ts(value.get("timestamp")))
            self.last_ts = convention.ts(value.get("timestamp"))
            return None
        if isinstance(value.get("type"), str):
            self.item(value, self.last_ts, line)
            return None
        return "neither a rollout record nor a response item"

    def finish(self, done_turn: str | None = None) -> list[_Turn]:
        """The completed turns; the rest counted as skipped. ``done_turn`` names a turn its
        agent has said is over (a Stop hook, a notification) though the file may not say so
        yet: it counts as complete once it ends with assistant text."""
        open_turn = self.current
        self.close_turn()
        done: list[_Turn] = []
        for turn in self.turns:
            last = turn.messages[-1]
            answered = (
                last["role"] == "assistant"
                and convention.kind("assistant", last["content"]) == "text"
            )
            if done_turn is not None and turn.turn_id == done_turn and answered:
                complete = True
            elif self.explicit:
                complete = turn.complete
            else:
                # no turn events: complete when another turn follows or it ends with text
                complete = turn is not open_turn or answered
            if complete:
                done.append(turn)
            else:
                self.skipped += len(turn.messages)
        return done


def read(
    path: Path, *, done_turn: str | None = None, live: bool = False
) -> Iterator[source.Record]:
    """The session of one rollout file, and the lines it could not read. ``done_turn``: see
    :meth:`_Reader.finish`; ``live`` leaves a last line still being written for the next
    read."""
    records: list[tuple[int, Any]] = []
    for item in source.jsonl(path, live=live):
        if isinstance(item, source.Problem):
            yield item
        else:
            records.append(item)
    reader = _Reader(path)
    for _, value in records:
        if isinstance(value, Mapping) and isinstance(value.get("payload"), Mapping):
            kind = value["payload"].get("type")
            reader.explicit = reader.explicit or kind == "task_complete"
            reader.user_events = reader.user_events or (
                value.get("type") == "event_msg" and kind == "user_message"
            )
    for line, value in records:
        problem = reader.record(value, line)
        if problem is not None:
            yield source.Problem(str(path), line, problem)
    turns = reader.finish(done_turn)
    session_id = reader.session_id
    if session_id is None:
        found = _UUID.findall(path.name)
        session_id = found[-1] if found else path.name.split(".")[0]
    if not turns and not reader.skipped:
        return
    numbered = [
        source.Turn(
            position=turn.turn_id or f"n{ordinal}",
            messages=tuple(turn.messages),
            line=turn.line,
        )
        for ordinal, turn in enumerate(turns, start=1)
    ]
    yield source.Session(
        source=SOURCE,
        session_key=session_id,
        metadata=convention.metadata(reader.meta),
        turns=tuple(numbered),
        origin=str(path),
        skipped=reader.skipped,
    )
