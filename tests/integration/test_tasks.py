"""The Celery tasks through a real (in-process, threaded) worker on the in-memory broker, on
SQLite and PostgreSQL: the ``sgme.append`` path for ingestion services, and refinement
retries ending in success or in ``error`` without holding up other files."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helpers
import kombu as untyped_kombu
import pytest
from celery import Celery
from conftest import REDIS_URL, unavailable

from pipeline import anomalies, database, errors, index, l1, reader, refine, tables
from pipeline.runtime import Runtime
from pipeline.service import Service
from pipeline.settings import Settings
from workers import app as worker_app
from workers import embedded

kombu: Any = untyped_kombu  #: no type hints: its calls are Any

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
        return [refine.Item("fact", p.content, (window.source_ref(p),)) for p in window.parts]


wait_for = helpers.wait_for


@pytest.fixture
def runtime(database_url: str, data_dir: Path) -> Iterator[Runtime]:
    FAILURES.clear()
    CALLS.clear()
    settings = Settings.load(
        environ={},
        data_dir=data_dir,
        database_url=database_url,
        broker_url="memory://",
        refiner=f"{__name__}:FlakyRefiner",
        refine_min_messages=1,
        refine_idle_seconds=0,
        refine_retry_backoff=1,
        refine_max_retries=3,
        refine_dispatch_interval=0.5,
        sweep_interval=0.5,
        sweep_age=0.5,
    )
    runtime = Runtime(settings, database.Database.from_url(database_url))
    yield runtime
    runtime.close()


@pytest.fixture
def running(runtime: Runtime, data_dir: Path) -> Iterator[tuple[Celery, Service]]:
    """A Celery app with an in-process worker running, and the service its tasks call."""
    app, service = worker_app.create(runtime)
    runner = embedded.Embedded(app, queues=worker_app.QUEUES, data_dir=data_dir, concurrency=2)
    runner.start()
    try:
        yield app, service
    finally:
        runner.stop()


@pytest.fixture
def app(running: tuple[Celery, Service]) -> Celery:
    return running[0]


@pytest.fixture
def worker(app: Celery, runtime: Runtime) -> database.Database:
    """The index the worker of ``app`` writes to."""
    return runtime.db


def _row(db: database.Database, key: str) -> tables.FileRow | None:
    with db.transaction() as conn:
        return index.find_file(conn, "hermes", "session", key)


def _anomalies(db: database.Database, kind: str) -> list[tables.Anomaly]:
    with db.transaction() as conn:
        return anomalies.listed(conn, kinds=[kind])


def _body(key: str, *contents: str, idempotency_key: str | None = "k") -> dict[str, Any]:
    body: dict[str, Any] = {
        "agent_id": "hermes",
        "session_key": key,
        "messages": [{"role": "user", "content": c} for c in contents],
    }
    if idempotency_key is not None:
        body["idempotency_key"] = f"{key}-{idempotency_key}"
    return body


def test_append_task_ingests_flushes_and_refines_once(
    app: Celery, worker: database.Database, data_dir: Path
) -> None:
    body = _body("celery", "one", "two")
    for _ in range(3):  # a redelivered task carries the same idempotency key
        app.send_task("sgme.append", kwargs=body, queue="append")

    def refined() -> bool:
        row = _row(worker, "celery")
        return row is not None and row.status == "refined" and row.last_refined_seq == 2

    wait_for(refined)
    row = _row(worker, "celery")
    assert row is not None and (row.flushed_seq, row.next_seq) == (2, 3)
    assert [m.content for m in reader.messages(worker, data_dir, row.file_id)] == ["one", "two"]
    with worker.transaction() as conn:
        items = l1.list_items(conn, file_id=row.file_id)
    assert [i.content for i in items] == ["one", "two"]


def test_invalid_append_tasks_land_in_anomalies(app: Celery, worker: database.Database) -> None:
    app.send_task("sgme.append", kwargs=_body("nokey", "x", idempotency_key=None), queue="append")
    bad_role = _body("badrole", "x")
    bad_role["messages"][0]["role"] = "bot"
    app.send_task("sgme.append", kwargs=bad_role, queue="append")

    wait_for(lambda: len(_anomalies(worker, "append_task_rejected")) == 2)
    details = sorted(a.detail for a in _anomalies(worker, "append_task_rejected"))
    assert "session_key='badrole'" in details[0] and "messages[0].role: must be" in details[0]
    assert "session_key='nokey'" in details[1] and "idempotency_key is required" in details[1]
    assert _row(worker, "nokey") is None and _row(worker, "badrole") is None


def test_a_task_of_another_deployment_is_passed_on_and_recorded(
    app: Celery, worker: database.Database, runtime: Runtime
) -> None:
    """Two stores that share a broker database must not write into each other's index: a
    task stamped with another deployment is not run but passed on, whole, to that
    deployment's own queue; ours and unstamped ones are run."""
    ours = {"sgme_deployment": runtime.deployment}
    theirs = {"sgme_deployment": "0b6c3e6e-5d1f-4f1e-9a65-3b1c2d4e5f60"}
    for _ in range(2):
        app.send_task("sgme.append", kwargs=_body("theirs", "x"), queue="append", headers=theirs)
    app.send_task("sgme.flush", args=["f"], queue="append", headers=theirs)
    app.send_task("sgme.append", kwargs=_body("ours", "y"), queue="append", headers=ours)
    app.send_task("sgme.append", kwargs=_body("unstamped", "z"), queue="append")

    wait_for(lambda: _row(worker, "ours") and _row(worker, "unstamped"))
    wait_for(lambda: sum(a.count for a in _anomalies(worker, "foreign_task")) == 3)
    found = _anomalies(worker, "foreign_task")
    assert sorted((a.key.split(":")[1], a.count) for a in found) == [
        ("sgme.append", 2),
        ("sgme.flush", 1),
    ]
    assert runtime.deployment in found[0].detail and theirs["sgme_deployment"] in found[0].detail
    assert _row(worker, "theirs") is None
    passed = []
    with app.connection_for_read() as connection:
        queue = connection.SimpleQueue(f"sgme.deployment.{theirs['sgme_deployment']}")
        for _ in range(3):
            message = queue.get(timeout=10)
            body_args, body_kwargs, _ = message.decode()
            headers = message.headers
            passed.append((headers["task"], headers["sgme_deployment"], body_args, body_kwargs))
            message.ack()
        queue.close()
    assert sorted(passed, key=str) == sorted(
        [
            ("sgme.append", theirs["sgme_deployment"], [], _body("theirs", "x")),
            ("sgme.append", theirs["sgme_deployment"], [], _body("theirs", "x")),
            ("sgme.flush", theirs["sgme_deployment"], ["f"], {}),
        ],
        key=str,
    )


