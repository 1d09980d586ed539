"""The L0 file format: pure parse and render, no I/O (docs/design.md §2).

A file is a YAML frontmatter followed by message blocks::

    ---
    format_version: 1
    file_id: "…"
    …
    ---

    # 2026-08-03T11:18:06Z user

    body

    ## 2026-08-03T11:20:05Z tool

    **tool**: read_file

    output

Only a line matching :data:`HEADING` in full is a heading. Body lines that a looser reader
could mistake for a heading are escaped with one more leading backslash on write and lose one
on read, so every text round-trips: ``parse(render(x)).content == canonical(x)``.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import itertools
import operator
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, AnyStr, NamedTuple

import yaml

from pipeline import errors, refs, vocabulary

FORMAT_VERSION = 1
ROLES = vocabulary.ROLES
SOURCE_TYPES = vocabulary.SOURCE_TYPES

#: a message heading, the whole line (lines are split on ``\n`` only)
HEADING = re.compile(
    r"(#|##) ([0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{1,6})?Z)"
    r" (user|assistant|tool|system)"
)
_HEADING_BYTES = re.compile(HEADING.pattern.encode("ascii"))
#: a heading with the ``\n`` before it, ending at ``\n`` or the end of the text, and the blank
#: line the writer puts after it when one follows (not before a ``#``: that could be the next
#: heading, which needs its ``\n``). One C-level scan finds them all: the literal ``\n#``
#: prefix makes other lines nearly free.
_HEADING_BLOCK = re.compile(
    r"\n(##?) " + HEADING.pattern.split(" ", 1)[1] + r"(?:\n\n(?!#)|(?![^\n]))"
)
#: the seed's loose heading rule; body lines matching it (after any backslashes) are escaped
LOOSE_HEADING = re.compile(r"^#{1,2} .* (?:user|assistant|tool|system)$", re.MULTILINE)
_ESCAPE = re.compile(r"^(\\*#{1,2} .* (?:user|assistant|tool|system))$", re.MULTILINE)
#: the backslash to drop, on the first line and after a ``\n``: a lookahead, not a group, so
#: ``sub`` takes a literal replacement, and a literal ``\n\\`` prefix rather than ``^``, which
#: the regex engine would try at every character (together 3x faster on escaped bodies)
_UNESCAPE_FIRST = re.compile(r"\\(?=\\*#{1,2} .* (?:user|assistant|tool|system)$)", re.MULTILINE)
_UNESCAPE = re.compile(r"\n\\(?=\\*#{1,2} .* (?:user|assistant|tool|system)$)", re.MULTILINE)
_TOOL_LINE = re.compile(r"\*\*tool\*\*: (.*)")
_CALL_LINE = re.compile(r"\*\*tool call\*\*: ([^\n]+)")  #: a tool call's first line (format.md)
_BREAKS = re.compile(r"(?:\r?\n)*")
#: a UTC timestamp of the file's form (:func:`format_ts` leaves no trailing zero in a fraction)
TS = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{1,6})?Z")
#: characters a YAML double-quoted scalar must escape (quotes, breaks, non-printables)
_YAML_ESCAPE = re.compile('[\\\\"\x00-\x1f\x7f-\x9f\u2028\u2029\ufeff\ufffe\uffff]')
_YAML_NAMED = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t", "\r": "\\r"}


@dataclass(frozen=True)
class Header:
    """The frontmatter: immutable facts about a file."""

    file_id: str
    session_key: str
    agent_id: str
    source_type: str
    started_at: str
    metadata: Mapping[str, Any] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION


@dataclass(frozen=True)
class Message:
    """One message; ``seq`` is its 1-based position in the file (0 until placed)."""

    role: str
    content: str
    ts: str
    tool_name: str | None = None
    seq: int = 0

    def to_json(self, file_id: str) -> dict[str, Any]:
        """The message as the API, the CLI and the refiners show it (a call: its tool's name)."""
        call = self.role == "assistant" and _CALL_LINE.match(self.content)
        return {
            "seq": self.seq,
            "ts": self.ts,
            "role": self.role,
            "content": self.content,
            "tool_name": call.group(1) if call else self.tool_name,
            "source_ref": refs.format(file_id, self.seq),
        }


def _message(role: str, content: str, ts: str, tool_name: str | None, seq: int) -> Message:
    """``Message(...)`` without the frozen dataclass's per-field ``object.__setattr__``: parse
    builds one per block, and on chat-sized messages that constructor was ~15% of parse."""
    message = _new(Message)
    fields = {"role": role, "content": content, "ts": ts, "tool_name": tool_name, "seq": seq}
    _set(message, "__dict__", fields)
    return message


_new = object.__new__
_set = object.__setattr__


@dataclass(frozen=True)
class Document:
    """A parsed file: its header and its messages in file order."""

    header: Header
    messages: tuple[Message, ...]

    def source_ref(self, seq: int) -> str:
        """``file_id:seq`` for a message of this file."""
        return refs.format(self.header.file_id, seq)


# ---------------------------------------------------------------------------------------------
# timestamps


def format_ts(when: dt.datetime) -> str:
    """UTC, ``Z`` suffix, seconds, and the fraction only when there is one."""
    # isoformat, not strftime: its %Y gives "999" for the year 999 and the heading would stop
    # matching. isoformat writes four digits, and a fraction of six when there is one; an
    # aware time is written in UTC, without its "+00:00"
    text = when.isoformat() if when.tzinfo is None else when.astimezone(dt.UTC).isoformat()[:-6]
    return (text.rstrip("0") if when.microsecond else text) + "Z"


def parse_ts(text: str) -> dt.datetime:
    """The aware UTC datetime of a timestamp this module wrote."""
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


# ---------------------------------------------------------------------------------------------
# render


def canonical(text: str) -> str:
    """What a body reads back as: leading and trailing line breaks removed, nothing else.

    Trailing ``\\r`` characters go too: the writer follows every body with ``\\n``, so a
    trailing ``\\r`` would read back as part of a ``\\r\\n`` break and be lost anyway.
    """
    if not text.startswith(("\n", "\r")):  # most texts: no call to count breaks
        return text.rstrip("\r\n")
    return text[_leading_breaks(text) :].rstrip("\r\n")


def _leading_breaks(text: str) -> int:
    """How many characters of ``\\n`` / ``\\r\\n`` line breaks ``text`` starts with."""
    start = 0
    while True:
        if text.startswith("\n", start):
            start += 1
        elif text.startswith("\r\n", start):
            start += 2
        else:
            return start


def escape(body: str) -> str:
    """Add one backslash to every line a loose reader could take for a heading."""
    if "#" not in body:
        return body
    return _ESCAPE.sub(r"\\\1", body)


def unescape(body: str) -> str:
    """Inverse of :func:`escape`."""
    if "\\" not in body:
        return body
    if body.startswith("\\") and _UNESCAPE_FIRST.match(body):
        body = body[1:]
    if "\n\\" in body:
        body = _UNESCAPE.sub("\n", body)
    return body


def _yaml_quote(value: str) -> str:
    def one(match: re.Match[str]) -> str:
        char = match.group()
        named = _YAML_NAMED.get(char)
        if named:
            return named
        code = ord(char)
        return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"

    return '"' + _YAML_ESCAPE.sub(one, value) + '"'


def _yaml_key(key: str, pad: str) -> str:
    """A mapping key; a long one in the explicit ``? key`` form, as YAML loaders refuse an
    implicit key longer than 1024 characters (the whole frontmatter would be unreadable)."""
    quoted = _yaml_quote(key)
    if len(quoted) > 1000:
        return f"{pad}? {quoted}\n{pad}"
    return f"{pad}{quoted}"


def _yaml_value(value: Any, indent: int) -> str:
    """Block YAML for a JSON value; every string double-quoted so it reads back as itself."""
    pad = "  " * indent
    if isinstance(value, dict):
        if not value:
            return " {}\n"
        return "\n" + "".join(
            f"{_yaml_key(str(key), pad)}:{_yaml_value(item, indent + 1)}"
            for key, item in value.items()
        )
    if isinstance(value, list):
        if not value:
            return " []\n"
        return "\n" + "".join(f"{pad}-{_yaml_value(item, indent + 1)}" for item in value)
    if value is None:
        return " null\n"
    if value is True or value is False:
        return " true\n" if value else " false\n"
    if isinstance(value, int):
        return f" {value}\n"
    if isinstance(value, float):
        text = repr(value)
        if "e" in text and "." not in text.split("e")[0]:
            mantissa, exponent = text.split("e")
            text = f"{mantissa}.0e{exponent}"
        elif "." not in text and "e" not in text:
            text += ".0"
        return f" {text}\n"
    return f" {_yaml_quote(str(value))}\n"


def render_frontmatter(header: Header) -> str:
    """The frontmatter block, keys in spec order, strings quoted, ending in a blank line."""
    lines = [
        "---\n",
        f"format_version: {header.format_version}\n",
        f"file_id: {_yaml_quote(header.file_id)}\n",
        f"session_key: {_yaml_quote(header.session_key)}\n",
        f"agent_id: {_yaml_quote(header.agent_id)}\n",
        f"source_type: {_yaml_quote(header.source_type)}\n",
        f"started_at: {_yaml_quote(header.started_at)}\n",
    ]
    if header.metadata:
        lines.append("metadata:" + _yaml_value(dict(header.metadata), 1))
    lines.append("---\n\n")
    return "".join(lines)


def render_block(message: Message, *, first: bool) -> str:
    """One message block: heading, blank line, escaped body, blank line."""
    marker = "#" if first else "##"
    body = escape(canonical(message.content))
    if message.role == "tool" and message.tool_name is not None:
        body = (
            f"**tool**: {message.tool_name}\n\n{body}" if body else f"**tool**: {message.tool_name}"
        )
    return f"{marker} {message.ts} {message.role}\n\n{body}\n\n"


def render_upload(content: str) -> str:
    """The body of an upload file: the document itself, escaped, with no heading."""
    return escape(canonical(content)) + "\n"


def render(header: Header, messages: Iterable[Message]) -> str:
    """A whole session or external file."""
    blocks = [render_block(m, first=i == 0) for i, m in enumerate(messages)]
    return render_frontmatter(header) + "".join(blocks)


# ---------------------------------------------------------------------------------------------
# parse

#: a quoted string with nothing the writer escapes: read literally, it means what YAML reads
#: (a raw ``\r``, ``\x85`` or control character would not, so such text takes the YAML path)
_FAST_CHARS = r'[^"\\\x00-\x1f\x7f-\x9f\u2028\u2029\ufeff\ufffe\uffff]*'
_FAST_ITEM = rf'  "{_FAST_CHARS}": "{_FAST_CHARS}"\n'
_FAST_FRONTMATTER = re.compile(
    r"format_version: ([0-9]+)\n"
    rf'file_id: "({_FAST_CHARS})"\n'
    rf'session_key: "({_FAST_CHARS})"\n'
    rf'agent_id: "({_FAST_CHARS})"\n'
    rf'source_type: "({_FAST_CHARS})"\n'
    rf'started_at: "({_FAST_CHARS})"\n'
    rf"((?:metadata: \{{\}}\n)|(?:metadata:\n(?:{_FAST_ITEM})+))?"
)
_FAST_META_ITEM = re.compile(rf'  "({_FAST_CHARS})": "({_FAST_CHARS})"\n')


def _frontmatter_end(text: AnyStr, marks: tuple[AnyStr, AnyStr, AnyStr]) -> tuple[int, int]:
    """``(yaml_end, body_start)``: where the frontmatter's YAML ends and the first byte after
    its closing ``---`` line. One rule for text (:func:`parse`) and bytes (:func:`chain`):
    the closing line is the first line that is exactly ``---``, ended by ``\n`` or by the end
    of the file."""
    opening, closing, last = marks
    if not text.startswith(opening):
        line = text.split(opening[-1:], 1)[0][:40]
        first = line.decode("utf-8", "replace") if isinstance(line, bytes) else line
        raise errors.FormatError(f"line 1: expected '---' to open the frontmatter, got {first!r}")
    if text.startswith(opening, 4):
        return 4, 8
    if text == opening[:3] + last:  # "---\n---" and nothing else
        return 4, len(text)
    end = text.find(closing, 3)
    if end >= 0:
        return end + 1, end + 5
    if text.endswith(last):
        return len(text) - 3, len(text)
    raise errors.FormatError("line 1: unterminated frontmatter (no closing '---' line)")


_TEXT_MARKS = ("---\n", "\n---\n", "\n---")
_BYTE_MARKS = (b"---\n", b"\n---\n", b"\n---")


def split_frontmatter(text: str) -> tuple[str, int]:
    """The YAML between the ``---`` lines and the offset just past the closing ``---`` line."""
    yaml_end, body = _frontmatter_end(text, _TEXT_MARKS)
    return text[4:yaml_end], body


def _header_from_mapping(data: object) -> Header:
    if not isinstance(data, dict):
        raise errors.FormatError("frontmatter is not a YAML mapping")
    version = data.get("format_version")
    if type(version) is not int or version != FORMAT_VERSION:
        raise errors.FormatError(f"unknown format_version {version!r}")
    started = data.get("started_at")
    if isinstance(started, dt.datetime):
        started = format_ts(started if started.tzinfo else started.replace(tzinfo=dt.UTC))
    for key in ("file_id", "session_key", "agent_id", "source_type"):
        if not isinstance(data.get(key), str):
            raise errors.FormatError(
                f"frontmatter field {key} must be a string, got {data.get(key)!r}"
            )
    if not isinstance(started, str) or not TS.fullmatch(started):
        raise errors.FormatError(
            f"frontmatter field started_at is not a UTC timestamp: {started!r}"
        )
    if data["source_type"] not in SOURCE_TYPES:
        raise errors.FormatError(f"frontmatter source_type {data['source_type']!r} is unknown")
    metadata = data.get("metadata")
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict):
        raise errors.FormatError(f"frontmatter metadata must be a mapping, got {metadata!r}")
    return Header(
        file_id=data["file_id"],
        session_key=data["session_key"],
        agent_id=data["agent_id"],
        source_type=data["source_type"],
        started_at=started,
        metadata=metadata,
        format_version=version,
    )


