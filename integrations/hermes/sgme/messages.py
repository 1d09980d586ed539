"""Hermes' OpenAI-style messages in SGME's tool-call convention (docs/format.md, "Tool calls").

The provider runs inside Hermes' own environment, without the ``pipeline`` package, so this
re-implements the few lines of ``pipeline.importers.convention`` and
``pipeline.importers.openai.convert`` it needs; the project's tests check that both turn the
same messages into the same appends. Standard library only.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

CALL_PREFIX = "**tool call**: "
MAX_TOOL_NAME = 200
MAX_MESSAGE_BYTES = 8 * 1024 * 1024
MAX_APPEND_MESSAGES = 1000
MAX_APPEND_BYTES = 32 * 1024 * 1024
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}

_CALL_LINE = re.compile(r"\\*\*\*tool call\*\*: ")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_LONE_SURROGATE = re.compile(r"[\ud800-\udfff]")

Message = dict[str, Any]


def clean_text(text: str) -> str:
    """NUL and lone surrogates (which L0 refuses) become U+FFFD; nothing else changes."""
    text = text.replace("\x00", "\ufffd")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = _LONE_SURROGATE.sub("\ufffd", text)
    return text


def content_text(content: Any) -> str:
    """A string as it is; a list of parts as their texts joined by newlines (``[type]`` for a
    part without text)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return clean_text(content)
    if isinstance(content, Mapping):
        content = [content]
    if not isinstance(content, list):
        return clean_text(json.dumps(content, ensure_ascii=False, default=str))
    parts = []
    for part in content:
        if isinstance(part, str):
            parts.append(part)
        elif isinstance(part, Mapping):
            if isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part.get("content"), (str, list)):
                parts.append(content_text(part["content"]))
            else:
                parts.append("[%s]" % (part.get("type") or "part"))
        elif part is not None:
            parts.append(json.dumps(part, ensure_ascii=False, default=str))
    return clean_text("\n".join(parts))


def tool_name(name: Any, default: str = "tool") -> str:
    """One line, no control characters, at most 200 characters."""
    text = name if isinstance(name, str) else ""
    text = _CONTROL.sub(" ", clean_text(text)).strip()[:MAX_TOOL_NAME].strip()
    return text or default


def arguments_text(arguments: Any) -> str:
    if arguments is None:
        return ""
    if isinstance(arguments, str):
        return clean_text(arguments)
    return clean_text(json.dumps(arguments, ensure_ascii=False, default=str))


def ts(value: Any) -> str | None:
    """Unix seconds (or milliseconds) or ISO 8601 as ``YYYY-MM-DDTHH:MM:SS[.f]Z``; else None."""
    if value is None or isinstance(value, bool):
        return None
    try:
        if isinstance(value, (int, float)):
            if not math.isfinite(value):
                return None
            when = dt.datetime.fromtimestamp(value / 1000 if value > 1e11 else value, dt.UTC)
        elif isinstance(value, str):
            text = value.strip()
            if text[-1:] in ("Z", "z"):
                text = text[:-1] + "+00:00"
            when = dt.datetime.fromisoformat(text)
            if when.tzinfo is None:
                when = when.replace(tzinfo=dt.UTC)
            when = when.astimezone(dt.UTC)
        else:
            return None
    except (ValueError, OverflowError, OSError):
        return None
    text = (
        f"{when.year:04d}-{when.month:02d}-{when.day:02d}"
        f"T{when.hour:02d}:{when.minute:02d}:{when.second:02d}"
    )
    if when.microsecond:
        text += f".{when.microsecond:06d}".rstrip("0")
    return text + "Z"


def _message(role: str, content: str, when: str | None, name: str | None = None) -> Message:
    message: Message = {"role": role, "content": content}
    if when is not None:
        message["ts"] = when
    if name is not None:
        message["tool_name"] = name
    return message


def _call(name: Any, arguments: Any, when: str | None) -> Message:
    head = CALL_PREFIX + tool_name(name)
    args = arguments_text(arguments)
    return _message("assistant", head + "\n\n" + args if args else head, when)


def _calls(message: Mapping[str, Any]) -> list[tuple[Any, Any, Any]]:
    out = []
    calls = message.get("tool_calls")
    for call in calls if isinstance(calls, list) else []:
        if isinstance(call, Mapping):
            function = call.get("function")
            spec = function if isinstance(function, Mapping) else call
            out.append((call.get("id"), spec.get("name"), spec.get("arguments")))
    legacy = message.get("function_call")
    if isinstance(legacy, Mapping):
        out.append((None, legacy.get("name"), legacy.get("arguments")))
    return out


