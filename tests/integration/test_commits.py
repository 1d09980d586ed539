"""Group commit (docs/design.md §3, pipeline.database.commits) on SQLite and PostgreSQL: work that
queues while a commit runs goes into the next transaction together; a piece that fails fails alone;
a failed transaction fails every piece in it and commits none; a deadlock runs the group again; and
journal.ingest really shares its commits when called from many threads."""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import helpers
import pytest
import sqlalchemy as sa

from pipeline import anomalies, clock, database, errors, index, journal, tables
from pipeline.database import commits, statements

THREADS = 12


def _anomaly(kind: str) -> Callable[[sa.Connection], str]:
    """Work that records an anomaly (a row to find afterwards) and returns its kind."""

    def work(conn: sa.Connection) -> str:
        anomalies.record(conn, None, kind, "group commit test", now=clock.SYSTEM.now())
        return kind

    return work


def _kinds(db: database.Database) -> list[str]:
    with db.transaction() as conn:
        return sorted(a.kind for a in anomalies.listed(conn))


def _queued(group: commits.Group) -> int:
    with group._mutex:
        return len(group._queue)


def _run_behind_a_held_commit(
    group: commits.Group, first: Callable[[sa.Connection], Any], rest: list[Callable[..., Any]]
) -> tuple[Any, list[Any]]:
    """Run ``first`` and hold its transaction open until every piece of ``rest`` is queued
    behind it (so they form one group); the outcome of each (a value or the exception)."""
    entered, release = threading.Event(), threading.Event()

    def held(conn: sa.Connection) -> Any:
        value = first(conn)
        entered.set()
        release.wait(10)
        return value

    outcomes: list[Any] = [None] * (len(rest) + 1)

    def call(i: int, work: Callable[[sa.Connection], Any]) -> None:
        try:
            outcomes[i] = group.run(work)
        except Exception as exc:
            outcomes[i] = exc

    leader = threading.Thread(target=call, args=(0, held))
    leader.start()
    assert entered.wait(10), "the leader never ran its work"
    others = [threading.Thread(target=call, args=(i + 1, w)) for i, w in enumerate(rest)]
    for thread in others:
        thread.start()
    helpers.wait_for(lambda: _queued(group) == len(rest), what="every piece to queue", poll=0.001)
    release.set()
    for thread in [leader, *others]:
        thread.join(30)
        assert not thread.is_alive()
    return outcomes[0], outcomes[1:]


def test_work_queued_behind_a_commit_shares_the_next_one(db: database.Database) -> None:
    group = commits.Group(db)
    first, rest = _run_behind_a_held_commit(
        group, _anomaly("k00"), [_anomaly(f"k{i:02d}") for i in range(1, THREADS)]
    )
    assert [first, *rest] == [f"k{i:02d}" for i in range(THREADS)]
    assert (group.groups, group.works) == (2, THREADS)  # the first alone, then all the rest
    assert _kinds(db) == [f"k{i:02d}" for i in range(THREADS)]


@pytest.mark.parametrize("optimistic", [False, True], ids=["savepoints", "optimistic"])
def test_a_failing_piece_fails_alone_and_leaves_nothing(
    db: database.Database, optimistic: bool
) -> None:
    def failing(conn: sa.Connection) -> str:
        anomalies.record(
            conn, None, "bad", "written, then rolled back to its savepoint", now=clock.SYSTEM.now()
        )
        raise errors.Conflict("this request contradicts what is recorded")

    group = commits.Group(db, optimistic=optimistic)
    _, rest = _run_behind_a_held_commit(
        group, _anomaly("first"), [_anomaly("a"), failing, _anomaly("b")]
    )
    assert rest[0] == "a" and rest[2] == "b"
    assert isinstance(rest[1], errors.Conflict)
    assert _kinds(db) == ["a", "b", "first"]


