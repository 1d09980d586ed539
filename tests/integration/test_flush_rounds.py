"""Flush rounds (docs/design.md §3): :func:`flush.flush_files` writes any set of files with
one read snapshot and one commit, repairs the files that need it as a step of the round,
returns each file's result or error and what is left, and stays within its byte budget;
:class:`local_queue.LocalQueue` runs the rounds and flushes the files a round hands back on
their own — on SQLite and PostgreSQL."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import helpers
import pytest
import sqlalchemy as sa
from conftest import set_row

from pipeline import (
    anomalies,
    archive,
    audit,
    database,
    document,
    errors,
    flush,
    index,
    integrity,
    journal,
    local_queue,
    locks,
    redaction,
    rewrite,
    search,
    store,
    tables,
    terms,
)
from pipeline.settings import Settings

TS = "2026-08-03T11:18:06Z"


def _body(key: str, text: str = "hello") -> dict[str, Any]:
    messages = [{"role": "user", "content": text, "ts": TS}]
    return {"agent_id": "hermes", "session_key": key, "messages": messages}


def _locks(db: database.Database, data_dir: Path) -> locks.FileLocks:
    return locks.FileLocks(db, data_dir, timeout=5)


def test_a_round_writes_every_file_with_one_commit(db: database.Database, data_dir: Path) -> None:
    ids = [journal.ingest(db, _body(f"s{i}")).file_id for i in range(5)]
    journal.ingest(db, _body("s0", "again"))
    groups = db.group.groups
    ran: list[int] = []

    def run(thunks: list[Callable[[], None]]) -> list[BaseException | None]:
        ran.append(len(thunks))
        return flush.serially(thunks)

    done = flush.flush_files(db, _locks(db, data_dir), data_dir, ids, run=run)
    assert (done.again, done.later, done.errors) == ([], [], {})
    assert ran == [5]
    assert db.group.groups == groups + 1  # one commit for the five files
    assert {i: r.messages for i, r in done.results.items()} == {
        ids[0]: 2,
        **{i: 1 for i in ids[1:]},
    }
    for file_id in ids:
        row = helpers.file_row(db, file_id)
        assert (row.flushed_seq, row.next_seq - 1, row.flush_pending) == (
            row.next_seq - 1,
            row.flushed_seq,
            False,
        )
    # exactly what a flush of one file writes: the chain checks out
    assert integrity.fsck(db, data_dir) == []


def test_a_round_updates_its_files_rows_in_file_order(
    db: database.Database, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever order its files come in (the order every group takes PostgreSQL's row locks
    in, pipeline.database.commits); the files with nothing to write among them too."""
    ids = [journal.ingest(db, _body(f"s{i}")).file_id for i in range(6)]
    settled = journal.ingest(db, _body("s-settled")).file_id
    flush.flush(db, _locks(db, data_dir), data_dir, settled)
    set_row(db, settled, flush_pending=True)  # pending, with nothing left to write
    updated: list[str] = []
    advance, settle = index.advance_flushed, index.settle_flush

    def advancing(conn: sa.Connection, file_id: str, **kw: Any) -> int | None:
        updated.append(file_id)
        return advance(conn, file_id, **kw)

    def settling(conn: sa.Connection, file_id: str) -> bool:
        updated.append(file_id)
        return settle(conn, file_id)

    monkeypatch.setattr(index, "advance_flushed", advancing)
    monkeypatch.setattr(index, "settle_flush", settling)
    given = sorted([*ids, settled], reverse=True)
    done = flush.flush_files(db, _locks(db, data_dir), data_dir, given)
    assert (done.again, done.later, done.errors) == ([], [], {})
    assert updated == sorted(given)
    assert {i: r.messages for i, r in done.results.items()} == {**dict.fromkeys(ids, 1), settled: 0}


