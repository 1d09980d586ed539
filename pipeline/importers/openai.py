"""OpenAI chat transcripts: ``{"messages": [...]}`` records, as a JSON list or JSON Lines.

Roles ``system``, ``developer`` (written as ``system``), ``user``, ``assistant`` and ``tool``
(legacy ``function`` too). An assistant message's ``tool_calls`` (``[{"id", "function":
{"name", "arguments"}}]``, or the legacy ``function_call``) become tool-call messages after its
text, with their ids; a tool message's name comes from ``name``/``tool_name`` or, failing
those, from the call its ``tool_call_id`` answers (:func:`chat.convert`).

A record's session_key is the file's name and the record's ``id`` (or ``conversation_id``,
``session_id``) — ``train.json#1`` — so two files whose records share an id stay two sessions;
a record without an id is keyed by a hash of its messages, so the same conversation imports to
the same file wherever the file lies. A record with no message to import is counted as
empty, not reported.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from pipeline.importers import chat, convention, source

SOURCE = "openai"
MAX_SESSION_KEY = 512


def files(path: Path) -> list[Path]:
    """``path``, or the ``.json``/``.jsonl`` files (``.zst`` too) under it."""
    return source.walk(path, (".json", ".jsonl", ".json.zst", ".jsonl.zst"))


def convert(messages: Sequence[Any]) -> tuple[list[convention.Message], int]:
    """OpenAI-style messages in the convention (:func:`chat.convert`)."""
    return chat.convert(messages)


def turns(messages: Sequence[convention.Message]) -> list[source.Unit]:
    """Messages cut into turns at each user message, numbered in order from 0 (what comes
    before the first user message, a system prompt say, is a turn of its own)."""
    return [
        source.Unit(position=str(number), messages=tuple(turn))
        for number, (_, turn) in enumerate(chat.turns(messages))
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


def records(
    path: Path,
    *,
    prefix: str,
    field: str,
    convert: Callable[[Sequence[Any]], tuple[list[convention.Message], int]],
) -> Iterator[source.Record]:
    """The chat records of one file — each a JSON object whose ``field`` lists its messages —
    as sessions, empty records and problems; for this importer and ShareGPT's."""
    for item in source.json_records(path):
        if isinstance(item, source.Problem):
            yield item
            continue
        line, number, record = item
        if isinstance(record, list):
            record = {field: record}
        listed = record.get(field) if isinstance(record, Mapping) else None
        if not isinstance(listed, list):
            yield source.Problem(str(path), line, f"record {number}: no {field!r} list")
            continue
        assert isinstance(record, Mapping)
        messages, skipped = convert(listed)
        if not messages:
            yield source.Empty(str(path), line)
            continue
        model = record.get("model")
        yield source.Session(
            source=prefix,
            session_key=session_key(record, messages, path=path, prefix=prefix),
            metadata=convention.metadata(
                {"importer": prefix, "file": path.name, "record": number, "model": model}
            ),
            units=tuple(
                source.Unit(position=turn.position, messages=turn.messages, line=line)
                for turn in turns(messages)
            ),
            origin=str(path),
            skipped=skipped,
        )


def read(path: Path) -> Iterator[source.Record]:
    """Every conversation record of one file."""
    return records(path, prefix=SOURCE, field="messages", convert=convert)
