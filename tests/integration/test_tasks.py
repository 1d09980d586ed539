"""The Celery tasks through a real (in-process, threaded) worker on the in-memory broker, on
SQLite and PostgreSQL: the ``sgme.append`` path for ingestion services, and refinement
retries ending in success or in ``error`` without holding up other files."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from pipeline import index, raw, refine
from pipeline.settings import Settings
from workers import app as worker_app
from workers import embedded, tasks

#: per session_key, how many times FlakyRefiner fails before it succeeds (-1: always)
FAILURES: dict[str, int] = {}
CALLS: dict[str, int] = {}


class FlakyRefiner:
    """Fails the first N calls for a session, then extracts one item per message."""

    name = "flaky"

    def refine(self, window: refine.Window) -> list[refine.Item]:
        key = window.session_key
        CALLS[key] = CALLS.get(key, 0) + 1
        budget = FAILURES.get(key, 0)
        if budget < 0 or CALLS[key] <= budget:
            raise RuntimeError(f"refiner down for {key} (call {CALLS[key]})")
        return [refine.Item("fact", p.content, (p.source_ref,)) for p in window.parts]


def wait_for(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


@pytest.fixture
def worker(database_url: str, data_dir: Path) -> Iterator[sa.Engine]:
    FAILURES.clear()
    CALLS.clear()
    settings = Settings(
        data_dir=data_dir,
        database_url=database_url,
        broker_url="memory://",
        refiner=f"{__name__}:FlakyRefiner",
        refine_min_messages=1,
        refine_idle_seconds=0,
        refine_retry_backoff=0.05,
        refine_max_retries=3,
        refine_dispatch_interval=0.5,
        sweep_interval=0.5,
        sweep_age=0.5,
    )
    worker_app.configure(settings)
    engine = worker_app.runtime().engine
    runner = embedded.Embedded(data_dir=data_dir, concurrency=2)
    runner.start()
    try:
        yield engine
    finally:
        runner.stop()
        engine.dispose()


def _row(engine: sa.Engine, key: str) -> index.FileRow | None:
    with index.transaction(engine) as conn:
        return index.find_file(conn, "hermes", "session", key, for_update=False)


def _anomalies(engine: sa.Engine, kind: str) -> list[index.Anomaly]:
    with index.transaction(engine) as conn:
        return index.list_anomalies(conn, kinds=[kind])


def _body(key: str, *contents: str, idempotency_key: str | None = "k") -> dict[str, Any]:
    body: dict[str, Any] = {
        "agent_id": "hermes",
        "session_key": key,
        "messages": [{"role": "user", "content": c} for c in contents],
    }
    if idempotency_key is not None:
        body["idempotency_key"] = f"{key}-{idempotency_key}"
    return body


def test_append_task_ingests_flushes_and_refines_once(worker: sa.Engine, data_dir: Path) -> None:
    body = _body("celery", "one", "two")
    for _ in range(3):  # a redelivered task carries the same idempotency key
        worker_app.app.send_task("sgme.append", kwargs=body, queue="append")

    def refined() -> bool:
        row = _row(worker, "celery")
        return row is not None and row.status == "refined" and row.last_refined_seq == 2

    wait_for(refined)
    row = _row(worker, "celery")
    assert row is not None and (row.flushed_seq, row.next_seq) == (2, 3)
    assert [m.content for m in raw.messages(worker, data_dir, row.file_id)] == ["one", "two"]
    with index.transaction(worker) as conn:
        items = index.list_l1_items(conn, file_id=row.file_id)
    assert [i.content for i in items] == ["one", "two"]


def test_invalid_append_tasks_land_in_anomalies(worker: sa.Engine) -> None:
    worker_app.app.send_task(
        "sgme.append", kwargs=_body("nokey", "x", idempotency_key=None), queue="append"
    )
    bad_role = _body("badrole", "x")
    bad_role["messages"][0]["role"] = "bot"
    worker_app.app.send_task("sgme.append", kwargs=bad_role, queue="append")

    wait_for(lambda: len(_anomalies(worker, "append_task_rejected")) == 2)
    details = sorted(a.detail for a in _anomalies(worker, "append_task_rejected"))
    assert "session_key='badrole'" in details[0] and "role must be one of" in details[0]
    assert "session_key='nokey'" in details[1] and "idempotency_key is required" in details[1]
    assert _row(worker, "nokey") is None and _row(worker, "badrole") is None


def test_refiner_failing_twice_then_succeeding_refines(worker: sa.Engine) -> None:
    FAILURES["flaky"] = 2
    tasks.append.delay(**_body("flaky", "a", "b"))

    def refined() -> bool:
        row = _row(worker, "flaky")
        return row is not None and row.status == "refined"

    wait_for(refined)
    assert CALLS["flaky"] == 3
    assert _anomalies(worker, "refine_failed") == []


def test_refiner_always_failing_ends_in_error_and_others_go_on(worker: sa.Engine) -> None:
    FAILURES["down"] = -1
    tasks.append.delay(**_body("down", "a"))
    tasks.append.delay(**_body("fine", "b"))

    def settled() -> bool:
        down, fine = _row(worker, "down"), _row(worker, "fine")
        return (
            down is not None
            and down.status == "error"
            and fine is not None
            and fine.status == "refined"
        )

    wait_for(settled)
    assert CALLS["down"] == 4  # the first try and refine_max_retries = 3 retries
    failed = _anomalies(worker, "refine_failed")
    down = _row(worker, "down")
    assert down is not None and [a.file_id for a in failed] == [down.file_id]
    assert "refiner down for down" in failed[0].detail
    assert down.last_refined_seq == 0 and down.refine_lease_until is None
