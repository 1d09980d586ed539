"""The keys earlier versions gave Claude Code and Codex turns, so that a turn they stored
whole is not stored again record by record (docs/clients.md, "Keys").

Earlier versions cut a transcript into turns — a user message and everything up to the next
one — and keyed each turn ``{source}:{session}:{turn}:{hash of what it said}``, appending it
whole once it looked finished. This version keys what the source itself identifies (a Claude
Code record, a Codex item: :func:`convention.unit_key`). Each unit of a turn an earlier version
could have stored carries that turn's key as its ``legacy_key``; the server answers a unit
whose turn it stored under that key as already stored, and writes nothing.

The turns are those the earlier readers made of the file: every turn, finished or not (a key
no version stored is simply not found), on every branch of a Claude Code transcript (an
earlier capture stored a branch while it was live). Computed once for a whole file, when it is
read from its start — ``sgme import``, and a capture's first reading of a transcript — since
later readings only meet units no earlier version saw.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pipeline.importers import convention

CLAUDE_CODE = "claude-code"
CODEX = "codex"
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.I)
_INJECTED = re.compile(r"\s*<([A-Za-z_][\w-]*)[^>]*>.*</\1>\s*", re.S)
_INJECTED_PREFIXES = ("# AGENTS.md instructions", "<user_instructions>", "<environment_context>")


def _injected(text: str) -> bool:
    return text.lstrip().startswith(_INJECTED_PREFIXES) or bool(_INJECTED.fullmatch(text))


def _turn_key(source: str, session: str, position: str, messages: list[Any]) -> str:
    """The key the earlier runner sent a turn's (first) append under."""
    parts = [part for m in messages for part in convention.split_large(m)]
    key = convention.key(source, session, position, parts)
    return key if len(list(convention.batches(parts))) == 1 else f"{key}/0"


# ---------------------------------------------------------------------------------------------
# Claude Code: the records of a branch, cut into turns, one assistant message per message.id


class _Turns:
    """The earlier reader's conversion of one branch: turns of messages, and which turn each
    record went into."""

    def __init__(self) -> None:
        self.turns: list[tuple[str, list[convention.Message]]] = []
        self.members: dict[str, int] = {}  # record uuid -> index into turns
        self.names: dict[str, str] = {}
        self._open: object = None
        self._waiting: list[str] = []  # uuids of the assistant records being merged
        self._thinking: list[convention.Message] = []
        self._text: list[str] = []
        self._calls: list[tuple[Any, Any, Any]] = []
        self._when: str | None = None

    def _add(self, message: convention.Message, uuid: str) -> None:
        if message["role"] == "user" or not self.turns:
            self.turns.append((uuid, []))
        self.turns[-1][1].append(message)

    def _flush(self, uuid: str) -> None:
        if self._open is None:
            return
        messages = [
            *self._thinking,
            *convention.assistant_turn("\n\n".join(self._text), self._calls, self._when),
        ]
        for message in messages:
            self._add(message, uuid)
        for waiting in self._waiting:
            self.members[waiting] = len(self.turns) - 1
        self._open, self._waiting = None, []
        self._thinking, self._text, self._calls = [], [], []

    def _user(self, entry: Mapping[str, Any], content: Any, uuid: str) -> None:
        when = convention.ts(entry.get("timestamp"))
        texts: list[str] = []

        def add_text() -> None:
            text = "\n".join(texts)
            if text.strip():
                self._add(convention.text_message("user", text, when), uuid)
            texts.clear()

        for block in content if isinstance(content, list) else [content]:
            if isinstance(block, Mapping) and block.get("type") == "tool_result":
                add_text()
                answered = block.get("tool_use_id")
                name = self.names.get(str(answered), "tool")
                self._add(convention.tool_result(name, block.get("content"), when, answered), uuid)
            elif isinstance(block, Mapping) and block.get("type") == "image":
                texts.append("[image]")
            else:
                texts.append(convention.content_text(block))
        add_text()

    def _assistant(self, entry: Mapping[str, Any], message: Mapping[str, Any], uuid: str) -> None:
        message_id = message.get("id") or uuid
        if message_id != self._open:
            self._flush(uuid)
            self._open = message_id
            self._when = convention.ts(entry.get("timestamp"))
        self._waiting.append(uuid)
        content = message.get("content")
        for block in content if isinstance(content, list) else [content]:
            if isinstance(block, str):
                self._text.append(block)
            elif isinstance(block, Mapping):
                kind = block.get("type")
                if kind == "text" and isinstance(block.get("text"), str):
                    self._text.append(block["text"])
                elif kind == "tool_use":
                    name = convention.tool_name(block.get("name"))
                    if isinstance(block.get("id"), str):
                        self.names[block["id"]] = name
                    self._calls.append((name, block.get("input"), block.get("id")))
                elif kind in ("thinking", "redacted_thinking"):
                    text = block.get("thinking") if kind == "thinking" else "[redacted]"
                    found = convention.thinking(text, self._when)
                    if found is not None:
                        self._thinking.append(found)

    def take(self, entry: Mapping[str, Any]) -> None:
        uuid = str(entry.get("uuid"))
        message = entry.get("message")
        if entry.get("type") not in ("user", "assistant") or not isinstance(message, Mapping):
            return
        if entry.get("isCompactSummary"):
            self._flush(uuid)
            found = convention.summary(
                message.get("content"), convention.ts(entry.get("timestamp"))
            )
            if found is not None:
                self.turns.append((uuid, [found]))
                self.members[uuid] = len(self.turns) - 1
        elif entry.get("isMeta"):
            return
        elif entry.get("type") == "assistant":
            self._assistant(entry, message, uuid)
        else:
            self._flush(uuid)
            self._user(entry, message.get("content"), uuid)
            if self.turns:
                self.members[uuid] = len(self.turns) - 1


