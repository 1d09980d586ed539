"""A sender's order (issue 13, :mod:`pipeline.ordering`) against a real index, on SQLite and
PostgreSQL: numbered appends are written in their sender's order whatever order they come in;
a queued one that is early waits in the index, one already applied replays (same key) or is
recorded and dropped; a gap that never fills is let go after ``order_wait_seconds`` and
recorded once; over HTTP an out-of-order number is refused at once; a session uses sequences
always or never."""

from __future__ import annotations

import datetime as dt
import random
import threading
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from pipeline import (
    database,
    errors,
    index,
    journal,
    ledger,
    ordering,
    reader,
    refine,
    tables,
    validation,
)
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
    engine: sa.Engine, append: validation.Append, *, wait: float = 60.0
) -> journal.AppendResult | ordering.Held:
    return journal.ingest_queued(engine, append, wait_seconds=wait)


def row_of(engine: sa.Engine, session_key: str = "s") -> tables.FileRow | None:
    with database.transaction(engine) as conn:
        return index.find_file(conn, AGENT, "session", session_key)


def contents(engine: sa.Engine, data_dir: Path, session_key: str = "s") -> list[str]:
    """The session's messages as they are in its file, after a flush."""
    row = row_of(engine, session_key)
    assert row is not None
    journal.flush(engine, data_dir, row.file_id)
    return [m.content for m in reader.messages(engine, data_dir, row.file_id, limit=10_000)]


def anomalies(engine: sa.Engine, *kinds: str) -> list[tables.Anomaly]:
    with database.transaction(engine) as conn:
        return index.list_anomalies(conn, kinds=list(kinds))


def waiting(engine: sa.Engine) -> int:
    with database.transaction(engine) as conn:
        return ledger.waiting_backlog(conn)[0]


def age_waiting(engine: sa.Engine, seconds: float) -> None:
    """Make every held append ``seconds`` older, as if that much time had passed."""
    w = tables.waiting_appends.c
    keys = (w.agent_id, w.source_type, w.session_key, w.sequence)
    with database.transaction(engine) as conn:
        for row in conn.execute(sa.select(*keys, w.received_at)).all():
            conn.execute(
                sa.update(tables.waiting_appends)
                .where(*(k == v for k, v in zip(keys, row[:4], strict=True)))
                .values(received_at=row.received_at - dt.timedelta(seconds=seconds))
            )


def settle(engine: sa.Engine, *, wait: float) -> list[str]:
    return ordering.settle_waiting(engine, age=0, write=journal.writer(), wait_seconds=wait)


# ---------------------------------------------------------------------------------------------
# in order, out of order


def test_numbered_appends_in_order_move_the_session_on(engine: sa.Engine, data_dir: Path) -> None:
    first = journal.ingest(engine, numbered(1))
    assert (first.first_seq, first.kick) == (1, True)
    row = row_of(engine)
    assert row is not None and row.next_sequence == 2
    second = journal.ingest(engine, numbered(2))
    assert second.first_seq == 2
    assert row_of(engine).next_sequence == 3  # type: ignore[union-attr]
    assert contents(engine, data_dir) == ["s #1", "s #2"]
    with database.transaction(engine) as conn:
        assert index.get_file(conn, first.file_id).to_json()["next_sequence"] == 3  # type: ignore[union-attr]


def test_early_queued_appends_wait_and_follow_their_predecessor(
    engine: sa.Engine, data_dir: Path
) -> None:
    """3 and 2 come first: they wait in the index (no file yet: 1 gives its metadata); 1
    lands and they follow in the same transaction, in order."""
    for number in (3, 2):
        held = queued(engine, numbered(number))
        assert held == ordering.Held(number, expected=1)
    assert row_of(engine) is None and waiting(engine) == 2
    first = queued(engine, numbered(1, metadata={"app": "ingest"}))
    assert isinstance(first, journal.AppendResult) and first.kick
    assert (first.first_seq, first.last_seq) == (1, 1)
    assert waiting(engine) == 0
    row = row_of(engine)
    assert row is not None and (row.next_sequence, row.next_seq) == (4, 4)
    assert row.metadata == {"app": "ingest"}
    assert contents(engine, data_dir) == ["s #1", "s #2", "s #3"]
    queued(engine, numbered(4))
    assert contents(engine, data_dir) == ["s #1", "s #2", "s #3", "s #4"]
    assert anomalies(engine) == []


