"""The turn ``sync_turn`` is called for, as append bodies.

Hermes' transcript is converted and cut into turns by ``convention.py`` — the very module the
``state.db`` importer uses, copied here by ``sgme hermes install`` (the provider runs inside
Hermes without SGME's package) — and keyed by :func:`convention.hermes_key`, so the provider
and ``sgme import hermes`` write the same turn under the same key.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # beside this module once installed (see __init__)
    from pipeline.importers import chat, convention
else:
    from . import chat, convention

Message = dict[str, Any]


def current_turn(
    messages: Sequence[Any], assistant_content: str, *, when: str | None
) -> tuple[int, list[Message]] | None:
    """The completed turn at the end of Hermes' transcript, in the convention, with its number
    (its user message's ordinal in the transcript): the last turn holding the final answer
    (matched by text, else the last turn with a user message), up to that answer. ``when``
    stands in for messages without a time of their own. None when there is no such turn."""
    converted, _ = chat.convert(list(messages), when=when)
    turns = [(n, t) for n, t in chat.turns(converted) if n > 0]
    if not turns:
        return None
    answer = assistant_content.strip()
    for number, turn in reversed(turns):
        for end in range(len(turn) - 1, -1, -1):
            if turn[end]["role"] == "assistant" and _text(turn[end]) == answer:
                return number, turn[: end + 1]
    number, turn = turns[-1]
    return number, turn


def _text(message: Mapping[str, Any]) -> str:
    if convention.kind("assistant", message["content"]) != "text":
        return ""
    return convention.unescape_text(message["content"], "assistant").strip()


def bodies(
    session: str,
    number: int,
    turn: Sequence[Message],
    *,
    agent_id: str,
    metadata: Mapping[str, Any],
) -> tuple[str, list[dict[str, Any]]]:
    """The turn's key and its append bodies (several when it is larger than one append may
    be: ``key/0``, ``key/1``, … as the importer sends it)."""
    parts = [part for message in turn for part in convention.split_large(message)]
    key = convention.hermes_key(session, number, parts)
    runs = list(convention.batches(parts))
    out = []
    for index, batch in enumerate(runs):
        body: dict[str, Any] = {
            "agent_id": agent_id,
            "session_key": session,
            "source_type": "session",
            "idempotency_key": key if len(runs) == 1 else f"{key}/{index}",
            "messages": batch,
        }
        if metadata:
            body["metadata"] = dict(metadata)
        out.append(body)
    return key, out


def rewind_body(
    session: str,
    number: int,
    turn: Sequence[Message],
    places: Sequence[int],
    *,
    agent_id: str,
    metadata: Mapping[str, Any],
    when: str | None,
) -> dict[str, Any]:
    """The append body of the rewind marker before turn ``number`` (:func:`convention.rewound`
    naming ``places``), keyed as ``sgme import hermes`` keys it, with the turn's key as its
    ``legacy_key`` (:func:`chat.first_key`)."""
    marker = convention.rewound(places, when)
    position = chat.rewind_position(number, turn)
    body: dict[str, Any] = {
        "agent_id": agent_id,
        "session_key": session,
        "source_type": "session",
        "idempotency_key": convention.key(
            convention.HERMES, session, position, [marker], times=False
        ),
        "messages": [marker],
        "legacy_key": chat.first_key(session, number, turn),
    }
    if metadata:
        body["metadata"] = dict(metadata)
    return body
