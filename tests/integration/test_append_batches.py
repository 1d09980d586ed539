"""``POST /v1/append`` committed in batches on one thread (pipeline.api.batching), on SQLite and
PostgreSQL: concurrent requests share a commit; each is answered on its own (a refused one
refuses only itself); no answer leaves before its batch's commit returned; and the group
committer's batch entry point (``Group.run_many``) keeps order and fails pieces alone."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from pathlib import Path
from typing import Any

import helpers
import httpx
import pytest
import sqlalchemy as sa

from pipeline import anomalies, clock, database, errors, journal, validation
from pipeline.api import app as api_app
from pipeline.api import appends, batching
from pipeline.service import Appended
from pipeline.settings import Settings

AGENT = "batcher"
CLIENTS = 40


def _body(session: str, n: int, **extra: Any) -> dict[str, Any]:
    content = f"batched message {n} of {session}"
    return {
        "agent_id": AGENT,
        "session_key": session,
        "messages": [{"role": "user", "content": content}],
        **extra,
    }


def _app(db: database.Database, data_dir: Path, database_url: str) -> tuple[Any, Any]:
    settings = Settings(data_dir=data_dir, database_url=database_url, allowed_hosts=("testserver",))
    service = helpers.service(db, settings, helpers.RecordingQueue())
    return api_app.create_app(service), service


async def _post_all(app: Any, bodies: list[Any]) -> list[httpx.Response]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        return list(
            await asyncio.gather(*(client.post("/v1/append", json=body) for body in bodies))
        )


def test_concurrent_appends_share_commits_and_each_gets_its_own_answer(
    db: database.Database, data_dir: Path, database_url: str
) -> None:
    app, service = _app(db, data_dir, database_url)
    sessions = [f"s{i % 4}" for i in range(CLIENTS)]
    bodies: list[Any] = [_body(s, n) for n, s in enumerate(sessions)]
    bodies[7] = {"agent_id": AGENT, "session_key": "s3", "messages": []}  # refused: 422
    bodies[8] = b"{not json"  # refused: 422
    groups_before = db.group.groups

    async def post() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
            return list(
                await asyncio.gather(
                    *(
                        c.post(
                            "/v1/append", content=b, headers={"content-type": "application/json"}
                        )
                        if isinstance(b, bytes)
                        else c.post("/v1/append", json=b)
                        for b in bodies
                    )
                )
            )

    answers = asyncio.run(post())
    statuses = [r.status_code for r in answers]
    assert statuses[7] == 422 and statuses[8] == 422
    assert answers[7].headers["content-type"] == "application/problem+json"
    ok = [r for i, r in enumerate(answers) if i not in (7, 8)]
    assert [r.status_code for r in ok] == [202] * (CLIENTS - 2)
    batcher: batching.AppendBatcher = app.state.append_batcher
    assert batcher.appends == CLIENTS - 2
    assert batcher.batches < batcher.appends  # they shared commits
    assert db.group.groups - groups_before <= batcher.batches

    # Each session's seqs are 1..n with no gap or repeat, each answer naming its own.
    seqs: dict[str, list[int]] = {}
    for r in ok:
        got = r.json()
        assert got["first_seq"] == got["last_seq"]
        seqs.setdefault(got["file_id"], []).append(got["first_seq"])
    assert len(seqs) == 4
    for found in seqs.values():
        assert sorted(found) == list(range(1, len(found) + 1))
    # And the files hold exactly the messages acknowledged, each once.
    for file_id in seqs:
        journal.flush(db, data_dir, file_id, lock_timeout=5)
    text = b"".join(p.read_bytes() for p in (data_dir / "raw").rglob("*.md")).decode()
    for n in range(CLIENTS):
        if n in (7, 8):
            continue
        assert text.count(f"batched message {n} of ") == 1
    assert service.queue.kicks  # the flushes were kicked


def test_an_append_over_the_backlog_is_refused_alone(
    db: database.Database, data_dir: Path, database_url: str
) -> None:
    settings = Settings(data_dir=data_dir, database_url=database_url, allowed_hosts=("testserver",))
    service = helpers.service(db, settings, helpers.RecordingQueue())
    app = api_app.create_app(service)
    big = "y" * 2000
    service.admission.limits = dataclasses.replace(service.admission.limits, max_total_bytes=1500)
    bodies = [_body("ok", 1), {**_body("big", 2), "messages": [{"role": "user", "content": big}]}]
    answers = asyncio.run(_post_all(app, bodies))
    assert answers[0].status_code == 202
    assert answers[1].status_code == 503
    assert answers[1].json()["type"].endswith("overloaded")
    assert "Retry-After" in answers[1].headers


class _Blocking:
    """A service whose batch commit waits for the test to let it return."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def append_many(self, bodies: list[validation.Append]) -> list[Any]:
        self.entered.set()
        assert self.release.wait(10)
        return [f"committed {b.session_key}" for b in bodies]