def test_redelivered_tasks_replay_and_other_appends_with_a_taken_number_are_dropped(
    engine: sa.Engine, data_dir: Path
) -> None:
    queued(engine, numbered(1))
    assert queued(engine, numbered(3)) == ordering.Held(3, expected=2)
    # a redelivery of the waiting 3: nothing new waits
    assert queued(engine, numbered(3)) == ordering.Held(3, expected=2)
    assert waiting(engine) == 1
    # another append claiming 3 while it waits: dropped, recorded
    other = queued(engine, numbered(3, key="other-3", content="intruder"))
    assert other == ordering.Held(3, expected=2, dropped=True)
    queued(engine, numbered(2))
    # a redelivery of an applied one replays (the same key): nothing written
    again = queued(engine, numbered(2))
    assert isinstance(again, journal.AppendResult) and again.replayed and again.first_seq == 2
    # another append with an applied number: dropped, recorded once per number
    for _ in range(2):
        late = queued(engine, numbered(1, key="other-1", content="intruder"))
        assert late == ordering.Held(1, expected=4, dropped=True)
    assert contents(engine, data_dir) == ["s #1", "s #2", "s #3"]
    found = anomalies(engine, "sequence_duplicate")
    assert [(a.key, a.count) for a in found] == [("3", 1), ("1", 2)]
    assert "'other-1'" in found[1].detail and "was dropped" in found[1].detail
    row = row_of(engine)
    assert row is not None and found[1].file_id == row.file_id


def test_http_and_the_queue_may_feed_one_session(engine: sa.Engine, data_dir: Path) -> None:
    """An HTTP append of the expected number lets the held ones follow; the same append sent
    both ways is written once."""
    queued(engine, numbered(2))
    queued(engine, numbered(3))
    journal.ingest(engine, numbered(1))
    assert waiting(engine) == 0
    queued(engine, numbered(5))
    with pytest.raises(errors.OutOfOrder) as ahead:  # HTTP never waits, even behind a held one
        journal.ingest(engine, numbered(5))
    assert ahead.value.expected == 4
    journal.ingest(engine, numbered(4))
    assert journal.ingest(engine, numbered(5)).replayed  # written from the queue: a replay
    assert contents(engine, data_dir) == [f"s #{n}" for n in range(1, 6)]
    assert waiting(engine) == 0 and anomalies(engine) == []


def test_same_key_different_body_while_waiting_is_a_conflict(engine: sa.Engine) -> None:
    queued(engine, numbered(2))
    with pytest.raises(errors.Conflict, match="idempotency_key 's/2'"):
        queued(engine, numbered(2, content="changed"))
    assert waiting(engine) == 1


# ---------------------------------------------------------------------------------------------
# gaps


def test_a_gap_is_let_go_after_the_wait_and_a_late_arrival_is_recorded(
    engine: sa.Engine, data_dir: Path
) -> None:
    """1–3 and 5–6 sent, 4 never: after the wait 5 and 6 follow 3, one sequence_gap names 4;
    then 4 comes: recorded as sequence_late, not appended."""
    for number in (1, 2, 3, 6, 5):
        queued(engine, numbered(number), wait=0.5)
    assert settle(engine, wait=60) == []  # not yet
    assert contents(engine, data_dir) == ["s #1", "s #2", "s #3"]
    age_waiting(engine, 0.6)
    row = row_of(engine)
    assert row is not None
    assert settle(engine, wait=0.5) == [row.file_id]
    assert contents(engine, data_dir) == ["s #1", "s #2", "s #3", "s #5", "s #6"]
    assert waiting(engine) == 0
    gaps = anomalies(engine, "sequence_gap")
    assert [(g.file_id, g.key, g.count) for g in gaps] == [(row.file_id, "4", 1)]
    assert gaps[0].detail.startswith("sequence 4 never arrived within order_wait_seconds (0.5 s)")
    assert "sequence 5 was applied after sequence 3" in gaps[0].detail

    late = queued(engine, numbered(4), wait=0.5)
    assert late == ordering.Held(4, expected=7, dropped=True)
    assert contents(engine, data_dir) == ["s #1", "s #2", "s #3", "s #5", "s #6"]
    recorded = anomalies(engine, "sequence_late")
    assert [(a.file_id, a.key) for a in recorded] == [(row.file_id, "4")]
    assert "'s/4'" in recorded[0].detail and "not appended" in recorded[0].detail
    assert len(anomalies(engine, "sequence_gap")) == 1
    queued(engine, numbered(7), wait=0.5)
    assert contents(engine, data_dir)[-1] == "s #7"


