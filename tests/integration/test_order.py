"""A sender's order (issue 13, :mod:`pipeline.ordering`) against a real index, on SQLite and
PostgreSQL: numbered appends are written in their sender's order whatever order they come in;
a queued one that is early waits in the index, one already applied replays (same key) or is
recorded and dropped; a gap that never fills is let go after ``order_wait_seconds`` and
recorded once; over HTTP an out-of-order number is refused at once; a session uses sequences
always or never."""

from __future__ import annotations

import random
import threading
import tracemalloc
from pathlib import Path
from typing import Any

import helpers
import pytest

from pipeline import (
    anomalies,
    database,
    errors,
    index,
    ingest,
    journal,
    ledger,
    reader,
    tables,
    validation,
)
from pipeline.clock import ManualClock
from pipeline.service import Service
from pipeline.settings import Settings

AGENT = "hermes"


def numbered(
    sequence: int | None,
    session_key: str = "s",
    *,
    key: str | None = None,
    content: str | None = None,
    **extra: Any,
) -> validation.Append:
    """The append of one message numbered ``sequence`` (its content says which)."""
    body: dict[str, Any] = {
        "agent_id": AGENT,
        "session_key": session_key,
        "idempotency_key": key or f"{session_key}/{sequence}",
        "messages": [{"role": "user", "content": content or f"{session_key} #{sequence}"}],
        **extra,
    }
    if sequence is not None:
        body["sequence"] = sequence
    return validation.parse_append(body)


def queued(
    db: database.Database, append: validation.Append, *, wait: float = 60.0
) -> ingest.AppendResult | ingest.Held:
    return ingest.queued(db, append, wait_seconds=wait)


def row_of(db: database.Database, session_key: str = "s") -> tables.FileRow | None:
    with db.transaction() as conn:
        return index.find_file(conn, AGENT, "session", session_key)


def contents(db: database.Database, data_dir: Path, session_key: str = "s") -> list[str]:
    """The session's messages as they are in its file, after a flush."""
    row = row_of(db, session_key)
    assert row is not None
    journal.flush(db, data_dir, row.file_id)
    return [m.content for m in reader.messages(db, data_dir, row.file_id, limit=10_000)]


def recorded_anomalies(db: database.Database, *kinds: str) -> list[tables.Anomaly]:
    with db.transaction() as conn:
        return anomalies.listed(conn, kinds=list(kinds))


def waiting(db: database.Database) -> int:
    with db.transaction() as conn:
        return ledger.waiting_backlog(conn)[0]


def age_waiting(db: database.Database, seconds: float) -> None:
    """Let ``seconds`` pass on the index's clock: every held append is that much older."""
    assert isinstance(db.clock, ManualClock)
    db.clock.advance(seconds)


def settle(db: database.Database, *, wait: float) -> list[str]:
    return ingest.settle_waiting(db, age=0, limits=None, wait_seconds=wait)


# ---------------------------------------------------------------------------------------------
# in order, out of order


def test_numbered_appends_in_order_move_the_session_on(
    db: database.Database, data_dir: Path
) -> None:
    first = journal.ingest(db, numbered(1))
    assert (first.first_seq, first.kick) == (1, True)
    row = row_of(db)
    assert row is not None and row.next_sequence == 2
    second = journal.ingest(db, numbered(2))
    assert second.first_seq == 2
    assert row_of(db).next_sequence == 3  # type: ignore[union-attr]
    assert contents(db, data_dir) == ["s #1", "s #2"]
    with db.transaction() as conn:
        assert index.get_file(conn, first.file_id).to_json()["next_sequence"] == 3  # type: ignore[union-attr]


def test_early_queued_appends_wait_and_follow_their_predecessor(
    db: database.Database, data_dir: Path
) -> None:
    """3 and 2 come first: they wait in the index (no file yet: 1 gives its metadata); 1
    lands and they follow in the same transaction, in order."""
    for number in (3, 2):
        held = queued(db, numbered(number))
        assert held == ingest.Held(number, expected=1)
    assert row_of(db) is None and waiting(db) == 2
    first = queued(db, numbered(1, metadata={"app": "ingest"}))
    assert isinstance(first, journal.AppendResult) and first.kick
    assert (first.first_seq, first.last_seq) == (1, 1)
    assert waiting(db) == 0
    row = row_of(db)
    assert row is not None and (row.next_sequence, row.next_seq) == (4, 4)
    assert row.metadata == {"app": "ingest"}
    assert contents(db, data_dir) == ["s #1", "s #2", "s #3"]
    queued(db, numbered(4))
    assert contents(db, data_dir) == ["s #1", "s #2", "s #3", "s #4"]
    assert recorded_anomalies(db) == []


