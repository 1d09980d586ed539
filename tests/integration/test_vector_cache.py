"""The vectors a process keeps in memory for its searches (pipeline.vector_cache, used by
pipeline.vectors.nearest; docs/search.md), on SQLite and PostgreSQL: a search scores a kept
file without reading its blocks, and never scores what the index no longer holds — after
another process's commit, a redaction, an erasure or a model change — nor another agent's
file; the byte bound holds, and what does not fit is read from the index as without a
cache."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helpers
import numpy as np
import pytest
import sqlalchemy as sa

from pipeline import (
    catalog,
    database,
    embeddings,
    erasure,
    journal,
    redaction,
    rewrite,
    tables,
    vector_cache,
    vectors,
)
from pipeline.settings import Settings

Fake = helpers.FakeEmbedder
EVERY = catalog.Filters()


session = helpers.flushed_session


def run(db: database.Database, data_dir: Path, embedder: Any) -> int:
    """Embedding rounds until nothing is left; the messages embedded."""
    done = 0
    while n := vectors.run_round(
        db, data_dir, embedder, claim_messages=256, lease_seconds=60.0, max_chars=2000
    ):
        done += n
    return done


def near(
    db: database.Database,
    model: str,
    point: Any,
    filters: catalog.Filters = EVERY,
    cache: vector_cache.Cache | None = None,
    limit: int = 10,
    shortlist: vectors.Shortlist | None = None,
) -> list[tuple[str, int, float]]:
    """``(file_id, seq, score)`` of :func:`vectors.nearest`'s hits."""
    with db.reading() as conn:
        found = vectors.nearest(
            conn, model, point, filters, limit=limit, cache=cache, shortlist=shortlist
        )
    return [(h.file_id, h.seq, round(h.score, 5)) for h in found]


def coded(center_rows: int = 1) -> vector_cache.Cache:
    """A cache whose model has a center (so sign codes) from its first ``center_rows``
    vectors on."""
    return vector_cache.Cache(1 << 20, center_rows=center_rows)


def codes_follow_vectors(db: database.Database, model: str, cache: vector_cache.Cache) -> None:
    """Every kept entry holds the index's vectors of its file and their codes."""
    center = cache.center(model, 64)
    assert center is not None
    with db.reading() as conn:
        blocks = conn.execute(
            sa.select(tables.message_vectors.c.file_id, tables.message_vectors.c.vectors)
            .where(tables.message_vectors.c.model == model)
            .order_by(tables.message_vectors.c.file_id, tables.message_vectors.c.lo)
        ).all()
    stored: dict[str, bytes] = {}
    for file_id, data in blocks:
        stored[file_id] = stored.get(file_id, b"") + data
    for (kept_model, _, file_id), (entry, _) in cache._entries.items():
        assert kept_model == model and entry.codes is not None
        assert entry.matrix.tobytes() == stored[file_id]
        assert np.array_equal(entry.codes, vector_cache.signs(entry.matrix - center))


@pytest.fixture
def blocks_read(db: database.Database) -> Iterator[list[int]]:
    """How many times a search read blocks out of the index (statements on
    message_vectors' vectors), counted as they run."""
    counted: list[int] = []

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if "message_vectors.vectors" in statement and statement.lstrip().startswith("SELECT"):
            counted.append(1)

    sa.event.listen(db.engine, "before_cursor_execute", count)
    yield counted
    sa.event.remove(db.engine, "before_cursor_execute", count)


def test_a_kept_file_is_scored_without_reading_its_blocks(
    db: database.Database, data_dir: Path, blocks_read: list[int]
) -> None:
    fake = Fake()
    a = session(db, data_dir, "a", ["red apple", "green pear", "blue sky"])
    b = session(db, data_dir, "b", ["red wine", "yellow sun"])
    run(db, data_dir, fake)
    point = fake.query("red apple")
    cache = vector_cache.Cache(1 << 20)
    expected = near(db, fake.model, point)
    assert expected[0][:2] == (a, 1) and len(expected) == 5
    read = len(blocks_read)
    assert near(db, fake.model, point, cache=cache) == expected  # read once and kept
    assert len(blocks_read) == read + 1 and len(cache) == 2
    assert (cache.hits, cache.misses) == (0, 2)
    assert cache.used == 5 * (64 + 4)  # int8 vectors and int32 seqs
    for _ in range(3):
        assert near(db, fake.model, point, cache=cache) == expected
    assert len(blocks_read) == read + 1  # every later search from memory
    assert (cache.hits, cache.misses) == (6, 2)
    assert near(db, fake.model, point, catalog.Filters(file_id=b), cache=cache) == [
        h for h in expected if h[0] == b
    ]


