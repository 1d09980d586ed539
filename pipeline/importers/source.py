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
class Turn:
    """One source turn: the unit of an idempotency key (and of one append, when it fits)."""

    position: str  #: stable within its session: a turn id, or an ordinal
    messages: tuple[convention.Message, ...]
    line: int | None = None  #: where it starts in its file, for reports


@dataclasses.dataclass(frozen=True)
class Session:
    """One source session in the convention, ready to append."""

    source: str  #: the key prefix: ``hermes``, ``codex``, ``claude-code``, …
    session_key: str
    metadata: Mapping[str, Any]
    turns: tuple[Turn, ...]
    origin: str  #: the file it came from
    skipped: int = 0  #: source messages deliberately left out (meta, inactive, unfinished)
    times: bool = True  #: whether keys hash the messages' times (not for Hermes: see its key)


@dataclasses.dataclass(frozen=True)
class Problem:
    """A record that could not be imported; the rest goes on."""

    file: str
    line: int | None
    detail: str

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


def jsonl(path: Path, *, live: bool = False) -> Iterator[tuple[int, Any] | Problem]:
    """``(line number, value)`` for each line of a JSON Lines file (blank lines skipped); a
    line that cannot be read, or a file that cannot be read to its end, is a
    :class:`Problem`. A last line without its newline that does not parse is still being
    written: reported as such, or (``live``: a transcript read while its agent writes it)
    left for the next read without a word."""
    name = str(path)
    number = 0
    try:
        with open_binary(path) as stream:
            while True:
                raw = stream.readline(MAX_LINE + 1)
                if not raw:
                    break
                number += 1
                if len(raw) > MAX_LINE and not raw.endswith(b"\n"):
                    while raw and not raw.endswith(b"\n"):
                        raw = stream.readline(MAX_LINE)
                    yield Problem(name, number, f"line longer than {MAX_LINE} bytes")
                    continue
                if not raw.strip():
                    continue
                try:
                    yield number, parse_json(decode(raw))
                except ValueError as exc:
                    if raw.endswith(b"\n"):
                        yield Problem(name, number, str(exc))
                    elif not live:
                        detail = f"unterminated last line (still being written?): {exc}"
                        yield Problem(name, number, detail)
    except (OSError, zstandard.ZstdError, EOFError) as exc:
        yield Problem(name, number + 1 if number else None, f"cannot read: {exc}")


def json_records(path: Path) -> Iterator[tuple[int | None, int, Any] | Problem]:
    """The records of a file that is either one JSON value (a list of records, or a single
    record) or JSON Lines: ``(line number or None, record number, record)``; problems as
    :class:`Problem`."""
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
            if whole.lstrip().startswith(b"[") or str(exc).startswith(("not UTF-8", "nested")):
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