def test_a_gap_is_let_go_by_the_next_arrival_too(engine: sa.Engine, data_dir: Path) -> None:
    """No sweep needed while tasks keep coming: an arrival finds the oldest waiting one
    overdue. Two holes in a row are two gaps, each recorded."""
    queued(engine, numbered(1), wait=0.3)
    for number in (4, 6):
        queued(engine, numbered(number), wait=0.3)
    age_waiting(engine, 0.4)
    held = queued(engine, numbered(7), wait=0.3)
    row = row_of(engine)
    assert row is not None and held == ordering.Held(7, expected=2, kick=row.file_id)
    assert contents(engine, data_dir) == ["s #1", "s #4", "s #6", "s #7"]
    assert [g.key for g in anomalies(engine, "sequence_gap")] == ["2-3", "5"]


def test_a_session_whose_first_append_never_comes(engine: sa.Engine, data_dir: Path) -> None:
    for number in (3, 2):
        queued(engine, numbered(number, metadata={"from": str(number)}), wait=0.2)
    age_waiting(engine, 0.3)
    settle(engine, wait=0.2)
    row = row_of(engine)
    assert row is not None and row.metadata == {"from": "2"}  # the first append written
    assert contents(engine, data_dir) == ["s #2", "s #3"]
    gap = anomalies(engine, "sequence_gap")
    assert [(g.key, g.file_id) for g in gap] == [("1", row.file_id)]
    assert "sequence 2 was applied first" in gap[0].detail


# ---------------------------------------------------------------------------------------------
# HTTP's path: refused at once; sequences always or never


def test_out_of_order_is_refused_at_once_naming_the_expected_one(engine: sa.Engine) -> None:
    with pytest.raises(errors.OutOfOrder) as ahead:
        journal.ingest(engine, numbered(2))
    assert ahead.value.expected == 1 and ahead.value.status == 409
    assert "sequence 2 is ahead: this session expects sequence 1 next" in ahead.value.detail
    assert row_of(engine) is None and waiting(engine) == 0
    journal.ingest(engine, numbered(1))
    journal.ingest(engine, numbered(2))
    # a retry of 2 replays; another append numbered 2 is refused
    assert journal.ingest(engine, numbered(2)).replayed
    with pytest.raises(errors.OutOfOrder, match="sequence 2 of this session was already applied"):
        journal.ingest(engine, numbered(2, key="another"))
    with pytest.raises(errors.OutOfOrder) as behind:
        journal.ingest(engine, numbered(1, key="again"))
    assert behind.value.expected == 3
    assert row_of(engine).next_sequence == 3  # type: ignore[union-attr]


def test_a_session_uses_sequences_always_or_never(engine: sa.Engine) -> None:
    journal.ingest(engine, numbered(1, "numbered"))
    with pytest.raises(errors.InvalidInput, match=r"sequence is required.*expects sequence 2 next"):
        journal.ingest(engine, numbered(None, "numbered", key="plain"))
    journal.ingest(engine, numbered(None, "plain", key="p1"))
    with pytest.raises(errors.InvalidInput, match="has appends without a sequence"):
        journal.ingest(engine, numbered(1, "plain", key="p2"))
    with pytest.raises(errors.InvalidInput, match="has appends without a sequence"):
        queued(engine, numbered(5, "plain", key="p3"))
    # numbered appends waiting for a session's first: one without a number is refused too
    queued(engine, numbered(2, "waiting"))
    with pytest.raises(errors.InvalidInput, match="appends with a sequence wait"):
        journal.ingest(engine, numbered(None, "waiting", key="w"))
    assert row_of(engine, "waiting") is None