def test_redelivered_tasks_replay_and_other_appends_with_a_taken_number_are_dropped(
    db: database.Database, data_dir: Path
) -> None:
    queued(db, numbered(1))
    assert queued(db, numbered(3)) == ingest.Held(3, expected=2)
    # a redelivery of the waiting 3: nothing new waits
    assert queued(db, numbered(3)) == ingest.Held(3, expected=2)
    assert waiting(db) == 1
    # another append claiming 3 while it waits: dropped, recorded
    other = queued(db, numbered(3, key="other-3", content="intruder"))
    assert other == ingest.Held(3, expected=2, dropped=True)
    queued(db, numbered(2))
    # a redelivery of an applied one replays (the same key): nothing written
    again = queued(db, numbered(2))
    assert isinstance(again, journal.AppendResult) and again.replayed and again.first_seq == 2
    # another append with an applied number: dropped, recorded once per number
    for _ in range(2):
        late = queued(db, numbered(1, key="other-1", content="intruder"))
        assert late == ingest.Held(1, expected=4, dropped=True)
    assert contents(db, data_dir) == ["s #1", "s #2", "s #3"]
    found = recorded_anomalies(db, "sequence_duplicate")
    assert [(a.key, a.count) for a in found] == [("3", 1), ("1", 2)]
    assert "'other-1'" in found[1].detail and "was dropped" in found[1].detail
    row = row_of(db)
    assert row is not None and found[1].file_id == row.file_id


def test_http_and_the_queue_may_feed_one_session(db: database.Database, data_dir: Path) -> None:
    """An HTTP append of the expected number lets the held ones follow; the same append sent
    both ways is written once."""
    queued(db, numbered(2))
    queued(db, numbered(3))
    journal.ingest(db, numbered(1))
    assert waiting(db) == 0
    queued(db, numbered(5))
    with pytest.raises(errors.OutOfOrder) as ahead:  # HTTP never waits, even behind a held one
        journal.ingest(db, numbered(5))
    assert ahead.value.expected == 4
    journal.ingest(db, numbered(4))
    assert journal.ingest(db, numbered(5)).replayed  # written from the queue: a replay
    assert contents(db, data_dir) == [f"s #{n}" for n in range(1, 6)]
    assert waiting(db) == 0 and recorded_anomalies(db) == []


def test_same_key_different_body_while_waiting_is_a_conflict(db: database.Database) -> None:
    queued(db, numbered(2))
    with pytest.raises(errors.Conflict, match="idempotency_key 's/2'"):
        queued(db, numbered(2, content="changed"))
    assert waiting(db) == 1


# ---------------------------------------------------------------------------------------------
# gaps


def test_a_gap_is_let_go_after_the_wait_and_a_late_arrival_is_recorded(
    db: database.Database, data_dir: Path
) -> None:
    """1–3 and 5–6 sent, 4 never: after the wait 5 and 6 follow 3, one sequence_gap names 4;
    then 4 comes: recorded as sequence_late, not appended."""
    for number in (1, 2, 3, 6, 5):
        queued(db, numbered(number), wait=0.5)
    assert settle(db, wait=60) == []  # not yet
    assert contents(db, data_dir) == ["s #1", "s #2", "s #3"]
    age_waiting(db, 0.6)
    row = row_of(db)
    assert row is not None
    assert settle(db, wait=0.5) == [row.file_id]
    assert contents(db, data_dir) == ["s #1", "s #2", "s #3", "s #5", "s #6"]
    assert waiting(db) == 0
    gaps = recorded_anomalies(db, "sequence_gap")
    assert [(g.file_id, g.key, g.count) for g in gaps] == [(row.file_id, "4", 1)]
    assert gaps[0].detail.startswith("sequence 4 never arrived within order_wait_seconds (0.5 s)")
    assert "sequence 5 was applied after sequence 3" in gaps[0].detail

    late = queued(db, numbered(4), wait=0.5)
    assert late == ingest.Held(4, expected=7, dropped=True)
    assert contents(db, data_dir) == ["s #1", "s #2", "s #3", "s #5", "s #6"]
    recorded = recorded_anomalies(db, "sequence_late")
    assert [(a.file_id, a.key) for a in recorded] == [(row.file_id, "4")]
    assert "'s/4'" in recorded[0].detail and "not appended" in recorded[0].detail
    assert len(recorded_anomalies(db, "sequence_gap")) == 1
    queued(db, numbered(7), wait=0.5)
    assert contents(db, data_dir)[-1] == "s #7"


