"""What every importer produces, and the reading helpers they share.

An importer reads its source into :class:`Session` records — a session_key, its metadata and
its turns, each turn already in the tool-call convention — :class:`Problem` records for
whatever it could not read (a malformed line is reported with its file and line, then
skipped) and :class:`Empty` records for records that hold nothing to import (counted, not
errors). :mod:`pipeline.importers.runner` turns sessions into appends.

Reading is strict about what it cannot read correctly and lenient about everything else: a
line that is not UTF-8 (a Latin-1 file, say) is reported, never imported as replacement
characters; a UTF-8 byte order mark is accepted; a value nested deeper than
:data:`MAX_DEPTH` is reported (no depth can exhaust the stack); a file reached through a
symlink that points outside the tree the import was given is left alone.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import re
import stat
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO, Protocol

import zstandard

from pipeline import errors
from pipeline.importers import convention

#: the largest JSONL line read (a line past it is reported, not loaded): 64 MiB
MAX_LINE = 64 * 1024 * 1024
#: how deep a record may nest (objects and lists); deeper ones are reported, not imported
MAX_DEPTH = 100
BOM = b"\xef\xbb\xbf"


@dataclasses.dataclass(frozen=True)
class Unit:
    """What the source itself identifies, the unit of an idempotency key (and of one append,
    when it fits): a Claude Code record, a Codex item, a Hermes turn, a dataset's turn."""

    position: str  #: stable within its session: a record's uuid, a turn id and place, an ordinal
    messages: tuple[convention.Message, ...]
    line: int | None = None  #: where it starts in its file, for reports
    #: the key an earlier version gave the turn this unit belongs to (the server answers a unit
    #: whose turn it stored whole as already stored: docs/clients.md, "Keys")
    legacy_key: str | None = None


@dataclasses.dataclass(frozen=True)
class Session:
    """One source session in the convention, ready to append."""

    source: str  #: the key prefix: ``hermes``, ``codex``, ``claude-code``, …
    session_key: str
    metadata: Mapping[str, Any]
    units: tuple[Unit, ...]
    origin: str  #: the file it came from
    skipped: int = 0  #: source messages deliberately left out (meta, reasoning, unfinished)
    #: keys hash what a unit says (a turn that may change: Hermes, datasets); False: the unit is
    #: immutable in its source (a record, an item) and its key is its position alone
    hashed: bool = True
    times: bool = True  #: whether hashed keys cover the messages' times (not for Hermes)


@dataclasses.dataclass(frozen=True)
class Problem:
    """A record that could not be imported; the rest goes on."""

    file: str
    line: int | None
    detail: str
    #: True: the record was read, and the server refused it; False: it could not be read
    refused: bool = False
    end: int | None = None  #: a JSON Lines line's: the byte offset just past it

    def to_json(self) -> dict[str, Any]:
        """``{"file", "line", "detail"}``."""
        return {"file": self.file, "line": self.line, "detail": self.detail}

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line is not None else self.file
        return f"{where}: {self.detail}"


@dataclasses.dataclass(frozen=True)
class Empty:
    """A record with nothing to import (no messages, or only empty ones): counted, skipped."""

    file: str
    line: int | None


Record = Session | Problem | Empty


class Reader(Protocol):
    """What an importer module provides."""

    def files(self, path: Path) -> list[Path]:
        """The source files under ``path`` (a file, or a directory to walk), in order."""
        ...

    def read(self, path: Path) -> Iterator[Record]:
        """The sessions of one source file, its empty records and its problems."""
        ...


def existing(path: Path) -> Path:
    """``path`` if it exists; :class:`~pipeline.errors.NotFound` naming it otherwise."""
    if not path.exists():
        raise errors.NotFound(f"no such file or directory: {str(path)!r}")
    return path