def test_an_optimistic_group_takes_savepoints_only_once_a_piece_fails(
    db: database.Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As on PostgreSQL (where each costs two round trips): a group runs without them; when a
    piece fails, it fails alone, the group's transaction rolls back, and the rest run again in
    savepoints: what each caller is told and what is stored are as with them all along."""
    taken: list[str] = []
    savepoint = statements.savepoint

    def counted(conn: sa.Connection, name: str, action: str) -> None:
        taken.append(action)
        savepoint(conn, name, action)

    monkeypatch.setattr(statements, "savepoint", counted)
    runs: list[str] = []

    def piece(kind: str) -> Callable[[sa.Connection], str]:
        def work(conn: sa.Connection) -> str:
            runs.append(kind)
            return _anomaly(kind)(conn)

        return work

    def failing(conn: sa.Connection) -> str:
        runs.append("bad")
        anomalies.record(conn, None, "bad", "written, then rolled back", now=clock.SYSTEM.now())
        raise errors.Conflict("this request contradicts what is recorded")

    group = commits.Group(db, optimistic=True)
    _, rest = _run_behind_a_held_commit(group, piece("first"), [piece("a"), piece("b")])
    assert (rest, taken, runs) == (["a", "b"], [], ["first", "a", "b"])
    runs.clear()
    _, rest = _run_behind_a_held_commit(group, piece("second"), [piece("c"), failing, piece("d")])
    assert rest[0] == "c" and rest[2] == "d"
    assert isinstance(rest[1], errors.Conflict)
    assert runs == ["second", "c", "bad", "c", "d"]  # the failing piece ran once
    assert taken == ["begin", "release"] * 2  # c and d, in the second run
    assert _kinds(db) == ["a", "b", "c", "d", "first", "second"]


@pytest.mark.parametrize("optimistic", [False, True], ids=["savepoints", "optimistic"])
def test_a_piece_that_must_run_again_goes_into_the_next_group(
    db: database.Database, optimistic: bool
) -> None:
    runs: list[int] = []

    def racing(conn: sa.Connection) -> str:
        runs.append(1)
        if len(runs) == 1:
            anomalies.record(
                conn, None, "lost", "rolled back before the rerun", now=clock.SYSTEM.now()
            )
            raise commits.Again
        return _anomaly("again")(conn)

    group = commits.Group(db, optimistic=optimistic)
    _, rest = _run_behind_a_held_commit(group, _anomaly("first"), [racing, _anomaly("x")])
    assert rest == ["again", "x"] and len(runs) == 2
    assert group.groups == 3  # first; x (racing went back); racing alone
    assert _kinds(db) == ["again", "first", "x"]


@pytest.mark.parametrize("optimistic", [False, True], ids=["savepoints", "optimistic"])
def test_a_failed_transaction_fails_every_piece_and_commits_none(
    db: database.Database, optimistic: bool
) -> None:
    if db.postgres:

        def breaking(conn: sa.Connection) -> str:
            conn.execute(sa.text("SELECT pg_terminate_backend(pg_backend_pid())"))
            return "never"

        failure: type[errors.SgmeError] = errors.IndexUnavailable
    else:

        def breaking(conn: sa.Connection) -> str:
            # A foreign key checked only at COMMIT: the piece itself succeeds, the commit fails.
            conn.execute(sa.text("PRAGMA defer_foreign_keys=ON"))
            values = {"seq": 1, "o": 0, "n": 1, "ts": "2026-01-01 00:00:00.000000"}
            conn.execute(
                sa.text(
                    "INSERT INTO messages (file_id, seq, byte_offset, byte_length, ts, role) "
                    "VALUES ('no-such-file', :seq, :o, :n, :ts, 'user')"
                ),
                values,
            )
            return "never"

        failure = errors.ConstraintViolation

    group = commits.Group(db, optimistic=optimistic)
    _, rest = _run_behind_a_held_commit(
        group, _anomaly("first"), [_anomaly("a"), breaking, _anomaly("b")]
    )
    assert [type(r) for r in rest] == [failure] * 3, rest
    assert _kinds(db) == ["first"]  # nothing of the failed group committed
    assert (group.groups, group.works) == (1, 1)


@pytest.mark.parametrize("optimistic", [False, True], ids=["savepoints", "optimistic"])
def test_a_group_that_deadlocks_every_time_goes_one_piece_at_a_time(
    db: database.Database, optimistic: bool
) -> None:
    """A group whose pieces lock rows another process's group locks in another order may be
    aborted on every run; then each piece runs alone, holding only its own locks, and every
    one is stored. (The database here aborts any transaction that holds two pieces, as
    PostgreSQL would at each run of two groups locking across each other.)"""
    pieces: list[str] = []

    class Deadlocking:
        @contextlib.contextmanager
        def committing(self, *, durable: bool = True) -> Iterator[sa.Connection]:
            pieces.clear()
            with db.committing(durable=durable) as conn:
                yield conn
                if len(pieces) > 1:
                    raise errors.Deadlock("deadlock detected (two pieces in one transaction)")

    def piece(kind: str) -> Callable[[sa.Connection], str]:
        def work(conn: sa.Connection) -> str:
            pieces.append(kind)
            return _anomaly(kind)(conn)

        return work

    group = commits.Group(Deadlocking(), optimistic=optimistic)
    first, rest = _run_behind_a_held_commit(group, piece("first"), [piece(k) for k in "abc"])
    assert [first, *rest] == ["first", "a", "b", "c"]  # nobody was told of the deadlocks
    assert _kinds(db) == ["a", "b", "c", "first"]  # each stored once


def test_a_deadlock_runs_the_group_again(postgres_url: str) -> None:
    # SQLite has one writer at a time and cannot deadlock: PostgreSQL only.
    db = database.Database.from_url(postgres_url)
    other = database.Database.from_url(postgres_url)  # another handle: another group committer
    row1, row2 = (f"row-{uuid.uuid4().hex[:8]}" for _ in range(2))
    with db.transaction() as conn:
        for kind in (row1, row2):
            anomalies.record(conn, None, kind, "a row to lock", now=clock.SYSTEM.now())
    both = threading.Barrier(2, timeout=10)
    runs: list[str] = []

    def locking(first: str, second: str) -> Callable[[sa.Connection], str]:
        def work(conn: sa.Connection) -> str:
            runs.append(first)
            lock = sa.text("SELECT id FROM anomalies WHERE kind = :k FOR UPDATE")
            conn.execute(lock, {"k": first})
            if runs.count(first) == 1:
                both.wait()  # both hold their first row: now each asks for the other's
            conn.execute(lock, {"k": second})
            return first

        return work

    results: dict[str, Any] = {}

    def call(db: database.Database, first: str, second: str) -> None:
        try:
            results[first] = commits.Group(db).run(locking(first, second))
        except Exception as exc:
            results[first] = exc

    threads = [
        threading.Thread(target=call, args=(db, row1, row2)),
        threading.Thread(target=call, args=(other, row2, row1)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    other.dispose()
    db.dispose()
    assert results == {row1: row1, row2: row2}  # nobody was told of the deadlock
    # PostgreSQL aborted one (at least once: a rerun that meets the other transaction still
    # holding its lock may be chosen again under load); it ran again and succeeded
    assert len(runs) >= 3
    assert max(runs.count(row1), runs.count(row2)) <= commits.DEADLOCK_ATTEMPTS


def test_a_group_runs_its_pieces_in_the_order_of_their_keys(db: database.Database) -> None:
    ran: list[str] = []

    def piece(name: str) -> Callable[[sa.Connection], str]:
        def work(conn: sa.Connection) -> str:
            ran.append(name)
            return name

        return work

    names = ["b1", "none1", "a", "b2", "none2"]
    done = db.group.run_many([piece(n) for n in names], keys=["b", None, "a", "b", None])
    assert done == names  # each caller's value, in the order given
    # without a key first, then by key; pieces of one key (one file) in the order they came
    assert ran == ["none1", "none2", "a", "b1", "b2"]


def test_groups_locking_rows_in_their_keys_order_never_deadlock(postgres_url: str) -> None:
    """Two processes' groups whose pieces come in opposite orders: each would hold one row and
    ask for the other's (a deadlock, as the API's appends met a worker's flushes); in the
    order of their keys the second waits for the first, and neither is aborted."""
    db = database.Database.from_url(postgres_url)
    other = database.Database.from_url(postgres_url)  # another handle: another group committer
    row1, row2 = sorted(f"row-{uuid.uuid4().hex[:8]}" for _ in range(2))
    with db.transaction() as conn:
        for kind in (row1, row2):
            anomalies.record(conn, None, kind, "a row to lock", now=clock.SYSTEM.now())
    holding = {id(db): threading.Event(), id(other): threading.Event()}
    # a transaction waiting for this one (for a row it locked): PostgreSQL's lock table
    waited_for = sa.text(
        "SELECT 1 FROM pg_locks w JOIN pg_locks mine ON w.transactionid = mine.transactionid"
        " WHERE mine.pid = pg_backend_pid() AND mine.locktype = 'transactionid'"
        " AND mine.granted AND NOT w.granted"
    )

    def locking(handle: database.Database, kind: str) -> Callable[[sa.Connection], str]:
        def work(conn: sa.Connection) -> str:
            lock = sa.text("SELECT id FROM anomalies WHERE kind = :k FOR UPDATE")
            conn.execute(lock, {"k": kind})
            mine = holding[id(handle)]
            if not mine.is_set():  # the group's first piece: give the other group its turn
                mine.set()
                theirs = holding[id(other if handle is db else db)]
                # it holds its first row too (and both ask for the other's next), or it waits
                # for ours
                helpers.wait_for(
                    lambda: theirs.is_set() or conn.execute(waited_for).first(),
                    timeout=10,
                    what="the other group's first row, or its wait for ours",
                    poll=0.005,
                )
            return kind

        return work

    results: dict[int, Any] = {}

    def call(handle: database.Database, kinds: list[str]) -> None:
        try:
            works = [locking(handle, kind) for kind in kinds]
            results[id(handle)] = handle.group.run_many(works, keys=kinds)
        except Exception as exc:
            results[id(handle)] = exc

    threads = [
        threading.Thread(target=call, args=(db, [row2, row1])),
        threading.Thread(target=call, args=(other, [row1, row2])),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    aborted = db.group.aborted + other.group.aborted
    other.dispose()
    db.dispose()
    assert results == {id(db): [row2, row1], id(other): [row1, row2]}
    assert aborted == 0  # in arrival order PostgreSQL aborted one of them (checked)


def test_ingest_from_many_threads_shares_commits(db: database.Database) -> None:
    group = db.group
    groups, works = group.groups, group.works
    start = threading.Barrier(THREADS, timeout=10)
    acks: list[journal.AppendResult] = []

    def append(t: int) -> None:
        start.wait()
        for i in range(20):
            body = {
                "agent_id": "group",
                "session_key": f"s{t % 3}",
                "messages": [{"role": "user", "content": f"t{t} m{i}"}],
            }
            acks.append(journal.ingest(db, body))

    threads = [threading.Thread(target=append, args=(t,)) for t in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(acks) == THREADS * 20
    assert group.works - works == THREADS * 20
    # fewer commits than appends: concurrent appends shared them
    assert group.groups - groups < THREADS * 20
    # three sessions, seqs 1..n each with no gap and no repeat
    by_file: dict[str, list[int]] = {}
    for ack in acks:
        by_file.setdefault(ack.file_id, []).append(ack.first_seq)
    assert sorted(len(v) for v in by_file.values()) == [80, 80, 80]
    for seqs in by_file.values():
        assert sorted(seqs) == list(range(1, 81))
    with db.transaction() as conn:
        rows = [index.get_file(conn, f) for f in by_file]
    assert all(isinstance(r, tables.FileRow) and r.next_seq == 81 for r in rows)


def test_a_held_connection_the_server_dropped_is_replaced(
    postgres_database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The group committer's and the flush's held connections have no pool pre-ping: one
    idle for a while is checked before use, and one the server dropped (a restart, an idle
    timeout) is replaced instead of failing the next append."""
    from pipeline.database import transactions

    monkeypatch.setattr(transactions, "HELD_PING_AFTER", 0.0)
    db = database.Database.from_url(postgres_database_url)
    try:
        assert db.commit(_anomaly("before")) == "before"
        with db.reading(held=True) as conn:
            conn.exec_driver_sql("SELECT 1")
        with db.transaction() as conn:  # another session drops every other one of ours
            conn.exec_driver_sql(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        assert db.commit(_anomaly("after")) == "after"
        with db.reading(held=True) as conn:
            assert conn.exec_driver_sql("SELECT 1").scalar() == 1
    finally:
        db.dispose()
