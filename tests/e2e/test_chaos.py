"""Chaos, end to end (docs/design.md §3, §8): the queue is not durable, so the journal and the index
must carry every acknowledged append through a wiped broker, a SIGKILLed worker and a
SIGKILLed embedded server.

While 2,000 messages over 50 sessions are being appended over HTTP:

- PostgreSQL + Redis: Redis is wiped once (``FLUSHDB`` of the tests' own database 15 — the
  issue's ``FLUSHALL``, scoped so that nothing but this test's data is touched), later the
  worker is SIGKILLed and a new one started. Lost flush kicks are re-sent by the sweeper,
  lost refine jobs come back when their lease runs out.
- Embedded (SQLite, in-memory broker): ``sgme serve`` is SIGKILLed and started again on the
  same data directory; clients retry with their idempotency keys meanwhile.

Everything runs with the shipped defaults (a one-minute lease, refinement after 20 new
messages or a minute of quiet): every file is refined within two minutes of the last fault.
Afterwards every acknowledged message is in its file exactly once and in order (compared with
the source_refs the API acknowledged), and the L1 items are exactly those of the content
sent. Skipped off CI when PostgreSQL or Redis is missing.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import harness
import httpx
import pytest
from conftest import REDIS_URL

SESSIONS = 50
MESSAGES = 2000
CLIENTS = 4
AFTER_FAULT = 120  #: seconds from the last fault by which every file must be refined


@pytest.mark.timeout(300)
def test_broker_wipe_and_worker_kill_lose_nothing(
    tmp_path: Path, production: tuple[harness.Procs, str, Any]
) -> None:
    procs, database_url, redis = production
    port = harness.free_port()
    env = harness.clean_env()  # the shipped defaults
    args = ["--data-dir", str(tmp_path / "data"), "--database-url", database_url]
    broker = ["--broker-url", REDIS_URL, "--log-level", "warning"]
    worker_args = ["worker", *args, *broker, "--pool", "threads", "--concurrency", "4"]
    procs.run(["migrate", *args], env)
    workers = [procs.start("worker-1", worker_args, env)]
    beat = procs.start("beat", ["beat", *args, *broker], env)
    api = procs.start("api", ["api", *args, *broker, "--port", str(port)], env)

    def alive() -> None:
        for proc in (workers[-1], beat, api):
            proc.check_alive()

    base_url = f"http://127.0.0.1:{port}"
    with httpx.Client(base_url=base_url, timeout=10) as client:
        harness.wait_healthy(client, api)
        harness.wait_worker(client, timeout=30, check=alive)
        sessions = harness.make_workload(sessions=SESSIONS, messages=MESSAGES, seed=3)
        load = harness.Load(base_url, sessions, clients=CLIENTS, seed=3)
        load.start(timeout=60)

        harness.wait_until(
            lambda: load.acked_messages >= MESSAGES // 3 or load.errors,
            timeout=60,
            what="a third of the workload",
            check=alive,
        )
        redis.flushdb()  # queued kicks and refine jobs, unacked deliveries: all gone

        harness.wait_until(
            lambda: load.acked_messages >= 2 * MESSAGES // 3 or load.errors,
            timeout=60,
            what="two thirds of the workload",
            check=alive,
        )
        workers[0].kill()  # whatever it had reserved or was running is lost with it
        fault = time.monotonic()
        workers.append(procs.start("worker-2", worker_args, env))

        load.join()
        assert load.acked_messages == MESSAGES
        left = AFTER_FAULT - (time.monotonic() - fault)
        harness.wait_settled(client, sessions, timeout=left, check=alive)
        harness.check_all(client, sessions)

    for proc in (api, beat, workers[-1]):
        proc.stop()
    assert '"ok": true' in procs.run(["fsck", "--json", *args], env)


@pytest.mark.timeout(300)
def test_embedded_serve_killed_and_restarted(tmp_path: Path, procs: harness.Procs) -> None:
    port = harness.free_port()
    env = harness.clean_env()  # the shipped defaults
    args = ["--data-dir", str(tmp_path / "data")]
    serve_args = ["serve", *args, "--port", str(port), "--log-level", "warning"]
    servers = [procs.start("serve-1", serve_args, env)]
    base_url = f"http://127.0.0.1:{port}"
    with httpx.Client(base_url=base_url, timeout=10) as client:
        harness.wait_healthy(client, servers[0])
        sessions = harness.make_workload(sessions=SESSIONS, messages=MESSAGES, seed=4)
        load = harness.Load(base_url, sessions, clients=CLIENTS, seed=4)
        load.start(timeout=60)

        harness.wait_until(
            lambda: load.acked_messages >= MESSAGES // 2 or load.errors,
            timeout=60,
            what="half of the workload",
            check=servers[0].check_alive,
        )
        # Mid-request for some clients, mid-flush or mid-refine for the worker threads; the
        # clients retry with the same idempotency keys until the new server answers.
        servers[0].kill()
        fault = time.monotonic()
        servers.append(procs.start("serve-2", serve_args, env))
        harness.wait_healthy(client, servers[1])

        load.join()
        assert load.acked_messages == MESSAGES
        left = AFTER_FAULT - (time.monotonic() - fault)
        harness.wait_settled(client, sessions, timeout=left, check=servers[1].check_alive)
        harness.check_all(client, sessions)

    servers[1].stop()
    assert servers[1].popen.returncode == 0, servers[1].tail()
    assert '"ok": true' in procs.run(["fsck", "--json", *args], env)