def walk(path: Path, suffixes: tuple[str, ...]) -> list[Path]:
    """``path`` itself when it is a file; else every file under it whose name ends with one of
    ``suffixes``, sorted by path (so runs are repeatable). Directory symlinks are not
    followed, and a file symlink only when it points inside the tree (an import reads what it
    was given, not what a link reaches elsewhere)."""
    existing(path)
    if path.is_file():
        return [path]
    root = path.resolve()
    found: list[Path] = []
    seen: set[Path] = set()

    def failed(exc: OSError) -> None:
        raise errors.StorageUnavailable(f"cannot list {str(path)!r}: {exc}") from exc

    for directory, _, names in os.walk(path, onerror=failed):
        for name in names:
            if not name.endswith(suffixes):
                continue
            candidate = Path(directory, name)
            target = candidate.resolve()
            if not target.is_relative_to(root) or not target.is_file() or target in seen:
                continue
            seen.add(target)
            found.append(candidate)
    return sorted(found)


def open_binary(path: Path) -> BinaryIO:
    """A byte stream over ``path``, decompressing ``.zst`` files as it reads."""
    try:
        raw = path.open("rb")
    except OSError as exc:
        raise errors.StorageUnavailable(f"cannot open {str(path)!r}: {exc}") from exc
    if path.name.endswith(".zst"):
        reader = zstandard.ZstdDecompressor().stream_reader(raw, closefd=True)
        return io.BufferedReader(reader)
    return raw


def decode(data: bytes) -> str:
    """UTF-8 text (a byte order mark dropped); ``ValueError`` naming the first bad byte and
    what to do, when it is not UTF-8 — never replacement characters in the import."""
    try:
        return data.removeprefix(BOM).decode("utf-8")
    except UnicodeDecodeError as exc:
        byte = exc.object[exc.start]
        hint = " (a Latin-1 file? convert it: iconv -f latin1 -t utf-8)" if byte >= 0x80 else ""
        raise ValueError(f"not UTF-8: byte 0x{byte:02x} at offset {exc.start}{hint}") from None