@pytest.mark.parametrize("round_", [True, False], ids=["round", "one file"])
def test_the_catalog_rows_and_search_terms_are_made_before_the_commit(
    db: database.Database, data_dir: Path, monkeypatch: pytest.MonkeyPatch, round_: bool
) -> None:
    """SQLite has one writer: the flush makes its messages' terms and catalog rows (their
    timestamps parsed) before its transaction, so an acknowledgement queued behind the flush's
    commit does not wait for them."""
    ids = [journal.ingest(db, _body(f"s{i}", f"green tea number {i}")).file_id for i in range(3)]
    in_commit = False
    made: list[bool] = []  # for each text whose terms were made: inside a commit?
    parsed: list[bool] = []  # for each timestamp parsed: inside a commit?
    real_committing, real_terms, real_parse_ts = db.committing, terms.terms, document.parse_ts

    @contextlib.contextmanager
    def committing(*, durable: bool = True) -> Iterator[sa.Connection]:
        nonlocal in_commit
        with real_committing(durable=durable) as conn:
            in_commit = True
            try:
                yield conn
            finally:
                in_commit = False

    def watched(text: str) -> list[str]:
        made.append(in_commit)
        return real_terms(text)

    def parse_ts(text: str) -> dt.datetime:
        parsed.append(in_commit)
        return real_parse_ts(text)

    monkeypatch.setattr(document, "parse_ts", parse_ts)
    monkeypatch.setattr(db, "committing", committing)
    monkeypatch.setattr(terms, "terms", watched)
    if round_:
        assert flush.flush_files(db, _locks(db, data_dir), data_dir, ids).left == []
    else:
        for file_id in ids:
            flush.flush(db, _locks(db, data_dir), data_dir, file_id)
    assert made == [False, False, False]
    assert len(parsed) >= 3  # each chunk's end, at least
    assert True not in parsed
    monkeypatch.undo()
    found = search.search(db, data_dir, "green tea", limit=10, match="all")
    assert sorted(hit.file_id for hit in found) == sorted(ids)