def test_another_processs_commit_is_seen_at_the_next_search(
    db: database.Database, data_dir: Path, database_url: str, blocks_read: list[int]
) -> None:
    fake = Fake()
    a = session(db, data_dir, "a", ["red apple", "green pear"])
    run(db, data_dir, fake)
    cache = vector_cache.Cache(1 << 20)
    point = fake.query("purple plum")
    assert [h[:2] for h in near(db, fake.model, point, cache=cache)] == [(a, 1), (a, 2)]
    # another process (its own engine and connections) appends, flushes and embeds
    other = database.Database.from_url(database_url)
    try:
        assert session(other, data_dir, "a", ["purple plum"]) == a  # one more message in a
        assert run(other, data_dir, fake) == 1
    finally:
        other.dispose()
    read = len(blocks_read)
    found = near(db, fake.model, point, cache=cache)
    assert found[0][:2] == (a, 3) and len(found) == 3
    assert len(blocks_read) == read + 1  # the file read again, once
    assert found == near(db, fake.model, point)
    assert near(db, fake.model, point, cache=cache) == found
    assert len(blocks_read) == read + 2  # (and the uncached search's read)


def test_a_redacted_message_is_never_scored_from_memory(
    db: database.Database, data_dir: Path, file_locks: Any
) -> None:
    fake = Fake()
    a = session(db, data_dir, "a", ["hello there", "my password is hunter2", "bye now"])
    run(db, data_dir, fake)
    cache = vector_cache.Cache(1 << 20)
    secret = fake.query("my password is hunter2")
    assert near(db, fake.model, secret, cache=cache)[0][:2] == (a, 2)
    who = rewrite.Who(reason="a leaked password", actor="test", token_id=None)
    redaction.redact(db, file_locks, data_dir, f"{a}:2", who)
    assert near(db, fake.model, secret, cache=cache) == []  # the blocks are gone at once
    assert run(db, data_dir, fake) == 3
    found = near(db, fake.model, secret, cache=cache)
    assert found == near(db, fake.model, secret)  # the re-embedded vectors, not the kept ones
    assert [h[1] for h in found] != [] and found[0][2] < 0.9


def test_an_erased_file_is_never_scored_and_leaves_memory(
    db: database.Database, data_dir: Path, file_locks: Any
) -> None:
    fake = Fake()
    a = session(db, data_dir, "a", ["red apple"], agent="alice")
    b = session(db, data_dir, "b", ["red wine"], agent="bob")
    run(db, data_dir, fake)
    cache = vector_cache.Cache(1 << 20)
    point = fake.query("red apple")
    assert {h[0] for h in near(db, fake.model, point, cache=cache)} == {a, b}
    assert len(cache) == 2
    who = rewrite.Who(reason="asked to", actor="test", token_id=None)
    erasure.erase_file(db, file_locks, data_dir, a, who)
    alices = catalog.Filters(agents=["alice"])
    assert near(db, fake.model, point, alices, cache=cache) == []
    assert [h[0] for h in near(db, fake.model, point, cache=cache)] == [b]
    assert len(cache) == 1 and cache.used == 64 + 4  # a search over every file let it go


def test_a_model_change_never_scores_the_old_models_kept_vectors(
    db: database.Database, data_dir: Path, blocks_read: list[int]
) -> None:
    old, new = Fake("fake-1"), Fake("fake-2")
    a = session(db, data_dir, "a", ["red apple", "green pear"])
    run(db, data_dir, old)
    cache = vector_cache.Cache(1 << 20)
    point = old.query("red apple")
    assert [h[:2] for h in near(db, old.model, point, cache=cache)] == [(a, 1), (a, 2)]
    assert near(db, new.model, point, cache=cache) == []  # no vector of the new model yet
    assert run(db, data_dir, new) == 2  # its commit replaced the old model's blocks
    assert near(db, old.model, point, cache=cache) == []
    found = near(db, new.model, new.query("red apple"), cache=cache)
    assert [h[:2] for h in found] == [(a, 1), (a, 2)]
    read = len(blocks_read)
    assert near(db, new.model, new.query("red apple"), cache=cache) == found
    assert len(blocks_read) == read


