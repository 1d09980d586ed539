"""Redaction and erasure against crashes and concurrent appends (docs/design.md §13), on SQLite and
PostgreSQL: a process SIGKILLed at every step of a redaction (of a live and of an archived file) or
of an erasure leaves the old file or the new one, never a torn one; afterwards the next flush or
sweep finishes it, nothing acknowledged is lost, fsck is clean, search no longer finds the text and
no L1 item cites it. Appends racing a redaction or an erasure of their file all land (in the
redacted file, or in the session's new file after the erasure)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import sqlalchemy as sa

from pipeline import (
    archive,
    catalog,
    database,
    document,
    erasure,
    errors,
    index,
    integrity,
    journal,
    l1,
    locks,
    reader,
    redaction,
    refine,
    rewrite,
    tables,
    terms,
)

CHILD = Path(__file__).with_name("redact_child.py")
ROOT = Path(__file__).resolve().parents[2]
WORD = "zanzibarquokka"
REASON = "leaked in a test"


def _text(i: int) -> str:
    what = WORD if i == 3 else f"plan {i}"
    return f"I prefer the {what} option.\n```\n# a comment in code user\n```"


def _append(db: database.Database, first: int, count: int) -> list[tuple[str, str]]:
    """Acknowledged appends (one message each): their refs and contents."""
    acked = []
    for i in range(first, first + count):
        body = {
            "agent_id": "hermes",
            "session_key": "crash",
            "messages": [{"role": "user", "content": _text(i), "ts": f"2026-08-03T11:00:{i:02d}Z"}],
        }
        acked.append((journal.ingest(db, body).source_refs[0], _text(i)))
    return acked


def _setup(
    db: database.Database, file_locks: locks.FileLocks, data_dir: Path, *, archived: bool
) -> tuple[str, list[tuple[str, str]]]:
    acked = _append(db, 1, 6)
    file_id = acked[0][0].split(":")[0]
    journal.flush(db, data_dir, file_id)
    c = refine.claim(db, file_id, lease_seconds=60)
    assert c is not None
    items = refine.run(
        db, data_dir, refine.load_refiner("builtin"), c, budget_tokens=6000, overlap=1
    )
    assert refine.commit(db, c, items, refiner="builtin")
    assert any(f"{file_id}:3" in i.source_refs for i in items)
    if archived:
        assert archive.compress(db, file_locks, data_dir, file_id) is not None
    return file_id, acked


def _row(db: database.Database, file_id: str) -> tables.FileRow:
    with db.reading() as conn:
        row = index.get_file(conn, file_id)
    assert row is not None
    return row


def _on_disk(data_dir: Path, row: tables.FileRow) -> bytes:
    path = data_dir / row.path
    return archive.read_path(path) if row.status == "archived" else path.read_bytes()


def _assert_old_or_new(data: bytes, old: bytes) -> None:
    """The file is the old one or the redacted one: every message as it was but seq 3, which
    is the tombstone; never anything in between."""
    if data == old:
        return
    before = document.parse(old.decode()).messages
    after = document.parse(data.decode()).messages
    assert len(after) == len(before)
    for a, b in zip(after, before, strict=True):
        if a.seq == 3:
            assert a.content.startswith("[REDACTED:message]") and a.content.endswith(REASON)
            assert (a.ts, a.role) == (b.ts, b.role)
        else:
            assert a == b


def _run_child(database_url: str, data_dir: Path, ref: str, step: str) -> None:
    proc = subprocess.run(
        [sys.executable, str(CHILD), database_url, str(data_dir), ref, step],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        check=False,
    )
    assert proc.returncode == -9, proc.stderr  # SIGKILLed at the step, not before


def _search(db: database.Database, word: str) -> list[str]:
    with db.reading() as conn:
        found = catalog.find(conn, terms.parse_query(word), catalog.Filters(), limit=20)
    return [f"{h.message.file_id}:{h.message.seq}" for h in found]


@pytest.mark.parametrize("step", rewrite.REDACT_STEPS)
def test_sigkill_at_every_step_of_a_redaction(
    db: database.Database,
    file_locks: locks.FileLocks,
    database_url: str,
    data_dir: Path,
    step: str,
) -> None:
    crash_and_check(db, file_locks, database_url, data_dir, step, archived=False)


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """A migrated SQLite index of the test's own (the archived file's steps run on it)."""
    url = f"sqlite:///{tmp_path / 'archived.sqlite3'}"
    engine = database.create_engine(url)
    database.migrate(engine)
    engine.dispose()
    return url


@pytest.mark.parametrize("step", rewrite.REDACT_STEPS)
def test_sigkill_at_every_step_of_a_redaction_of_an_archived_file(
    sqlite_url: str, data_dir: Path, step: str
) -> None:
    db = database.Database.from_url(sqlite_url)
    file_locks = locks.FileLocks(db, data_dir, timeout=10)
    try:
        crash_and_check(db, file_locks, sqlite_url, data_dir, step, archived=True)
    finally:
        file_locks.close()
        db.dispose()


def crash_and_check(
    db: database.Database,
    file_locks: locks.FileLocks,
    database_url: str,
    data_dir: Path,
    step: str,
    *,
    archived: bool,
) -> None:
    file_id, acked = _setup(db, file_locks, data_dir, archived=archived)
    old = _on_disk(data_dir, _row(db, file_id))
    acked += _append(db, 7, 2)  # acknowledged, waiting in the journal

    _run_child(database_url, data_dir, f"{file_id}:3", step)

    # the appends waiting in the journal are not written by the redaction: the file is
    # exactly the old one or the redacted one
    _assert_old_or_new(_on_disk(data_dir, _row(db, file_id)), old)

    # the next appends and their flush (which finishes an unfinished redaction first), then
    # the beat's sweep and the operator running the same redaction again
    acked += _append(db, 9, 2)
    journal.flush(db, data_dir, file_id)
    redaction.finish_interrupted(db, file_locks, data_dir, age=0)
    redaction.redact(db, file_locks, data_dir, f"{file_id}:3", rewrite.Who("again", REASON))

    row = _row(db, file_id)
    messages = reader.messages(db, data_dir, file_id, limit=100)
    assert [m.seq for m in messages] == list(range(1, 11))
    for message, (ref, content) in zip(messages, acked, strict=True):
        assert ref == f"{file_id}:{message.seq}"
        if message.seq == 3:
            assert message.content.startswith("[REDACTED:message]")
        else:
            assert message.content == content
    assert WORD.encode() not in _on_disk(data_dir, row)
    assert _search(db, WORD) == []
    with db.reading() as conn:
        items = l1.list_items(conn, file_id=file_id, limit=1000)
    assert all(f"{file_id}:3" not in json.loads(i.source_refs) for i in items)
    assert not any(WORD in i.content for i in items)
    assert not [p for p in (data_dir / "raw").rglob(".*") if p.is_file()]  # no temp left
    assert integrity.fsck(db, data_dir) == []
    with db.reading() as conn:
        (record,) = [
            r for r in conn.execute(sa.select(tables.audit_log)).all() if r.action == "redact"
        ]
    assert record.finished_at is not None and record.seq == 3


@pytest.mark.parametrize("step", erasure.ERASE_STEPS)
def test_sigkill_at_every_step_of_an_erasure(
    db: database.Database,
    file_locks: locks.FileLocks,
    database_url: str,
    data_dir: Path,
    step: str,
) -> None:
    file_id, _ = _setup(db, file_locks, data_dir, archived=False)
    _append(db, 7, 1)
    _run_child(database_url, data_dir, f"erase:{file_id}", step)
    with pytest.raises(errors.Gone):
        reader.get_file(db, file_id)
    redaction.finish_interrupted(db, file_locks, data_dir, age=0)
    assert not list((data_dir / "raw").rglob(f"*{file_id}*"))
    assert _search(db, WORD) == []
    assert integrity.fsck(db, data_dir) == []
    assert integrity.reindex(db, file_locks, data_dir).inserted == 0  # never brought back


def test_appends_racing_a_redaction_all_land(
    db: database.Database, file_locks: locks.FileLocks, data_dir: Path
) -> None:
    file_id, acked = _setup(db, file_locks, data_dir, archived=False)
    stop = threading.Event()
    lock = threading.Lock()
    failures: list[BaseException] = []

    def writer() -> None:
        i = 7
        try:
            while not stop.is_set() and i < 60:
                (done,) = _append(db, i, 1)
                with lock:
                    acked.append(done)
                journal.flush(db, data_dir, file_id)
                i += 1
        except BaseException as exc:  # reported below
            failures.append(exc)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        for seq in (3, 5, 2):
            who = rewrite.Who("t", REASON)
            redaction.redact(db, file_locks, data_dir, f"{file_id}:{seq}", who)
    finally:
        stop.set()
        thread.join()
    assert not failures, failures
    journal.flush(db, data_dir, file_id)
    messages = reader.messages(db, data_dir, file_id, limit=1000)
    assert [m.seq for m in messages] == list(range(1, len(acked) + 1))
    for message, (ref, content) in zip(messages, acked, strict=True):
        assert ref == f"{file_id}:{message.seq}"
        if message.seq in (2, 3, 5):
            assert message.content.startswith("[REDACTED:message]")
        else:
            assert message.content == content
    assert _search(db, WORD) == []
    assert integrity.fsck(db, data_dir) == []


def test_appends_racing_an_erasure_land_in_a_new_file(
    db: database.Database, file_locks: locks.FileLocks, data_dir: Path
) -> None:
    file_id, _ = _setup(db, file_locks, data_dir, archived=False)
    stop = threading.Event()
    after: list[tuple[str, str]] = []
    failures: list[BaseException] = []

    def writer() -> None:
        i = 7
        try:
            while not stop.is_set() and i < 60:
                done = _append(db, i, 1)[0]
                after.append(done)
                with contextlib.suppress(errors.NotFound):  # its file was erased meanwhile
                    journal.flush(db, data_dir, done[0].split(":")[0])
                i += 1
        except BaseException as exc:
            failures.append(exc)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        while len(after) < 5:
            thread.join(0.01)
        erasure.erase_file(db, file_locks, data_dir, file_id, rewrite.Who("t", "asked"))
        while len([r for r, _ in after if not r.startswith(file_id)]) < 5 and thread.is_alive():
            thread.join(0.01)
    finally:
        stop.set()
        thread.join()
    assert not failures, failures
    survivors = [(r, c) for r, c in after if not r.startswith(file_id)]
    assert survivors, "no append came after the erasure"
    (new_id,) = {r.split(":")[0] for r, _ in survivors}
    journal.flush(db, data_dir, new_id)
    messages = reader.messages(db, data_dir, new_id, limit=1000)
    # every append acknowledged after the erasure is in the new file, in order, once
    assert [(f"{new_id}:{m.seq}", m.content) for m in messages] == survivors
    with pytest.raises(errors.Gone):
        reader.get_file(db, file_id)
    assert integrity.fsck(db, data_dir) == []
