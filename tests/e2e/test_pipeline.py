"""End to end, with real processes and a real Celery worker: 2,000 messages over 50 sessions
are appended over HTTP by concurrent clients; then every file must hold each acknowledged
message exactly once, in order, byte for byte, and be refined into exactly the L1 items the
builtin refiner finds in what was sent, each source_ref resolving through ``/v1/refs``.

Twice: embedded (``sgme serve``: SQLite, in-memory broker, in-process worker and beat) and
production-shaped (``sgme migrate``, ``sgme worker --pool threads``, ``sgme beat`` and
``sgme api`` on PostgreSQL and Redis — skipped off CI when either is missing).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import harness
import httpx
from conftest import REDIS_URL

SESSIONS = 50
MESSAGES = 2000
CLIENTS = 4


def run_workload(base_url: str, *, seed: int) -> list[harness.Session]:
    sessions = harness.make_workload(sessions=SESSIONS, messages=MESSAGES, seed=seed)
    load = harness.Load(base_url, sessions, clients=CLIENTS, seed=seed)
    load.start(timeout=90)
    load.join()
    assert load.acked_messages == MESSAGES
    assert load.retries == 0, "an append failed although nothing was broken"
    return sessions


def test_embedded_serve(tmp_path: Path, procs: harness.Procs) -> None:
    data = tmp_path / "data"
    port = harness.free_port()
    env = harness.clean_env(**harness.FAST)
    args = ["--data-dir", str(data)]
    serve = procs.start(
        "serve", ["serve", *args, "--port", str(port), "--log-level", "warning"], env
    )
    base_url = f"http://127.0.0.1:{port}"
    with httpx.Client(base_url=base_url, timeout=10) as client:
        harness.wait_healthy(client, serve)
        sessions = run_workload(base_url, seed=1)
        harness.wait_settled(client, sessions, timeout=90, check=serve.check_alive)
        items = harness.check_all(client, sessions)
    assert items > MESSAGES // 4  # the workload is mostly made of things worth keeping

    serve.stop()
    assert serve.popen.returncode == 0, serve.tail()
    assert '"ok": true' in procs.run(["fsck", "--json", *args], env)


def test_postgres_redis_worker_beat_api(
    tmp_path: Path, production: tuple[harness.Procs, str, Any]
) -> None:
    procs, database_url, _redis = production
    port = harness.free_port()
    env = harness.clean_env(**harness.FAST)
    args = ["--data-dir", str(tmp_path / "data"), "--database-url", database_url]
    broker = ["--broker-url", REDIS_URL, "--log-level", "warning"]
    # `sgme api` and the worker do not migrate: the deployment runs `sgme migrate` first
    procs.run(["migrate", *args], env)
    worker = procs.start(
        "worker", ["worker", *args, *broker, "--pool", "threads", "--concurrency", "4"], env
    )
    beat = procs.start("beat", ["beat", *args, *broker], env)
    api = procs.start("api", ["api", *args, *broker, "--port", str(port)], env)

    def alive() -> None:
        for proc in (worker, beat, api):
            proc.check_alive()

    base_url = f"http://127.0.0.1:{port}"
    with httpx.Client(base_url=base_url, timeout=10) as client:
        harness.wait_healthy(client, api)
        harness.wait_worker(client, timeout=30, check=alive)
        sessions = run_workload(base_url, seed=2)
        harness.wait_settled(client, sessions, timeout=90, check=alive)
        items = harness.check_all(client, sessions)
    assert items > MESSAGES // 4

    for proc in (api, beat, worker):
        proc.stop()
    assert '"ok": true' in procs.run(["fsck", "--json", *args], env)