def _chain(
    by_uuid: Mapping[str, Mapping[str, Any]], leaf: Mapping[str, Any]
) -> list[Mapping[str, Any]]:
    """The records from the root to ``leaf``, across compaction boundaries."""
    chain: list[Mapping[str, Any]] = []
    seen: set[str] = set()
    current: Mapping[str, Any] | None = leaf
    while current is not None:
        uuid = str(current.get("uuid"))
        if uuid in seen:
            break
        seen.add(uuid)
        chain.append(current)
        parent = current.get("parentUuid")
        if not parent and current.get("subtype") == "compact_boundary":
            parent = current.get("logicalParentUuid")
        current = by_uuid.get(parent) if isinstance(parent, str) else None
    chain.reverse()
    return chain


def claude_code(path: Path, records: Iterable[Any]) -> dict[str, str]:
    """Record uuid → the key of the turn an earlier version made of it, for every branch."""
    by_uuid: dict[str, Mapping[str, Any]] = {}
    entries: list[Mapping[str, Any]] = []
    for value in records:
        if not isinstance(value, Mapping) or not isinstance(value.get("uuid"), str):
            continue
        kind = value.get("type")
        if kind not in ("user", "assistant", "system"):
            continue
        if kind != "system" and not isinstance(value.get("message"), Mapping):
            continue
        by_uuid[value["uuid"]] = value
        if kind != "system":
            entries.append(value)
    main = [e for e in entries if not e.get("isSidechain")] or entries
    found: dict[str, str] = {}
    covered: set[str] = set()
    for leaf in reversed(main):  # the latest branch first: its keys win where branches share
        if leaf["uuid"] in covered:
            continue
        chain = _chain(by_uuid, leaf)
        covered.update(str(e.get("uuid")) for e in chain)
        session = _session_key(path, chain[0])
        turns = _Turns()
        for entry in chain:
            turns.take(entry)
        turns._flush("")
        keys = [
            _turn_key(CLAUDE_CODE, session, first, messages) if messages else None
            for first, messages in turns.turns
        ]
        for uuid, index in turns.members.items():
            if keys[index] is not None:
                found.setdefault(uuid, keys[index])  # type: ignore[arg-type]
    return found


def _session_key(path: Path, first: Mapping[str, Any]) -> str:
    session_id = str(first.get("sessionId") or path.name.removesuffix(".jsonl"))
    agent = first.get("agentId")
    if path.name.startswith("agent-") or (isinstance(agent, str) and first.get("isSidechain")):
        name = agent if isinstance(agent, str) else path.name.removesuffix(".jsonl")
        return f"{session_id}/agent-{name.removeprefix('agent-')}"
    return session_id


# ---------------------------------------------------------------------------------------------
# Codex: completed turns of a rollout


