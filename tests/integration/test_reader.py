"""Reading through the index (:mod:`pipeline.reader`): only committed bytes, only the bytes a
read needs, and damage recorded once."""

from __future__ import annotations

from pathlib import Path

import helpers
import pytest

from pipeline import anomalies, catalog, database, errors, journal, reader


def _session(db: database.Database, data_dir: Path, *contents: str) -> str:
    body = {
        "agent_id": "hermes",
        "session_key": "s",
        "messages": [{"role": "user", "content": c} for c in contents],
    }
    file_id = journal.ingest(db, body).file_id
    journal.flush(db, data_dir, file_id)
    return file_id


def test_a_page_reads_only_its_messages_bytes(db: database.Database, data_dir: Path) -> None:
    file_id = _session(db, data_dir, "one", "two", "three", "four")
    path = data_dir / helpers.file_row(db, file_id).path
    data = bytearray(path.read_bytes())
    first = data.index(b"one")
    data[first : first + 3] = b"XXX"  # damage a message the page does not read
    path.write_bytes(bytes(data))
    page = reader.messages(db, data_dir, file_id, after_seq=2, limit=2)
    assert [(m.seq, m.content) for m in page] == [(3, "three"), (4, "four")]


def test_a_ref_brings_its_neighbours_within_the_byte_budget(
    db: database.Database, data_dir: Path
) -> None:
    file_id = _session(db, data_dir, "a", "b" * 5000, "c", "d")
    found = reader.resolve(db, data_dir, f"{file_id}:3", context=2, max_bytes=2000)
    # the 5000-byte neighbour does not fit: that side stops there
    assert [m.seq for m in found.before] == []
    assert [m.seq for m in found.after] == [4]
    assert found.message.content == "c"


def test_a_file_not_yet_cataloged_is_read_whole(db: database.Database, data_dir: Path) -> None:
    file_id = _session(db, data_dir, "one", "two")
    with db.transaction() as conn:  # a store migrated without its data directory
        catalog.clear(conn)
    page = reader.messages(db, data_dir, file_id)
    assert [m.content for m in page] == ["one", "two"]


def test_a_short_file_is_damage_recorded_once(db: database.Database, data_dir: Path) -> None:
    file_id = _session(db, data_dir, "one", "two")
    path = data_dir / helpers.file_row(db, file_id).path
    path.write_bytes(path.read_bytes()[:-5])
    for _ in range(3):
        with pytest.raises(errors.FileDamaged):
            reader.messages(db, data_dir, file_id)
    assert helpers.file_row(db, file_id).status == "error"
    with db.reading() as conn:
        found = anomalies.listed(conn, file_id=file_id)
    assert [(a.kind, a.count) for a in found] == [("file_unreadable", 1)]


def test_another_agent_s_file_is_not_found(db: database.Database, data_dir: Path) -> None:
    file_id = _session(db, data_dir, "one")
    with pytest.raises(errors.NotFound) as mine:
        reader.get_file(db, file_id, agents=["someone-else"])
    with pytest.raises(errors.NotFound) as missing:
        reader.get_file(db, "0b6c3e6e-5d1f-4f1e-9a65-3b1c2d4e5f60", agents=["someone-else"])
    assert mine.value.detail.replace(file_id, "X") == missing.value.detail.replace(
        "0b6c3e6e-5d1f-4f1e-9a65-3b1c2d4e5f60", "X"
    )
