"""Cold archive (docs/design.md §5) on SQLite and PostgreSQL: archive → read identical, crash at
every step, append to an archived file, corrupt archives, fsck and reindex over archived files."""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import threading
from pathlib import Path

import helpers
import pytest
import sqlalchemy as sa
import zstandard
from conftest import set_row

from pipeline import (
    anomalies,
    archive,
    catalog,
    database,
    errors,
    index,
    integrity,
    journal,
    ledger,
    locks,
    reader,
    refine,
    store,
    tables,
)
from pipeline.settings import Archive

CONTENT = [
    "I prefer tea.\n```python\n# Display the results to the user\nprint(1)\n```",
    "## Notes for the user\n混合 CJK 内容 " * 40,
    "plain text\r\nwith CRLF\r\n",
]


def _refined_file(db: database.Database, data_dir: Path, key: str, *, messages: int = 6) -> str:
    body = {
        "agent_id": "hermes",
        "session_key": key,
        "messages": [
            {
                "role": "user" if i % 2 == 0 else "assistant",
                "content": CONTENT[i % 3] + f" #{i}",
                "ts": f"2026-03-0{1 + i % 9}T10:00:0{i % 10}Z",
            }
            for i in range(messages)
        ],
    }
    result = journal.ingest(db, body)
    journal.flush(db, data_dir, result.file_id)
    claim = refine.claim(db, result.file_id, lease_seconds=60)
    assert claim is not None
    assert refine.commit(db, claim, [], refiner="test")
    return result.file_id


def _age(db: database.Database, file_id: str, days: float) -> None:
    when = db.now() - dt.timedelta(days=days)
    set_row(db, file_id, flushed_at=when, ended_at=when)


def _live_files(data_dir: Path) -> list[Path]:
    return sorted(p for p in (data_dir / "raw").rglob("*") if p.is_file())


