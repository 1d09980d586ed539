"""Two stores must never share a broker database (docs/design.md §8): the first to start names
its deployment in Redis, and a worker, beat or API of another store refuses to start, saying
why, instead of taking the first one's tasks into its own index."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import celery
import harness
import httpx
import kombu as untyped_kombu
import pytest
import sqlalchemy as sa
from conftest import REDIS_URL

from pipeline import database, index, tables

kombu: Any = untyped_kombu  #: no type hints: its calls are Any


@pytest.mark.timeout(120)
def test_a_second_store_on_the_same_broker_refuses_to_start(
    production: tuple[harness.Procs, str, Any], tmp_path: Path
) -> None:
    procs, database_url, redis = production
    broker = ["--broker-url", REDIS_URL, "--log-level", "warning"]
    first = ["--data-dir", str(tmp_path / "first"), "--database-url", database_url]
    second = ["--data-dir", str(tmp_path / "second")]  # another store: its own SQLite index
    env = harness.clean_env(**harness.FAST, broker_claim_interval="3600")
    procs.run(["migrate", *first], env)
    procs.run(["migrate", *second], env)
    port = harness.free_port()
    api = procs.start("api-1", ["api", *first, *broker, "--port", str(port)], env)
    worker = procs.start("worker-1", ["worker", *first, *broker, "--pool", "solo"], env)
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
        harness.wait_healthy(client, api, timeout=60)
        deployment = client.get("/v1/health").json()["deployment"]
        harness.wait_worker(client, timeout=60, check=worker.check_alive)
    assert redis.get("sgme:deployment").decode() == deployment

    for name, args in (
        ("worker-2", ["worker", *second, *broker, "--pool", "solo"]),
        ("beat-2", ["beat", *second, *broker]),
        ("api-2", ["api", *second, *broker, "--port", str(harness.free_port())]),
    ):
        other = procs.start(name, args, env)
        other.popen.wait(60)
        assert other.popen.returncode == 2, other.tail()
        assert f"belongs to deployment {deployment}" in other.tail(), other.tail()
    assert worker.alive() and api.alive()  # the first store goes on


def _deployment(database_url: str) -> str:
    engine = database.create_engine(database_url)
    try:
        with engine.connect() as conn:
            return index.deployment_id(conn)
    finally:
        engine.dispose()


def _foreign_tasks(database_url: str) -> int:
    engine = database.create_engine(database_url)
    try:
        with engine.connect() as conn:
            query = sa.select(sa.func.coalesce(sa.func.sum(tables.anomalies.c.count), 0)).where(
                tables.anomalies.c.kind == tables.Kind.FOREIGN_TASK.value
            )
            return int(conn.execute(query).scalar_one())
    finally:
        engine.dispose()


def _files(base_url: str, agent_id: str) -> list[dict[str, Any]]:
    r = httpx.get(f"{base_url}/v1/files", params={"agent_id": agent_id, "limit": 1000}, timeout=10)
    assert r.status_code == 200, r.text
    found: list[dict[str, Any]] = r.json()["files"]
    return found


@pytest.mark.timeout(300)
def test_a_task_of_another_store_is_passed_on_to_it_never_dropped(
    production: tuple[harness.Procs, str, Any], tmp_path: Path
) -> None:
    """The race a wipe opens: store A runs, Redis is wiped, store B claims the database before
    A asserts it again. B's tasks that A's worker takes go to B's own queue, which B's
    workers read: every one lands in B, none in A."""
    procs, database_url, redis = production
    broker = ["--broker-url", REDIS_URL, "--log-level", "warning"]
    first = ["--data-dir", str(tmp_path / "first"), "--database-url", database_url]
    second_url = f"sqlite:///{tmp_path / 'second' / 'index.sqlite3'}"
    second = ["--data-dir", str(tmp_path / "second"), "--database-url", second_url]
    # A asserts its claim only at start here: the window a wipe opens stays open
    env = harness.clean_env(**harness.FAST, broker_claim_interval="3600")
    procs.run(["migrate", *first], env)
    procs.run(["migrate", *second], env)
    theirs = _deployment(second_url)
    port = harness.free_port()
    api = procs.start("api-a", ["api", *first, *broker, "--port", str(port)], env)
    worker = procs.start("worker-a", ["worker", *first, *broker, "--pool", "solo"], env)
    base = f"http://127.0.0.1:{port}"
    with httpx.Client(base_url=base, timeout=10) as client:
        harness.wait_healthy(client, api, timeout=60)
        harness.wait_worker(client, timeout=60, check=worker.check_alive)

    redis.flushdb()  # the wipe
    sender = celery.Celery("sender", broker=REDIS_URL, set_as_current=False)
    with kombu.Connection(REDIS_URL) as connection:  # closed after: the next test's Redis
        for n in range(40):
            body = {
                "agent_id": "b-agent",
                "session_key": f"s{n}",
                "idempotency_key": f"k{n}",
                "messages": [{"role": "user", "content": f"for store B {n}"}],
            }
            stamp = {"sgme_deployment": theirs}
            sender.send_task(
                "sgme.append", kwargs=body, queue="append", headers=stamp, connection=connection
            )
    sender.close()
    queue = f"sgme.deployment.{theirs}"
    # only A consumes now: it takes all 40, and passes each on to B's queue
    harness.wait_until(
        lambda: _foreign_tasks(database_url) == 40 and redis.llen(queue) == 40,
        timeout=60,
        what="A's worker to pass B's tasks on",
        check=worker.check_alive,
    )

    port_b = harness.free_port()
    procs.start("worker-b", ["worker", *second, *broker, "--pool", "solo"], env)
    api_b = procs.start("api-b", ["api", *second, *broker, "--port", str(port_b)], env)
    base_b = f"http://127.0.0.1:{port_b}"
    with httpx.Client(base_url=base_b, timeout=10) as client:
        harness.wait_healthy(client, api_b, timeout=60)

    def landed() -> bool:
        files = _files(base_b, "b-agent")
        return len(files) == 40 and all(f["flushed_seq"] == 1 for f in files)

    harness.wait_until(landed, timeout=120, what="B's workers to run its 40 tasks")
    assert sorted(f["session_key"] for f in _files(base_b, "b-agent")) == sorted(
        f"s{n}" for n in range(40)
    )
    assert _files(base, "b-agent") == []
    assert redis.llen(queue) == 0


@pytest.mark.timeout(180)
def test_a_wiped_broker_is_claimed_again_by_the_running_store(
    production: tuple[harness.Procs, str, Any], tmp_path: Path
) -> None:
    procs, database_url, redis = production
    broker = ["--broker-url", REDIS_URL, "--log-level", "warning"]
    first = ["--data-dir", str(tmp_path / "first"), "--database-url", database_url]
    second = ["--data-dir", str(tmp_path / "second")]
    env = harness.clean_env(**harness.FAST, broker_claim_interval="1")
    procs.run(["migrate", *first], env)
    procs.run(["migrate", *second], env)
    ours = _deployment(database_url)
    for name, args in (
        ("worker-1", ["worker", *first, *broker, "--pool", "solo"]),
        ("beat-1", ["beat", *first, *broker]),
        ("api-1", ["api", *first, *broker, "--port", str(harness.free_port())]),
    ):
        proc = procs.start(name, args, env)
        harness.wait_until(
            lambda: redis.get("sgme:deployment") == ours.encode(),
            timeout=60,
            what=f"{name} to claim the broker",
            check=proc.check_alive,
        )
        redis.flushdb()  # the wipe: the running process names its store again
        harness.wait_until(
            lambda: redis.get("sgme:deployment") == ours.encode(),
            timeout=15,
            what=f"{name} to claim the wiped broker again",
            check=proc.check_alive,
        )
        other = procs.start(f"{name}-other", ["worker", *second, *broker, "--pool", "solo"], env)
        other.popen.wait(60)
        assert other.popen.returncode == 2, other.tail()
        assert f"belongs to deployment {ours}" in other.tail(), other.tail()
        proc.stop()