def test_a_search_scores_only_its_scope_whatever_is_kept(
    db: database.Database, data_dir: Path
) -> None:
    fake = Fake()
    mine = session(db, data_dir, "mine", ["the secret plan", "lunch"], agent="alice")
    other = session(db, data_dir, "theirs", ["the secret plan"], agent="bob")
    run(db, data_dir, fake)
    cache = vector_cache.Cache(1 << 20)
    point = fake.query("the secret plan")
    assert {h[0] for h in near(db, fake.model, point, cache=cache)} == {mine, other}
    alices = near(db, fake.model, point, catalog.Filters(agents=["alice"]), cache=cache)
    bobs = near(db, fake.model, point, catalog.Filters(agent_id="bob"), cache=cache)
    assert [h[:2] for h in alices] == [(mine, 1), (mine, 2)]
    assert [h[:2] for h in bobs] == [(other, 1)]
    session_only = catalog.Filters(agents=["alice", "bob"], session_key="theirs")
    assert [h[:2] for h in near(db, fake.model, point, session_only, cache=cache)] == [(other, 1)]
    users = catalog.Filters(agents=["alice"], role="assistant")
    assert near(db, fake.model, point, users, cache=cache) == []  # its own conditions too


def test_the_bound_holds_and_what_does_not_fit_is_read_from_the_index(
    db: database.Database, data_dir: Path, blocks_read: list[int]
) -> None:
    fake = Fake()
    small = session(db, data_dir, "small", ["red apple", "green pear"])
    session(db, data_dir, "large", [f"red thing {i}" for i in range(6)])
    run(db, data_dir, fake)
    point = fake.query("red apple")
    expected = near(db, fake.model, point)
    # room for the small file's 2 vectors (2 x 68 bytes), not the large one's 6
    cache = vector_cache.Cache(300)
    for _ in range(3):
        assert near(db, fake.model, point, cache=cache) == expected
        assert cache.used == 2 * 68 and len(cache) == 1
    read = len(blocks_read)
    assert near(db, fake.model, point, cache=cache) == expected
    assert len(blocks_read) == read + 1  # the large file only, at every search
    # another search's file evicts what it leaves unused, least recently used first
    third = session(db, data_dir, "third", ["red one", "red two", "red three"])
    run(db, data_dir, fake)
    thirds = catalog.Filters(file_id=third)
    assert {h[0] for h in near(db, fake.model, point, thirds, cache=cache)} == {third}
    assert len(cache) == 1 and cache.used == 3 * 68  # the small file's 2 went for its 3
    read = len(blocks_read)
    near(db, fake.model, point, thirds, cache=cache)
    assert len(blocks_read) == read
    assert near(db, fake.model, point, catalog.Filters(file_id=small), cache=cache)
    assert len(blocks_read) == read + 1
    nothing = vector_cache.Cache(0)
    expected = near(db, fake.model, point)
    assert near(db, fake.model, point, cache=nothing) == expected
    assert len(nothing) == 0 and nothing.used == 0


def test_a_services_hybrid_searches_keep_their_vectors_and_see_a_redaction(
    db: database.Database, data_dir: Path
) -> None:
    settings = Settings.load(
        environ={"SGME_EMBED_CACHE_BYTES": "4096"}, data_dir=data_dir, search_embedder="local"
    )
    service = helpers.service(db, settings)
    service.hybrid.embedder = fake = Fake(embeddings.LOCAL_MODEL)
    a = session(db, data_dir, "a", ["hello there", "my password is hunter2", "bye now"])
    session(db, data_dir, "b", ["an unrelated turn"], agent="other")
    assert service.hybrid.embed_round() == 4
    cache = service.hybrid.cache
    assert cache.limit == 4096
    mine = catalog.Filters(agents=["hermes"])
    found, how = service.hybrid.ranked("password hunter2", mine, limit=3)
    assert how.mode == "hybrid" and found[0].source_ref == f"{a}:2"
    assert (len(cache), cache.hits) == (1, 0)  # only the caller's file was read and kept
    service.hybrid.ranked("password hunter2", mine, limit=3)
    assert cache.hits == 1
    who = rewrite.Who(reason="a leaked password", actor="test", token_id=None)
    service.removals.redact([f"{a}:2"], who)
    assert service.hybrid.embed_round() == 3
    near_only = fake.query("my password is hunter2")
    with db.reading() as conn:
        expected = vectors.nearest(conn, fake.model, near_only, mine, limit=5)
        assert vectors.nearest(conn, fake.model, near_only, mine, limit=5, cache=cache) == expected
    assert expected[0].score < 0.9  # the redacted text's vector, not the one kept before


