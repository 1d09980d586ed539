"""What every importer produces, and the reading helpers they share.

An importer reads its source into :class:`Session` records — a session_key, its metadata and
its turns, each turn already in the tool-call convention — and :class:`Problem` records for
whatever it could not read (a malformed line is reported with its file and line, then skipped).
:mod:`pipeline.importers.runner` turns sessions into appends.
"""

from __future__ import annotations

import dataclasses
import io
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

import zstandard

from pipeline import errors
from pipeline.importers import convention

#: the largest JSONL line read (a line past it is reported, not loaded): 64 MiB
MAX_LINE = 64 * 1024 * 1024


@dataclasses.dataclass(frozen=True)
class Turn:
    """One source turn: the unit of an idempotency key (and of one append, when it fits)."""

    position: str  #: stable within its session: a turn id, or an ordinal
    messages: tuple[convention.Message, ...]
    line: int | None = None  #: where it starts in its file, for reports


@dataclasses.dataclass(frozen=True)
class Session:
    """One source session in the convention, ready to append."""

    source: str  #: the key prefix: ``hermes-db``, ``codex``, ``claude-code``, …
    session_key: str
    metadata: Mapping[str, Any]
    turns: tuple[Turn, ...]
    origin: str  #: the file it came from
    skipped: int = 0  #: source messages deliberately left out (meta, inactive, unfinished)


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


class Reader(Protocol):
    """What an importer module provides."""

    def files(self, path: Path) -> list[Path]:
        """The source files under ``path`` (a file, or a directory to walk), in order."""
        ...

    def read(self, path: Path) -> Iterator[Session | Problem]:
        """The sessions of one source file, and its problems."""
        ...


def existing(path: Path) -> Path:
    """``path`` if it exists; :class:`~pipeline.errors.NotFound` naming it otherwise."""
    if not path.exists():
        raise errors.NotFound(f"no such file or directory: {str(path)!r}")
    return path


def walk(path: Path, suffixes: tuple[str, ...]) -> list[Path]:
    """``path`` itself when it is a file; else every file under it whose name ends with one of
    ``suffixes``, sorted by path (so runs are repeatable)."""
    existing(path)
    if path.is_file():
        return [path]
    try:
        found = [p for p in path.rglob("*") if p.is_file() and p.name.endswith(suffixes)]
    except OSError as exc:
        raise errors.StorageUnavailable(f"cannot list {str(path)!r}: {exc}") from exc
    return sorted(found)


def open_text(path: Path) -> io.TextIOBase:
    """A text stream over ``path``, decompressing ``.zst`` files as it reads."""
    try:
        raw = path.open("rb")
    except OSError as exc:
        raise errors.StorageUnavailable(f"cannot open {str(path)!r}: {exc}") from exc
    if path.name.endswith(".zst"):
        reader = zstandard.ZstdDecompressor().stream_reader(raw, closefd=True)
        return io.TextIOWrapper(io.BufferedReader(reader), encoding="utf-8", errors="replace")
    return io.TextIOWrapper(raw, encoding="utf-8", errors="replace")


def jsonl(path: Path) -> Iterator[tuple[int, Any] | Problem]:
    """``(line number, value)`` for each line of a JSON Lines file (blank lines skipped); a
    line that is not JSON, or a file that cannot be read to its end, is a :class:`Problem`."""
    name = str(path)
    number = 0
    try:
        with open_text(path) as stream:
            for number, line in enumerate(stream, start=1):
                if len(line) > MAX_LINE:
                    yield Problem(name, number, f"line longer than {MAX_LINE} characters")
                    continue
                if not line.strip():
                    continue
                try:
                    yield number, json.loads(line)
                except ValueError as exc:
                    yield Problem(name, number, f"not JSON: {exc}")
    except (OSError, zstandard.ZstdError, EOFError) as exc:
        yield Problem(name, number + 1 if number else None, f"cannot read: {exc}")


def json_records(path: Path) -> Iterator[tuple[int | None, int, Any] | Problem]:
    """The records of a file that is either one JSON value (a list of records, or a single
    record) or JSON Lines: ``(line number or None, record number, record)``; problems as
    :class:`Problem`."""
    name = str(path)
    try:
        with open_text(path) as stream:
            first = stream.readline()
            # JSON Lines when the first line is a whole JSON value on its own (a JSON list
            # that starts with "[" on its own line is not); otherwise one JSON document.
            text = None if _is_json_object(first) else first + stream.read()
    except (OSError, zstandard.ZstdError, EOFError) as exc:
        yield Problem(name, None, f"cannot read: {exc}")
        return
    if text is not None:
        try:
            value = json.loads(text)
        except ValueError as exc:
            if text.lstrip().startswith("["):
                yield Problem(name, None, f"not JSON: {exc}")
                return
            value = None  # JSON Lines whose first line is malformed: read line by line
        if value is not None:
            for number, record in enumerate(value if isinstance(value, list) else [value]):
                yield None, number, record
            return
    for number, item in enumerate(jsonl(path)):
        # a malformed line counts as a record: fixing it does not renumber the ones after it
        yield item if isinstance(item, Problem) else (item[0], number, item[1])


def _is_json_object(line: str) -> bool:
    if not line.lstrip().startswith("{"):
        return False
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False
