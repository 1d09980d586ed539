"""Servers failing under load (issue: hardening), with the production topology — ``sgme api``,
``sgme worker`` and ``sgme beat`` on PostgreSQL and Redis of the test's own:

- PostgreSQL restarted while appends arrive: requests during the outage are refused with 503
  (never a false 2xx, never a 500), and afterwards every acknowledged source_ref resolves to
  its message, once;
- Redis stopped for 30 s: appends go on being acknowledged (the journal is the truth), and
  once Redis is back flushes and refinement catch up; nothing lost, nothing doubled.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import harness
import httpx
import pytest
import services
from conftest import scratch_database

SESSIONS = 20
MESSAGES = 600


@contextlib.contextmanager
def topology(
    procs: harness.Procs, tmp_path: Path, database_url: str, broker_url: str
) -> Iterator[tuple[httpx.Client, str, list[Any]]]:
    """api + worker + beat; the client, the API's URL and the processes."""
    env = harness.clean_env(**harness.FAST)
    args = ["--data-dir", str(tmp_path / "data"), "--database-url", database_url]
    broker = ["--broker-url", broker_url, "--log-level", "warning"]
    procs.run(["migrate", *args], env)
    port = harness.free_port()
    worker = procs.start(
        "worker", ["worker", *args, *broker, "--pool", "threads", "--concurrency", "4"], env
    )
    beat = procs.start("beat", ["beat", *args, *broker], env)
    api = procs.start("api", ["api", *args, *broker, "--port", str(port)], env)
    base_url = f"http://127.0.0.1:{port}"
    with httpx.Client(base_url=base_url, timeout=10) as client:
        harness.wait_healthy(client, api)
        yield client, base_url, [api, worker, beat]
    for proc in (api, beat, worker):
        proc.stop()
    assert '"ok": true' in procs.run(["fsck", "--json", *args], env)


def alive(processes: list[Any]) -> Any:
    def check() -> None:
        for proc in processes:
            proc.check_alive()

    return check


@pytest.mark.timeout(240)
def test_postgres_restarted_under_load(procs: harness.Procs, tmp_path: Path) -> None:
    with (
        services.private_postgres() as postgres,
        services.private_redis() as redis,
        topology(procs, tmp_path, postgres.url, redis.url) as (client, url, processes),
    ):
        check = alive(processes)
        harness.wait_worker(client, timeout=30, check=check)
        sessions = harness.make_workload(sessions=SESSIONS, messages=MESSAGES, seed=11)
        load = harness.Load(url, sessions, clients=4, seed=11)
        load.start(timeout=150)
        harness.wait_until(
            lambda: load.acked_messages >= MESSAGES // 3 or load.errors,
            timeout=60,
            what="a third of the workload",
            check=check,
        )
        postgres.stop()
        before = sum(n for status, n in load.statuses.items() if status >= 500)
        harness.wait_until(
            lambda: sum(n for s, n in load.statuses.items() if s >= 500) > before + 10,
            timeout=30,
            what="requests refused during the outage",
            check=check,
        )
        postgres.start()

        load.join()
        assert load.acked_messages == MESSAGES
        refused = {s: n for s, n in load.statuses.items() if s >= 500}
        assert set(refused) == {503}, load.statuses  # never a 500, never a false 2xx
        harness.wait_settled(client, sessions, timeout=90, check=check)
        harness.check_all(client, sessions)  # every acknowledged source_ref, once, in order


@pytest.mark.timeout(240)
def test_redis_stopped_for_30_seconds(procs: harness.Procs, tmp_path: Path) -> None:
    with (
        scratch_database("sgme_faults") as database_url,
        services.private_redis() as redis,
        topology(procs, tmp_path, database_url, redis.url) as (client, url, processes),
    ):
        check = alive(processes)
        harness.wait_worker(client, timeout=30, check=check)
        sessions = harness.make_workload(sessions=SESSIONS, messages=MESSAGES, seed=12)
        load = harness.Load(url, sessions, clients=4, seed=12)
        load.start(timeout=150)
        harness.wait_until(
            lambda: load.acked_messages >= MESSAGES // 4 or load.errors,
            timeout=60,
            what="a quarter of the workload",
            check=check,
        )
        redis.stop()
        stopped = time.monotonic()
        at_stop = load.acked_messages
        harness.wait_until(
            # on a fast machine the load can near its end while Redis stops: then the rest
            lambda: load.acked_messages >= min(at_stop + MESSAGES // 4, MESSAGES) or load.errors,
            timeout=25,
            what="appends acknowledged while Redis is down",
            check=check,
        )
        harness.wait_until(
            lambda: time.monotonic() - stopped >= 30, timeout=35, what="30 s of outage"
        )
        redis.start()  # empty: every queued kick and job was lost with it

        load.join()
        assert load.acked_messages == MESSAGES
        assert not {s for s in load.statuses if s >= 500}, load.statuses
        harness.wait_settled(client, sessions, timeout=90, check=check)
        harness.check_all(client, sessions)
