"""Row records (pipeline.tables.Record): ``of`` builds the same frozen record as the
dataclass' own ``__init__``, faster for a whole row, and falls back to it for anything else."""

from __future__ import annotations

import dataclasses

import factories
import pytest

from pipeline import tables


def _file_row() -> dict[str, object]:
    """A whole ``raw_files`` row as a mapping, as the index reads it."""
    row = factories.file_row("f1")
    return dataclasses.asdict(dataclasses.replace(row, next_seq=4, flushed_seq=3, next_sequence=7))


def test_a_whole_row_makes_the_same_frozen_record(monkeypatch: pytest.MonkeyPatch) -> None:
    values = _file_row()
    expected = tables.FileRow(**values)  # type: ignore[arg-type]

    def init(self: object, **kwargs: object) -> None:
        raise AssertionError("a whole row went through __init__")

    monkeypatch.setattr(tables.FileRow, "__init__", init)
    made = tables.FileRow.of(values)
    monkeypatch.undo()
    assert type(made) is tables.FileRow
    assert made == expected
    assert hash(made) == hash(expected)
    assert made.next_seq == 4 and made.next_sequence == 7
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.next_seq = 5  # type: ignore[misc]
    moved = dataclasses.replace(made, flushed_seq=4)
    assert (moved.flushed_seq, made.flushed_seq) == (4, 3)
    values["next_seq"] = 99
    assert made.next_seq == 4  # the record is not the mapping


def test_a_partial_or_foreign_mapping_goes_through_init() -> None:
    values = _file_row()
    del values["next_sequence"]
    made = tables.FileRow.of(values)
    assert made.next_sequence is None  # the field's default, as __init__ gives it
    with pytest.raises(TypeError):
        tables.FileRow.of({**_file_row(), "stray": 1})
    with pytest.raises(TypeError):
        tables.FileRow.of({"file_id": "f1"})
