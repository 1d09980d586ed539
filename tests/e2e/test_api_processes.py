"""``sgme api --workers 2`` (docs/design.md §8): two API processes on one port, a Celery worker and
PostgreSQL + Redis; client threads append to the same three sessions at once, each append
landing in whichever process accepted its connection. Afterwards every acknowledged message is
in its file exactly once, at the seq it was given, each writer's messages in its own order and
each append in one piece; both processes answered; and fsck is clean."""

from __future__ import annotations

import random
import re
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import harness
import httpx
from conftest import REDIS_URL

WRITERS = 8
APPENDS = 40  #: per writer
SESSIONS = ("one", "two", "three")
CONTENT = re.compile(r"w(\d+) a(\d+) (\d+)/(\d+)")


def test_two_api_processes_share_sessions(
    tmp_path: Path, production: tuple[harness.Procs, str, Any]
) -> None:
    procs, database_url, _redis = production
    port = harness.free_port()
    env = harness.clean_env(**harness.FAST)
    args = ["--data-dir", str(tmp_path / "data"), "--database-url", database_url]
    broker = ["--broker-url", REDIS_URL, "--log-level", "warning"]
    procs.run(["migrate", *args], env)
    worker = procs.start(
        "worker", ["worker", *args, *broker, "--pool", "threads", "--concurrency", "4"], env
    )
    api = procs.start("api", ["api", *args, *broker, "--port", str(port), "--workers", "2"], env)

    def alive() -> None:
        for proc in (worker, api):
            proc.check_alive()

    base_url = f"http://127.0.0.1:{port}"
    with httpx.Client(base_url=base_url, timeout=10) as client:
        harness.wait_healthy(client, api)
        harness.wait_worker(client, timeout=30, check=alive)

        # both processes answer: a new connection goes to whichever accepts it first
        processes: set[int] = set()

        def both_answered() -> bool:
            with httpx.Client(base_url=base_url, timeout=5) as fresh:
                processes.add(fresh.get("/v1/health").json()["process"])
            return len(processes) == 2

        harness.wait_until(both_answered, timeout=30, what="two API processes", check=alive)
        assert api.pid not in processes  # the supervisor itself serves nothing

        told, seen_by = _append_concurrently(base_url)
        # the appends really went through both processes
        assert len(seen_by) == 2, seen_by

        file_ids = {ref.split(":")[0] for refs in told.values() for ref, _ in refs}
        assert len(file_ids) == len(SESSIONS)
        total = sum(len(refs) for refs in told.values())

        def flushed() -> bool:
            rows = [client.get(f"/v1/files/{f}").json() for f in file_ids]
            return sum(r["flushed_seq"] for r in rows) == total and all(
                r["pending_messages"] == 0 for r in rows
            )

        harness.wait_until(flushed, timeout=60, what="every append flushed", check=alive)
        contents = {f: _messages(client, f) for f in file_ids}

    # every acknowledged message at its seq, once; nothing else
    for refs in told.values():
        for ref, content in refs:
            file_id, seq = ref.split(":")
            assert contents[file_id][int(seq) - 1] == content
    assert sorted(c for cs in contents.values() for c in cs) == sorted(
        c for refs in told.values() for _, c in refs
    )
    # each writer's messages in its own order, each append in one piece
    for messages in contents.values():
        parsed = [CONTENT.fullmatch(c) for c in messages]
        assert all(parsed)
        by_writer: dict[int, list[tuple[int, int]]] = defaultdict(list)
        for i, match in enumerate(parsed):
            assert match is not None
            w, a, part, _ = (int(g) for g in match.groups())
            by_writer[w].append((a, part))
            if part > 1:
                prev = parsed[i - 1]
                assert prev is not None and prev.group(1, 2) == match.group(1, 2)
        for order in by_writer.values():
            assert order == sorted(order)

    api.stop()
    worker.stop()
    assert '"ok": true' in procs.run(["fsck", "--json", *args], env)


def _append_concurrently(
    base_url: str,
) -> tuple[dict[int, list[tuple[str, str]]], set[int]]:
    """``WRITERS`` threads append ``APPENDS`` batches of 1–3 messages each to random shared
    sessions, a new connection per append: ``({writer: [(source_ref, content)]}, the
    processes that took the appends)``."""
    told: dict[int, list[tuple[str, str]]] = defaultdict(list)
    seen_by: set[int] = set()
    errors: list[BaseException] = []
    start = threading.Barrier(WRITERS, timeout=30)

    def write(w: int) -> None:
        rng = random.Random(w)
        try:
            start.wait()
            for a in range(APPENDS):
                # a connection per append: both processes get this writer's appends
                with httpx.Client(base_url=base_url, timeout=30) as client:
                    size = rng.randint(1, 3)
                    contents = [f"w{w} a{a} {i + 1}/{size}" for i in range(size)]
                    body = {
                        "agent_id": "processes",
                        "session_key": rng.choice(SESSIONS),
                        "idempotency_key": f"w{w}-a{a}",
                        "messages": [{"role": "user", "content": c} for c in contents],
                    }
                    answer = client.post("/v1/append", json=body)
                    assert answer.status_code == 202, answer.text
                    refs = answer.json()["source_refs"]
                    told[w].extend(zip(refs, contents, strict=True))
                    # the same connection, so the same process that took the append
                    seen_by.add(client.get("/v1/health").json()["process"])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(w,)) for w in range(WRITERS)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120 - (time.monotonic() - started))
        assert not thread.is_alive(), "a writer is still appending after two minutes"
    if errors:
        raise errors[0]
    return told, seen_by


def _messages(client: httpx.Client, file_id: str) -> list[str]:
    """Every message's content of a file, in seq order (paged)."""
    found: list[str] = []
    after = 0
    while True:
        page = client.get(f"/v1/files/{file_id}/messages", params={"after_seq": after}).json()
        found += [m["content"] for m in page["messages"]]
        if page["next_after_seq"] is None:
            return found
        after = page["next_after_seq"]