def test_refiner_failing_twice_then_succeeding_refines(
    app: Celery, worker: database.Database
) -> None:
    FAILURES["flaky"] = 2
    app.tasks["sgme.append"].delay(**_body("flaky", "a", "b"))

    def refined() -> bool:
        row = _row(worker, "flaky")
        return row is not None and row.status == "refined"

    wait_for(refined)
    assert CALLS["flaky"] == 3
    assert _anomalies(worker, "refine_failed") == []


def test_refiner_always_failing_ends_in_error_and_others_go_on(
    app: Celery, worker: database.Database
) -> None:
    FAILURES["down"] = -1
    app.tasks["sgme.append"].delay(**_body("down", "a"))
    app.tasks["sgme.append"].delay(**_body("fine", "b"))

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


def test_only_transient_errors_are_retried(
    running: tuple[Celery, Service], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Retries hang off the error class: a bug runs once, a busy database is retried (with
    backoff and jitter, as many times as the settings allow)."""
    app, service = running
    flush = app.tasks["sgme.flush"]
    assert flush.autoretry_for == (errors.TransientError,)
    assert flush.retry_jitter is True
    assert flush.max_retries == service.settings.flush_max_retries
    segment = app.tasks["sgme.refine_segment"]
    assert segment.max_retries == service.settings.refine.max_retries == 3
    assert segment.acks_late is True and segment.reject_on_worker_lost is True
    calls = {"bug": 0, "busy": 0}

    def flaky_flush(file_id: str) -> None:
        calls[file_id] += 1
        if file_id == "bug":
            raise errors.InternalError("a typo'd column")
        if calls[file_id] <= 2:
            raise errors.IndexUnavailable("database is locked")

    monkeypatch.setattr(service, "wait_flushed", flaky_flush)
    flush.delay("bug")
    flush.delay("busy")
    wait_for(lambda: calls["busy"] == 3)
    assert calls["bug"] == 1


def test_a_late_ack_on_a_channel_whose_broker_connection_closed_is_a_connection_error() -> None:
    """A task that finishes after Redis went away is acknowledged on a channel whose
    connection was closed: kombu builds a pool from the transport's client, which the close
    set to None. That is a connection error (Celery logs the lost acknowledgement and goes on),
    not an AttributeError that ends the worker (tests/e2e/test_faults.py)."""
    connection = kombu.Connection(REDIS_URL)
    try:
        channel = connection.channel()
    except connection.connection_errors as exc:
        unavailable(f"Redis is not reachable at {REDIS_URL}: {exc}")
    errors_ = connection.connection_errors
    queue = kombu.Queue(f"sgme-late-ack-{id(channel)}", channel=channel, auto_delete=True)
    queue.declare()
    kombu.Producer(channel).publish({"task": 1}, routing_key=queue.name)
    message = queue.get(no_ack=False)
    assert message is not None
    channel._pool = None
    connection.transport.client = None  # as the consumer's close after a broker loss leaves it
    with pytest.raises(worker_app.ChannelGone) as raised:
        message.ack()
    assert isinstance(raised.value, errors_)
    channel.close()  # and its close does not raise either
