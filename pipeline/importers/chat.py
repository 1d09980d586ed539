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


class Branch:
    """The turns of one Hermes session in the order they were stored, to mark a rewind the same
    way from the provider and from the ``state.db`` importer."""

    def __init__(self) -> None:
        # [turn number (None: a rewind marker), messages stored, still live]
        self._stream: list[list[Any]] = []

    def add(self, number: int, turn: Sequence[Message]) -> None:
        """A turn stored, numbered by its user message."""
        stored = sum(len(convention.split_large(m)) for m in turn)
        self._stream.append([number, stored, True])

    def rewound(self, number: int) -> list[int]:
        """The places, counted back from a rewind marker stored next, of the messages of the
        live turns numbered ``number`` or more (:func:`convention.rewound`); [] when there are
        none (no marker)."""
        places: list[int] = []
        offset = 0
        for turn_number, stored, live in reversed(self._stream):
            if live and turn_number is not None and turn_number >= number:
                places.extend(range(offset + 1, offset + stored + 1))
            offset += stored
        return sorted(places)

    def rewind(self, number: int) -> None:
        """The live turns numbered ``number`` or more taken back, and their marker stored."""
        for entry in self._stream:
            if entry[2] and entry[0] is not None and entry[0] >= number:
                entry[2] = False
        self._stream.append([None, 1, False])


def rewind_position(number: int, turn: Sequence[Message]) -> str:
    """Where the rewind marker before a Hermes turn goes: the turn's number and a hash of what
    it says (two rewinds back to the same turn number are two markers)."""
    parts = [part for message in turn for part in convention.split_large(message)]
    return f"{number}:{convention.digest(parts, times=False)[:16]}:rewound"


def first_key(session: str, number: int, turn: Sequence[Message]) -> str:
    """The key of a Hermes turn's first append (``key/0`` when it takes several): the rewind
    marker before the turn gives it as its ``legacy_key``, so that a store already holding the
    turn (stored before markers were written) gets no marker after it, out of place."""
    parts = [part for message in turn for part in convention.split_large(message)]
    key = convention.hermes_key(session, number, parts)
    return key if len(list(convention.batches(parts))) == 1 else f"{key}/0"
