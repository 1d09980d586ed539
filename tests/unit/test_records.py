"""Row records (pipeline.tables.Record): ``of`` builds the same frozen record as the
dataclass' own ``__init__``, faster for a whole row, and falls back to it for anything else."""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest

from pipeline import tables

WHEN = dt.datetime(2026, 12, 3, 9, 30)


def _file_row() -> dict[str, object]:
    values: dict[str, object] = {f.name: None for f in dataclasses.fields(tables.FileRow)}
    values.update(
        file_id="f1",
        path="raw/sessions/f1.md",
        source_type="session",
        agent_id="a",
        session_key="s",
        metadata_json="{}",
        started_at=WHEN,
        status="new",
        next_seq=4,
        flushed_seq=3,
        flushed_bytes=120,
        flush_pending=False,
        last_refined_seq=0,
        refine_epoch=0,
        created_at=WHEN,
        updated_at=WHEN,
        next_sequence=7,
    )
    return values


def test_a_whole_row_makes_the_same_frozen_record() -> None:
    values = _file_row()
    made = tables.FileRow.of(values)
    assert type(made) is tables.FileRow
    assert made == tables.FileRow(**values)  # type: ignore[arg-type]
    assert hash(made) == hash(tables.FileRow(**values))  # type: ignore[arg-type]
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
