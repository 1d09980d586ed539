"""The tool-call convention: how every client writes tool calls, tool results, thinking and
compaction summaries into L0 (docs/format.md, "Tool calls").

- an assistant **tool call** is a message of role ``assistant`` whose body is::

      **tool call**: {name}
      **call id**: {id}                (when the source has one)

      ```json
      {arguments, exactly as the source gave them}
      ```

  (the header alone when there are no arguments; the fence is longer than any run of
  backticks in the arguments, and says ``json`` only when they are JSON);
- a **tool result** is a message of role ``tool`` with ``tool_name`` (the format's tool block);
  its body starts with ``**call id**: {id}`` and a blank line when the source has the id;
- **thinking** (the model's own reasoning, e.g. Claude Code's thinking blocks) is an assistant
  message whose body is ``**thinking**``, a blank line, then the text;
- a **compaction summary** (what an agent wrote to continue a compacted conversation) is a
  system message whose body is ``**compaction summary**``, a blank line, then the text;
- a **rewind** (the conversation taken back to an earlier point: Claude Code's rewind, an
  edited prompt) is a system message written where the conversation goes on from the earlier
  point, whose body is ``**rewound**: {places}``, a blank line, then a sentence: ``places``
  lists the messages the rewind took back, counted back from it (``1-3, 5``: the three
  messages just before it and the fifth). Messages are appended as they are said, so a branch
  cannot be marked once it is written; the marker says which messages are on it;
- an assistant message that has text *and* calls becomes the text message followed by one
  call message per call, in the source's order.

Text that starts like one of these marker lines, in a role where the marker means something,
gets one more leading backslash (and loses it again when read), so a marked message and an
ordinary one can never be confused — the same mboxrd-style quoting the format uses for
headings.

Pure functions, standard library only: ``sgme hermes install`` copies this very file into the
Hermes provider's directory, which runs inside Hermes without this package. OpenAI-style chat
messages (datasets, Hermes) are converted by :mod:`.chat` on top of these rules.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import math
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

#: the first line of a tool-call body
CALL_PREFIX = "**tool call**: "
#: the line naming the call a call message or a result belongs to
ID_PREFIX = "**call id**: "
THINKING = "**thinking**"
SUMMARY = "**compaction summary**"
REWOUND = "**rewound**"
#: the key prefix of Hermes turns, shared by the provider and the state.db importer
HERMES = "hermes"
#: what a tool name (or a call id) may be at most (the format's rule for tool_name)
MAX_TOOL_NAME = 200
#: docs/design.md §2 defaults, mirrored so clients split their appends before the server refuses
MAX_MESSAGE_BYTES = 8 * 1024 * 1024
MAX_APPEND_MESSAGES = 1000
MAX_APPEND_BYTES = 32 * 1024 * 1024
MAX_METADATA_BYTES = 8 * 1024
MAX_METADATA_DEPTH = 8  #: deeper metadata values are dropped (the server allows 16)
MAX_IDEMPOTENCY_KEY = 200
#: metadata strings longer than this are cut: metadata describes a session, it is not content
MAX_METADATA_STRING = 1000

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_LONE_SURROGATE = re.compile(r"[\ud800-\udfff]")
#: per role, the first lines that are markers there (after any number of backslashes)
_MARKED = {
    "assistant": re.compile(r"\\*(?:\*\*tool call\*\*: |\*\*thinking\*\*(?:\n|$))"),
    "tool": re.compile(r"\\*\*\*call id\*\*: "),
    "system": re.compile(r"\\*\*\*(?:compaction summary\*\*(?:\n|$)|rewound\*\*: )"),
}
#: what the convention before call ids and thinking escaped (assistant call lines only)
_LEGACY_MARKED = re.compile(r"\\*\*\*tool call\*\*: ")

Message = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Call:
    """A tool call read back from its message."""

    name: str
    arguments: str
    call_id: str | None = None


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
    ``[{type}]`` so its place in the message shows. Nested part lists are read without
    recursion, so no depth of nesting can exhaust the stack."""
    if content is None:
        return ""
    if isinstance(content, str):
        return clean_text(content)
    if isinstance(content, Mapping):
        content = [content]
    if not isinstance(content, list):
        return clean_text(_json(content))
    parts: list[str] = []
    stack: list[Iterator[Any]] = [iter(content)]
    while stack:
        part = next(stack[-1], _END)
        if part is _END:
            stack.pop()
        elif isinstance(part, str):
            parts.append(part)
        elif isinstance(part, Mapping):
            text = part.get("text")
            inner = part.get("content")
            if isinstance(text, str):
                parts.append(text)
            elif isinstance(inner, str):
                parts.append(inner)
            elif isinstance(inner, list):
                stack.append(iter(inner))
            else:
                parts.append(f"[{part.get('type') or 'part'}]")
        elif part is not None:
            parts.append(_json(part))
    return clean_text("\n".join(parts))


