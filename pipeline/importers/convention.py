"""The tool-call convention: how every client writes tool calls and tool results into L0.

One shape for the Hermes provider and every importer (docs/format.md, "Tool calls"):

- an assistant **tool call** is a message of role ``assistant`` whose body is::

      **tool call**: {name}

      {arguments, exactly as the source gave them}

  (just the first line when there are no arguments);
- a **tool result** is a message of role ``tool`` with ``tool_name`` (the format's tool block);
- an assistant message that has text *and* calls becomes the text message followed by one
  call message per call, in the source's order.

Ordinary assistant text that happens to start like a call line gets one more leading backslash
(and loses it again in :func:`parse_tool_call`), so the two can never be confused — the same
mboxrd-style quoting the format uses for headings.

Pure functions, no I/O. ``integrations/hermes/sgme/messages.py`` re-implements the few lines the
provider needs (it runs inside Hermes without this package); a test keeps both in step.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

#: the first line of a tool-call body
CALL_PREFIX = "**tool call**: "
#: what a tool name may be at most (the format's rule for tool_name, used for call names too)
MAX_TOOL_NAME = 200
#: docs/design.md §2 defaults, mirrored so importers split their appends before the server refuses
MAX_MESSAGE_BYTES = 8 * 1024 * 1024
MAX_APPEND_MESSAGES = 1000
MAX_APPEND_BYTES = 32 * 1024 * 1024
MAX_METADATA_BYTES = 8 * 1024
MAX_IDEMPOTENCY_KEY = 200
#: metadata strings longer than this are cut: metadata describes a session, it is not content
MAX_METADATA_STRING = 1000

_CALL_LINE = re.compile(r"\\*\*\*tool call\*\*: ")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_LONE_SURROGATE = re.compile(r"[\ud800-\udfff]")

Message = dict[str, Any]


# ---------------------------------------------------------------------------------------------
# text


def clean_text(text: str) -> str:
    """``text`` with what the format refuses made storable: NUL and lone surrogates (which
    JSON sources can carry) become U+FFFD. Everything else is kept exactly."""
    if "\x00" in text:
        text = text.replace("\x00", "\ufffd")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = _LONE_SURROGATE.sub("\ufffd", text)
    return text


def content_text(content: Any) -> str:
    """The text of a message's content as sources give it: a string, or a list of parts
    (OpenAI ``{"type": "text", "text"}``, Anthropic ``{"type": "text"}``, Codex
    ``input_text``/``output_text``) joined by newlines; a part without text is written as
    ``[{type}]`` so its place in the message shows."""
    if content is None:
        return ""
    if isinstance(content, str):
        return clean_text(content)
    if isinstance(content, Mapping):
        content = [content]
    if not isinstance(content, list):
        return clean_text(json.dumps(content, ensure_ascii=False, default=str))
    parts: list[str] = []
    for part in content:
        if isinstance(part, str):
            parts.append(part)
        elif isinstance(part, Mapping):
            text = part.get("text")
            if isinstance(text, str):
                parts.append(text)
            elif isinstance(part.get("content"), str | list):
                parts.append(content_text(part.get("content")))
            else:
                parts.append(f"[{part.get('type') or 'part'}]")
        elif part is not None:
            parts.append(json.dumps(part, ensure_ascii=False, default=str))
    return clean_text("\n".join(parts))


def tool_name(name: object, *, default: str = "tool") -> str:
    """A tool name the format accepts: one line, no control characters, at most 200
    characters; ``default`` when the source has none."""
    text = name if isinstance(name, str) else ""
    text = _CONTROL.sub(" ", clean_text(text)).strip()[:MAX_TOOL_NAME].strip()
    return text or default


def arguments_text(arguments: Any) -> str:
    """Call arguments as text: a string exactly as given, anything else as JSON."""
    if arguments is None:
        return ""
    if isinstance(arguments, str):
        return clean_text(arguments)
    return clean_text(json.dumps(arguments, ensure_ascii=False, default=str))


def escape_text(text: str) -> str:
    """Assistant text that starts like a call line gets one more leading backslash."""
    return "\\" + text if _CALL_LINE.match(text) else text


def unescape_text(text: str) -> str:
    """Inverse of :func:`escape_text`."""
    return text[1:] if text.startswith("\\") and _CALL_LINE.match(text) else text


def call_body(name: str, arguments: str) -> str:
    """The body of an assistant tool-call message."""
    head = CALL_PREFIX + name
    return f"{head}\n\n{arguments}" if arguments else head


def parse_tool_call(content: str) -> tuple[str, str] | None:
    """``(name, arguments)`` when an assistant body is a tool call, else None."""
    if not content.startswith(CALL_PREFIX):
        return None
    head, _, rest = content.partition("\n")
    name = head[len(CALL_PREFIX) :]
    if not name:
        return None
    return name, rest[1:] if rest.startswith("\n") else rest


# ---------------------------------------------------------------------------------------------
# messages


def ts(value: Any) -> str | None:
    """A source timestamp as the format writes it (UTC, ``Z``), or None when there is none or
    it cannot be read (the server then stamps its receive time).

    Accepts Unix seconds (int/float, or milliseconds when it is clearly too large for seconds),
    ISO 8601 with ``Z`` or an offset, and ISO 8601 without one (taken as UTC)."""
    if value is None or isinstance(value, bool):
        return None
    try:
        if isinstance(value, int | float):
            if not math.isfinite(value):
                return None
            seconds = value / 1000 if value > 1e11 else value
            when = dt.datetime.fromtimestamp(seconds, dt.UTC)
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


def text_message(role: str, content: Any, when: str | None) -> Message:
    """A user, assistant or system message (assistant text escaped, see module doc)."""
    text = content_text(content)
    if role == "assistant":
        text = escape_text(text)
    return _message(role, text, when)


def tool_call(name: Any, arguments: Any, when: str | None) -> Message:
    """An assistant tool-call message."""
    return _message("assistant", call_body(tool_name(name), arguments_text(arguments)), when)


def tool_result(name: Any, content: Any, when: str | None) -> Message:
    """A tool result: role ``tool`` with ``tool_name``."""
    return _message("tool", content_text(content), when, tool_name(name))


def assistant_turn(text: Any, calls: Iterable[tuple[Any, Any]], when: str | None) -> list[Message]:
    """An assistant message with text and calls: the text first (when there is any), then one
    message per ``(name, arguments)`` call, in order."""
    out: list[Message] = []
    body = content_text(text)
    if body.strip():
        out.append(text_message("assistant", body, when))
    out.extend(tool_call(name, arguments, when) for name, arguments in calls)
    return out


def split_large(message: Message, *, limit: int = MAX_MESSAGE_BYTES) -> list[Message]:
    """A message over the per-message limit as consecutive messages of the same role, time
    and tool name, each under it, cut on character boundaries: nothing is dropped."""
    content: str = message["content"]
    if len(content) * 4 <= limit or len(content.encode("utf-8")) <= limit:
        return [message]
    parts: list[Message] = []
    start = 0
    while start < len(content):
        # a character is at most 4 bytes: limit // 4 characters always fit
        end = min(len(content), start + max(1, limit // 4))
        parts.append({**message, "content": content[start:end]})
        start = end
    return parts


# ---------------------------------------------------------------------------------------------
# appends


def digest(messages: Sequence[Mapping[str, Any]]) -> str:
    """A stable hash of messages (role, content, ts, tool_name): the "content" part of a key."""
    encoded = json.dumps(
        [[m.get("role"), m.get("content"), m.get("ts"), m.get("tool_name")] for m in messages],
        ensure_ascii=False,
        separators=(",", ":"),
    )
    return hashlib.sha256(encoded.encode("utf-8", "surrogatepass")).hexdigest()


def key(source: str, session: str, position: str, messages: Sequence[Mapping[str, Any]]) -> str:
    """The idempotency key of one source turn: ``{source}:{session}:{position}:{hash}``.

    The hash covers the turn's messages, so a turn that changed in the source (a rewind, an
    edit) is a new key and is appended, while an unchanged one replays. A session or position
    too long for the 200-character limit is replaced by its own hash."""
    session_part = session if len(session) <= 100 else "h" + _short(session, 32)
    position_part = position if len(position) <= 40 else "h" + _short(position, 16)
    return f"{source}:{session_part}:{position_part}:{digest(messages)[:16]}"


def _short(text: str, length: int) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:length]


def metadata(fields: Mapping[str, Any]) -> dict[str, Any]:
    """Session metadata from source fields: empty values dropped, long strings cut, and keys
    dropped from the end until it fits the 8 KiB limit (it describes, it is not content)."""
    out: dict[str, Any] = {}
    for name, value in fields.items():
        if value is None or value == "" or value == {} or value == []:
            continue
        if isinstance(value, str):
            value = clean_text(value)[:MAX_METADATA_STRING]
        out[name] = value
    while out and len(json.dumps(out, ensure_ascii=False, default=str).encode()) > (
        MAX_METADATA_BYTES
    ):
        out.pop(next(reversed(out)))
    plain: dict[str, Any] = json.loads(json.dumps(out, ensure_ascii=False, default=str))
    return plain  # plain JSON only: no tuples, datetimes or NaN reach the server


def batches(
    messages: Sequence[Message],
    *,
    max_messages: int = MAX_APPEND_MESSAGES,
    max_bytes: int = MAX_APPEND_BYTES,
) -> Iterator[list[Message]]:
    """``messages`` cut into runs that each fit one append."""
    batch: list[Message] = []
    size = 0
    for message in messages:
        length = len(message["content"].encode("utf-8"))
        if batch and (len(batch) >= max_messages or size + length > max_bytes):
            yield batch
            batch, size = [], 0
        batch.append(message)
        size += length
    if batch:
        yield batch
