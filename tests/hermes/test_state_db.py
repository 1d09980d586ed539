"""The state.db importer on a database written by Hermes' own SessionDB (hermes-agent 0.19.0,
in .venv-hermes): rewound rows kept and marked, pre-compaction history as its own session, the
running turn left for later — then imported for real into a SQLite index and read back."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import hermes_env
from conftest import Sgme

from pipeline import database, document, journal
from pipeline.importers import convention, reader, runner


def make_state_db(tmp_path: Path) -> Path:
    path = tmp_path / "hermes-home" / "state.db"
    path.parent.mkdir(parents=True)
    done = subprocess.run(
        [str(hermes_env.python()), str(hermes_env.HERE / "make_state_db.py"), str(path)],
        env=hermes_env.hermes_env(path.parent),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1])["schema_version"] == 22
    return path


def test_import_a_state_db_made_by_hermes(tmp_path: Path) -> None:
    path = make_state_db(tmp_path)
    bodies: list[dict[str, Any]] = []

    def record(body: dict[str, Any]) -> dict[str, Any]:
        bodies.append(body)
        return {"file_id": body["session_key"]}

    report = runner.run(reader("hermes"), path, agent_id="hermes", ingest=record)
    by_session: dict[str, list[tuple[str, str, str | None]]] = {}
    for body in bodies:
        by_session.setdefault(body["session_key"], []).extend(
            (m["role"], m["content"], m.get("tool_name")) for m in body["messages"]
        )
    assert list(by_session) == ["s1", "s2", "s2#compacted"]
    assert by_session["s1"] == [
        ("user", "list files\n[image_url]", None),
        ("assistant", convention.call_body("terminal", '{"command": "ls"}', "c1"), None),
        ("tool", convention.result_body("a.txt", "c1"), "terminal"),
        ("assistant", "One file: a.txt", None),
        ("user", "delete it", None),  # taken back by /undo: kept, and marked
        ("assistant", "Deleted.", None),
        ("system", convention.rewound([1, 2], None)["content"], None),
        ("user", "copy it", None),
        ("assistant", "Copied.", None),
    ]
    assert by_session["s2"] == [
        ("user", "[summary] first/one", None),
        ("assistant", "Noted.", None),
        ("user", "second", None),
        ("assistant", "two", None),
        ("user", "third", None),
        ("assistant", "three", None),
    ]
    assert by_session["s2#compacted"] == [
        ("user", "first", None),
        ("assistant", "one", None),
        ("user", "second", None),
        ("assistant", "two", None),
    ]
    first = {body["session_key"]: body for body in reversed(bodies)}
    assert first["s1"]["metadata"] == {
        "importer": "hermes",
        "source": "cli",
        "model": "model-a",
        "title": "Listing files",
        "cwd": "/src/app",
    }
    assert first["s2"]["metadata"]["parent_session"] == "s1"
    assert first["s2#compacted"]["metadata"]["compacted_from"] == "s2"
    assert first["s1"]["messages"][0]["ts"] == "2026-08-03T11:18:07Z"
    assert report.errors == []
    assert report.skipped == 1  # the question s2 has not answered yet
    # the provider's keys: the turn numbered by its user message (a rewound turn as it was
    # while live), hashed without times; the marker before the turn after the rewind
    keys = [b["idempotency_key"] for b in bodies if b["session_key"] == "s1"]
    assert [k.rsplit(":", 1)[0] for k in keys] == [
        "hermes:s1:1",
        "hermes:s1:2",
        f"hermes:s1:2:{keys[3].rsplit(':', 1)[1]}:rewound",
        "hermes:s1:2",
    ]
    assert keys[1] != keys[3]

    # for real: into a SQLite index, a flush per session, twice
    db = database.Database.from_url(f"sqlite:///{tmp_path / 'index.sqlite3'}")
    database.migrate(db.engine)
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    try:
        for run in range(2):
            flushed: list[str] = []

            def flush(file_id: str, flushed: list[str] = flushed) -> None:
                flushed.append(file_id)
                journal.flush(db, data_dir, file_id)

            again = runner.run(
                reader("hermes"),
                path,
                agent_id="hermes",
                ingest=lambda body: journal.ingest(db, body),
                flush=flush,
            )
            assert (again.messages, len(flushed)) == ((19, 3) if run == 0 else (0, 0))
        texts = {}
        for md in (data_dir / "raw" / "sessions").glob("*.md"):
            doc = document.parse(md.read_text(encoding="utf-8"), file_id=md.stem)
            texts[doc.header.session_key] = [(m.role, m.content) for m in doc.messages]
        assert texts["s1"][1] == (
            "assistant",
            convention.call_body("terminal", '{"command": "ls"}', "c1"),
        )
        assert {k: len(v) for k, v in texts.items()} == {"s1": 9, "s2": 6, "s2#compacted": 4}
    finally:
        db.dispose()


def test_sgme_import_hermes_reads_a_hermes_home(sgme: Sgme, tmp_path: Path) -> None:
    """The command on a Hermes home (its state.db found inside), twice."""
    home = make_state_db(tmp_path).parent
    first = sgme("import", "hermes", str(home), "--json")
    assert first.code == 0, first.err
    report = json.loads(first.out.decode().splitlines()[-1])
    assert report == {
        "files": 3,
        "messages": 19,
        "skipped": 1,
        "unreadable": 0,
        "erased": 0,
        "empty": 0,
        "errors": [],
        "replayed": 0,
    }
    listed = sgme("ls", "--agent-id", "hermes", "--json").json()
    assert sorted((r["session_key"], r["flushed_seq"]) for r in listed) == [
        ("s1", 9),
        ("s2", 6),
        ("s2#compacted", 4),
    ]
    again = json.loads(sgme("import", "hermes", str(home), "--json").out.decode().splitlines()[-1])
    assert (again["messages"], again["replayed"]) == (0, 19)