# ---------------------------------------------------------------------------------------------
# the service: Celery's entry point, the sweep, the backlog


class Recorder:
    def __init__(self) -> None:
        self.kicks: list[str] = []

    def flush(self, file_id: str) -> None:
        self.kicks.append(file_id)

    def refine(self, claim: refine.Claim) -> None:
        pass


def service(engine: sa.Engine, data_dir: Path, database_url: str, **settings: Any) -> Service:
    values = {"data_dir": data_dir, "database_url": database_url, **settings}
    return Service(Settings.load(environ={}, **values), engine, Recorder())


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
    engine: sa.Engine, data_dir: Path, database_url: str
) -> None:
    svc = service(engine, data_dir, database_url, order_wait_seconds=0.3, sweep_age=0)
    kicks = svc.queue.kicks  # type: ignore[union-attr]
    assert isinstance(svc.append_queued(body(2)), ordering.Held)
    assert kicks == []
    done = svc.append_queued(body(1))
    row = row_of(engine)
    assert row is not None and kicks == [row.file_id]
    assert done is not None and not isinstance(done, ordering.Held)
    assert done.result.first_seq == 1
    svc.append_queued(body(4))
    svc.append_queued({**body(5), "sequence": "five"})  # invalid: recorded, like any bad task
    assert svc.sweep() == [row.file_id] and waiting(engine) == 1  # the journal's kick
    age_waiting(engine, 0.4)
    kicks.clear()
    assert svc.sweep() == [row.file_id] and kicks == [row.file_id]
    assert waiting(engine) == 0
    assert contents(engine, data_dir) == ["#1", "#2", "#4"]
    assert [a.key for a in anomalies(engine, "sequence_gap")] == ["3"]
    rejected = anomalies(engine, "append_task_rejected")
    assert len(rejected) == 1 and "sequence: must be an integer from 1" in rejected[0].detail


def test_held_appends_wait_on_through_a_full_backlog(
    engine: sa.Engine, data_dir: Path, database_url: str
) -> None:
    """Past backlog_max_file_messages the held ones stay held (the arrival that let them go
    stands); once a flush made room, the sweep writes them."""
    svc = service(engine, data_dir, database_url, backlog_max_file_messages=2, sweep_age=0)
    for number in (3, 2):
        svc.append_queued(body(number))
    svc.append_queued(body(1))
    assert waiting(engine) == 1  # 1 and 2 written; 3 would pass the limit
    assert contents(engine, data_dir) == ["#1", "#2"]
    svc.sweep()
    assert contents(engine, data_dir) == ["#1", "#2", "#3"]
    assert waiting(engine) == 0
    # the same append as a held one, over HTTP once the backlog has room: written once
    for number in (6, 5, 4):
        svc.append_queued(body(number))
    assert waiting(engine) == 1  # 4 and 5 written; 6 would pass the limit
    assert contents(engine, data_dir) == ["#1", "#2", "#3", "#4", "#5"]
    assert svc.append(body(6)).result.first_seq == 6
    assert waiting(engine) == 0
    assert contents(engine, data_dir) == ["#1", "#2", "#3", "#4", "#5", "#6"]
    assert anomalies(engine) == []


# ---------------------------------------------------------------------------------------------
# concurrency: many writers, one order


def test_concurrent_writers_keep_the_senders_order(
    engine: sa.Engine, data_dir: Path, database_url: str
) -> None:
    """Eight threads on four engines (four group committers: as many transactions at once, as
    from four processes) take 200 numbered appends, a quarter of them twice, in a shuffled
    order: each is written once, in the sender's order."""
    engines = [database.create_engine(database_url) for _ in range(4)]
    count = 200
    rng = random.Random(13)
    tasks = [numbered(n) for n in range(1, count + 1)]
    tasks += rng.sample(tasks, count // 4)
    rng.shuffle(tasks)
    lock = threading.Lock()
    failures: list[BaseException] = []

    def worker(mine: sa.Engine) -> None:
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
    assert contents(engine, data_dir) == [f"s #{n}" for n in range(1, count + 1)]
    assert waiting(engine) == 0 and anomalies(engine) == []
    row = row_of(engine)
    assert row is not None and (row.next_sequence, row.flushed_seq) == (count + 1, count)
