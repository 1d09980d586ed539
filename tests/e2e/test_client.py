"""``pipeline.client`` against a real ``sgme serve`` with tokens: typed answers, a 503 made for
real (the index's write lock held from another connection) retried and written once, each
refusal raised as its own error class, paging to the end, search within the token's agents,
and the async client."""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import json
import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import harness
import httpx
import pytest

from pipeline import client, errors
from pipeline.api import models

# One server for the module: keep its tests on one xdist worker.
pytestmark = pytest.mark.xdist_group("client-e2e")

MAX_REQUEST_BYTES = 256 * 1024  #: the server's http_max_request_bytes, for the 413
PATIENT = client.Retry(attempts=60, deadline=60.0, backoff=0.1, max_backoff=0.5)


@dataclasses.dataclass(frozen=True)
class Server:
    url: str
    data_dir: Path
    admin: str  #: every agent, every scope
    reader: str  #: agent alice, scope read
    appender: str  #: agent alice, scope append
    proc: harness.Proc


class Recording(httpx.BaseTransport):
    """A real transport that notes each exchange: (method, path, status, request body)."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.seen: list[tuple[str, str, int, bytes]] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.inner.handle_request(request)
        self.seen.append((request.method, request.url.path, response.status_code, request.content))
        return response

    def statuses(self) -> list[int]:
        return [status for _, _, status, _ in self.seen]

    def close(self) -> None:
        self.inner.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """``sgme serve`` on a free port with three tokens; SQLite gives up on a held write lock
    after half a second (a 503), and bodies over 256 KiB are refused (a 413)."""
    root = tmp_path_factory.mktemp("client-e2e")
    data_dir = root / "data"
    procs = harness.Procs(root / "logs")
    env = harness.clean_env(
        **harness.FAST,
        sqlite_busy_timeout="0.5",
        http_max_request_bytes=str(MAX_REQUEST_BYTES),
    )
    common = ["--data-dir", str(data_dir)]
    procs.run(["migrate", *common], env)

    def token(agent: str, scope: str) -> str:
        made = procs.run(
            ["token", "create", "--agent-id", agent, "--scope", scope, "--json", *common], env
        )
        return str(json.loads(made)["token"])

    tokens = token("*", "admin"), token("alice", "read"), token("alice", "append")
    port = harness.free_port()
    proc = procs.start(
        "serve", ["serve", *common, "--port", str(port), "--log-level", "warning"], env
    )
    url = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=url, timeout=10) as probe:
            harness.wait_healthy(probe, proc, timeout=60)
        yield Server(url, data_dir, *tokens, proc)
    finally:
        procs.close()


def session(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def test_answers_are_the_api_models(server: Server) -> None:
    with client.Client(server.url, server.admin) as sgme:
        key = session("typed")
        ack = sgme.append(
            agent_id="alice",
            session_key=key,
            messages=[
                {"role": "user", "content": "I prefer green tea.", "ts": "2026-08-03T11:18:06Z"},
                {"role": "tool", "content": "3 hits", "tool_name": "search"},
            ],
            metadata={"client": "test"},
            wait=True,
        )
        assert isinstance(ack, models.Appended)
        assert (ack.first_seq, ack.last_seq) == (1, 2)
        assert ack.source_refs == [f"{ack.file_id}:1", f"{ack.file_id}:2"]

        row = sgme.file(ack.file_id)
        assert isinstance(row, models.File)
        assert (row.session_key, row.agent_id, row.flushed_seq) == (key, "alice", 2)
        assert row.metadata == {"client": "test"}

        raw = sgme.raw(ack.file_id)
        assert raw == (server.data_dir / row.path).read_bytes()
        assert b"I prefer green tea." in raw

        page = sgme.messages(ack.file_id)
        assert isinstance(page, models.Messages)
        assert [(m.seq, m.role, m.content, m.tool_name) for m in page.messages] == [
            (1, "user", "I prefer green tea.", None),
            (2, "tool", "3 hits", "search"),
        ]
        assert page.messages[0].ts == "2026-08-03T11:18:06Z"

        ref = sgme.ref(ack.source_refs[1], context=1)
        assert isinstance(ref, models.Ref)
        assert (ref.message.content, [m.seq for m in ref.before], ref.after) == ("3 hits", [1], [])

        listed = sgme.files(agent_id="alice", limit=1000)
        assert isinstance(listed, models.Files)
        assert ack.file_id in {f.file_id for f in listed.files}

        up = sgme.upload(agent_id="alice", filename="notes.txt", content="# Notes\n\nkeep it")
        assert isinstance(up, models.Uploaded) and up.source_ref == f"{up.file_id}:1"
        assert sgme.file(up.file_id).metadata == {"filename": "notes.txt"}

        # the builtin refiner finds the preference; poll until the embedded worker has run
        items = harness.wait_until(
            lambda: sgme.l1(file_id=ack.file_id).items,
            timeout=60,
            what="L1 items of the typed session",
            check=server.proc.check_alive,
        )
        assert all(isinstance(item, models.L1Item) for item in items)
        assert [(i.kind, i.content, i.source_refs) for i in items if i.kind == "preference"] == [
            ("preference", "I prefer green tea.", [f"{ack.file_id}:1"])
        ]
        assert sgme.health().status == "ok"


def test_search_finds_what_was_appended_within_the_tokens_agents(server: Server) -> None:
    word = f"kumquat{uuid.uuid4().hex[:8]}"  # found only in this test's messages
    key = session("search")
    with client.Client(server.url, server.admin) as admin:
        alices = admin.append(
            agent_id="alice",
            session_key=key,
            messages=[
                {"role": "user", "content": f"I keep the {word} jam in the blue jar."},
                {"role": "assistant", "content": f"Noted: {word} jam, blue jar."},
                {"role": "user", "content": "unrelated", "ts": "2026-08-03T11:18:06Z"},
            ],
            wait=True,  # flushed: the catalog has the messages once the answer comes
        )
        bobs = admin.append(
            agent_id="bob",
            session_key=key,
            messages=[{"role": "user", "content": f"bob's {word} jam is red"}],
            wait=True,
        )
        everyone = admin.search(f"{word} jam", match="all")
        assert isinstance(everyone, models.Hits)
        found = {h.source_ref for h in everyone.hits}
        assert found == {*alices.source_refs[:2], bobs.source_refs[0]}
        phrase = admin.search(f'"blue jar" {word}', agent_id="alice", role="user", match="all")
        assert [(h.source_ref, h.role, h.agent_id, h.session_key) for h in phrase.hits] == [
            (alices.source_refs[0], "user", "alice", key)
        ]
        assert word in phrase.hits[0].snippet and phrase.hits[0].file_id == alices.file_id
        assert admin.search(word, until="2000-01-01T00:00:00Z").hits == []
        with pytest.raises(errors.InvalidInput):
            admin.search("!!")
        # the server has no embedder: ranked by words, and a search by meaning too, saying so
        words = admin.search(f"{word} jam", mode="lexical")
        assert words.ranking is not None and words.ranking.model_dump() == {
            "mode": "lexical",
            "model": None,
            "embedding_lag": None,
            "fallback": None,
        }
        meant = admin.search(f"{word} jam", mode="hybrid")
        assert meant.ranking is not None and meant.ranking.mode == "lexical"
        assert meant.ranking.fallback == "no embedder is configured (setting search_embedder)"
        assert [h.source_ref for h in meant.hits] == [h.source_ref for h in words.hits]
    with client.Client(server.url, server.reader) as reader:  # alice's only
        mine = reader.search(word, match="all")
        assert {h.agent_id for h in mine.hits} == {"alice"} and len(mine.hits) == 2
        ranked = reader.search(f"where do I keep the {word} jams?")  # the default: ranked
        assert {h.agent_id for h in ranked.hits} == {"alice"}
        assert ranked.hits[0].source_ref in alices.source_refs[:2]
        assert reader.search(word, agent_id="bob").hits == []
    with client.Client(server.url, server.appender) as appender, pytest.raises(errors.Forbidden):
        appender.search(word)  # searching needs the read scope


def test_a_503_from_a_locked_index_is_retried_and_written_once(server: Server) -> None:
    transport = Recording()
    key = session("locked")
    lock = sqlite3.connect(server.data_dir / "index.sqlite3", timeout=30, isolation_level=None)
    lock.execute("BEGIN IMMEDIATE")  # the writer lock: the server's appends wait, then 503
    locked = True
    try:
        with (
            client.Client(server.url, server.admin, retry=PATIENT, transport=transport) as sgme,
            concurrent.futures.ThreadPoolExecutor(1) as pool,
        ):
            sending = pool.submit(
                sgme.append,
                agent_id="bob",
                session_key=key,
                messages=[{"role": "user", "content": "sent while the index was locked"}],
                wait=True,
            )
            harness.wait_until(
                lambda: 503 in transport.statuses(), timeout=30, what="a 503 from a locked index"
            )
            lock.execute("ROLLBACK")
            locked = False
            ack = sending.result(timeout=60)
            stored = [m.content for m in sgme.iter_messages(ack.file_id)]
    finally:
        if locked:
            lock.execute("ROLLBACK")
        lock.close()
    appends = [seen for seen in transport.seen if seen[1] == "/v1/append"]
    statuses = [status for _, _, status, _ in appends]
    assert statuses[0] == 503 and statuses[-1] == 200, statuses
    assert set(statuses[:-1]) == {503}
    bodies = [json.loads(body) for _, _, _, body in appends]
    assert len({body["idempotency_key"] for body in bodies}) == 1
    assert all(body == bodies[0] for body in bodies)
    assert (ack.first_seq, ack.last_seq) == (1, 1)
    assert stored == ["sent while the index was locked"]


def test_each_refusal_is_its_own_error_class(server: Server) -> None:
    with Recording() as transport:
        refusals(server, transport)
    statuses = [status for status in transport.statuses() if status >= 400]
    assert statuses == [401, 401, 403, 403, 404, 404, 409, 413, 422, 429]  # none retried


def refusals(server: Server, transport: Recording) -> None:
    """Each refusal the API can give a client, raised as its error class."""

    def as_(token: str | None) -> client.Client:
        return client.Client(server.url, token, retry=PATIENT, transport=transport)

    def body(agent: str = "alice", **extra: Any) -> dict[str, Any]:
        message = {"role": "user", "content": "hello"}
        return {"agent_id": agent, "session_key": "errors", "messages": [message], **extra}

    with pytest.raises(errors.Unauthorized) as no_token:
        as_(None).files()
    assert (no_token.value.status, no_token.value.error) == (401, "")
    with pytest.raises(errors.Unauthorized) as bad_token:
        as_("sgme_" + "x" * 43).files()
    assert (bad_token.value.status, bad_token.value.error) == (401, "invalid_token")

    with pytest.raises(errors.Forbidden) as no_scope:
        as_(server.reader).append(**body())
    assert (no_scope.value.status, no_scope.value.scope) == (403, "append")
    with pytest.raises(errors.Forbidden) as other_agent:
        as_(server.appender).append(**body("bob"))
    assert other_agent.value.status == 403 and "bob" in other_agent.value.detail

    carols = as_(server.admin).append(**body("carol"), wait=True)
    missing = str(uuid.uuid4())
    for who, file_id in ((server.admin, missing), (server.reader, carols.file_id)):
        with pytest.raises(errors.NotFound) as not_found:
            as_(who).messages(file_id)
        assert not_found.value.status == 404
        assert not_found.value.detail == f"no file {file_id}"

    admin = as_(server.admin)
    admin.append(**body(idempotency_key="k-409"))
    with pytest.raises(errors.Conflict) as conflict:
        admin.append(**body(idempotency_key="k-409", metadata={"changed": True}))
    assert conflict.value.status == 409 and "k-409" in conflict.value.detail

    big = [{"role": "user", "content": "x" * MAX_REQUEST_BYTES}]
    with pytest.raises(errors.RequestTooLarge) as too_large:
        admin.append(agent_id="alice", session_key="big", messages=big)
    assert too_large.value.status == 413 and str(MAX_REQUEST_BYTES) in too_large.value.detail

    with pytest.raises(errors.InvalidInput) as invalid:
        admin.append(agent_id="alice", session_key="bad", messages=[{"role": "robot"}])
    assert invalid.value.status == 422 and "messages[0]" in invalid.value.detail

    admin.refine(carols.file_id)
    with pytest.raises(errors.Throttled) as throttled:
        admin.refine(carols.file_id)  # the cooldown (300 s) is past the deadline: no wait
    assert throttled.value.status == 429 and throttled.value.retry_after is not None
    assert throttled.value.retry_after > PATIENT.deadline


def test_the_paging_helpers_read_to_the_end(server: Server) -> None:
    transport = Recording()
    agent = session("pager")
    with client.Client(server.url, server.admin, transport=transport) as sgme:
        made = sorted(
            sgme.append(
                agent_id=agent,
                session_key=f"s{n}",
                messages=[{"role": "user", "content": f"file {n}"}],
                wait=True,
            ).file_id
            for n in range(5)
        )
        many = sgme.append(
            agent_id=agent,
            session_key="s0",
            messages=[{"role": "user", "content": f"message {n}"} for n in range(2, 8)],
            wait=True,
        )
        transport.seen.clear()
        assert [f.file_id for f in sgme.iter_files(agent_id=agent, page_size=2)] == made
        assert [path for _, path, _, _ in transport.seen] == ["/v1/files"] * 3

        transport.seen.clear()
        found = list(sgme.iter_messages(many.file_id, page_size=3))
        assert [m.seq for m in found] == list(range(1, 8))
        assert [m.content for m in found] == ["file 0"] + [f"message {n}" for n in range(2, 8)]
        assert len(transport.seen) == 4  # 3 + 3 + 1, then the empty page that ends it

        assert [m.seq for m in sgme.iter_messages(many.file_id, after_seq=5)] == [6, 7]


def test_the_async_client(server: Server) -> None:
    key = session("async")

    async def scenario() -> tuple[list[models.Appended], list[str], list[str]]:
        async with client.AsyncClient(server.url, server.admin, retry=PATIENT) as sgme:
            acks = await asyncio.gather(
                *(
                    sgme.append(
                        agent_id="alice",
                        session_key=key,
                        messages=[{"role": "user", "content": f"async {n}"}],
                        wait=True,
                    )
                    for n in range(5)
                )
            )
            contents = [m.content async for m in sgme.iter_messages(acks[0].file_id, page_size=2)]
            files = [f.session_key async for f in sgme.iter_files(agent_id="alice", page_size=3)]
            with pytest.raises(errors.NotFound):
                await sgme.ref(f"{uuid.uuid4()}:1")
            return list(acks), contents, files

    acks, contents, files = asyncio.run(scenario())
    assert len({ack.file_id for ack in acks}) == 1
    assert sorted(ack.first_seq for ack in acks) == [1, 2, 3, 4, 5]
    assert sorted(contents) == [f"async {n}" for n in range(5)]
    by_seq = {ack.first_seq: n for n, ack in enumerate(acks)}
    assert contents == [f"async {by_seq[seq]}" for seq in range(1, 6)]
    assert files.count(key) == 1