def test_a_shortlist_as_long_as_the_scope_is_the_exact_ranking(
    db: database.Database, data_dir: Path
) -> None:
    fake = Fake()
    a = session(db, data_dir, "a", ["red apple", "green pear", "blue sky", "red wine"])
    session(db, data_dir, "b", ["apple pie", "red car", "sky high", "yellow sun", "pear tree"])
    run(db, data_dir, fake)
    point = fake.query("red apple")
    expected = near(db, fake.model, point)  # every vector scored, read from the index
    assert len(expected) == 9
    cache = coded()
    assert near(db, fake.model, point, cache=cache) == expected  # kept, with codes
    whole = vectors.Shortlist(exact_below=0, rerank=9)
    assert near(db, fake.model, point, cache=cache, shortlist=whole) == expected
    found = near(db, fake.model, point, cache=cache, shortlist=vectors.Shortlist(0, 1))
    assert found[0] == expected[0] and found[0][:2] == (a, 1)
    assert len(found) < len(expected)  # only the codes nearest the query's were scored
    exact = vectors.Shortlist(exact_below=9, rerank=1)  # the scope is not above it
    assert near(db, fake.model, point, cache=cache, shortlist=exact) == expected


def test_a_shortlist_keeps_to_the_callers_scope_and_filters(
    db: database.Database, data_dir: Path
) -> None:
    fake = Fake()
    mine = session(db, data_dir, "mine", ["lunch at noon", "the plan for lunch"], agent="alice")
    other = session(db, data_dir, "theirs", ["the secret plan"], agent="bob")
    said = journal.ingest(
        db,
        {
            "agent_id": "alice",
            "session_key": "roles",
            "messages": [
                {"role": "assistant", "content": "the secret plan"},
                {"role": "user", "content": "a plan"},
            ],
        },
    ).file_id
    journal.flush(db, data_dir, said)
    run(db, data_dir, fake)
    cache = coded()
    point = fake.query("the secret plan")
    tight = vectors.Shortlist(exact_below=0, rerank=1)
    best = near(db, fake.model, point, cache=cache)  # every file kept
    assert {h[:2] for h in best[:2]} == {(other, 1), (said, 1)}  # the two nearest, equal
    alices = near(db, fake.model, point, catalog.Filters(agents=["alice"]), cache, 10, tight)
    assert alices and {h[0] for h in alices} <= {mine, said}  # never bob's, however near
    users = catalog.Filters(agents=["alice"], role="user")
    found = near(db, fake.model, point, users, cache, 10, tight)
    assert found and (said, 1) not in {h[:2] for h in found}  # the nearest one's role is out
    assert near(db, fake.model, point, catalog.Filters(agent_id="carol"), cache, 10, tight) == []


def test_kept_codes_follow_commits_redactions_and_erasures(
    db: database.Database, data_dir: Path, file_locks: Any
) -> None:
    fake = Fake()
    a = session(db, data_dir, "a", ["hello there", "my password is hunter2", "bye now"])
    b = session(db, data_dir, "b", ["red wine"], agent="bob")
    run(db, data_dir, fake)
    cache = coded()
    tight = vectors.Shortlist(exact_below=0, rerank=1)
    secret = fake.query("my password is hunter2")
    assert near(db, fake.model, secret, cache=cache, shortlist=tight)[0][:2] == (a, 2)
    codes_follow_vectors(db, fake.model, cache)
    assert session(db, data_dir, "a", ["purple plum"]) == a  # one more message in a
    assert run(db, data_dir, fake) == 1
    plum = near(db, fake.model, fake.query("purple plum"), cache=cache, shortlist=tight)
    assert plum[0][:2] == (a, 4)  # the committed vector, scored through its code
    codes_follow_vectors(db, fake.model, cache)
    who = rewrite.Who(reason="a leaked password", actor="test", token_id=None)
    redaction.redact(db, file_locks, data_dir, f"{a}:2", who)
    run(db, data_dir, fake)
    found = near(db, fake.model, secret, cache=cache, shortlist=tight)
    assert found and found[0][2] < 0.9  # the redacted text's vector, not the one kept before
    codes_follow_vectors(db, fake.model, cache)
    erasure.erase_file(db, file_locks, data_dir, a, who)
    assert [h[0] for h in near(db, fake.model, secret, cache=cache, shortlist=tight)] == [b]
    codes_follow_vectors(db, fake.model, cache)