def convert(messages: Sequence[Any], when: str | None = None) -> tuple[list[Message], int]:
    """OpenAI-style messages in the convention (what ``pipeline.importers.openai.convert``
    does), and how many were left out; ``when`` for messages without a time of their own."""
    out: list[Message] = []
    skipped = 0
    names: dict[str, str] = {}
    for message in messages:
        if not isinstance(message, Mapping):
            skipped += 1
            continue
        stamp = ts(message.get("timestamp", message.get("ts"))) or when
        role = message.get("role")
        if role == "assistant":
            calls = _calls(message)
            for call_id, name, _ in calls:
                if isinstance(call_id, str) and isinstance(name, str):
                    names[call_id] = name
            text = content_text(message.get("content"))
            before = len(out)
            if text.strip():
                out.append(
                    _message("assistant", "\\" + text if _CALL_LINE.match(text) else text, stamp)
                )
            out.extend(_call(name, args, stamp) for _, name, args in calls)
            skipped += len(out) == before
        elif role in ("tool", "function"):
            name = message.get("tool_name") or message.get("name")
            if not name:
                name = names.get(str(message.get("tool_call_id")))
            out.append(
                _message("tool", content_text(message.get("content")), stamp, tool_name(name))
            )
        elif role in ROLES:
            text = content_text(message.get("content"))
            if text.strip():
                out.append(_message(ROLES[role], text, stamp))
            else:
                skipped += 1
        else:
            skipped += 1
    return out, skipped


def current_turn(
    messages: Sequence[Any], user_content: str, assistant_content: str
) -> tuple[int, list[Any]]:
    """The completed turn at the end of Hermes' transcript: from its user message to the final
    assistant message (matched by text, else the last of each role), and the user message's
    position in the transcript (-1 when there is none)."""

    def text(message: Any) -> str:
        return content_text(message.get("content")).strip() if isinstance(message, Mapping) else ""

    def role(message: Any) -> Any:
        return message.get("role") if isinstance(message, Mapping) else None

    end = next(
        (
            i
            for i in range(len(messages) - 1, -1, -1)
            if role(messages[i]) == "assistant" and text(messages[i]) == assistant_content.strip()
        ),
        next(
            (i for i in range(len(messages) - 1, -1, -1) if role(messages[i]) == "assistant"),
            len(messages) - 1,
        ),
    )
    start = next(
        (
            i
            for i in range(end, -1, -1)
            if role(messages[i]) == "user" and text(messages[i]) == user_content.strip()
        ),
        next((i for i in range(end, -1, -1) if role(messages[i]) == "user"), -1),
    )
    if start < 0:
        return -1, []
    return start, list(messages[start : end + 1])


def turn_key(session_id: str, position: int, messages: Sequence[Message]) -> str:
    """``hermes:{session}:{position}:{hash}``; the hash covers role, content and tool name but
    not times, so the same turn sent again is the same key whenever it is sent."""
    encoded = json.dumps(
        [[m.get("role"), m.get("content"), m.get("tool_name")] for m in messages],
        ensure_ascii=False,
        separators=(",", ":"),
    )
    digest = hashlib.sha256(encoded.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    session = session_id
    if len(session) > 100:
        session = "h" + hashlib.sha256(session.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return f"hermes:{session}:{position}:{digest}"


def split_large(message: Message, limit: int = MAX_MESSAGE_BYTES) -> list[Message]:
    """A message over the per-message limit as consecutive parts (nothing dropped)."""
    content = message["content"]
    if len(content.encode("utf-8")) <= limit:
        return [message]
    step = max(1, limit // 4)
    return [dict(message, content=content[i : i + step]) for i in range(0, len(content), step)]


def batches(messages: Sequence[Message]) -> Iterator[list[Message]]:
    """Runs of messages that each fit one append (1,000 messages, 32 MiB)."""
    batch: list[Message] = []
    size = 0
    for message in messages:
        length = len(message["content"].encode("utf-8"))
        if batch and (len(batch) >= MAX_APPEND_MESSAGES or size + length > MAX_APPEND_BYTES):
            yield batch
            batch, size = [], 0
        batch.append(message)
        size += length
    if batch:
        yield batch
