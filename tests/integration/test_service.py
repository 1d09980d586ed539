"""The use cases (:class:`pipeline.service.Service`), as the tasks, the API and the command call
them: what each one writes, enqueues and answers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import helpers
import pytest

from pipeline import anomalies, database, errors, index, validation
from pipeline.clock import ManualClock
from pipeline.service import Appended, Service
from pipeline.settings import Refine, Settings


def _body(key: str, *contents: str, **extra: Any) -> dict[str, Any]:
    messages = [{"role": "user", "content": c} for c in contents or ("hello",)]
    return {"agent_id": "hermes", "session_key": key, "messages": messages, **extra}


@pytest.fixture
def queue() -> helpers.RecordingQueue:
    return helpers.RecordingQueue()


@pytest.fixture
def service(
    db: database.Database, data_dir: Path, database_url: str, queue: helpers.RecordingQueue
) -> Service:
    settings = Settings(
        data_dir=data_dir,
        database_url=database_url,
        refine=Refine(min_messages=2, idle_seconds=60),
    )
    return helpers.service(db, settings, queue)


def test_an_append_kicks_once_until_its_file_is_flushed(
    service: Service, queue: helpers.RecordingQueue
) -> None:
    first = helpers.append(service, _body("s", "one")).result
    helpers.append(service, _body("s", "two"))
    assert queue.kicks == [first.file_id]  # coalesced: one flush writes both
    flushed = service.flush(first.file_id)
    assert (flushed.messages, flushed.flushed_seq) == (2, 2)
    # two messages wait for refinement: due by count, so the flush claimed and submitted it
    assert [(c.file_id, c.lo, c.hi) for c in queue.claims] == [(first.file_id, 0, 2)]


def test_an_append_to_a_known_session_locks_in_its_files_order(
    service: Service, db: database.Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On PostgreSQL its piece of the group goes with the session's file as its key (the
    order of the row locks, pipeline.database.commits); a session not known yet goes without
    one. The same for appends that arrive together and for queued ones. SQLite takes no row
    locks: nothing is remembered, no piece has a key."""
    seen: list[str | None] = []
    run, run_many = db.group.run, db.group.run_many

    def run_keyed(work: Any, *, durable: bool = True, key: str | None = None) -> Any:
        seen.append(key)
        return run(work, durable=durable, key=key)

    def run_many_keyed(works: Any, *, durable: bool = True, keys: Any = None) -> Any:
        seen.extend(keys or [None] * len(works))
        return run_many(works, durable=durable, keys=keys)

    monkeypatch.setattr(db.group, "run", run_keyed)
    monkeypatch.setattr(db.group, "run_many", run_many_keyed)
    first = helpers.append(service, _body("s", "one")).result
    helpers.append(service, _body("s", "two"))
    limits = service.settings.limits
    bodies = [validation.parse_append(_body(k, "three"), limits) for k in "st"]
    answers = service.append_many(bodies)
    queued = service.append_queued(_body("s", "four", idempotency_key="k4"))
    assert isinstance(queued, Appended)
    other = answers[1]
    assert isinstance(other, Appended)
    assert other.result.file_id != first.file_id
    # the two that arrived together are one piece (pipeline.batches), whose key is the
    # first of its known files' (it locks its rows in file order)
    if db.postgres:
        assert seen == [None, first.file_id, first.file_id, first.file_id]
        assert service.known.key(bodies[1]) == other.result.file_id
    else:
        assert seen == [None, None, None, None]
        assert service.known.key(bodies[1]) is None


def test_a_task_body_without_a_key_is_recorded_and_dropped(
    service: Service, db: database.Database
) -> None:
    assert service.append_queued(_body("s")) is None
    with db.reading() as conn:
        found = anomalies.listed(conn)
        assert index.find_file(conn, "hermes", "session", "s") is None
    assert [(a.kind, a.file_id) for a in found] == [("append_task_rejected", None)]
    assert "idempotency_key is required" in found[0].detail


def test_the_sweep_kicks_only_rows_older_than_its_age(
    service: Service, queue: helpers.RecordingQueue, clock: ManualClock
) -> None:
    queue.broken = True  # the kicks at ingest are lost
    file_id = helpers.append(service, _body("s")).result.file_id
    queue.broken = False
    assert service.sweep(age=3) == []  # acknowledged just now
    clock.advance(3)
    assert service.sweep(age=3) == [file_id]
    assert queue.kicks == [file_id]


def test_refine_now_runs_every_segment_in_this_process(
    service: Service, queue: helpers.RecordingQueue
) -> None:
    file_id = helpers.append(service, _body("s", "I prefer green tea."), wait=True).result.file_id
    assert service.refine_now(file_id) == 1
    assert service.refine_now(file_id) == 0  # nothing left
    items = service.l1_items(file_id=file_id)
    assert [json.loads(item.source_refs) for item in items] == [[f"{file_id}:1"]]
    assert queue.claims == []  # nothing was sent to the workers


def test_restore_of_a_live_file_is_a_conflict(service: Service) -> None:
    file_id = helpers.append(service, _body("s"), wait=True).result.file_id
    with pytest.raises(errors.Conflict, match="not archived"):
        service.upkeep.restore(file_id)


def test_health_counts_what_waits_for_its_file(service: Service) -> None:
    assert service.health()["journal_backlog"] == {"rows": 0, "messages": 0, "bytes": 0}
    file_id = helpers.append(service, _body("s", "one", "two")).result.file_id
    health = service.health()
    assert (health["status"], health["index"], health["data_dir"]) == ("ok", "ok", "ok")
    assert health["journal_backlog"]["messages"] == 2
    service.flush(file_id)
    assert service.health()["journal_backlog"]["messages"] == 0