def parse_header(yaml_text: str) -> Header:
    """The frontmatter's YAML as a :class:`Header`; our own shape takes a fast path."""
    fast = _FAST_FRONTMATTER.fullmatch(yaml_text)
    if fast:
        version, file_id, session_key, agent_id, source_type, started_at, meta = fast.groups()
        metadata = dict(_FAST_META_ITEM.findall(meta)) if meta else {}
        return _header_from_mapping(
            {
                "format_version": int(version),
                "file_id": file_id,
                "session_key": session_key,
                "agent_id": agent_id,
                "source_type": source_type,
                "started_at": started_at,
                "metadata": metadata,
            }
        )
    try:
        data = yaml.safe_load(yaml_text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f"line {mark.line + 2}: " if mark is not None else ""
        raise errors.FormatError(f"{line}frontmatter is not valid YAML: {exc}") from None
    return _header_from_mapping(data)


def _strip_breaks(text: str) -> str:
    """Remove leading and trailing ``\\n`` / ``\\r\\n`` line breaks (the parser's rule)."""
    start = _leading_breaks(text)
    end = len(text)
    while end > start and text[end - 1] == "\n":
        end -= 2 if end - 2 >= start and text[end - 2] == "\r" else 1
    return text[start:end] if start or end < len(text) else text


def _body(raw: str) -> str:
    """:func:`_strip_breaks`, done in C unless a ``\\r`` at an edge needs the exact rule."""
    body = raw.strip("\n")
    if body.startswith("\r") or body.endswith("\r"):
        return _strip_breaks(raw)
    return body


def parse(text: str, *, file_id: str | None = None) -> Document:
    """A whole file. ``file_id``, when given, must equal the frontmatter's."""
    yaml_text, offset = split_frontmatter(text)
    header = parse_header(yaml_text)
    if file_id is not None and header.file_id != file_id:
        raise errors.FormatError(
            f"line 3: file_id {header.file_id!r} is not the file's own id {file_id!r}"
        )
    # the frontmatter's closing line ends in the "\n" at offset - 1
    headings = list(_HEADING_BLOCK.finditer(text, offset - 1))
    if not headings:
        content = unescape(_body(text[offset:]))
        message = Message(role="user", content=content, ts=header.started_at, seq=1)
        return Document(header=header, messages=(message,))
    return Document(header=header, messages=tuple(_messages(text, headings, 1)))


def _messages(text: str, headings: Sequence[re.Match[str]], first: int) -> list[Message]:
    """The messages of the blocks whose headings (:data:`_HEADING_BLOCK`) are ``headings``,
    the first numbered ``first``: each block runs to the next heading, the last to the end of
    ``text``."""
    messages: list[Message] = []
    append, make, body_message = messages.append, _message, _body_message
    last = len(headings) - 1
    size = len(text)
    # The hot loop of every full read, kept flat: at ~1 KB a message, each step counts. A
    # block as the writer lays it out (heading, blank line, [tool line, blank line,] body,
    # blank line) is cut out with one slice; anything else (extra or CRLF breaks, an empty
    # body) goes the general way, which strips breaks by the parser's rule.
    for i, m in enumerate(headings):
        _, ts, role = m.groups()
        start = m.end()
        stop = headings[i + 1].start() + 1 if i < last else size
        end = stop - 2  # the writer's blank line before the next heading (or at the end)
        tool_name = None
        if role == "tool" and text.startswith("**tool**: ", start):
            # the tool line, then a blank line: the body starts after it
            nl = text.find("\n", start, end)
            tool = _TOOL_LINE.fullmatch(text, start, nl) if nl > 0 else None
            if tool is not None and text.startswith("\n\n", nl):
                tool_name, start = tool.group(1), nl + 2
            else:
                start = -1  # not the writer's layout: the general way below
        if (
            start - m.end(3) >= 2
            and start < end
            and text[end] == "\n"
            and text[stop - 1] == "\n"
            and text[start] not in "\r\n"
            and text[end - 1] not in "\r\n"
        ):
            body = text[start:end]
            append(make(role, unescape(body) if "\\" in body else body, ts, tool_name, first + i))
        else:
            append(body_message(text[m.end(3) + 1 : stop], ts, role, first + i))
    return messages


def _body_message(raw: str, ts: str, role: str, seq: int) -> Message:
    """The message whose heading said ``ts`` and ``role`` and whose body is ``raw`` (the text
    after the heading line, up to the next heading)."""
    body = _body(raw)
    tool_name = None
    if role == "tool" and body.startswith("**tool**: "):
        # no partition: a tool's output is often the biggest body, so copy it only once
        nl = body.find("\n")
        tool = _TOOL_LINE.fullmatch(body, 0, nl if nl >= 0 else len(body))
        if tool:
            tool_name = tool.group(1)
            # the end was stripped with the body; only the breaks after the tool line go
            breaks = _BREAKS.match(body, nl + 1) if nl >= 0 else None
            body = body[breaks.end() :] if breaks else ""
    if "\\" in body:
        body = unescape(body)
    return _message(role, body, ts, tool_name, seq)


def parse_block(block: bytes, seq: int, *, upload_ts: str | None = None) -> Message:
    """One message from the bytes of its block (a heading line and its body), as read from a
    file by its offset; an upload's single block has no heading: pass ``upload_ts``."""
    try:
        text = block.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise errors.FormatError(f"message {seq} is not UTF-8 at byte {exc.start}") from None
    if upload_ts is not None:
        return Message(role="user", content=unescape(_body(text)), ts=upload_ts, seq=seq)
    nl = text.find("\n")
    heading = HEADING.fullmatch(text, 0, nl if nl >= 0 else len(text))
    if heading is None:
        raise errors.FormatError(f"message {seq} does not start with a heading line")
    _, ts, role = heading.groups()
    return _body_message(text[nl + 1 :] if nl >= 0 else "", ts, role, seq)


class Located(NamedTuple):
    """A message and where its block is in the file (bytes). A tuple: a flush and a reindex
    make one a message, in a third less time than a frozen dataclass's."""

    offset: int
    length: int
    message: Message


def locate(
    data: bytes, *, base: int = 0, first_seq: int = 1, upload_ts: str | None = None
) -> list[Located]:
    """The blocks of ``data``: a whole file (``base`` 0: it starts with its frontmatter) or
    rendered blocks written after ``base`` bytes of one. ``upload_ts`` marks an upload, whose
    one block is everything after the frontmatter."""
    if upload_ts is None and data.isascii():
        found = _located_ascii(data, base, first_seq)
        if found is not None:
            return found
    return _located(data, base, first_seq, upload_ts)


def _located(data: bytes, base: int, first_seq: int, upload_ts: str | None) -> list[Located]:
    """:func:`locate`, the general way: the blocks' bytes found, then each one decoded and
    parsed (:func:`parse_block`)."""
    if base == 0:
        body, starts = block_offsets(data)
        if upload_ts is not None or (starts == [body] and not _HEADING_BYTES.match(data, body)):
            starts = [body]
            upload_ts = upload_ts or _header_of(data).started_at
    else:
        starts = _block_starts(data, 0)
    bounds = [*starts, len(data)]
    return [
        Located(base + lo, hi - lo, parse_block(data[lo:hi], seq, upload_ts=upload_ts))
        for seq, (lo, hi) in enumerate(itertools.pairwise(bounds), first_seq)
    ]


def _located_ascii(data: bytes, base: int, first_seq: int) -> list[Located] | None:
    """:func:`locate` of ASCII ``data`` (most chat), its characters its bytes: the headings
    found by one scan of the text and the messages cut out by :func:`_messages`, as
    :func:`parse` does, instead of a decode and a parse a block (half the time of a flush's
    and a reindex's reading). None when it has no heading (an upload): the general way says
    what it is."""
    if base == 0:
        _, start = _frontmatter_end(data, _BYTE_MARKS)
        text = data.decode("ascii")
        shift = 0
    else:  # rendered blocks: the "\n" a heading is found after, put before the first
        start = 1
        text = "\n" + data.decode("ascii")
        shift = 1
    headings = list(_HEADING_BLOCK.finditer(text, start - 1))
    if not headings:
        return None
    starts = [m.start() + 1 - shift for m in headings]
    lengths = list(map(operator.sub, [*starts[1:], len(data)], starts))
    offsets = [base + lo for lo in starts]
    return list(map(Located, offsets, lengths, _messages(text, headings, first_seq)))


def _header_of(data: bytes) -> Header:
    yaml_text, _ = split_frontmatter(data[: data.find(b"\n---", 3) + 5].decode("utf-8"))
    return parse_header(yaml_text)


# ---------------------------------------------------------------------------------------------
# blocks and the hash chain (docs/design.md §3)


def _block_starts(data: bytes, start: int) -> list[int]:
    """Offsets of the heading lines in ``data`` from ``start`` (a line start) on."""
    starts = []
    match = _HEADING_BYTES.fullmatch
    find = data.find
    size = len(data)
    if data.startswith(b"#", start):
        line = start
    else:
        pos = find(b"\n#", start)
        line = pos + 1 if pos >= 0 else -1
    while line >= 0:
        end = find(b"\n", line)
        if end < 0:
            end = size
        if match(data, line, end):
            starts.append(line)
        pos = find(b"\n#", end)
        line = pos + 1 if pos >= 0 else -1
    return starts


def block_offsets(data: bytes) -> tuple[int, list[int]]:
    """``(body_start, starts)``: where the frontmatter ends and where each block begins.

    A file without any heading has one block: everything after the frontmatter.
    """
    _, body = _frontmatter_end(data, _BYTE_MARKS)
    return body, _block_starts(data, body) or [body]


def chain_start(prefix: bytes) -> bytes:
    """``h0``: the digest of every byte before the first block."""
    return hashlib.sha256(prefix).digest()


def chain_extend(head: bytes, block: bytes) -> bytes:
    """``h_i = sha256(h_{i-1} ‖ block_i)``."""
    return hashlib.sha256(head + block).digest()


def chain(data: bytes, *, starts: Sequence[int] | None = None) -> tuple[bytes, int]:
    """``(head, block count)`` of a whole file's bytes; ``starts``: where its blocks begin,
    when :func:`block_offsets` (or :func:`locate`, whose offsets they are but for an upload's)
    found them already — a reader of a whole file then scans it for headings once."""
    if starts is None:
        _, starts = block_offsets(data)
    head = chain_start(data[: starts[0]])
    bounds = [*starts, len(data)]
    for lo, hi in itertools.pairwise(bounds):
        head = chain_extend(head, data[lo:hi])
    return head, len(starts)


def split_rendered(blocks: bytes) -> list[bytes]:
    """Rendered blocks (as the writer made them, back to back) split into single blocks."""
    bounds = [*_block_starts(blocks, 0), len(blocks)]
    return [blocks[lo:hi] for lo, hi in itertools.pairwise(bounds)]