def too_deep(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether ``value`` nests objects and lists more than ``limit`` deep (no recursion)."""
    level: list[Any] = [value]
    for _ in range(limit + 1):
        level = [
            child
            for item in level
            if isinstance(item, dict | list)
            for child in (item.values() if isinstance(item, dict) else item)
            if isinstance(child, dict | list)
        ]
        if not level:
            return False
    return True


def parse_json(text: str | bytes) -> Any:
    """A JSON value; ``ValueError`` with a reason when it is not JSON or nests past
    :data:`MAX_DEPTH` (whose parse could exhaust the stack)."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise ValueError(f"nested more than {MAX_DEPTH} levels deep") from None
    except ValueError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if too_deep(value):
        raise ValueError(f"nested more than {MAX_DEPTH} levels deep")
    return value


@dataclasses.dataclass(frozen=True)
class Line:
    """One JSON Lines record: its line number, the byte offset just past it, its value."""

    number: int
    end: int
    value: Any


def lines(
    path: Path,
    *,
    offset: int = 0,
    number: int = 0,
    live: bool = False,
    deadline: float | None = None,
) -> Iterator[Line | Problem]:
    """The records of a JSON Lines file from byte ``offset`` (line ``number`` read before it),
    each a :class:`Line` (blank lines skipped); a line that cannot be read is a
    :class:`Problem` with its line number and reason, and the rest goes on.

    Read in chunks, never a line past :data:`MAX_LINE` whole, and not past ``deadline``
    (``time.monotonic()``): the caller continues from the last line's ``end``. Only regular
    files are read (a device or a pipe never ends). A last line without its newline is still
    being written: ``live`` (a transcript its agent writes) leaves it for the next read;
    otherwise it is taken when it parses, else reported as such."""
    name = str(path)
    try:
        stream = _open_tail(path, offset)
    except ValueError as exc:
        yield Problem(name, None, str(exc))
        return
    except (OSError, zstandard.ZstdError, EOFError) as exc:
        yield Problem(name, None, f"cannot read: {exc}")
        return
    with stream:
        yield from _lines(stream, name, offset, number, live=live, deadline=deadline)


def _open_tail(path: Path, offset: int) -> BinaryIO:
    """``path`` open at ``offset`` (of its decompressed bytes, for ``.zst``)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError("not a regular file: not read")
        raw = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    if not path.name.endswith(".zst"):
        raw.seek(offset)
        return raw
    stream = io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(raw, closefd=True))
    left = offset
    while left > 0:  # a compressed stream cannot seek: read up to the offset
        skipped = stream.read(min(left, CHUNK))
        if not skipped:
            break
        left -= len(skipped)
    return stream


#: bytes read at a time
CHUNK = 1024 * 1024


def _lines(
    stream: BinaryIO,
    name: str,
    offset: int,
    number: int,
    *,
    live: bool,
    deadline: float | None,
) -> Iterator[Line | Problem]:
    buffer = b""
    base = offset  # the file offset of buffer[0]
    skipping = False  # inside a line longer than MAX_LINE: dropped up to its newline
    try:
        while True:
            if deadline is not None and time.monotonic() > deadline:
                return
            chunk = stream.read(CHUNK)
            if not chunk:
                break
            buffer += chunk
            start = 0
            while True:
                newline = buffer.find(b"\n", start)
                if newline == -1:
                    break
                number += 1
                raw = buffer[start : newline + 1]
                start = newline + 1
                if skipping:
                    skipping = False
                    detail = f"line longer than {MAX_LINE} bytes"
                    yield Problem(name, number, detail, end=base + start)
                elif raw.strip():
                    yield _line(name, number, base + start, raw)
                if deadline is not None and time.monotonic() > deadline:
                    return
            buffer, base = buffer[start:], base + start
            if len(buffer) > MAX_LINE:
                if live:
                    return  # still being written: the next read meets it whole
                skipping = True
                base += len(buffer)
                buffer = b""
    except (OSError, zstandard.ZstdError, EOFError) as exc:
        yield Problem(name, number + 1, f"cannot read: {exc}")
        return
    if skipping:
        yield Problem(name, number + 1, f"line longer than {MAX_LINE} bytes")
    elif buffer.strip() and not live:
        found = _line(name, number + 1, base + len(buffer), buffer)
        if isinstance(found, Problem):
            detail = f"unterminated last line (still being written?): {found.detail}"
            found = Problem(name, number + 1, detail, end=found.end)
        yield found


def _line(name: str, number: int, end: int, raw: bytes) -> Line | Problem:
    try:
        return Line(number, end, parse_json(decode(raw)))
    except ValueError as exc:
        return Problem(name, number, str(exc), end=end)


def jsonl(path: Path, *, live: bool = False) -> Iterator[tuple[int, Any] | Problem]:
    """:func:`lines` from the start, as ``(line number, value)``."""
    for item in lines(path, live=live):
        yield item if isinstance(item, Problem) else (item.number, item.value)


def json_records(path: Path) -> Iterator[tuple[int | None, int, Any] | Problem]:
    """The records of a file that is either one JSON value (a list of records, or a single
    record) or JSON Lines: ``(line number or None, record number, record)``; problems as
    :class:`Problem`. A list whose one element cannot be read (not JSON, nested too deep, not
    UTF-8) costs that element only: it is reported by its line, the others are read."""
    name = str(path)
    try:
        with open_binary(path) as stream:
            first = stream.readline(MAX_LINE + 1).removeprefix(BOM)
            # JSON Lines when the first line is a whole JSON object on its own (a JSON list
            # that starts with "[" on its own line is not); otherwise one JSON document.
            whole = None if _is_json_object(first) else first + stream.read()
    except (OSError, zstandard.ZstdError, EOFError) as exc:
        yield Problem(name, None, f"cannot read: {exc}")
        return
    if whole is not None:
        try:
            value = parse_json(decode(whole))
        except ValueError as exc:
            if whole.lstrip().startswith(b"["):
                yield from _list(name, whole)
                return
            if str(exc).startswith(("not UTF-8", "nested")):
                yield Problem(name, None, str(exc))
                return
            value = None  # JSON Lines whose first line is malformed: read line by line
        if value is not None:
            for number, record in enumerate(value if isinstance(value, list) else [value]):
                yield None, number, record
            return
    for number, item in enumerate(jsonl(path)):
        # a malformed line counts as a record: fixing it does not renumber the ones after it
        yield item if isinstance(item, Problem) else (item[0], number, item[1])


def _is_json_object(line: bytes) -> bool:
    if not line.lstrip().startswith(b"{"):
        return False
    try:
        return isinstance(parse_json(decode(line)), dict)
    except ValueError:
        return False


_DECODER = json.JSONDecoder()
#: what a JSON value's extent is made of: strings (skipped whole) and brackets
_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]', re.S)
_SCALAR_END = re.compile(r"[^,\]]*")
_BAD_BYTE = re.compile("[\udc80-\udcff]")


def _list(name: str, data: bytes) -> Iterator[tuple[int | None, int, Any] | Problem]:
    """The elements of a JSON list one by one, when the list as a whole does not parse: each
    element that is not JSON, nests past :data:`MAX_DEPTH` or holds bytes that are not UTF-8
    is reported by its line and the others are read."""
    clean = True
    try:
        text = data.removeprefix(BOM).decode("utf-8")
    except UnicodeDecodeError:
        text, clean = data.removeprefix(BOM).decode("utf-8", "surrogateescape"), False
    line, counted = 1, 0
    for number, (start, end, found) in enumerate(_elements(text)):
        line += text.count("\n", counted, start)
        counted = start
        if isinstance(found, ValueError):
            yield Problem(name, line, str(found))
            if end is None:
                return
            continue
        bad = None if clean or end is None else _BAD_BYTE.search(text, start, end)
        if bad is not None:
            byte = ord(bad.group()) - 0xDC00
            hint = " (a Latin-1 file? convert it: iconv -f latin1 -t utf-8)"
            yield Problem(name, line, f"not UTF-8: byte 0x{byte:02x}{hint}")
        elif too_deep(found):
            yield Problem(name, line, f"nested more than {MAX_DEPTH} levels deep")
        else:
            yield line, number, found


def _elements(text: str) -> Iterator[tuple[int, int | None, Any]]:
    """``(start, end, value)`` of each element of the JSON list ``text``; a ``ValueError``
    for the value of one that does not parse (``end`` None: nothing after it can be read)."""
    pos = _skip(text, _skip(text, 0) + 1)  # past the "["
    if text.startswith("]", pos):
        return
    while True:
        start = pos
        try:
            value, pos = _DECODER.raw_decode(text, start)
        except RecursionError:
            end = _end(text, start)
            yield start, end, ValueError(f"nested more than {MAX_DEPTH} levels deep")
            if end is None:
                return
            pos = end
        except ValueError as exc:
            end = _end(text, start)
            yield start, end, ValueError(f"not JSON: {exc}")
            if end is None:
                return
            pos = end
        else:
            yield start, pos, value
        pos = _skip(text, pos)
        if text.startswith(",", pos):
            pos = _skip(text, pos + 1)
            continue
        if not text.startswith("]", pos):
            yield pos, None, ValueError("not JSON: expected ',' or ']' after a list element")
        return


def _skip(text: str, pos: int) -> int:
    """Past the white space at ``pos``."""
    while pos < len(text) and text[pos] in " \t\n\r":
        pos += 1
    return pos


def _end(text: str, start: int) -> int | None:
    """Where the JSON value at ``start`` ends, by its brackets and strings alone (no parse, no
    recursion: for a value the parser refused); None when it never does."""
    if not text.startswith(("[", "{"), start):
        found = _SCALAR_END.match(text, start)
        end = found.end() if found else len(text)
        return end if end < len(text) else None
    depth = 0
    for token in _TOKENS.finditer(text, start):
        mark = token.group()
        if mark in "[{":
            depth += 1
        elif mark in "]}":
            depth -= 1
            if depth == 0:
                return token.end()
    return None