def test_a_batch_marks_its_files_archived_in_file_order(
    db: database.Database,
    data_dir: Path,
    file_locks: locks.FileLocks,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Whatever order its files come in: the order every group takes PostgreSQL's row locks
    in (pipeline.database.commits)."""
    file_ids = [_refined_file(db, data_dir, f"s{i}") for i in range(5)]
    for file_id in file_ids:
        _age(db, file_id, 40)
    marked: list[str] = []
    mark = index.mark_archived

    def marking(conn: sa.Connection, row: tables.FileRow, *, path: str, now: dt.datetime) -> bool:
        marked.append(row.file_id)
        return mark(conn, row, path=path, now=now)

    monkeypatch.setattr(index, "mark_archived", marking)
    given = sorted(file_ids, reverse=True)
    outcomes = dict(archive.compress_many(db, file_locks, data_dir, given))
    assert all(isinstance(o, archive.Outcome) for o in outcomes.values()), outcomes
    assert marked == sorted(file_ids)


def test_cold_files_only_fully_refined_and_old(db: database.Database, data_dir: Path) -> None:
    old = _refined_file(db, data_dir, "old")
    young = _refined_file(db, data_dir, "young")
    unrefined = journal.ingest(
        db,
        {"agent_id": "hermes", "session_key": "u", "messages": [{"role": "user", "content": "x"}]},
    ).file_id
    journal.flush(db, data_dir, unrefined)
    pending_extra = _refined_file(db, data_dir, "pending")
    journal.ingest(
        db,
        {
            "agent_id": "hermes",
            "session_key": "pending",
            "messages": [{"role": "user", "content": "more"}],
        },
    )
    for file_id in (old, unrefined, pending_extra):
        _age(db, file_id, 100)
    _age(db, young, 10)

    assert archive.cold_files(db, older_than_days=90) == [old]
    assert archive.flag_unrefined(db, older_than_days=90) == [unrefined]
    assert archive.flag_unrefined(db, older_than_days=90) == []  # flagged once
    with db.transaction() as conn:
        kinds = [(a.file_id, a.kind) for a in anomalies.listed(conn, kinds=["unrefined_cold"])]
    assert kinds == [(unrefined, "unrefined_cold")]


def test_archive_then_read_is_identical(
    db: database.Database, data_dir: Path, file_locks: locks.FileLocks
) -> None:
    file_id = _refined_file(db, data_dir, "s1", messages=30)
    before_row = helpers.file_row(db, file_id)
    original = (data_dir / before_row.path).read_bytes()
    messages_before = reader.messages(db, data_dir, file_id, limit=1000)
    ref_before = reader.resolve(db, data_dir, f"{file_id}:7", context=2)

    outcome = archive.compress(db, file_locks, data_dir, file_id, Archive(level=3))

    assert outcome is not None
    row = helpers.file_row(db, file_id)
    assert row.status == "archived"
    assert row.archived_at is not None
    assert row.path == f"raw/archive/{before_row.started_at:%Y-%m}/{file_id}.md.zst"
    assert not (data_dir / before_row.path).exists()
    packed = (data_dir / row.path).read_bytes()
    assert outcome.bytes_before == len(original) and outcome.bytes_after == len(packed)
    assert len(packed) < len(original)
    frame = zstandard.get_frame_parameters(packed)
    assert frame.has_checksum
    assert (
        hashlib.sha256(reader.read_bytes(data_dir, row)).digest()
        == hashlib.sha256(original).digest()
    )
    assert reader.messages(db, data_dir, file_id, limit=1000) == messages_before
    ref_after = reader.resolve(db, data_dir, f"{file_id}:7", context=2)
    assert (ref_after.message, ref_after.before, ref_after.after) == (
        ref_before.message,
        ref_before.before,
        ref_before.after,
    )
    assert integrity.fsck(db, data_dir) == []
    assert archive.compress(db, file_locks, data_dir, file_id) is None  # already archived: no-op


class Crash(Exception):
    """What a fault hook raises: the process stops there, as if killed."""


def _crash_at(step: str) -> archive.FaultHook:
    def fault(at: str) -> None:
        if at == step:
            raise Crash(at)

    return fault


@pytest.mark.parametrize("step", archive.ARCHIVE_STEPS)
def test_crash_at_each_step_leaves_exactly_one_live_copy(
    db: database.Database, data_dir: Path, file_locks: locks.FileLocks, step: str
) -> None:
    file_id = _refined_file(db, data_dir, "crash")
    original = (data_dir / helpers.file_row(db, file_id).path).read_bytes()

    fault = _crash_at(step)

    with pytest.raises(Crash):
        archive.compress(db, file_locks, data_dir, file_id, fault=fault)

    # Whatever the crash left, the index points at a readable copy with the same bytes.
    row = helpers.file_row(db, file_id)
    assert reader.read_bytes(data_dir, row) == original

    # Re-running finishes (or cleans up and redoes) the job.
    archive.finish_interrupted(db, file_locks, data_dir)
    archive.compress(db, file_locks, data_dir, file_id)
    row = helpers.file_row(db, file_id)
    assert row.status == "archived"
    files = _live_files(data_dir)
    assert files == [data_dir / row.path], files  # no original, no temp, one archive
    assert reader.read_bytes(data_dir, row) == original
    assert integrity.fsck(db, data_dir) == []


@pytest.mark.parametrize("step", archive.ARCHIVE_STEPS)
def test_crash_in_a_batch_leaves_every_file_readable(
    db: database.Database, data_dir: Path, file_locks: locks.FileLocks, step: str
) -> None:
    file_ids = [_refined_file(db, data_dir, f"batch-{i}") for i in range(3)]
    originals = {f: (data_dir / helpers.file_row(db, f).path).read_bytes() for f in file_ids}

    fault = _crash_at(step)

    with pytest.raises(Crash):
        list(archive.compress_many(db, file_locks, data_dir, file_ids, fault=fault))

    for file_id in file_ids:
        assert reader.read_bytes(data_dir, helpers.file_row(db, file_id)) == originals[file_id]

    archive.finish_interrupted(db, file_locks, data_dir)
    outcomes = dict(archive.compress_many(db, file_locks, data_dir, file_ids))
    rows = {f: helpers.file_row(db, f) for f in file_ids}
    # a file the crashed run had already finished is no longer eligible (None)
    assert all(o is None or isinstance(o, archive.Outcome) for o in outcomes.values()), outcomes
    assert all(row.status == "archived" for row in rows.values())
    assert _live_files(data_dir) == sorted(data_dir / row.path for row in rows.values())
    for file_id, row in rows.items():
        assert reader.read_bytes(data_dir, row) == originals[file_id]
    assert integrity.fsck(db, data_dir) == []


def test_batch_reports_each_file(
    db: database.Database, data_dir: Path, file_locks: locks.FileLocks
) -> None:
    good = [_refined_file(db, data_dir, f"good-{i}") for i in range(4)]
    unrefined = journal.ingest(
        db,
        {
            "agent_id": "hermes",
            "session_key": "raw",
            "messages": [{"role": "user", "content": "x"}],
        },
    ).file_id
    journal.flush(db, data_dir, unrefined)
    damaged = _refined_file(db, data_dir, "damaged")
    with (data_dir / helpers.file_row(db, damaged).path).open("r+b") as handle:
        handle.seek(-3, 2)
        handle.write(b"XYZ")  # same length, another chain
    missing = "00000000-0000-4000-8000-000000000000"

    ids = [good[0], unrefined, good[1], damaged, missing, good[2], good[3]]
    outcomes = list(archive.compress_many(db, file_locks, data_dir, ids, Archive(workers=3)))

    assert [file_id for file_id, _ in outcomes] == ids  # one answer per file, in order
    by_id = dict(outcomes)
    for file_id in good:
        outcome = by_id[file_id]
        assert isinstance(outcome, archive.Outcome) and outcome.file_id == file_id
        assert helpers.file_row(db, file_id).status == "archived"
    assert by_id[unrefined] is None
    assert isinstance(by_id[damaged], errors.FileDamaged)
    assert isinstance(by_id[missing], errors.NotFound)
    assert helpers.file_row(db, damaged).status == "refined"  # kept as it was, original in place
    assert (data_dir / helpers.file_row(db, damaged).path).exists()


def test_overlapping_batches_archive_each_file_once(
    db: database.Database, data_dir: Path, file_locks: locks.FileLocks
) -> None:
    file_ids = [_refined_file(db, data_dir, f"both-{i}") for i in range(12)]
    originals = {f: (data_dir / helpers.file_row(db, f).path).read_bytes() for f in file_ids}
    results: list[list[tuple[str, archive.Result]]] = []

    def run(ids: list[str]) -> None:
        results.append(list(archive.compress_many(db, file_locks, data_dir, ids)))

    threads = [
        threading.Thread(target=run, args=(file_ids,)),
        threading.Thread(target=run, args=(list(reversed(file_ids)),)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)

    archived = [f for run in results for f, o in run if isinstance(o, archive.Outcome)]
    assert sorted(archived) == sorted(file_ids)  # each by exactly one of the two runs
    assert all(o is None for run in results for _, o in run if not isinstance(o, archive.Outcome))
    for file_id in file_ids:
        assert reader.read_bytes(data_dir, helpers.file_row(db, file_id)) == originals[file_id]
    assert integrity.fsck(db, data_dir) == []


def test_append_to_archived_file_restores_and_continues_seqs(
    db: database.Database, data_dir: Path, file_locks: locks.FileLocks
) -> None:
    file_id = _refined_file(db, data_dir, "back", messages=4)
    original = (data_dir / helpers.file_row(db, file_id).path).read_bytes()
    archive.compress(db, file_locks, data_dir, file_id)
    archived_path = data_dir / helpers.file_row(db, file_id).path

    result = journal.ingest(
        db,
        {
            "agent_id": "hermes",
            "session_key": "back",
            "messages": [
                {"role": "user", "content": "I am back."},
                {"role": "assistant", "content": "ok"},
            ],
        },
    )
    assert result.file_id == file_id
    assert result.source_refs == (f"{file_id}:5", f"{file_id}:6")
    journal.flush(db, data_dir, file_id)

    row = helpers.file_row(db, file_id)
    assert row.status == "new"
    assert row.path == f"raw/sessions/{file_id}.md"
    assert not archived_path.exists()
    data = (data_dir / row.path).read_bytes()
    assert data.startswith(original)
    assert [m.content for m in reader.messages(db, data_dir, file_id)][-2:] == [
        "I am back.",
        "ok",
    ]
    assert row.flushed_seq == 6
    assert integrity.fsck(db, data_dir) == []


def test_restore_puts_the_file_back(
    db: database.Database, data_dir: Path, file_locks: locks.FileLocks
) -> None:
    file_id = _refined_file(db, data_dir, "r")
    live = data_dir / helpers.file_row(db, file_id).path
    original = live.read_bytes()
    archive.compress(db, file_locks, data_dir, file_id)
    assert not live.exists()

    assert archive.restore(db, file_locks, data_dir, file_id) is True
    row = helpers.file_row(db, file_id)
    assert (row.status, row.path, row.archived_at) == (
        "refined",
        f"raw/sessions/{file_id}.md",
        None,
    )
    assert live.read_bytes() == original
    assert _live_files(data_dir) == [live]
    assert archive.restore(db, file_locks, data_dir, file_id) is False
    assert integrity.fsck(db, data_dir) == []


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_corrupt_archive_is_an_error_never_content(
    db: database.Database, data_dir: Path, file_locks: locks.FileLocks, damage: str
) -> None:
    file_id = _refined_file(db, data_dir, "bad", messages=20)
    archive.compress(db, file_locks, data_dir, file_id)
    path = data_dir / helpers.file_row(db, file_id).path
    packed = bytearray(path.read_bytes())
    if damage == "flip":
        packed[len(packed) // 2] ^= 0x40
    else:
        del packed[len(packed) * 2 // 3 :]
    path.write_bytes(bytes(packed))

    with pytest.raises(
        errors.FileDamaged, match=file_id[:8] if damage == "truncate" else "corrupt|holds"
    ):
        reader.read_bytes(data_dir, helpers.file_row(db, file_id))
    with pytest.raises(errors.FileDamaged):
        reader.messages(db, data_dir, file_id)
    with pytest.raises(errors.FileDamaged):
        archive.restore(db, file_locks, data_dir, file_id)
    problems = integrity.fsck(db, data_dir)
    assert [(p.file_id, p.kind) for p in problems] == [(file_id, "archive_corrupt")]


def test_reindex_understands_archived_files(
    db: database.Database, data_dir: Path, file_locks: locks.FileLocks
) -> None:
    file_id = _refined_file(db, data_dir, "ri")
    archive.compress(db, file_locks, data_dir, file_id)
    before = helpers.file_row(db, file_id)
    with db.transaction() as conn:
        conn.execute(sa.delete(tables.l1_items))
        catalog.clear(conn)  # the message catalog goes with the index
        conn.execute(sa.delete(tables.raw_files))

    report = integrity.reindex(db, file_locks, data_dir)

    assert (report.scanned, report.inserted, report.failed) == (1, 1, [])
    row = helpers.file_row(db, file_id)
    assert (row.status, row.path, row.flushed_seq, row.flushed_bytes, row.chain_head) == (
        "archived",
        before.path,
        before.flushed_seq,
        before.flushed_bytes,
        before.chain_head,
    )
    assert integrity.fsck(db, data_dir) == []


def test_cli_archive_dry_run_then_archive_and_restore(
    db: database.Database, database_url: str, data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from pipeline import cli

    cold = [_refined_file(db, data_dir, f"c{i}") for i in range(3)]
    warm = _refined_file(db, data_dir, "warm")
    for file_id in cold:
        _age(db, file_id, 120)
    _age(db, warm, 5)
    common = ["--data-dir", str(data_dir), "--database-url", database_url]
    sizes = sum(helpers.file_row(db, f).flushed_bytes for f in cold)

    assert cli.main(["archive", "--dry-run", "--json", *common]) == 0
    dry = json.loads(capsys.readouterr().out)
    assert (dry["files"], dry["bytes_before"], dry["dry_run"]) == (3, sizes, True)
    assert all(helpers.file_row(db, f).status == "refined" for f in [*cold, warm])

    assert cli.main(["archive", "--json", *common]) == 0
    done = json.loads(capsys.readouterr().out)
    packed = sum((data_dir / helpers.file_row(db, f).path).stat().st_size for f in cold)
    assert (done["files"], done["bytes_before"], done["bytes_after"]) == (3, sizes, packed)
    assert done["ratio"] == round(sizes / packed, 2)
    assert [helpers.file_row(db, f).status for f in cold] == ["archived"] * 3
    assert helpers.file_row(db, warm).status == "refined"

    assert cli.main(["archive", "--older-than", "0", "--json", *common]) == 0
    assert json.loads(capsys.readouterr().out)["files"] == 1
    assert helpers.file_row(db, warm).status == "archived"

    assert cli.main(["restore", cold[0], *common]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "refined"
    assert cli.main(["restore", cold[0], *common]) == 2
    assert "not archived" in capsys.readouterr().err
    assert cli.main(["fsck", *common]) == 0


def test_append_to_a_corrupt_archive_waits_in_the_journal(
    db: database.Database, data_dir: Path, file_locks: locks.FileLocks
) -> None:
    file_id = _refined_file(db, data_dir, "broken")
    archive.compress(db, file_locks, data_dir, file_id)
    path = data_dir / helpers.file_row(db, file_id).path
    path.write_bytes(path.read_bytes()[:-9])
    result = journal.ingest(
        db,
        {
            "agent_id": "hermes",
            "session_key": "broken",
            "messages": [{"role": "user", "content": "late"}],
        },
    )
    for _ in range(2):
        with pytest.raises(errors.FileDamaged):
            journal.flush(db, data_dir, file_id)
    row = helpers.file_row(db, file_id)
    assert (row.status, row.next_seq) == ("archived", result.last_seq + 1)
    with db.transaction() as conn:
        assert [a.kind for a in anomalies.listed(conn, file_id=file_id)] == ["restore_failed"]
        assert [j.first_seq for j in ledger.journal_after(conn, file_id, 0)] == [result.first_seq]


def test_every_archive_is_fsynced_before_its_rename_and_its_directory_before_the_commit(
    db: database.Database,
    data_dir: Path,
    file_locks: locks.FileLocks,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The temp files of a batch are fsynced together, but each before it takes its final name,
    and the renames' directory before the index points at them (strace-like: the calls'
    order as the store makes them)."""
    file_ids = [_refined_file(db, data_dir, f"synced-{i}") for i in range(3)]
    calls: list[tuple[str, str]] = []
    lock = threading.Lock()

    def record(name: str, real: object) -> object:
        def wrapper(path: Path, *args: object, **kwargs: object) -> object:
            with lock:
                calls.append((name, Path(path).name))
            return real(path, *args, **kwargs)  # type: ignore[operator]

        return wrapper

    monkeypatch.setattr(store, "fsync_file", record("fsync", store.fsync_file))
    monkeypatch.setattr(store, "rename", record("rename", store.rename))
    monkeypatch.setattr(store, "fsync_dir", record("fsync_dir", store.fsync_dir))
    real_commit = db.commit

    def commit(*args: object, **kwargs: object) -> object:
        calls.append(("commit", ""))
        return real_commit(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(db, "commit", commit)
    outcomes = dict(archive.compress_many(db, file_locks, data_dir, file_ids))
    assert all(isinstance(o, archive.Outcome) for o in outcomes.values()), outcomes

    for file_id in file_ids:
        temp = f".{file_id}.md.zst.tmp"
        assert calls.index(("fsync", temp)) < calls.index(("rename", temp))
    last_rename = max(i for i, (name, _) in enumerate(calls) if name == "rename")
    month = (data_dir / helpers.file_row(db, file_ids[0]).path).parent.name
    synced_dir = calls.index(("fsync_dir", month), last_rename)
    assert synced_dir < calls.index(("commit", ""))


@pytest.mark.parametrize("damage", ["flip", "truncate", "longer"])
def test_a_temp_file_that_does_not_hold_what_was_written_is_never_renamed(
    db: database.Database, data_dir: Path, file_locks: locks.FileLocks, damage: str
) -> None:
    """The verify reads back what the temp file holds: a changed byte, a lost tail or bytes
    past the frame (which a decompressor would ignore) fail it, and the original stays."""
    file_id = _refined_file(db, data_dir, "damaged-temp", messages=20)
    row = helpers.file_row(db, file_id)
    original = (data_dir / row.path).read_bytes()
    final = data_dir / archive.archive_relative_path(row)
    temp = final.with_name(f".{final.name}.tmp")

    def fault(step: str) -> None:
        if step != "temp_written":
            return
        packed = bytearray(temp.read_bytes())
        if damage == "flip":
            packed[len(packed) // 2] ^= 0x40
        elif damage == "truncate":
            del packed[-4:]
        else:
            packed += b"\0"
        temp.write_bytes(bytes(packed))  # the same file: the open descriptor sees it

    with pytest.raises(errors.FileDamaged, match="did not verify"):
        archive.compress(db, file_locks, data_dir, file_id, fault=fault)
    assert helpers.file_row(db, file_id).status == "refined"
    assert (data_dir / row.path).read_bytes() == original
    assert not temp.exists() and not final.exists()


def test_each_fsync_is_done_before_its_rename_and_each_original_deleted_after_the_commit(
    db: database.Database,
    data_dir: Path,
    file_locks: locks.FileLocks,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The temp files' fsyncs start as each file is packed, overlapping the packing of the
    others: each has returned before its file is renamed, and the originals go only after
    the index commit."""
    file_ids = [_refined_file(db, data_dir, f"overlap-{i}") for i in range(6)]
    calls: list[tuple[str, str]] = []
    lock = threading.Lock()
    real_fsync, real_rename, real_remove = store.fsync_file, store.rename, store.remove

    def fsync_file(path: Path, **kwargs: int | None) -> None:
        real_fsync(path, **kwargs)
        with lock:
            calls.append(("fsynced", path.name))

    def rename(src: Path, dst: Path, **kwargs: bool) -> None:
        with lock:
            calls.append(("rename", src.name))
        real_rename(src, dst, **kwargs)

    def remove(path: Path, **kwargs: bool) -> None:
        with lock:
            calls.append(("remove", path.name))
        real_remove(path, **kwargs)

    monkeypatch.setattr(store, "fsync_file", fsync_file)
    monkeypatch.setattr(store, "rename", rename)
    monkeypatch.setattr(store, "remove", remove)
    real_commit = db.commit

    def commit(*args: object, **kwargs: object) -> object:
        calls.append(("commit", ""))
        return real_commit(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(db, "commit", commit)
    outcomes = dict(archive.compress_many(db, file_locks, data_dir, file_ids, Archive(workers=3)))
    assert all(isinstance(o, archive.Outcome) for o in outcomes.values()), outcomes

    committed = calls.index(("commit", ""))
    for file_id in file_ids:
        temp = f".{file_id}.md.zst.tmp"
        assert calls.index(("fsynced", temp)) < calls.index(("rename", temp))
        assert calls.index(("remove", f"{file_id}.md")) > committed


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts /proc/self/fd")
def test_a_crash_while_packing_a_batch_leaves_no_temp_file_open(
    db: database.Database, data_dir: Path, file_locks: locks.FileLocks
) -> None:
    file_ids = [_refined_file(db, data_dir, f"open-{i}") for i in range(6)]
    list(archive.compress_many(db, file_locks, data_dir, file_ids[:1]))  # pools, connections
    for file_id in file_ids:
        with file_locks.hold(file_id):  # their lock files, kept open for the next time
            pass

    def open_files() -> list[str]:  # under the data directory (not the index's sockets)
        found = (os.readlink(fd) for fd in Path("/proc/self/fd").iterdir() if fd.exists())
        return sorted(f for f in found if f.startswith(str(data_dir)))

    before = open_files()
    packed = 0

    def fault(step: str) -> None:
        nonlocal packed
        if step == "verified":
            packed += 1
            if packed == 3:
                raise Crash(step)

    with pytest.raises(Crash):
        list(
            archive.compress_many(
                db, file_locks, data_dir, file_ids[1:], Archive(workers=3), fault=fault
            )
        )
    assert open_files() == before
