"""Row records (pipeline.tables.Record): ``of`` builds the same frozen record as the
dataclass' own ``__init__``, faster for a whole row, and falls back to it for anything else."""

from __future__ import annotations

import dataclasses
import datetime as dt

import factories
import pytest
import sqlalchemy as sa

from pipeline import tables


def _file_row() -> dict[str, object]:
    """A whole ``raw_files`` row as a mapping, as the index reads it."""
    row = factories.file_row("f1")
    return dataclasses.asdict(dataclasses.replace(row, next_seq=4, flushed_seq=3, next_sequence=7))


def _refuse_init(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``FileRow.__init__`` fail the test until ``monkeypatch.undo()``."""

    def init(self: object, **kwargs: object) -> None:
        raise AssertionError("a whole row went through __init__")

    monkeypatch.setattr(tables.FileRow, "__init__", init)


def test_a_whole_row_makes_the_same_frozen_record(monkeypatch: pytest.MonkeyPatch) -> None:
    values = _file_row()
    expected = tables.FileRow(**values)  # type: ignore[arg-type]
    _refuse_init(monkeypatch)
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


def test_a_result_row_takes_the_whole_row_way(monkeypatch: pytest.MonkeyPatch) -> None:
    """``from_row`` with a row as SQLAlchemy returns it: its own key view never compared
    equal to a set, so every listing went through ``__init__`` (twice the time)."""
    values = _file_row()
    engine = sa.create_engine("sqlite://")
    with engine.begin() as conn:
        tables.raw_files.create(conn)
        conn.execute(sa.insert(tables.raw_files), values)
        row = conn.execute(sa.select(tables.raw_files)).one()
    expected = tables.FileRow(**values)  # type: ignore[arg-type]
    _refuse_init(monkeypatch)
    made = tables.FileRow.from_row(row)
    monkeypatch.undo()
    assert made == expected


def test_to_json_shows_every_field_as_the_deep_copy_did() -> None:
    row = tables.FileRow.of(_file_row())
    made = row.to_json()
    copied = dataclasses.asdict(row)  # what it was made from before
    del copied["metadata_json"]
    assert "metadata_json" not in made and made["metadata"] == row.metadata
    assert list(made)[: len(copied)] == list(copied)  # the fields first, in their order
    for key, value in copied.items():
        assert made[key] == (tables.iso(value) if isinstance(value, dt.datetime) else value)
    assert (made["message_count"], made["pending_messages"]) == (3, 0)