def test_a_rounds_messages_are_cataloged_at_once_each_under_its_own_id(
    db: database.Database, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The catalog rows of a round's files go in one statement and their terms in another,
    whatever the number of files; each message is found by its own words, at its own seq."""
    words = {(i, seq): f"word{i}q{seq}" for i in range(4) for seq in range(1, i + 2)}
    earlier = journal.ingest(db, _body("s0", "flushed before the round"))
    flush.flush(db, _locks(db, data_dir), data_dir, earlier.file_id)  # rows there already
    ids = []
    for i in range(4):
        msgs = [{"role": "user", "content": words[i, seq], "ts": TS} for seq in range(1, i + 2)]
        body = {"agent_id": "hermes", "session_key": f"s{i}", "messages": msgs}
        ids.append(journal.ingest(db, body).file_id)
    assert ids[0] == earlier.file_id
    ran: list[str] = []  #: the statements run once per row, in one driver call
    real_many, real_bound = database.Prepared.many, database.many_bound

    def many(self: database.Prepared, conn: sa.Connection, params: Any) -> None:
        ran.append(self._for(conn.dialect).sql.split("(")[0].strip())
        real_many(self, conn, params)

    def many_bound(conn: sa.Connection, sql: str, rows: Any) -> None:
        ran.append(sql.split("(")[0].strip())
        real_bound(conn, sql, rows)

    monkeypatch.setattr(database.Prepared, "many", many)
    monkeypatch.setattr(database, "many_bound", many_bound)
    assert flush.flush_files(db, _locks(db, data_dir), data_dir, ids).left == []
    monkeypatch.undo()
    if not db.postgres:  # PostgreSQL sends the rows in one INSERT … RETURNING
        assert ran.count("INSERT INTO messages") == 1
        assert ran.count("INSERT INTO message_terms") == 1
    for (i, seq), word in words.items():
        found = search.search(db, data_dir, word, limit=5, match="all")
        assert [(hit.file_id, hit.seq) for hit in found] == [(ids[i], seq + (i == 0))]
    with db.reading() as conn:
        count = conn.execute(sa.select(sa.func.count()).select_from(tables.messages)).scalar()
    assert count == 1 + len(words)
    assert integrity.fsck(db, data_dir) == []


def test_a_round_over_a_mix_repairs_refuses_and_leaves_each_file_as_it_must(
    db: database.Database, data_dir: Path
) -> None:
    """One round over a plain file, a torn one, an archived one, a damaged one, one another
    process holds, one that spends the budget and one past it: the repairs are steps of the
    round (the torn tail cut, the archive restored, each recorded), the damaged file is
    refused with its anomaly, and the busy and late ones are left for the caller."""
    keys = ("plain", "torn", "archived", "missing", "busy", "big", "late")
    ids = dict(zip(keys, (journal.ingest(db, _body(k)).file_id for k in keys), strict=True))
    for file_id in ids.values():
        journal.flush(db, data_dir, file_id)
    _archive(db, data_dir, ids["archived"])
    for key in keys:
        journal.ingest(db, _body(key, "more " * (300 if key == "big" else 1)))
    with open(data_dir / helpers.file_row(db, ids["torn"]).path, "ab") as f:
        f.write(b"# never acknowledged")
    (data_dir / helpers.file_row(db, ids["missing"]).path).unlink()
    other = _locks(db, data_dir)  # another holder of one file's lock (another process)
    file_locks = locks.FileLocks(db, data_dir, timeout=0.05)
    with other.hold(ids["busy"]):
        done = flush.flush_files(db, file_locks, data_dir, [ids[k] for k in keys], chunk_bytes=1200)
    written = {k: done.results[ids[k]].messages for k in ("plain", "torn", "archived", "big")}
    assert written == {"plain": 1, "torn": 1, "archived": 1, "big": 1}  # "big" spent the budget
    assert list(done.errors) == [ids["missing"]]
    assert isinstance(done.errors[ids["missing"]], errors.FileDamaged)
    assert (done.again, done.later) == ([ids["busy"]], [ids["late"]])
    assert sorted(done.left) == sorted([ids["busy"], ids["late"]])
    assert anomalies_of(db, ids["torn"]) == ["torn_tail_truncated"]
    assert anomalies_of(db, ids["missing"]) == ["file_missing"]
    assert helpers.file_row(db, ids["missing"]).status == "error"
    restored = helpers.file_row(db, ids["archived"])
    assert (restored.flushed_seq, restored.status) == (2, "new")
    assert (data_dir / restored.path).read_bytes().count(b"more") == 1
    for key in ("busy", "late"):  # not read: their appends wait in the journal
        assert helpers.file_row(db, ids[key]).flushed_seq == 1
    # what was left is flushed by the next round, each in a round of its own here
    for key in ("busy", "late"):
        again = flush.flush_files(db, file_locks, data_dir, [ids[key]], wait=True)
        assert again.results[ids[key]].flushed_seq == 2


def _archive(db: database.Database, data_dir: Path, file_id: str) -> None:
    """Archive a flushed file (as the cold archive does a refined one)."""
    set_row(db, file_id, status="refined")
    assert archive.compress(db, _locks(db, data_dir), data_dir, file_id) is not None
    assert helpers.file_row(db, file_id).status == "archived"


@pytest.mark.parametrize("damage", ["torn", "archived"])
def test_a_round_of_one_repairs(db: database.Database, data_dir: Path, damage: str) -> None:
    """The repairs of a flush of one file are the round's: a torn tail cut and recorded, an
    archive restored, before the append is written."""
    file_id = journal.ingest(db, _body("r")).file_id
    journal.flush(db, data_dir, file_id)
    if damage == "archived":
        _archive(db, data_dir, file_id)
    journal.ingest(db, _body("r", "after"))
    if damage == "torn":
        with open(data_dir / helpers.file_row(db, file_id).path, "ab") as f:
            f.write(b"# never acknowledged")
    done = flush.flush_files(db, _locks(db, data_dir), data_dir, [file_id], wait=True)
    assert (done.errors, done.left) == ({}, [])
    assert (done.results[file_id].flushed_seq, done.results[file_id].status) == (2, "new")
    expected = ["torn_tail_truncated"] if damage == "torn" else []
    assert anomalies_of(db, file_id) == expected
    assert helpers.file_row(db, file_id).status == "new"
    assert integrity.fsck(db, data_dir) == []


def anomalies_of(db: database.Database, file_id: str) -> list[str]:
    with db.reading() as conn:
        return [a.kind for a in anomalies.listed(conn) if a.file_id == file_id]


def test_a_round_reads_about_its_byte_budget(db: database.Database, data_dir: Path) -> None:
    ids = [journal.ingest(db, _body(f"s{i}", "x" * 1000)).file_id for i in range(4)]
    done = flush.flush_files(db, _locks(db, data_dir), data_dir, ids, chunk_bytes=1500)
    assert list(done.results) == ids[:2]  # the second row took it past the budget
    assert done.later == ids[2:]
    assert store.size(data_dir / helpers.file_row(db, ids[2]).path) is None


def test_a_failed_write_in_a_round_of_several_hands_the_file_back(
    db: database.Database, data_dir: Path
) -> None:
    ids = [journal.ingest(db, _body(f"s{i}")).file_id for i in range(2)]

    def run(thunks: list[Callable[[], None]]) -> list[BaseException | None]:
        outcomes = flush.serially(thunks[:1])
        return [*outcomes, OSError("disk on fire")]

    done = flush.flush_files(db, _locks(db, data_dir), data_dir, ids, run=run)
    assert (list(done.results), done.again, done.errors) == ([ids[0]], [ids[1]], {})
    assert helpers.file_row(db, ids[1]).flushed_seq == 0


def test_rounds_flush_kicked_files_and_hand_the_rest_to_threads(
    db: database.Database, data_dir: Path, database_url: str
) -> None:
    settings = Settings(data_dir=data_dir, database_url=database_url)
    jobs = helpers.RecordingQueue()
    threads = local_queue.LocalQueue(jobs, threads=2, linger=0.001)
    service = helpers.service(db, settings, threads)
    threads.start(service.flusher, service.follow_up)
    try:
        ids = [helpers.append(service, _body(f"s{i}")).result.file_id for i in range(6)]
        helpers.wait_for(threads.idle, what="the flushes", timeout=10)
        assert threads.rounds >= 1 and threads.round_files >= 1
        for file_id in ids:
            assert helpers.file_row(db, file_id).flushed_seq == 1
        # a file whose bytes went missing is refused by the round, and marked
        gone = helpers.file_row(db, ids[0])
        (data_dir / gone.path).unlink()
        helpers.append(service, _body("s0", "more"))
        helpers.wait_for(threads.idle, what="the flushes", timeout=10)
        assert helpers.file_row(db, ids[0]).status == "error"
        assert anomalies_of(db, ids[0]) == ["file_missing"]
    finally:
        threads.close()


def _pending_with_nothing_to_write(db: database.Database, data_dir: Path) -> str:
    """A file kicked twice: the first flush wrote everything, the second finds nothing."""
    file_id = journal.ingest(db, _body("k")).file_id
    journal.flush(db, data_dir, file_id)
    with db.transaction() as conn:
        conn.execute(
            sa.update(tables.raw_files)
            .where(tables.raw_files.c.file_id == file_id)
            .values(flush_pending=True)
        )
    return file_id


@pytest.mark.parametrize("alone", [True, False], ids=["flush", "round"])
def test_an_append_while_a_flush_finds_nothing_is_flushed_again(
    db: database.Database, data_dir: Path, alone: bool
) -> None:
    # The append's ingest sees the file pending and does not kick it; the flush that found
    # nothing must not settle it, and must say to flush the file again.
    file_id = _pending_with_nothing_to_write(db, data_dir)
    key = helpers.file_row(db, file_id).session_key

    def append_meanwhile(step: str) -> None:
        if step == "read":
            assert journal.ingest(db, _body(key, "meanwhile")).kick is False

    file_locks = _locks(db, data_dir)
    if alone:
        result = flush.flush(db, file_locks, data_dir, file_id, fault=append_meanwhile)
    else:
        done = flush.flush_files(db, file_locks, data_dir, [file_id], fault=append_meanwhile)
        result = done.results[file_id]
    assert (result.messages, result.more) == (0, True)
    row = helpers.file_row(db, file_id)
    assert (row.flush_pending, row.flushed_seq, row.next_seq) == (True, 1, 3)
    assert journal.flush(db, data_dir, file_id).messages == 1


def test_a_round_checks_its_files_directory_once(
    db: database.Database, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = [journal.ingest(db, _body(f"s{i}")).file_id for i in range(3)]
    flush.flush_files(db, _locks(db, data_dir), data_dir, ids)  # the directories exist now
    for i in range(3):
        journal.ingest(db, _body(f"s{i}", "again"))
    folder = data_dir / Path(store.relative_path("session", ids[0])).parent
    looked: list[Path] = []
    lstat = os.lstat

    def counted(path: Any) -> Any:
        looked.append(Path(path))
        return lstat(path)

    monkeypatch.setattr(os, "lstat", counted)
    done = flush.flush_files(db, _locks(db, data_dir), data_dir, ids)
    assert sorted(done.results) == sorted(ids)
    assert (looked.count(folder.parent), looked.count(folder)) == (1, 1)  # not once a file


def test_a_round_writes_nothing_through_a_symlinked_directory(
    db: database.Database, data_dir: Path, tmp_path: Path
) -> None:
    """The round checks the files' directory once (not once a file), and still refuses it when
    it is a symlink: every file's error, the damage recorded."""
    ids = [journal.ingest(db, _body(f"s{i}")).file_id for i in range(3)]
    outside = tmp_path / "outside"
    outside.mkdir()
    folder = data_dir / Path(store.relative_path("session", ids[0])).parent
    folder.parent.mkdir(parents=True, exist_ok=True)
    folder.symlink_to(outside, target_is_directory=True)
    done = flush.flush_files(db, _locks(db, data_dir), data_dir, ids)
    assert sorted(done.errors) == sorted(ids) and done.left == []
    assert all(isinstance(e, errors.FileDamaged) for e in done.errors.values())
    assert done.results == {}
    assert list(outside.iterdir()) == []
    assert [anomalies_of(db, i) for i in ids] == [["file_replaced"]] * 3
    assert [helpers.file_row(db, i).flushed_seq for i in ids] == [0, 0, 0]


def test_a_failed_write_in_a_round_of_one_is_its_error(
    db: database.Database, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing is committed and nothing is left to run again: the caller gets the error (a
    flush of one file raises it), and the next flush writes the same bytes."""
    file_id = journal.ingest(db, _body("w")).file_id

    def full(path: Path, data: bytes) -> None:
        raise errors.InsufficientStorage("no space left")

    monkeypatch.setattr(store, "create", full)
    done = flush.flush_files(db, _locks(db, data_dir), data_dir, [file_id], wait=True)
    assert (done.results, done.left) == ({}, [])
    assert isinstance(done.errors[file_id], errors.InsufficientStorage)
    with pytest.raises(errors.InsufficientStorage):
        flush.flush(db, _locks(db, data_dir), data_dir, file_id)
    monkeypatch.undo()
    assert helpers.file_row(db, file_id).flushed_seq == 0
    assert journal.flush(db, data_dir, file_id).messages == 1


class _Interrupted(Exception):
    """A redaction stopped between its steps, as a crash stops it."""


def test_a_round_finishes_an_interrupted_redaction_before_it_writes(
    db: database.Database, data_dir: Path
) -> None:
    """A redaction a crash left between its rename and its commit (the file rewritten, the
    index one step behind) is finished by the round, under its lock, and then the file's
    appends are written after the redacted bytes: in a round of several files too."""
    ids = [journal.ingest(db, _body(f"s{i}", f"secret{i} words")).file_id for i in range(2)]
    for file_id in ids:
        journal.flush(db, data_dir, file_id)

    def crash(step: str) -> None:
        if step == "renamed":
            raise _Interrupted(step)

    who = rewrite.Who("tests", "an interrupted redaction")
    with pytest.raises(_Interrupted):
        redaction.redact(db, _locks(db, data_dir), data_dir, f"{ids[0]}:1", who, fault=crash)
    with db.reading() as conn:
        assert audit.file_and_pending(conn, ids[0])[1]  # unfinished
    for i in range(len(ids)):
        journal.ingest(db, _body(f"s{i}", "after"))
    done = flush.flush_files(db, _locks(db, data_dir), data_dir, ids)
    assert (done.errors, done.left) == ({}, [])
    assert [done.results[f].flushed_seq for f in ids] == [2, 2]
    text = (data_dir / helpers.file_row(db, ids[0]).path).read_bytes()
    assert b"secret0" not in text and b"[REDACTED:message]" in text and b"after" in text
    assert integrity.fsck(db, data_dir) == []
