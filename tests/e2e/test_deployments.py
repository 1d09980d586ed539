"""Two stores must never share a broker database (docs/design.md §8): the first to start names
its deployment in Redis, and a worker, beat or API of another store refuses to start, saying
why, instead of taking the first one's tasks into its own index."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import harness
import httpx
import pytest
from conftest import REDIS_URL


@pytest.mark.timeout(120)
def test_a_second_store_on_the_same_broker_refuses_to_start(
    production: tuple[harness.Procs, str, Any], tmp_path: Path
) -> None:
    procs, database_url, redis = production
    broker = ["--broker-url", REDIS_URL, "--log-level", "warning"]
    first = ["--data-dir", str(tmp_path / "first"), "--database-url", database_url]
    second = ["--data-dir", str(tmp_path / "second")]  # another store: its own SQLite index
    env = harness.clean_env(**harness.FAST)
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
