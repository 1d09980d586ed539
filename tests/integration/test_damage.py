"""Damage done behind the store's back (issue: hardening), on SQLite and PostgreSQL: a raw
file replaced by a symlink, a symlinked directory under raw/, and checks that keep reporting
when the index cannot record what they found. Each is refused, recorded once and logged once;
nothing is ever read or written through a link."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import helpers
import pytest

from pipeline import anomalies, database, errors, flush, index, integrity, reader
from pipeline.service import Service
from pipeline.settings import Settings


def body(session_key: str, content: str, source_type: str = "session") -> dict[str, Any]:
    return {
        "agent_id": "hermes",
        "session_key": session_key,
        "source_type": source_type,
        "messages": [{"role": "user", "content": content}],
    }


def recorded_anomalies(db: database.Database, file_id: str) -> list[tuple[str, int]]:
    with db.transaction() as conn:
        return [(a.kind, a.count) for a in anomalies.listed(conn, file_id=file_id)]


def status(db: database.Database, file_id: str) -> str:
    with db.transaction() as conn:
        row = index.get_file(conn, file_id)
    assert row is not None
    return row.status


@pytest.fixture
def service(db: database.Database, data_dir: Path, database_url: str) -> Service:
    return helpers.service(db, Settings(data_dir=data_dir, database_url=database_url))


def test_a_file_replaced_by_a_symlink_is_recorded_once_and_logged_once(
    service: Service, db: database.Database, data_dir: Path, tmp_path: Path, caplog: Any
) -> None:
    file_id = helpers.append(service, body("s", "first"), wait=True).result.file_id
    path = data_dir / f"raw/sessions/{file_id}.md"
    elsewhere = tmp_path / "elsewhere.md"
    elsewhere.write_bytes(path.read_bytes())
    path.unlink()
    path.symlink_to(elsewhere)
    target = elsewhere.read_bytes()

    helpers.append(service, body("s", "second"))
    with caplog.at_level(logging.DEBUG, logger="pipeline.service"):
        for _ in range(3):  # the sweeper comes back every few seconds
            with pytest.raises(errors.FileDamaged, match="not a regular file"):
                service.flush(file_id)
    errors_logged = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors_logged) == 1 and file_id in errors_logged[0].getMessage()
    assert recorded_anomalies(db, file_id) == [("file_replaced", 3)]
    assert status(db, file_id) == "error"
    assert elsewhere.read_bytes() == target  # nothing was written through the link
    with pytest.raises(errors.FileDamaged):
        reader.messages(db, data_dir, file_id)
    assert recorded_anomalies(db, file_id) == [("file_replaced", 3)]  # reads add nothing


def test_a_symlinked_directory_under_raw_is_refused(
    service: Service, db: database.Database, data_dir: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (data_dir / "raw").mkdir()
    os.symlink(outside, data_dir / "raw" / "external")
    result = helpers.append(service, body("thread-1", "mail", source_type="external")).result
    with pytest.raises(errors.FileDamaged, match="not a directory"):
        service.flush(result.file_id)
    assert list(outside.iterdir()) == []
    assert status(db, result.file_id) == "error"
    assert [k for k, _ in recorded_anomalies(db, result.file_id)] == ["file_replaced"]
    found = [(p.file_id, p.kind) for p in integrity.fsck(db, data_dir)]
    assert found == [("raw/external", "symlinked_dir")]


def test_fsck_reports_even_when_the_index_cannot_record(
    service: Service, db: database.Database, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    file_id = helpers.append(service, body("f", "text"), wait=True).result.file_id
    path = data_dir / f"raw/sessions/{file_id}.md"
    path.write_bytes(path.read_bytes().replace(b"text", b"TEXT"))

    def full(*_: Any, **__: Any) -> int:
        raise errors.IndexUnavailable("database or disk is full")

    monkeypatch.setattr(anomalies, "record", full)
    problems = integrity.fsck(db, data_dir)
    assert [(p.file_id, p.kind) for p in problems] == [(file_id, "chain_mismatch")]
    flush.stale_files(db, age=0)  # the index still answers reads
