"""Provenance (docs/design.md §2): a message is named forever by its ``source_ref``,
``"{file_id}:{seq}"`` — through appends, archiving, restore and redaction. The one place the
form is written and read."""

from __future__ import annotations

import re

from pipeline import errors

FILE_ID_PATTERN = "^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$"
SEQ_PATTERN = "^[1-9][0-9]{0,9}$"
SOURCE_REF_PATTERN = FILE_ID_PATTERN[:-1] + ":" + SEQ_PATTERN[1:]
MAX_SEQ = 2**31 - 1  #: the index stores seqs as 32-bit integers
_FILE_ID = re.compile(FILE_ID_PATTERN)
_SEQ = re.compile(SEQ_PATTERN)


def format(file_id: str, seq: int) -> str:
    """The source_ref of message ``seq`` of ``file_id``."""
    return f"{file_id}:{seq}"


def span(file_id: str, first: int, last: int) -> tuple[str, ...]:
    """The source_refs of messages ``first..last`` of ``file_id``."""
    return tuple(format(file_id, seq) for seq in range(first, last + 1))


_GROUPS = (8, 4, 4, 4, 12)
_HEX = frozenset("0123456789abcdefABCDEF")


def file_id_fault(value: str) -> str:
    """What keeps ``value`` from being a file_id, in words a person (or a model) can act on."""
    groups = value.split("-")
    if tuple(map(len, groups)) != _GROUPS or not set(value.replace("-", "")) <= _HEX:
        return "a file_id is 32 hexadecimal digits in groups of 8-4-4-4-12"
    if value != value.lower():
        return "its letters must be lowercase"
    if groups[2][0] != "4":
        return (
            f"it is a UUID of version {groups[2][0]}, and a file_id is a UUID4 (its third "
            "group starts with 4)"
        )
    return f"its fourth group starts with {groups[3][0]!r}, and a UUID4's with 8, 9, a or b"


def ref_fault(value: str) -> str:
    """What keeps ``value`` from being a source_ref, in words."""
    file_id, sep, seq = value.rpartition(":")
    if not sep:
        return "it has no ':' between a file_id and a seq"
    if not _FILE_ID.fullmatch(file_id):
        return f"its file_id: {file_id_fault(file_id)}"
    return f"its seq {seq[:20]!r} is not a whole number from 1 (ASCII digits, no leading 0)"


def fault(pattern: str, value: object) -> str | None:
    """What keeps ``value`` from matching ``pattern`` when that is the file_id's or the
    source_ref's, in words; None for any other pattern."""
    if not isinstance(value, str):
        return None
    if pattern == FILE_ID_PATTERN:
        return file_id_fault(value)
    return ref_fault(value) if pattern == SOURCE_REF_PATTERN else None


def check_file_id(value: object) -> str:
    """A lowercase UUID4 as made by the server."""
    if not isinstance(value, str) or not _FILE_ID.fullmatch(value):
        why = file_id_fault(value) if isinstance(value, str) else "not a string"
        raise errors.InvalidInput(f"not a file_id (a UUID4): {value!r:.80}: {why}")
    return value


def parse(ref: str) -> tuple[str, int]:
    """``"file_id:seq"`` → ``(file_id, seq)``; the seq is ASCII digits without a leading 0
    (at most 10 of them: a seq past :data:`MAX_SEQ` names no message, which is NotFound)."""
    file_id, sep, seq = ref.rpartition(":")
    if not sep or not _SEQ.fullmatch(seq) or not _FILE_ID.fullmatch(file_id):
        raise errors.InvalidInput(f"not a source_ref (file_id:seq): {ref!r:.80}: {ref_fault(ref)}")
    return file_id, int(seq)
