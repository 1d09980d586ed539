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


def check_file_id(value: object) -> str:
    """A lowercase UUID4 as made by the server."""
    if not isinstance(value, str) or not _FILE_ID.fullmatch(value):
        raise errors.InvalidInput(f"not a file_id (a UUID4): {value!r}")
    return value


def parse(ref: str) -> tuple[str, int]:
    """``"file_id:seq"`` → ``(file_id, seq)``; the seq is ASCII digits without a leading 0
    (at most 10 of them: a seq past :data:`MAX_SEQ` names no message, which is NotFound)."""
    file_id, sep, seq = ref.rpartition(":")
    if not sep or not _SEQ.fullmatch(seq):
        raise errors.InvalidInput(f"not a source_ref (file_id:seq): {ref!r}")
    return check_file_id(file_id), int(seq)