def test_a_late_number_behind_a_gap_of_millions_costs_no_memory(
    db: database.Database, data_dir: Path
) -> None:
    """A gap of 20,000,000 numbers let go, then a number inside it: found late by the gap's
    bounds (a set of its members would take gigabytes), and so is one far past the gap."""
    queued(db, numbered(1))
    queued(db, numbered(20_000_001), wait=0.5)
    age_waiting(db, 0.6)
    assert settle(db, wait=0.5) != []
    assert contents(db, data_dir) == ["s #1", "s #20000001"]
    assert [g.key for g in recorded_anomalies(db, "sequence_gap")] == ["2-20000000"]
    before = tracemalloc.is_tracing()
    tracemalloc.start()
    try:
        assert queued(db, numbered(5)) == ingest.Held(5, expected=20_000_002, dropped=True)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        if not before:
            tracemalloc.stop()
    assert peak < 10_000_000, peak  # bytes: the gap was never spelled out
    assert [a.key for a in recorded_anomalies(db, "sequence_late")] == ["5"]


def test_a_taken_number_sent_many_times_to_a_new_session_is_one_anomaly(
    db: database.Database,
) -> None:
    """300 tasks numbered 1,000,000 with different keys, to a session with no file yet: the
    first is held, the other 299 are one sequence_duplicate record, counted."""
    for i in range(300):
        queued(db, numbered(1_000_000, key=f"k{i}"))
    found = recorded_anomalies(db, "sequence_duplicate")
    assert [(a.file_id, a.count) for a in found] == [(None, 299)]
    assert "session_key='s'" in found[0].detail and "sequence 1000000" in found[0].detail
    assert waiting(db) == 1


def test_a_gap_is_let_go_by_the_next_arrival_too(db: database.Database, data_dir: Path) -> None:
    """No sweep needed while tasks keep coming: an arrival finds the oldest waiting one
    overdue. Two holes in a row are two gaps, each recorded."""
    queued(db, numbered(1), wait=0.3)
    for number in (4, 6):
        queued(db, numbered(number), wait=0.3)
    age_waiting(db, 0.4)
    held = queued(db, numbered(7), wait=0.3)
    row = row_of(db)
    assert row is not None and held == ingest.Held(7, expected=2, kick=row.file_id)
    assert contents(db, data_dir) == ["s #1", "s #4", "s #6", "s #7"]
    assert [g.key for g in recorded_anomalies(db, "sequence_gap")] == ["2-3", "5"]


def test_a_session_whose_first_append_never_comes(db: database.Database, data_dir: Path) -> None:
    for number in (3, 2):
        queued(db, numbered(number, metadata={"from": str(number)}), wait=0.2)
    age_waiting(db, 0.3)
    settle(db, wait=0.2)
    row = row_of(db)
    assert row is not None and row.metadata == {"from": "2"}  # the first append written
    assert contents(db, data_dir) == ["s #2", "s #3"]
    gap = recorded_anomalies(db, "sequence_gap")
    assert [(g.key, g.file_id) for g in gap] == [("1", row.file_id)]
    assert "sequence 2 was applied first" in gap[0].detail


# ---------------------------------------------------------------------------------------------
# HTTP's path: refused at once; sequences always or never


def test_out_of_order_is_refused_at_once_naming_the_expected_one(db: database.Database) -> None:
    with pytest.raises(errors.OutOfOrder) as ahead:
        journal.ingest(db, numbered(2))
    assert ahead.value.expected == 1 and ahead.value.status == 409
    assert "sequence 2 is ahead: this session expects sequence 1 next" in ahead.value.detail
    assert row_of(db) is None and waiting(db) == 0
    journal.ingest(db, numbered(1))
    journal.ingest(db, numbered(2))
    # a retry of 2 replays; another append numbered 2 is refused
    assert journal.ingest(db, numbered(2)).replayed
    with pytest.raises(errors.OutOfOrder, match="sequence 2 of this session was already applied"):
        journal.ingest(db, numbered(2, key="another"))
    with pytest.raises(errors.OutOfOrder) as behind:
        journal.ingest(db, numbered(1, key="again"))
    assert behind.value.expected == 3
    assert row_of(db).next_sequence == 3  # type: ignore[union-attr]


def test_a_session_uses_sequences_always_or_never(db: database.Database) -> None:
    journal.ingest(db, numbered(1, "numbered"))
    with pytest.raises(errors.Conflict, match=r"sequence is required.*expects sequence 2 next"):
        journal.ingest(db, numbered(None, "numbered", key="plain"))
    journal.ingest(db, numbered(None, "plain", key="p1"))
    with pytest.raises(errors.Conflict, match="has appends without a sequence"):
        journal.ingest(db, numbered(1, "plain", key="p2"))
    with pytest.raises(errors.Conflict, match="has appends without a sequence"):
        queued(db, numbered(5, "plain", key="p3"))
    # numbered appends waiting for a session's first: one without a number is refused too
    queued(db, numbered(2, "waiting"))
    with pytest.raises(errors.Conflict, match="appends with a sequence wait"):
        journal.ingest(db, numbered(None, "waiting", key="w"))
    assert row_of(db, "waiting") is None