def test_no_answer_leaves_before_its_batch_committed() -> None:
    blocking = _Blocking()
    batcher = batching.AppendBatcher(blocking)  # type: ignore[arg-type]
    body = validation.parse_append(_body("held", 1))

    async def scenario() -> Any:
        task = asyncio.ensure_future(batcher.append(lambda: body))
        while not blocking.entered.is_set():
            await asyncio.sleep(0.001)
        await asyncio.sleep(0.05)
        assert not task.done()  # the commit has not returned: no answer yet
        blocking.release.set()
        return await asyncio.wait_for(task, 10)

    assert asyncio.run(scenario()) == "committed held"
    assert (batcher.batches, batcher.appends) == (1, 1)


def test_a_batch_that_fails_as_a_whole_answers_every_request_with_a_500() -> None:
    class Broken:
        def append_many(self, bodies: list[validation.Append]) -> list[Appended]:
            raise RuntimeError("a bug")

    batcher = batching.AppendBatcher(Broken())  # type: ignore[arg-type]
    body = validation.parse_append(_body("x", 1))

    async def scenario() -> list[Any]:
        return list(
            await asyncio.gather(
                batcher.append(lambda: body), batcher.append(lambda: body), return_exceptions=True
            )
        )

    outcomes = asyncio.run(scenario())
    assert [type(o) for o in outcomes] == [errors.InternalError] * 2


def test_the_thread_ends_when_idle_and_starts_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(batching, "IDLE_SECONDS", 0.05)
    blocking = _Blocking()
    blocking.release.set()
    batcher = batching.AppendBatcher(blocking)  # type: ignore[arg-type]
    body = validation.parse_append(_body("idle", 1))
    first: Any = asyncio.run(batcher.append(lambda: body))
    helpers.wait_for(lambda: batcher._thread is None, timeout=5)
    second: Any = asyncio.run(batcher.append(lambda: body))
    assert first == second == "committed idle"
    assert batcher.appends == 2


def _record(kind: str) -> Any:
    def work(conn: sa.Connection) -> str:
        anomalies.record(conn, None, kind, "run_many test", now=clock.SYSTEM.now())
        return kind

    return work


def _fails(conn: sa.Connection) -> str:
    anomalies.record(conn, None, "undone", "run_many test", now=clock.SYSTEM.now())
    raise errors.InvalidInput("this piece is refused")


def test_run_many_keeps_order_and_fails_a_piece_alone(db: database.Database) -> None:
    outcomes = db.group.run_many([_record("a"), _fails, _record("b")])
    assert outcomes[0] == "a" and outcomes[2] == "b"
    assert isinstance(outcomes[1], errors.InvalidInput)
    with db.reading() as conn:
        kinds = sorted(a.kind for a in anomalies.listed(conn))
    assert kinds == ["a", "b"]


def test_run_many_behind_another_threads_commit_waits_for_its_own(db: database.Database) -> None:
    entered, release = threading.Event(), threading.Event()

    def held(conn: sa.Connection) -> str:
        entered.set()
        assert release.wait(10)
        return "held"

    leader = threading.Thread(target=db.commit, args=(held,))
    leader.start()
    assert entered.wait(10)
    found: list[Any] = []
    follower = threading.Thread(
        target=lambda: found.extend(db.group.run_many([_record(f"k{i}") for i in range(5)]))
    )
    follower.start()
    helpers.wait_for(lambda: len(db.group._queue) == 5, timeout=10)
    assert not found  # queued behind the held commit
    release.set()
    leader.join(10)
    follower.join(10)
    assert found == [f"k{i}" for i in range(5)]


def test_a_large_body_is_validated_apart_and_committed_with_the_rest(
    db: database.Database, data_dir: Path, database_url: str
) -> None:
    app, _ = _app(db, data_dir, database_url)
    large = {**_body("big", 0), "messages": [{"role": "user", "content": "z" * 100_000}]}
    assert len(str(large)) > appends.BATCH_VALIDATION_BYTES
    answers = asyncio.run(_post_all(app, [large, _body("big", 1), {**large, "agent_id": ""}]))
    assert [r.status_code for r in answers] == [202, 202, 422]
    assert sorted(r.json()["first_seq"] for r in answers[:2]) == [1, 2]
