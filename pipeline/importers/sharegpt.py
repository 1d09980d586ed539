"""ShareGPT datasets: ``{"conversations": [{"from", "value"}], "id"?}`` records, as a JSON list
or JSON Lines.

``from`` is ``human``/``user`` (user), ``gpt``/``assistant``/``chatgpt``/``bing``/``bard``
(assistant), ``system``, ``function_call`` (an assistant tool call: ``value`` is the JSON
``{"name", "arguments"}`` the model produced) or ``observation``/``tool``/``function`` (a tool
result, named after the call before it). Turns, session keys (``{file name}#{id}``), empty
records and metadata as in :mod:`pipeline.importers.openai`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from pipeline.importers import convention, openai, source

SOURCE = "sharegpt"
ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "model": "assistant",
    "system": "system",
}
RESULTS = ("observation", "tool", "function", "function_response", "tool_response")


def files(path: Path) -> list[Path]:
    """``path``, or the ``.json``/``.jsonl`` files (``.zst`` too) under it."""
    return openai.files(path)


def _call(value: Any) -> tuple[Any, Any]:
    """``(name, arguments)`` of a ``function_call`` turn; the raw value when it is not JSON."""
    try:
        parsed = source.parse_json(value) if isinstance(value, str) else value
    except ValueError:
        parsed = None
    if isinstance(parsed, Mapping) and isinstance(parsed.get("name"), str):
        arguments = parsed.get("arguments", parsed.get("parameters"))
        return parsed["name"], arguments
    return "function_call", value


def convert(conversation: Sequence[Any]) -> tuple[list[convention.Message], int]:
    """ShareGPT turns in the convention, and how many were left out."""
    out: list[convention.Message] = []
    skipped = 0
    last_call = "tool"
    for item in conversation:
        if not isinstance(item, Mapping):
            skipped += 1
            continue
        speaker = str(item.get("from", "")).lower()
        value = item.get("value")
        if speaker == "function_call":
            name, arguments = _call(value)
            last_call = convention.tool_name(name)
            out.append(convention.tool_call(name, arguments, None))
        elif speaker in RESULTS:
            out.append(convention.tool_result(item.get("name") or last_call, value, None))
        elif speaker in ROLES:
            message = convention.text_message(ROLES[speaker], value, None)
            if message["content"].strip():
                out.append(message)
            else:
                skipped += 1
        else:
            skipped += 1
    return out, skipped


def read(path: Path) -> Iterator[source.Record]:
    """Every conversation record of one file."""
    return openai.records(path, prefix=SOURCE, field="conversations", convert=convert)
