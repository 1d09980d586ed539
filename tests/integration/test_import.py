"""An import through the real append path: journal.ingest into a SQLite index, a flush per
session, the file read back; a second run writes nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipeline import database, document, index, journal
from pipeline.importers import convention, reader, runner


def read_back(db: database.Database, data_dir: Path, file_id: str) -> document.Document:
    with db.transaction() as conn:
        row = index.get_file(conn, file_id)
    assert row is not None
    return document.parse((data_dir / row.path).read_text(encoding="utf-8"), file_id=file_id)


def import_into(
    db: database.Database, data_dir: Path, path: Path
) -> tuple[runner.Report, list[str]]:
    file_ids: list[str] = []

    def ingest(body: dict[str, Any]) -> journal.AppendResult:
        return journal.ingest(db, body)

    def flush(file_id: str) -> None:
        file_ids.append(file_id)
        journal.flush(db, data_dir, file_id)

    report = runner.run(reader("openai"), path, agent_id="importer", ingest=ingest, flush=flush)
    return report, file_ids


def test_import_into_sqlite_and_read_back(tmp_path: Path) -> None:
    db = database.Database.from_url(f"sqlite:///{tmp_path / 'index.sqlite3'}")
    database.migrate(db.engine)
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    chat = {
        "id": "chat-1",
        "model": "gpt-x",
        "messages": [
            {
                "role": "user",
                "content": "# Display the results to the user",
                "timestamp": 1785755886,
            },
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "c", "function": {"name": "run", "arguments": '{"a": 1}'}}],
            },
            {"role": "tool", "tool_call_id": "c", "content": "done"},
            {"role": "assistant", "content": "All done."},
        ],
    }
    path = tmp_path / "chat.json"
    path.write_text(json.dumps(chat))
    try:
        report, file_ids = import_into(db, data_dir, path)
        assert (report.files, report.messages, report.errors) == (1, 4, [])
        [file_id] = file_ids
        doc = read_back(db, data_dir, file_id)
        assert doc.header.session_key == "chat.json#chat-1" and doc.header.agent_id == "importer"
        assert dict(doc.header.metadata) == {
            "importer": "openai",
            "file": "chat.json",
            "record": 0,
            "model": "gpt-x",
        }
        got = [(m.role, m.content, m.tool_name) for m in doc.messages]
        assert got == [
            ("user", "# Display the results to the user", None),
            ("assistant", convention.call_body("run", '{"a": 1}', "c"), None),
            ("tool", convention.result_body("done", "c"), "run"),
            ("assistant", "All done.", None),
        ]
        assert doc.messages[0].ts == "2026-08-03T11:18:06Z"
        before = next((data_dir / "raw").rglob("*.md")).read_bytes()

        again, flushed = import_into(db, data_dir, path)
        assert (again.messages, again.replayed, flushed) == (0, 4, [])
        assert next((data_dir / "raw").rglob("*.md")).read_bytes() == before
    finally:
        db.dispose()