_END = object()


def _json(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (ValueError, RecursionError):
        return str(type(value).__name__)


def tool_name(name: object, *, default: str = "tool") -> str:
    """A tool name the format accepts: one line, no control characters, at most 200
    characters; ``default`` when the source has none."""
    text = name if isinstance(name, str) else ""
    text = _CONTROL.sub(" ", clean_text(text)).strip()[:MAX_TOOL_NAME].strip()
    return text or default


def call_id(value: object) -> str | None:
    """A source's call id as one line (None when there is none)."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        return None
    return tool_name(value, default="") or None


def arguments_text(arguments: Any) -> str:
    """Call arguments as text: a string exactly as given, anything else as JSON."""
    if arguments is None:
        return ""
    if isinstance(arguments, str):
        return clean_text(arguments)
    return clean_text(_json(arguments))


def escape_text(text: str, role: str = "assistant") -> str:
    """Text that starts like a marker line of its role gets one more leading backslash."""
    marked = _MARKED.get(role)
    return "\\" + text if marked is not None and marked.match(text) else text


def unescape_text(text: str, role: str = "assistant") -> str:
    """Inverse of :func:`escape_text`."""
    marked = _MARKED.get(role)
    if marked is not None and text.startswith("\\") and marked.match(text):
        return text[1:]
    return text


def _fence(arguments: str) -> str:
    longest = max((len(run) for run in re.findall(r"`+", arguments)), default=0)
    return "`" * max(3, longest + 1)


def _is_json(text: str) -> bool:
    if not text.lstrip().startswith(("{", "[")):
        return False
    try:
        json.loads(text)
    except (ValueError, RecursionError):
        return False
    return True


def call_body(name: str, arguments: str, identifier: str | None = None) -> str:
    """The body of an assistant tool-call message."""
    head = CALL_PREFIX + name
    if identifier:
        head += "\n" + ID_PREFIX + identifier
    if not arguments:
        return head
    fence = _fence(arguments)
    info = "json" if _is_json(arguments) else ""
    return f"{head}\n\n{fence}{info}\n{arguments}\n{fence}"


def parse_call(content: str) -> Call | None:
    """The call an assistant body holds, else None. Reads calls written before call ids and
    fences (``**tool call**: name``, a blank line, the raw arguments) too."""
    if not content.startswith(CALL_PREFIX):
        return None
    head, _, rest = content.partition("\n")
    name = head[len(CALL_PREFIX) :]
    if not name:
        return None
    identifier = None
    if rest.startswith(ID_PREFIX):
        line, _, rest = rest.partition("\n")
        identifier = line[len(ID_PREFIX) :] or None
    if rest.startswith("\n"):
        rest = rest[1:]
    return Call(name, _unfence(rest), identifier)


def _unfence(text: str) -> str:
    opening = re.match(r"(`{3,})[^`\n]*\n", text)
    if opening is None:
        return text
    closing = "\n" + opening.group(1)
    if not text.endswith(closing) or len(text) - len(closing) < opening.end():
        return text
    return text[opening.end() : len(text) - len(closing)]


def parse_tool_call(content: str) -> tuple[str, str] | None:
    """``(name, arguments)`` when an assistant body is a tool call, else None."""
    found = parse_call(content)
    return None if found is None else (found.name, found.arguments)


def result_body(output: str, identifier: str | None = None) -> str:
    """The body of a tool result: the output, after its call id when there is one."""
    output = escape_text(output, "tool")
    return f"{ID_PREFIX}{identifier}\n\n{output}" if identifier else output


def parse_result(content: str) -> tuple[str | None, str]:
    """``(call id or None, output)`` of a tool message's body."""
    if content.startswith(ID_PREFIX):
        line, _, rest = content.partition("\n")
        return line[len(ID_PREFIX) :] or None, unescape_text(rest.removeprefix("\n"), "tool")
    return None, unescape_text(content, "tool")


#: the keys of the JSON Codex records a shell tool's result as
_CODEX_RESULT = frozenset({"output", "metadata"})


def result_output(output: str) -> str:
    """A tool result's output as a reader shows it. Codex records the results of its shell
    tools as JSON, ``{"output": "…", "metadata": {"exit_code": 0, "duration_seconds": 0.1}}``:
    shown by the output's text (with its exit code when that is not 0) rather than as an
    escaped JSON string. Any other output, as it is. What is stored stays as sent."""
    text = output.strip()
    if not (text.startswith("{") and text.endswith("}") and '"output"' in text):
        return output
    try:
        found = json.loads(text)
    except ValueError:
        return output
    if not isinstance(found, dict) or not set(found) <= _CODEX_RESULT:
        return output
    shown = found.get("output")
    if not isinstance(shown, str):
        return output
    metadata = found.get("metadata")
    code = metadata.get("exit_code") if isinstance(metadata, dict) else None
    if isinstance(code, int) and not isinstance(code, bool) and code != 0:
        shown = f"{shown.rstrip(chr(10))}\n(exit code {code})"
    return shown


def kind(role: str, content: str) -> str:
    """What a stored message is: ``call``, ``thinking``, ``summary``, ``rewound``, ``result``
    or ``text`` — so a reader or a refiner can fold or skip what is not conversation."""
    if role == "tool":
        return "result"
    if role == "assistant":
        if parse_call(content) is not None:
            return "call"
        if content == THINKING or content.startswith(THINKING + "\n"):
            return "thinking"
    if role == "system" and (content == SUMMARY or content.startswith(SUMMARY + "\n")):
        return "summary"
    if role == "system" and content.startswith(REWOUND + ": "):
        return "rewound"
    return "text"


def marked_text(content: str) -> str:
    """The text of a thinking or summary body (its marker line taken off)."""
    for marker in (THINKING, SUMMARY):
        if content == marker or content.startswith(marker + "\n"):
            return content[len(marker) :].lstrip("\n")
    return content


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
    """A user, assistant or system message (escaped where it looks marked, see module doc)."""
    return _message(role, escape_text(content_text(content), role), when)


def tool_call(name: Any, arguments: Any, when: str | None, identifier: Any = None) -> Message:
    """An assistant tool-call message."""
    body = call_body(tool_name(name), arguments_text(arguments), call_id(identifier))
    return _message("assistant", body, when)


def tool_result(name: Any, content: Any, when: str | None, identifier: Any = None) -> Message:
    """A tool result: role ``tool`` with ``tool_name``, its call id first when known."""
    body = result_body(content_text(content), call_id(identifier))
    return _message("tool", body, when, tool_name(name))


def thinking(text: Any, when: str | None) -> Message | None:
    """An assistant thinking message (None when there is no text)."""
    body = content_text(text)
    return _message("assistant", f"{THINKING}\n\n{body}", when) if body.strip() else None


def summary(text: Any, when: str | None) -> Message | None:
    """A compaction summary, as a system message (None when there is no text)."""
    body = content_text(text)
    return _message("system", f"{SUMMARY}\n\n{body}", when) if body.strip() else None


def rewound(places: Sequence[int], when: str | None) -> Message:
    """The marker of a rewind: the messages ``places`` back from it (1: the one just before
    it) were taken back."""
    ranges = _ranges(sorted(set(places)))
    if ranges == f"1-{len(places)}" or ranges == "1":
        which = "the message" if len(places) == 1 else f"the {len(places)} messages"
        taken = f"{which} just before this one"
    else:
        taken = f"the messages {ranges} places before this one"
    body = (
        f"{REWOUND}: {ranges}\n\nThe conversation went back to an earlier point (a rewind, or "
        f"an edited prompt): {taken} were taken back, and what follows goes on from before them."
    )
    return _message("system", body, when)


def _ranges(places: Sequence[int]) -> str:
    runs: list[list[int]] = []
    for place in places:
        if runs and place == runs[-1][1] + 1:
            runs[-1][1] = place
        else:
            runs.append([place, place])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def rewound_places(content: str) -> list[int]:
    """The places a rewind marker names (see :func:`rewound`); [] for any other message."""
    if not content.startswith(REWOUND + ": "):
        return []
    line = content[len(REWOUND) + 2 :].partition("\n")[0]
    places: list[int] = []
    for part in line.split(","):
        first, _, last = part.strip().partition("-")
        if not first.isdigit() or (last and not last.isdigit()):
            return []
        places += range(int(first), int(last or first) + 1)
    return places


def assistant_turn(text: Any, calls: Iterable[tuple[Any, ...]], when: str | None) -> list[Message]:
    """An assistant message with text and calls: the text first (when there is any), then one
    message per ``(name, arguments[, id])`` call, in order."""
    out: list[Message] = []
    body = content_text(text)
    if body.strip():
        out.append(text_message("assistant", body, when))
    for call in calls:
        name, arguments, identifier = (*call, None)[:3]
        out.append(tool_call(name, arguments, when, identifier))
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


def legacy_content(message: Mapping[str, Any]) -> str | None:
    """What the convention before call ids, fences and thinking wrote for a message (None for
    a message it did not write at all: thinking, a compaction summary). Keys hash this, so a
    turn imported by an earlier version keeps its key."""
    role, content = message.get("role"), message.get("content")
    if not isinstance(content, str) or not isinstance(role, str):
        return None
    found = kind(role, content)
    if found in ("thinking", "summary", "rewound"):
        return None
    if found == "call":
        call = parse_call(content)
        assert call is not None
        head = CALL_PREFIX + call.name
        return f"{head}\n\n{call.arguments}" if call.arguments else head
    if found == "result":
        return parse_result(content)[1]
    text = unescape_text(content, role)
    if role == "assistant" and _LEGACY_MARKED.match(text):
        return "\\" + text
    return text


def digest(messages: Sequence[Mapping[str, Any]], *, times: bool = True) -> str:
    """A stable hash of what messages say (role, content as :func:`legacy_content` writes it,
    tool name, and the time unless ``times`` is false): the "content" part of a key."""
    rows: list[list[Any]] = []
    for m in messages:
        content = legacy_content(m)
        if content is None:
            continue
        row = [m.get("role"), content, m.get("ts"), m.get("tool_name")]
        rows.append(row if times else [row[0], row[1], row[3]])
    encoded = json.dumps(rows, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(encoded.encode("utf-8", "surrogatepass")).hexdigest()


def key(
    source: str,
    session: str,
    position: str,
    messages: Sequence[Mapping[str, Any]],
    *,
    times: bool = True,
) -> str:
    """The idempotency key of one source turn: ``{source}:{session}:{position}:{hash}``.

    The hash covers what the turn says, so a turn that changed in the source (a rewind, an
    edit) is a new key and is appended, while an unchanged one replays. A session or position
    too long for the 200-character limit is replaced by its own hash."""
    session_part = session if len(session) <= 100 else "h" + _short(session, 32)
    position_part = position if len(position) <= 40 else "h" + _short(position, 16)
    return f"{source}:{session_part}:{position_part}:{digest(messages, times=times)[:16]}"


def unit_key(source: str, session: str, position: str) -> str:
    """The idempotency key of a unit the source itself identifies and never changes (a Claude
    Code record, a Codex item): ``{source}:{session}:{position}``, no hash — the same unit
    read at any moment, by any path, is the same key. A session longer than 100 characters,
    or a position longer than 80, is replaced by its hash."""
    session_part = session if len(session) <= 100 else "h" + _short(session, 32)
    position_part = position if len(position) <= 80 else "h" + _short(position, 32)
    return f"{source}:{session_part}:{position_part}"


def hermes_key(session: str, number: int, messages: Sequence[Mapping[str, Any]]) -> str:
    """The key of a Hermes turn, the same from the provider and from the state.db importer:
    the session id, the turn's number (its user message's ordinal in the live transcript) and
    a hash without times (the provider cannot know the times Hermes stores)."""
    return key(HERMES, session, str(number), messages, times=False)


def _short(text: str, length: int) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:length]


def metadata(fields: Mapping[str, Any]) -> dict[str, Any]:
    """Session metadata from source fields, made valid: empty values, numbers that are not
    finite and values nested past :data:`MAX_METADATA_DEPTH` dropped, long strings cut, and
    keys dropped from the end until it fits the 8 KiB limit (it describes, it is not content)."""
    out: dict[str, Any] = {}
    for name, value in fields.items():
        if _deeper(value, MAX_METADATA_DEPTH):
            continue
        value = _plain(value, MAX_METADATA_DEPTH)
        if value is None or value == "" or value == {} or value == []:
            continue
        out[clean_text(str(name))[:MAX_METADATA_STRING]] = value
    while out and len(_json(out).encode("utf-8", "surrogatepass")) > MAX_METADATA_BYTES:
        out.pop(next(reversed(out)))
    return out


def cwd(found: Mapping[str, Any]) -> str | None:
    """The working directory a session's agent ran in, from its metadata, where its source
    recorded one (Claude Code, Codex and Hermes do: ``cwd``)."""
    value = found.get("cwd")
    return value if isinstance(value, str) and value else None


def _deeper(value: Any, limit: int) -> bool:
    """Whether ``value`` nests mappings and lists more than ``limit`` deep (no recursion)."""
    level = [value]
    for _ in range(limit + 1):
        level = [
            child
            for item in level
            if isinstance(item, Mapping | list | tuple)
            for child in (item.values() if isinstance(item, Mapping) else item)
        ]
        if not any(isinstance(item, Mapping | list | tuple) for item in level):
            return False
    return True


def _plain(value: Any, depth: int) -> Any:
    """``value`` as plain JSON (None for what cannot be, or is nested deeper than ``depth``)."""
    if isinstance(value, str):
        return clean_text(value)[:MAX_METADATA_STRING]
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if depth <= 0:
        return None
    if isinstance(value, Mapping):
        items = ((clean_text(str(k)), _plain(v, depth - 1)) for k, v in value.items())
        return {k: v for k, v in items if v is not None}
    if isinstance(value, list | tuple):
        return [v for v in (_plain(item, depth - 1) for item in value) if v is not None]
    return clean_text(str(value))[:MAX_METADATA_STRING]


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