# ---------------------------------------------------------------------------------------------
# the service: Celery's entry point, the sweep, the backlog


def service(db: database.Database, data_dir: Path, database_url: str, **settings: Any) -> Service:
    values = {"data_dir": data_dir, "database_url": database_url, **settings}
    return helpers.service(db, Settings.load(environ={}, **values), helpers.RecordingQueue())


def body(sequence: int, **extra: Any) -> dict[str, Any]:
    return {
        "agent_id": AGENT,
        "session_key": "s",
        "idempotency_key": f"task-{sequence}",
        "sequence": sequence,
        "messages": [{"role": "user", "content": f"#{sequence}"}],
        **extra,
    }


def test_the_queued_path_holds_drops_and_the_sweep_lets_a_gap_go(
    db: database.Database, data_dir: Path, database_url: str
) -> None:
    svc = service(db, data_dir, database_url, order_wait_seconds=0.3, sweep_age=0)
    kicks = svc.queue.kicks  # type: ignore[union-attr]
    assert isinstance(svc.append_queued(body(2)), ingest.Held)
    assert kicks == []
    done = svc.append_queued(body(1))
    row = row_of(db)
    assert row is not None and kicks == [row.file_id]
    assert done is not None and not isinstance(done, ingest.Held)
    assert done.result.first_seq == 1
    svc.append_queued(body(4))
    svc.append_queued({**body(5), "sequence": "five"})  # invalid: recorded, like any bad task
    assert svc.sweep() == [row.file_id] and waiting(db) == 1  # the journal's kick
    age_waiting(db, 0.4)
    kicks.clear()
    assert svc.sweep() == [row.file_id] and kicks == [row.file_id]
    assert waiting(db) == 0
    assert contents(db, data_dir) == ["#1", "#2", "#4"]
    assert [a.key for a in recorded_anomalies(db, "sequence_gap")] == ["3"]
    rejected = recorded_anomalies(db, "append_task_rejected")
    assert len(rejected) == 1 and "sequence: must be an integer from 1" in rejected[0].detail


def test_held_appends_wait_on_through_a_full_backlog(
    db: database.Database, data_dir: Path, database_url: str
) -> None:
    """Past backlog_max_file_messages the held ones stay held (the arrival that let them go
    stands); once a flush made room, the sweep writes them."""
    svc = service(db, data_dir, database_url, backlog_max_file_messages=2, sweep_age=0)
    for number in (3, 2):
        svc.append_queued(body(number))
    svc.append_queued(body(1))
    assert waiting(db) == 1  # 1 and 2 written; 3 would pass the limit
    assert contents(db, data_dir) == ["#1", "#2"]
    svc.sweep()
    assert contents(db, data_dir) == ["#1", "#2", "#3"]
    assert waiting(db) == 0
    # the same append as a held one, over HTTP once the backlog has room: written once
    for number in (6, 5, 4):
        svc.append_queued(body(number))
    assert waiting(db) == 1  # 4 and 5 written; 6 would pass the limit
    assert contents(db, data_dir) == ["#1", "#2", "#3", "#4", "#5"]
    assert helpers.append(svc, body(6)).result.first_seq == 6
    assert waiting(db) == 0
    assert contents(db, data_dir) == ["#1", "#2", "#3", "#4", "#5", "#6"]
    assert recorded_anomalies(db) == []


# ---------------------------------------------------------------------------------------------
# concurrency: many writers, one order


def test_concurrent_writers_keep_the_senders_order(
    db: database.Database, data_dir: Path, database_url: str
) -> None:
    """Eight threads on four engines (four group committers: as many transactions at once, as
    from four processes) take 200 numbered appends, a quarter of them twice, in a shuffled
    order: each is written once, in the sender's order."""
    engines = [database.Database.from_url(database_url) for _ in range(4)]
    count = 200
    rng = random.Random(13)
    tasks = [numbered(n) for n in range(1, count + 1)]
    tasks += rng.sample(tasks, count // 4)
    rng.shuffle(tasks)
    lock = threading.Lock()
    failures: list[BaseException] = []

    def worker(mine: database.Database) -> None:
        while True:
            with lock:
                if not tasks:
                    return
                task = tasks.pop()
            try:
                queued(mine, task)
            except BaseException as exc:  # reported below
                failures.append(exc)

    threads = [threading.Thread(target=worker, args=(engines[i % 4],)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for other in engines:
        other.dispose()
    assert failures == []
    assert contents(db, data_dir) == [f"s #{n}" for n in range(1, count + 1)]
    assert waiting(db) == 0 and recorded_anomalies(db) == []
    row = row_of(db)
    assert row is not None and (row.next_sequence, row.flushed_seq) == (count + 1, count)
