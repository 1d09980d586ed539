"""OpenAI-style chat messages in the tool-call convention: OpenAI datasets, and Hermes' live
transcript and ``state.db`` rows (the same conversion for the provider and the importer, so
both write and key a turn alike).

Standard library only, and it imports its sibling relatively: ``sgme hermes install`` copies
this file and ``convention.py`` side by side into the Hermes provider, which runs inside
Hermes without this package.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from . import convention

#: OpenAI-style roles and what L0 writes for them
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}

Message = convention.Message


def calls(message: Mapping[str, Any]) -> list[tuple[Any, Any, Any]]:
    """``(name, arguments, id)`` of an assistant message's calls, in order."""
    out: list[tuple[Any, Any, Any]] = []
    listed = message.get("tool_calls")
    for call in listed if isinstance(listed, list) else []:
        if not isinstance(call, Mapping):
            continue
        function = call.get("function")
        spec = function if isinstance(function, Mapping) else call
        out.append((spec.get("name"), spec.get("arguments"), call.get("id")))
    legacy = message.get("function_call")
    if isinstance(legacy, Mapping):
        out.append((legacy.get("name"), legacy.get("arguments"), None))
    return out


def convert(messages: Sequence[Any], *, when: str | None = None) -> tuple[list[Message], int]:
    """OpenAI-style messages in the convention, and how many were left out (not an object,
    an unknown role, or empty). ``when`` stands in for messages without a time of their own."""
    out: list[Message] = []
    skipped = 0
    names: dict[str, str] = {}  # tool_call_id -> tool name, for results that lack one
    for message in messages:
        if not isinstance(message, Mapping):
            skipped += 1
            continue
        stamp = convention.ts(message.get("timestamp", message.get("ts"))) or when
        role = message.get("role")
        if role == "assistant":
            found = calls(message)
            for name, _, identifier in found:
                if isinstance(identifier, str) and isinstance(name, str):
                    names[identifier] = name
            converted = convention.assistant_turn(message.get("content"), found, stamp)
            if not converted:
                skipped += 1
            out.extend(converted)
        elif role in ("tool", "function"):
            identifier = message.get("tool_call_id")
            name = message.get("tool_name") or message.get("name")
            if not name:
                name = names.get(str(identifier))
            out.append(convention.tool_result(name, message.get("content"), stamp, identifier))
        elif role in ROLES:
            text = convention.text_message(ROLES[role], message.get("content"), stamp)
            if text["content"].strip():
                out.append(text)
            else:
                skipped += 1
        else:
            skipped += 1
    return out, skipped


def turns(messages: Sequence[Message]) -> list[tuple[int, list[Message]]]:
    """Messages cut into turns, each numbered by its user message: a turn starts at each user
    message (the n-th one numbers its turn n); what comes before the first one, a system
    prompt say, is turn 0."""
    out: list[tuple[int, list[Message]]] = []
    users = 0
    for message in messages:
        if message["role"] == "user":
            users += 1
            out.append((users, []))
        elif not out:
            out.append((0, []))
        out[-1][1].append(message)
    return out