class _Codex:
    def __init__(self, user_events: bool) -> None:
        self.session_id: str | None = None
        self.turns: list[dict[str, Any]] = []
        self.current: dict[str, Any] | None = None
        self.calls: dict[str, str] = {}
        self.user_events = user_events
        self.last_ts: str | None = None

    def open(self, turn_id: str | None) -> dict[str, Any]:
        self.close()
        self.current = {
            "id": turn_id,
            "messages": [],
            "lines": [],
            "user": False,
            "complete": False,
        }
        return self.current

    def close(self) -> None:
        if self.current is not None and self.current["messages"]:
            self.turns.append(self.current)
        self.current = None

    def add(self, message: convention.Message, line: int) -> None:
        turn = self.current if self.current is not None else self.open(None)
        turn["messages"].append(message)
        turn["lines"].append(line)

    def user(self, text: str, when: str | None, line: int, explicit: bool) -> None:
        if self.current is None or (self.current["user"] and not explicit):
            self.open(None)
        assert self.current is not None
        self.current["user"] = True
        self.add(convention.text_message("user", text, when), line)

    def item(self, payload: Mapping[str, Any], when: str | None, line: int, x: bool) -> None:
        kind = str(payload.get("type", ""))
        if kind == "message":
            role = payload.get("role")
            text = convention.content_text(payload.get("content"))
            if role == "assistant" and text.strip():
                self.add(convention.text_message("assistant", text, when), line)
            elif role == "user" and not self.user_events and text.strip() and not _injected(text):
                self.user(text, when, line, x)
        elif kind.endswith("_call_output"):
            answered = payload.get("call_id")
            name = self.calls.get(str(answered), kind.removesuffix("_output"))
            output = payload.get("output")
            if isinstance(output, Mapping) and "content" in output:
                text = convention.content_text(output["content"])
            elif isinstance(output, str):
                text = convention.clean_text(output)
            else:
                text = convention.arguments_text(output)
            self.add(convention.tool_result(name, text, when, answered), line)
        elif kind.endswith("_call"):
            name = convention.tool_name(payload.get("name"), default=kind.removesuffix("_call"))
            arguments = next(
                (payload[f] for f in ("arguments", "input", "action") if f in payload), None
            )
            call_id = payload.get("call_id")
            if isinstance(call_id, str):
                self.calls[call_id] = name
            self.add(convention.tool_call(name, arguments, when, call_id), line)

    def record(self, value: Any, line: int, explicit: bool) -> None:
        if not isinstance(value, Mapping):
            return
        if "payload" in value and "type" in value:
            when = convention.ts(value.get("timestamp")) or self.last_ts
            self.last_ts = when
            kind, payload = value["type"], value["payload"]
            if not isinstance(payload, Mapping):
                return
            if kind == "session_meta" and self.session_id is None:
                found = payload.get("id")
                self.session_id = found if isinstance(found, str) and found else None
            elif kind == "response_item":
                self.item(payload, when, line, explicit)
            elif kind == "event_msg":
                self.event(payload, when, line, explicit)
            elif kind == "turn_context":
                turn_id = payload.get("turn_id")
                if self.current is not None and self.current["id"] is None:
                    self.current["id"] = turn_id if isinstance(turn_id, str) else None
            return
        if "record_type" in value:
            return
        if "type" not in value and "id" in value and self.session_id is None:
            found = value.get("id")
            self.session_id = found if isinstance(found, str) and found else None
            self.last_ts = convention.ts(value.get("timestamp"))
        elif isinstance(value.get("type"), str):
            self.item(value, self.last_ts, line, explicit)

    def event(self, payload: Mapping[str, Any], when: str | None, line: int, x: bool) -> None:
        kind = payload.get("type")
        turn_id = payload.get("turn_id")
        turn_id = turn_id if isinstance(turn_id, str) and turn_id else None
        if kind == "task_started":
            self.open(turn_id)
        elif kind == "user_message":
            text = convention.content_text(payload.get("message"))
            if text.strip():
                self.user(text, when, line, x)
        elif kind == "task_complete":
            turn = self.current if self.current is not None else self.open(None)
            turn["id"] = turn["id"] or turn_id
            turn["complete"] = True
            self.close()
        elif kind == "turn_aborted":
            self.current = None


def codex(path: Path, records: list[tuple[int, Any]]) -> dict[int, str]:
    """Line → the key of the turn an earlier version made of its item (the turns it took:
    completed ones)."""
    explicit = user_events = False
    for _, value in records:
        if isinstance(value, Mapping) and isinstance(value.get("payload"), Mapping):
            kind = value["payload"].get("type")
            explicit = explicit or kind == "task_complete"
            user_events = user_events or (
                value.get("type") == "event_msg" and kind == "user_message"
            )
    reader = _Codex(user_events)
    for line, value in records:
        reader.record(value, line, explicit)
    still_open = reader.current
    reader.close()
    done = []  # the earlier reader numbered the turns it took: the completed ones
    for turn in reader.turns:
        last = turn["messages"][-1]
        answered = (
            last["role"] == "assistant" and convention.kind("assistant", last["content"]) == "text"
        )
        if turn["complete"] or (not explicit and (turn is not still_open or answered)):
            done.append(turn)
    session = reader.session_id
    if session is None:
        found = _UUID.findall(path.name)
        session = found[-1] if found else path.name.split(".")[0]
    keys: dict[int, str] = {}
    for ordinal, turn in enumerate(done, start=1):
        position = turn["id"] or f"n{ordinal}"
        key = _turn_key(CODEX, session, position, turn["messages"])
        for line in turn["lines"]:
            keys.setdefault(line, key)
    return keys
