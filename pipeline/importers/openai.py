"""OpenAI chat transcripts: ``{"messages": [...]}`` records, as a JSON list or JSON Lines.

Roles ``system``, ``developer`` (written as ``system``), ``user``, ``assistant`` and ``tool``
(legacy ``function`` too). An assistant message's ``tool_calls`` (``[{"id", "function":
{"name", "arguments"}}]``, or the legacy ``function_call``) become tool-call messages after its
text; a tool message's name comes from ``name``/``tool_name`` or, failing those, from the call
its ``tool_call_id`` answers. A record's session_key is its ``id`` (or ``conversation_id``,
``session_id``), else a hash of its messages, so the same conversation imports to the same file
wherever the file lies.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from pipeline.importers import convention, source

SOURCE = "openai"
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


def files(path: Path) -> list[Path]:
    """``path``, or the ``.json``/``.jsonl`` files (``.zst`` too) under it."""
    return source.walk(path, (".json", ".jsonl", ".json.zst", ".jsonl.zst"))


def _calls(message: Mapping[str, Any]) -> list[tuple[Any, Any, Any]]:
    """``(id, name, arguments)`` of an assistant message's calls, in order."""
    out: list[tuple[Any, Any, Any]] = []
    calls = message.get("tool_calls")
    for call in calls if isinstance(calls, list) else []:
        if not isinstance(call, Mapping):
            continue
        function = call.get("function")
        spec = function if isinstance(function, Mapping) else call
        out.append((call.get("id"), spec.get("name"), spec.get("arguments")))
    legacy = message.get("function_call")
    if isinstance(legacy, Mapping):
        out.append((None, legacy.get("name"), legacy.get("arguments")))
    return out


def convert(
    messages: Sequence[Any], *, when: str | None = None
) -> tuple[list[convention.Message], int]:
    """OpenAI-style messages in the convention, and how many were left out (not an object,
    an unknown role, or empty). ``when`` stands in for messages without a time of their own."""
    out: list[convention.Message] = []
    skipped = 0
    names: dict[str, str] = {}  # tool_call_id -> tool name, for results that lack one
    for message in messages:
        if not isinstance(message, Mapping):
            skipped += 1
            continue
        stamp = convention.ts(message.get("timestamp", message.get("ts"))) or when
        role = message.get("role")
        if role == "assistant":
            calls = _calls(message)
            for call_id, name, _ in calls:
                if isinstance(call_id, str) and isinstance(name, str):
                    names[call_id] = name
            converted = convention.assistant_turn(
                message.get("content"), [(name, args) for _, name, args in calls], stamp
            )
            if not converted:
                skipped += 1
            out.extend(converted)
        elif role in ("tool", "function"):
            name = message.get("tool_name") or message.get("name")
            if not name:
                name = names.get(str(message.get("tool_call_id")))
            out.append(convention.tool_result(name, message.get("content"), stamp))
        elif role in ROLES:
            text = convention.text_message(ROLES[role], message.get("content"), stamp)
            if text["content"].strip():
                out.append(text)
            else:
                skipped += 1
        else:
            skipped += 1
    return out, skipped


def turns(messages: Sequence[convention.Message]) -> list[list[convention.Message]]:
    """Messages cut into turns: a turn starts at each user message (what comes before the
    first one, a system prompt say, is a turn of its own)."""
    out: list[list[convention.Message]] = []
    for message in messages:
        if not out or message["role"] == "user":
            out.append([])
        out[-1].append(message)
    return out


def session_key(
    record: Mapping[str, Any], messages: Sequence[convention.Message], *, prefix: str = SOURCE
) -> str:
    """The record's own id, else ``{prefix}-`` and a hash of its converted messages."""
    for field in ("id", "conversation_id", "session_id"):
        value = record.get(field)
        if isinstance(value, str | int) and not isinstance(value, bool) and str(value).strip():
            return convention.clean_text(str(value)).strip()[:512]
    return f"{prefix}-{convention.digest(messages)[:24]}"


def read(path: Path) -> Iterator[source.Session | source.Problem]:
    """Every conversation record of one file."""
    for item in source.json_records(path):
        if isinstance(item, source.Problem):
            yield item
            continue
        line, number, record = item
        if isinstance(record, list):
            record = {"messages": record}
        if not isinstance(record, Mapping) or not isinstance(record.get("messages"), list):
            yield source.Problem(str(path), line, f"record {number}: no 'messages' list")
            continue
        messages, skipped = convert(record["messages"])
        if not messages:
            yield source.Problem(str(path), line, f"record {number}: no messages to import")
            continue
        yield source.Session(
            source=SOURCE,
            session_key=session_key(record, messages),
            metadata=convention.metadata(
                {
                    "importer": SOURCE,
                    "file": path.name,
                    "record": number,
                    "model": record.get("model"),
                }
            ),
            turns=tuple(
                source.Turn(position=str(i), messages=tuple(turn), line=line)
                for i, turn in enumerate(turns(messages))
            ),
            origin=str(path),
            skipped=skipped,
        )
