"""OpenAI chat transcripts: ``{"messages": [...]}`` records, as a JSON list or JSON Lines.

Roles ``system``, ``developer`` (written as ``system``), ``user``, ``assistant`` and ``tool``
(legacy ``function`` too). An assistant message's ``tool_calls`` (``[{"id", "function":
{"name", "arguments"}}]``, or the legacy ``function_call``) become tool-call messages after its
text, with their ids; a tool message's name comes from ``name``/``tool_name`` or, failing
those, from the call its ``tool_call_id`` answers (:func:`convention.convert_chat`).

A record's session_key is the file's name and the record's ``id`` (or ``conversation_id``,
``session_id``) — ``train.json#1`` — so two files whose records share an id stay two sessions;
a record without an id is keyed by a hash of its messages, so the same conversation imports to
the same file wherever the file lies. A record with no message to import is counted as
empty, not reported.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from pipeline.importers import convention, source

SOURCE = "openai"
MAX_SESSION_KEY = 512


def files(path: Path) -> list[Path]:
    """``path``, or the ``.json``/``.jsonl`` files (``.zst`` too) under it."""
    return source.walk(path, (".json", ".jsonl", ".json.zst", ".jsonl.zst"))


def convert(
    messages: Sequence[Any], *, when: str | None = None
) -> tuple[list[convention.Message], int]:
    """OpenAI-style messages in the convention (:func:`convention.convert_chat`)."""
    return convention.convert_chat(messages, when=when)


def turns(messages: Sequence[convention.Message]) -> list[source.Turn]:
    """Messages cut into turns at each user message, numbered in order from 0 (what comes
    before the first user message, a system prompt say, is a turn of its own)."""
    return [
        source.Turn(position=str(number), messages=tuple(turn))
        for number, (_, turn) in enumerate(convention.chat_turns(messages))
    ]


def session_key(
    record: Mapping[str, Any],
    messages: Sequence[convention.Message],
    *,
    path: Path,
    prefix: str = SOURCE,
) -> str:
    """``{file name}#{the record's own id}``, else ``{prefix}-`` and a hash of its messages."""
    for field in ("id", "conversation_id", "session_id"):
        value = record.get(field)
        if isinstance(value, str | int) and not isinstance(value, bool) and str(value).strip():
            identifier = convention.clean_text(str(value)).strip()
            name = convention.clean_text(path.name)
            return f"{name}#{identifier}"[:MAX_SESSION_KEY]
    return f"{prefix}-{convention.digest(messages)[:24]}"


def session(
    *,
    path: Path,
    line: int | None,
    number: int,
    record: Mapping[str, Any],
    messages: list[convention.Message],
    skipped: int,
    prefix: str,
    model: Any = None,
) -> source.Session | source.Empty:
    """One chat record as a session (or an empty record), for this importer and ShareGPT's."""
    if not messages:
        return source.Empty(str(path), line)
    return source.Session(
        source=prefix,
        session_key=session_key(record, messages, path=path, prefix=prefix),
        metadata=convention.metadata(
            {"importer": prefix, "file": path.name, "record": number, "model": model}
        ),
        turns=tuple(
            source.Turn(position=turn.position, messages=turn.messages, line=line)
            for turn in turns(messages)
        ),
        origin=str(path),
        skipped=skipped,
    )


def read(path: Path) -> Iterator[source.Record]:
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
        yield session(
            path=path,
            line=line,
            number=number,
            record=record,
            messages=messages,
            skipped=skipped,
            prefix=SOURCE,
            model=record.get("model"),
        )
