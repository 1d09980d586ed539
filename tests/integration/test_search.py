"""The message catalog and full-text search (docs/design.md §6), on SQLite and PostgreSQL: reads
that touch only the bytes they return, whatever the file's size; search over every raw
message in any language; the catalog kept in step by the flush, rebuilt by reindex, checked by
fsck; archived files still searchable."""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import os
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from pipeline import (
    archive,
    catalog,
    database,
    erasure,
    errors,
    flush,
    integrity,
    journal,
    locks,
    reader,
    redaction,
    refine,
    rewrite,
    search,
)
from pipeline.database import schema

TS = dt.datetime(2026, 8, 3, 11, 0, tzinfo=dt.UTC)


def ts(minutes: float) -> str:
    return (TS + dt.timedelta(minutes=minutes)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def session(
    db: database.Database,
    data_dir: Path,
    key: str,
    contents: list[str],
    *,
    agent: str = "hermes",
    role: str = "user",
    start: float = 0,
) -> str:
    """A flushed session of ``contents`` (1,000 messages per append); its file_id."""
    file_id = ""
    for lo in range(0, len(contents), 1000):
        tool = {"tool_name": "shell"} if role == "tool" else {}
        messages = [
            {"role": role, "content": c, "ts": ts(start + lo + i), **tool}
            for i, c in enumerate(contents[lo : lo + 1000])
        ]
        body = {"agent_id": agent, "session_key": key, "messages": messages}
        file_id = journal.ingest(db, body).file_id
    journal.flush(db, data_dir, file_id)
    return file_id


class Reads:
    """Counts the bytes read from raw files (every read goes through os.pread or os.read)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.bytes = 0
        real_pread, real_read = os.pread, os.read

        def pread(fd: int, n: int, offset: int) -> bytes:
            data = real_pread(fd, n, offset)
            self.bytes += len(data)
            return data

        def read(fd: int, n: int) -> bytes:
            data = real_read(fd, n)
            self.bytes += len(data)
            return data

        monkeypatch.setattr(os, "pread", pread)
        monkeypatch.setattr(os, "read", read)


@pytest.mark.parametrize("count", [10, 20_000])
def test_a_read_touches_only_the_bytes_it_returns(
    db: database.Database, data_dir: Path, monkeypatch: pytest.MonkeyPatch, count: int
) -> None:
    contents = [f"message {i} " + "x" * 200 for i in range(count)]
    file_id = session(db, data_dir, f"long-{count}", contents)
    with db.transaction() as conn:
        rows = catalog.rows(conn, file_id, after=0, upto=count)
    size = {r.seq: r.byte_length for r in rows}
    assert len(rows) == count
    reads = Reads(monkeypatch)

    ref = reader.resolve(db, data_dir, f"{file_id}:{count - 1}", context=1)
    assert [m.content for m in (*ref.before, ref.message, *ref.after)] == contents[-3:]
    assert reads.bytes == size[count - 2] + size[count - 1] + size[count]

    reads.bytes = 0
    page = reader.messages(db, data_dir, file_id, after_seq=count - 5, limit=5)
    assert [m.content for m in page] == contents[-5:]
    assert reads.bytes == sum(size[s] for s in range(count - 4, count + 1))

    reads.bytes = 0
    row = reader.get_file(db, file_id)
    found = reader.between(db, data_dir, row, count - 2, count)  # a refinement segment
    assert [m.seq for m in found] == [count - 1, count]
    assert reads.bytes == size[count - 1] + size[count]


def test_search_finds_phrases_words_and_cjk_among_thousands(
    db: database.Database, data_dir: Path
) -> None:
    filler = [f"routine status update number {i}, all systems nominal" for i in range(3000)]
    filler[1234] = "The user said: I prefer green tea over coffee in the morning."
    filler[2345] = "数据库迁移已经完成，我们决定使用 PostgreSQL 作为索引。"
    filler[2999] = "私はコーヒーよりも緑茶が好きです。한국어 문장도 찾을 수 있어요."
    file_id = session(db, data_dir, "big", filler)

    def refs(q: str, **filters: Any) -> list[str]:
        found = search.search(db, data_dir, q, catalog.Filters(**filters), limit=10, match="all")
        return [r.source_ref for r in found]

    assert refs('"green tea over coffee"') == [f"{file_id}:1235"]
    assert refs('"coffee over green tea"') == []  # a phrase is in order
    assert refs("PREFER morning") == [f"{file_id}:1235"]  # words, any case, all required
    assert refs("数据库") == [f"{file_id}:2346"]  # a CJK substring of three characters
    assert refs("迁移") == [f"{file_id}:2346"]  # and of two
    assert refs("緑茶") == [f"{file_id}:3000"]
    assert refs("문장도") == [f"{file_id}:3000"]
    assert refs("postgresql 索引") == [f"{file_id}:2346"]
    nominal = refs("nominal", file_id=file_id)
    assert len(nominal) == 10 and all(r.startswith(file_id) for r in nominal)
    hit = search.search(db, data_dir, "green tea", limit=1, match="all")[0]
    assert "prefer green tea" in hit.snippet
    assert (hit.seq, hit.role, hit.agent_id, hit.session_key) == (1235, "user", "hermes", "big")
    assert hit.ts == ts(1234).replace(".000000", "")
    with pytest.raises(errors.InvalidInput, match="no word"):
        search.search(db, data_dir, '"" ... !!')


def test_filters_combine_and_nobody_sees_another_agents_messages(
    db: database.Database, data_dir: Path
) -> None:
    a = session(db, data_dir, "s-a", ["the launch code is blue"], agent="alice")
    b = session(db, data_dir, "s-b", ["the launch code is red"], agent="bob", start=60)
    c = session(db, data_dir, "s-c", ["launch notes"], agent="bob", role="tool", start=120)

    def found(q: str = "launch", **filters: Any) -> set[str]:
        hits = search.search(db, data_dir, q, catalog.Filters(**filters), limit=50, match="all")
        return {h.file_id for h in hits}

    assert found() == {a, b, c}
    assert found(agents={"alice"}) == {a}
    assert found(agents={"alice"}, agent_id="bob") == set()
    assert found(agents=set()) == set()
    assert found(agent_id="bob") == {b, c}
    assert found(session_key="s-b") == {b}
    assert found(role="tool") == {c}
    assert found(file_id=a) == {a}
    assert found(since=(TS + dt.timedelta(minutes=30)).replace(tzinfo=None)) == {b, c}
    assert found(until=(TS + dt.timedelta(minutes=90)).replace(tzinfo=None)) == {a, b}
    assert found(agent_id="bob", until=(TS + dt.timedelta(minutes=90)).replace(tzinfo=None)) == {b}
    assert found("code red") == {b}


def test_reindex_after_losing_the_index_gives_the_same_results(
    db: database.Database, data_dir: Path, file_locks: locks.FileLocks
) -> None:
    session(db, data_dir, "one", [f"alpha beta {i} 中文检索 {i % 7}" for i in range(90)])
    session(db, data_dir, "two", ["beta gamma", "中文", "upload-like text"], agent="other")
    upload = journal.ingest_upload(
        db, {"agent_id": "hermes", "filename": "n.md", "content": "an uploaded beta note"}
    )
    journal.flush(db, data_dir, upload.file_id)
    queries = ["beta", "中文检索", '"alpha beta 17"', "note", "gamma"]

    def results() -> list[list[tuple[str, str, float]]]:
        # a limit above every query's matches: which of many equal scores come is not fixed
        return [
            [
                (r.source_ref, r.snippet, r.score)
                for r in search.search(db, data_dir, q, limit=search.MAX_LIMIT)
            ]
            for q in queries
        ]

    before = results()
    assert all(before) and before[3][0][0] == f"{upload.file_id}:1"
    with db.transaction() as conn:
        catalog.clear(conn)
    assert results() == [[] for _ in queries]
    integrity.reindex(db, file_locks, data_dir)
    assert results() == before
    assert integrity.fsck(db, data_dir) == []


def test_fsck_names_a_catalog_that_no_longer_matches(db: database.Database, data_dir: Path) -> None:
    file_id = session(db, data_dir, "c", ["one", "two", "three"])
    assert integrity.fsck(db, data_dir) == []
    with db.transaction() as conn:
        conn.execute(sa.text("UPDATE messages SET byte_length = byte_length + 1 WHERE seq = 2"))
    problems = integrity.fsck(db, data_dir)
    assert [(p.file_id, p.kind) for p in problems] == [(file_id, "catalog_mismatch")]
    assert "first difference at seq 2" in problems[0].detail


def test_archived_files_stay_searchable_and_readable(
    db: database.Database, data_dir: Path, file_locks: locks.FileLocks
) -> None:
    file_id = session(db, data_dir, "old", [f"archived fact number {i}" for i in range(50)])
    c = refine.claim(db, file_id, lease_seconds=60)
    assert c is not None and refine.commit(db, c, [], refiner="test")
    assert archive.compress(db, file_locks, data_dir, file_id) is not None
    hits = search.search(db, data_dir, '"fact number 42"', match="all")
    assert [(h.source_ref, h.snippet) for h in hits] == [
        (f"{file_id}:43", "archived fact number 42")
    ]
    ref = reader.resolve(db, data_dir, f"{file_id}:43", context=1)
    assert [m.content for m in (*ref.before, ref.message, *ref.after)] == [
        f"archived fact number {i}" for i in (41, 42, 43)
    ]
    assert integrity.fsck(db, data_dir) == []


def test_the_migration_fills_the_catalog_of_an_existing_store(
    db: database.Database, data_dir: Path
) -> None:
    """A store from before the catalog (schema 0005): migrating reads every file into it."""
    from alembic import command

    file_id = session(db, data_dir, "pre", ["before the catalog", "数据 in old files"])
    with db.engine.begin() as conn:
        config = schema.alembic_config()
        config.attributes["connection"] = conn
        command.downgrade(config, "0005")
    assert database.revisions(db.engine)[0] == {"0005"}
    integrity.migrate(db.engine, data_dir=data_dir)
    hits = search.search(db, data_dir, "数据")
    assert [h.source_ref for h in hits] == [f"{file_id}:2"]
    assert integrity.fsck(db, data_dir) == []


def test_sqlite_and_postgres_find_the_same_messages(tmp_path: Path, postgres_url: str) -> None:
    corpus = [
        "Deploy the API with two workers",
        "the api gateway returned 502",
        "数据库连接失败，重试三次",
        "我们决定用数据库作为索引",
        "パスワードを変更しました",
        "e-mail from Zoë about the café",
        "tool output: exit code 0",
    ] * 3
    queries = ["api", "数据库", "连接失败", "パスワード", "e-mail", "café", "zoë", '"exit code"']
    answers, ranked = [], []
    for url in (f"sqlite:///{tmp_path / 'index.sqlite3'}", postgres_url):
        db = database.Database.from_url(url)
        database.migrate(db.engine)
        if db.postgres:
            with db.engine.begin() as conn:
                catalog.clear(conn)
                conn.execute(sa.text("TRUNCATE raw_files, append_journal, append_keys CASCADE"))
        data_dir = tmp_path / f"data-{db.dialect.name}"
        session(db, data_dir, "mixed", corpus)
        answers.append(
            [
                sorted(h.seq for h in search.search(db, data_dir, q, limit=50, match="all"))
                for q in queries
            ]
        )
        ranked.append(
            [
                [(h.seq, round(h.score, 4)) for h in search.search(db, data_dir, q, limit=50)]
                for q in [*queries, "which workers deployed the API gateway?"]
            ]
        )
        db.dispose()
    sqlite, postgres = answers
    assert sqlite == postgres
    assert [len(a) for a in sqlite] == [6, 6, 3, 3, 3, 3, 3, 3]
    assert ranked[0] == ranked[1]  # the same BM25 scores, in the same order


# ---------------------------------------------------------------------------------------------
# ranked search (match=any, the default; docs/search.md)


def ranked(db: database.Database, data_dir: Path, q: str, **filters: Any) -> list[str]:
    found = search.search(db, data_dir, q, catalog.Filters(**filters), limit=10)
    return [r.source_ref for r in found]


def test_a_question_finds_its_answer_through_stems_not_word_forms(
    db: database.Database, data_dir: Path
) -> None:
    file_id = session(
        db,
        data_dir,
        "policy",
        [
            "Let's talk about the deploy pipeline.",
            "We decided that failed uploads are retried three times, backing off exponentially.",
            "Lunch is at noon.",
        ],
    )
    question = "What did we decide about retrying a failed upload?"
    assert ranked(db, data_dir, question)[0] == f"{file_id}:2"
    assert search.search(db, data_dir, question, match="all") == []  # not every word is there
    hit = search.search(db, data_dir, question, limit=1)[0]
    assert "decided" in hit.snippet and hit.score > 0


def test_an_old_answer_is_found_behind_ten_thousand_newer_messages_with_a_common_word(
    db: database.Database, data_dir: Path
) -> None:
    old = session(
        db, data_dir, "old", ["The launch password for the staging cluster is heliotrope."]
    )
    newer = [f"launch status report {i}: the launch went fine" for i in range(10_000)]
    session(db, data_dir, "newer", newer, start=60)
    found = ranked(db, data_dir, "what was the launch password again?")
    assert found[0] == f"{old}:1"
    # a search that runs past its time is stopped, and says why
    with pytest.raises(errors.QueryTooCostly, match="search_timeout"):
        search.search(db, data_dir, "launch report", how=search.Ranking(timeout=0.001))
    assert len(search.search(db, data_dir, "launch report", how=search.Ranking(timeout=30))) == 20


def test_common_words_count_when_the_rarer_ones_find_too_few_within_the_filters(
    db: database.Database, data_dir: Path
) -> None:
    # "deploy" is common (in 6 messages, the bound is 3): a question with a rarer word is
    # ranked by that word first; here it is only in another agent's messages, so within
    # alice's scope it finds nothing, and the common word must count after all (before, an
    # agent whose answers held only common words got no hit at all).
    mine = session(
        db,
        data_dir,
        "ops",
        ["The deploy window is Friday at six.", *[f"deploy {i} ok" for i in range(5)]],
        agent="alice",
    )
    session(db, data_dir, "zoo", ["A zebra escaped."], agent="bob", start=60)
    # (in fewer than half the messages: a word in more ranks nothing, the test below)
    session(db, data_dir, "misc", [f"lunch {i}" for i in range(10)], agent="carol", start=90)
    how = search.Ranking(common_matches=3)

    def found(**filters: Any) -> list[str]:
        q = "when is the zebra deploy?"
        hits = search.search(db, data_dir, q, catalog.Filters(**filters), limit=3, how=how)
        return [h.source_ref for h in hits]

    alices = found(agents={"alice"})
    assert len(alices) == 3 and {ref.split(":")[0] for ref in alices} == {mine}
    assert len(found(agents={"bob"})) == 1  # bob's zebra; his messages hold no "deploy"
    assert len(found()) == 3  # the zebra first, then messages with the common word


def test_common_words_are_scored_in_their_newest_matches_only(
    db: database.Database, data_dir: Path
) -> None:
    # "deploy" is common (in 8 messages, the bound is 3); a query of it alone scores its
    # newest 4 matches (common_scored), so the oldest, shortest one — BM25's best over every
    # match — is not among the hits; with a window that covers every match it comes first
    old = session(db, data_dir, "old", ["deploy"])
    newer = session(
        db, data_dir, "new", [f"the deploy {i} of the day went fine" for i in range(7)], start=60
    )
    session(db, data_dir, "misc", [f"lunch {i}" for i in range(10)], start=90)  # (as above)

    def refs(how: search.Ranking) -> list[str]:
        hits = search.search(db, data_dir, "deploy", limit=10, neighbours="none", how=how)
        return [h.source_ref for h in hits]

    window = refs(search.Ranking(common_matches=3, common_scored=4))
    assert sorted(window) == sorted(f"{newer}:{seq}" for seq in (4, 5, 6, 7))
    every = refs(search.Ranking(common_matches=3, common_scored=100))
    assert every[0] == f"{old}:1" and len(every) == 8
    assert refs(search.Ranking(common_matches=100)) == every  # not common: every match


def test_a_rare_words_hit_has_its_common_words_score_in_the_window(
    db: database.Database, data_dir: Path
) -> None:
    # "zebra" is rare but found only once (fewer than asked for): "deploy" (common) is then
    # scored in its newest matches and added to what "zebra" scored, so the zebra message in
    # the window scores what it would with every word counted
    session(db, data_dir, "ops", [f"deploy {i} went fine" for i in range(6)])
    zoo = session(db, data_dir, "zoo", ["the zebra deploy was late"], start=60)
    session(db, data_dir, "misc", [f"lunch {i}" for i in range(10)], start=90)
    q = "when was the zebra deploy?"

    def scores(how: search.Ranking) -> dict[str, float]:
        hits = search.search(db, data_dir, q, limit=5, neighbours="none", how=how)
        return {h.source_ref: h.score for h in hits}

    windowed = scores(search.Ranking(common_matches=3, common_scored=4))
    exact = scores(search.Ranking(common_matches=100))
    assert next(iter(windowed)) == next(iter(exact)) == f"{zoo}:1"
    assert windowed[f"{zoo}:1"] == pytest.approx(exact[f"{zoo}:1"], abs=1e-4)
    assert len(windowed) == 4  # the zebra, and the 3 other newest of the window's 4


def test_a_word_in_most_messages_is_left_out_beside_another_common_one(
    db: database.Database, data_dir: Path
) -> None:
    # "status" is in 9 of 10 messages (its idf is FTS5's floor: it ranks nothing) and
    # "backup" in 4 (common too, bound 3): a query of both scores "backup" alone; "status"
    # alone is still searched for
    # (a session each: no message has another's words in its context terms)
    texts = [f"status {i} backup done" if i < 4 else f"status {i} fine" for i in range(9)]
    files = [session(db, data_dir, f"log-{i}", [t], start=i) for i, t in enumerate(texts)]
    session_ids = {"lunch": session(db, data_dir, "lunch", ["lunch at noon"], start=20)}
    how = search.Ranking(common_matches=3, common_scored=100)

    def refs(q: str) -> list[str]:
        hits = search.search(db, data_dir, q, limit=10, neighbours="none", how=how)
        return sorted(h.source_ref for h in hits)

    assert refs("status backup") == sorted(f"{f}:1" for f in files[:4])
    assert refs("status") == sorted(f"{f}:1" for f in files)
    # beside a rarer word that finds fewer than asked for, it adds nothing
    rare = search.search(db, data_dir, "lunch status", limit=5, neighbours="none", how=how)
    assert [h.source_ref for h in rare] == [f"{session_ids['lunch']}:1"]
    # alone, it ranks nothing: its newest candidates, each scored 0
    few = dataclasses.replace(how, candidates=3)
    newest = search.search(db, data_dir, "status", limit=3, neighbours="none", how=few)
    assert sorted(h.source_ref for h in newest) == sorted(f"{f}:1" for f in files[6:])
    assert {h.score for h in newest} == {0.0}


def test_the_turn_after_the_one_that_shares_the_words_is_found(
    db: database.Database, data_dir: Path
) -> None:
    file_id = session(
        db,
        data_dir,
        "talk",
        [
            "Which restaurant did you book for Friday?",
            "Tavola, the little Sardinian place on Elm Street.",
            "Great, thanks.",
        ],
    )
    found = search.search(db, data_dir, "which restaurant was booked?", limit=3)
    assert [h.source_ref for h in found[:2]] == [f"{file_id}:1", f"{file_id}:2"]
    # BM25 alone: the turns after it hold its words in their context terms, lower
    none = search.search(db, data_dir, "which restaurant was booked?", neighbours="none")
    assert [h.source_ref for h in none] == [f"{file_id}:{s}" for s in (1, 2, 3)]
    alone = search.Ranking(context_weight=0)
    own = search.search(db, data_dir, "which restaurant was booked?", neighbours="none", how=alone)
    assert [h.source_ref for h in own] == [f"{file_id}:1"]


def test_a_turn_is_found_by_the_words_of_the_two_turns_before_it(
    db: database.Database, data_dir: Path
) -> None:
    file_id = session(
        db,
        data_dir,
        "kayak",
        [
            "Did you ever go kayaking on the lake like you planned?",
            "You remember that? Ha.",
            "Yes, twice last month! We even saw a heron.",
            "Nice, and the garden?",
            "Tomatoes everywhere.",
        ],
    )
    alone = search.Ranking(context_weight=0)
    q = "how often did they go kayaking on the lake?"
    found = search.search(db, data_dir, q, neighbours="none")
    # the answer is two turns after the question: in its context, not in the turn after's
    assert [h.source_ref for h in found] == [f"{file_id}:{s}" for s in (1, 2, 3)]
    own = search.search(db, data_dir, q, neighbours="none", how=alone)
    assert [h.source_ref for h in own] == [f"{file_id}:1"]


def test_a_long_answer_outranks_short_turns_that_hold_its_word_only_in_their_context(
    db: database.Database, data_dir: Path
) -> None:
    # the assistant's answers to three questions about a house: one long (the word once in
    # five sentences of travel talk), two short ones that hold it only in their context (the
    # question before them). A phrase in the context scores search_context_weight of what it
    # would in the message's own terms: with FTS5's column weights on the term frequency
    # instead, BM25's saturation made the short turns' context count more than the long
    # turn's own word.
    fillers = [
        "We set off early and the traffic was awful for the first hour, then it cleared.",
        "I had packed far too much, as usual, and the suitcase barely closed.",
        "The hotel was fine, nothing special, but the breakfast was generous.",
        "On the first evening we walked around the old town and found a tiny bakery.",
        "My phone kept losing signal, which honestly was a relief after a busy month.",
    ]
    long = " ".join(
        [*fillers[:2], "The cellar under the house is what sold it to us.", *fillers[2:]]
    )
    dialogues = {
        "viewing": ["How did the viewing go on Saturday?", long],
        "cold": ["Is the house always this cold?", "Only in the mornings."],
        "next-door": ["The house next door is for sale.", "Really? Since when?"],
        "chat": [f"Small talk number {i} about nothing much." for i in range(40)],
    }
    files = {}
    for n, (key, turns) in enumerate(dialogues.items()):
        messages = [
            {"role": ("user", "assistant")[i % 2], "content": text, "ts": ts(100 * n + i)}
            for i, text in enumerate(turns)
        ]
        body = {"agent_id": "hermes", "session_key": key, "messages": messages}
        files[key] = journal.ingest(db, body).file_id
        journal.flush(db, data_dir, files[key])
    answers = catalog.Filters(role="assistant")
    found = search.search(db, data_dir, "the house?", answers, limit=3)
    assert [h.source_ref for h in found] == [
        f"{files['viewing']}:2",
        *sorted(f"{files[k]}:2" for k in ("cold", "next-door")),
    ]


def test_the_token_scope_and_filters_hold_for_ranked_search(
    db: database.Database, data_dir: Path
) -> None:
    a = session(db, data_dir, "s-a", ["what is the launch code?", "it is blue"], agent="alice")
    b = session(db, data_dir, "s-b", ["what is the launch code?"], agent="bob", start=60)
    c = session(db, data_dir, "s-c", ["launch notes", "tool says red"], agent="bob", role="tool")

    def found(q: str = "the launch code", **filters: Any) -> set[str]:
        hits = search.search(db, data_dir, q, catalog.Filters(**filters), limit=50)
        return {h.source_ref for h in hits}

    assert found() == {f"{a}:1", f"{a}:2", f"{b}:1", f"{c}:1", f"{c}:2"}
    assert found(agents={"alice"}) == {f"{a}:1", f"{a}:2"}
    assert found(agents={"alice"}, agent_id="bob") == set()
    assert found(agents=set()) == set()
    assert found(agent_id="bob") == {f"{b}:1", f"{c}:1", f"{c}:2"}
    assert found(session_key="s-b") == {f"{b}:1"}
    assert found(role="tool") == {f"{c}:1", f"{c}:2"}
    mixed = journal.ingest(
        db,
        {
            "agent_id": "carol",
            "session_key": "s-d",
            "messages": [
                {"role": "user", "content": "the launch code?", "ts": ts(200)},
                {"role": "assistant", "content": "green", "ts": ts(201)},
            ],
        },
    ).file_id
    journal.flush(db, data_dir, mixed)
    assert found(agent_id="carol") == {f"{mixed}:1", f"{mixed}:2"}  # the answer follows
    assert found(agent_id="carol", role="user") == {f"{mixed}:1"}  # but not in another role
    # the answer matches by its context terms (the question before it), in its own role
    assert found(agent_id="carol", role="assistant") == {f"{mixed}:2"}
    none = search.Ranking(context_weight=0)
    hits = search.search(
        db, data_dir, "the launch code", catalog.Filters(role="assistant"), how=none
    )
    assert hits == []  # without them: the turn after a match of another role is not one
    assert found(file_id=a) == {f"{a}:1", f"{a}:2"}
    assert found(since=(TS + dt.timedelta(minutes=30)).replace(tzinfo=None)) == {
        f"{b}:1",
        f"{mixed}:1",
        f"{mixed}:2",
    }
    assert found(until=TS.replace(tzinfo=None)) == {f"{a}:1", f"{c}:1"}  # at its very time
    assert found(until=(TS + dt.timedelta(seconds=30)).replace(tzinfo=None)) == {
        f"{a}:1",
        f"{c}:1",
    }


def test_cjk_questions_find_their_answers(db: database.Database, data_dir: Path) -> None:
    filler = [f"今天的会议记录第{i}号，没有新的决定。" for i in range(300)]
    filler[17] = "我上次说的那家餐厅叫小南国，在静安寺旁边。"
    filler[230] = "来週の打ち合わせは金曜日の午後三時からに決まりました。"
    file_id = session(db, data_dir, "cjk", filler)
    assert ranked(db, data_dir, "我上次说的那家餐厅叫什么")[0] == f"{file_id}:18"
    assert ranked(db, data_dir, "打ち合わせはいつに決まった？")[0] == f"{file_id}:231"


def test_reindex_rebuilds_the_same_rankings(
    db: database.Database, data_dir: Path, file_locks: locks.FileLocks
) -> None:
    session(db, data_dir, "one", [f"we deployed release {i} of the gateway" for i in range(60)])
    session(db, data_dir, "two", ["which gateway release failed?", "release 7 failed"])
    queries = ["which release of the gateway failed?", "deploying gateways", "失败"]

    def results() -> list[list[tuple[str, float]]]:
        return [
            [(r.source_ref, r.score) for r in search.search(db, data_dir, q, limit=50)]
            for q in queries
        ]

    before = results()
    assert before[0] and before[1]
    with db.transaction() as conn:
        catalog.clear(conn)
    integrity.reindex(db, file_locks, data_dir)
    assert results() == before


def test_context_terms_are_the_same_however_the_turns_were_flushed(
    db: database.Database, data_dir: Path, file_locks: locks.FileLocks
) -> None:
    """A turn's context is the two turns before it whether they came in its flush, an
    earlier one, a round of many files' or an earlier chunk of a backlog; reindex makes it
    the same from the file."""
    turns = ["Did you try the quince jam?", "Hmm, which one?", "The one from the market.",
             "Yes! Delicious on toast.", "Great.", "And the plum one?", "Too sweet."]  # fmt: skip

    def appended(i: int) -> str:
        message = {"role": "user" if i % 2 == 0 else "assistant", "content": turns[i]}
        body = {"agent_id": "hermes", "session_key": "jam", "messages": [message | {"ts": ts(i)}]}
        return journal.ingest(db, body).file_id

    file_id = appended(0)
    journal.flush(db, data_dir, file_id)
    appended(1)
    flush.flush_files(db, file_locks, data_dir, [file_id])
    for i in (2, 3, 4):
        appended(i)
    flush.flush(db, file_locks, data_dir, file_id, chunk_bytes=1)  # a chunk a message
    appended(5)
    appended(6)
    journal.flush(db, data_dir, file_id)

    def results() -> list[tuple[str, float]]:
        hits = search.search(db, data_dir, "quince jam market", neighbours="none", limit=50)
        return [(h.source_ref, h.score) for h in hits]

    before = results()
    assert [ref for ref, _ in before][:1] == [f"{file_id}:1"]
    assert {ref for ref, _ in before} == {f"{file_id}:{s}" for s in (1, 2, 3, 4, 5)}
    with db.transaction() as conn:
        catalog.clear(conn)
    integrity.reindex(db, file_locks, data_dir)
    assert results() == before


def test_a_flush_takes_the_turns_before_it_from_the_last_flush_until_the_file_changes(
    db: database.Database,
    data_dir: Path,
    file_locks: locks.FileLocks,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A flush keeps what the context of the file's next messages is made of: the next
    flush (one message a call) reads no earlier message back. A redaction changes the file,
    and the next flush reads the turns before it again: the redacted words are in no
    context."""
    read: list[int] = []
    texts_before = flush._texts_before

    def counted(path: Path, row: Any, tail: Any) -> list[str]:
        read.append(len(tail))
        return texts_before(path, row, tail)

    monkeypatch.setattr(flush, "_texts_before", counted)

    def said(seq: int, text: str) -> None:
        message = {"role": "user", "content": text, "ts": ts(seq)}
        body = {"agent_id": "hermes", "session_key": "kept", "messages": [message]}
        journal.ingest(db, body)
        journal.flush(db, data_dir, file_id)

    file_id = session(db, data_dir, "kept", ["Did you try the quince jam?"])
    said(1, "Yes, twice!")
    said(2, "And?")
    assert read == [0]  # the first flush only: a new file has no turns before
    refs = [h.source_ref for h in search.search(db, data_dir, "quince", neighbours="none")]
    assert refs == [f"{file_id}:{s}" for s in (1, 2, 3)]
    redaction.redact(db, file_locks, data_dir, f"{file_id}:2", rewrite.Who("test", "asked"))
    said(3, "Delicious.")
    assert read == [0, 2]  # the file changed: its last two turns read back
    assert search.search(db, data_dir, "twice", neighbours="none") == []
    refs = [h.source_ref for h in search.search(db, data_dir, "quince", neighbours="none")]
    assert sorted(refs) == [f"{file_id}:{s}" for s in (1, 2, 3)]


def test_hits_come_with_their_turns_around_them_each_shown_once(
    db: database.Database, data_dir: Path
) -> None:
    file_id = session(
        db,
        data_dir,
        "around",
        ["hello", "any news on the quince tart?", "baked it!", "the quince tart was great",
         "glad", "x" * 3000, "bye"],
    )  # fmt: skip
    how = search.Ranking(context_chars=100)
    q = "quince tart"
    hits = search.search(db, data_dir, q, neighbours="none", limit=2, context=2, how=how)
    # the two turns that say it (the turns after them hold it in their context only)
    assert sorted(h.seq for h in hits) == [2, 4]
    by_seq = {h.seq: h for h in hits}
    sides = {h.seq: ([t.seq for t in h.before], [t.seq for t in h.after]) for h in hits}
    # turn 3 is between the two hits: shown once, around the better one; a side stops at a hit
    first, second = hits[0].seq, hits[1].seq
    if first == 2:
        assert sides == {2: ([1], [3]), 4: ([], [5, 6])}
    else:
        assert sides == {4: ([3], [5, 6]), 2: ([1], [])}
    assert by_seq[2].before[0].text == "hello" and by_seq[2].before[0].role == "user"
    assert by_seq[2].before[0].source_ref == f"{file_id}:1"
    long = by_seq[4].after[1]
    assert len(long.text) == 100 and long.text == "x" * 99 + "…"
    assert second != first
    assert search.search(db, data_dir, "quince", context=0)[0].before == ()
    with pytest.raises(errors.InvalidInput, match=r"context must be 0\.\.3"):
        search.search(db, data_dir, "quince", context=4)


def test_speakers_are_tags_not_words_and_filter(
    db: database.Database, data_dir: Path, file_locks: locks.FileLocks
) -> None:
    """A dialogue's turns start with their speaker's name: the name is a tag (the speaker=
    filter), not a word of the turn, so a question that names a speaker ranks what is said."""
    said = [
        "Caroline: I finally adopted the puppy from the shelter!",
        "Mel: No way! What is she called?",
        "Caroline: Biscuit. She already owns the couch.",
        "Mel: I told Caroline about my pottery class yesterday.",
        "Caroline: Pottery sounds fun.",
    ]
    messages = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": text, "ts": ts(i)}
        for i, text in enumerate(said)
    ]
    body = {
        "agent_id": "hermes",
        "session_key": "dialogue",
        "metadata": {"speakers": ["Caroline", "Mel", 7], "speaker": "Caroline"},
        "messages": messages,
    }
    file_id = journal.ingest(db, body).file_id
    journal.flush(db, data_dir, file_id)
    plain = session(db, data_dir, "plain", ["notes for the week"])  # no speakers declared

    def refs(q: str, **filters: Any) -> list[str]:
        found = search.search(db, data_dir, q, catalog.Filters(**filters), neighbours="none")
        return [h.source_ref for h in found]

    # "Caroline" is a word of turn 4 (and of the context of the two after it) only
    assert refs("Caroline")[:1] == [f"{file_id}:4"]
    assert f"{file_id}:1" not in refs("Caroline")
    assert refs("puppy", speaker="caroline") == [f"{file_id}:1", f"{file_id}:3"]
    assert refs("puppy", speaker="Mel") == [f"{file_id}:2"]  # by its context
    assert refs("pottery", speaker="CAROLINE") == [f"{file_id}:5"]
    assert refs("notes", speaker="Caroline") == []
    assert refs("notes") == [f"{plain}:1"]
    # the turn after a hit, in another speaker's voice, is not brought in under the filter
    nexts = search.search(db, data_dir, "adopted", catalog.Filters(speaker="Caroline"))
    assert [h.seq for h in nexts] == [1, 3]
    # what reindex makes is the same; a redaction forgets a speaker's turn whole
    before = refs("puppy couch", speaker="Caroline")
    with db.transaction() as conn:
        catalog.clear(conn)
    integrity.reindex(db, file_locks, data_dir)
    assert refs("puppy couch", speaker="Caroline") == before
    redaction.redact(db, file_locks, data_dir, f"{file_id}:3", rewrite.Who("test", "asked"))
    assert refs("couch") == []
    assert refs("biscuit", speaker="Caroline") == []
    assert integrity.fsck(db, data_dir) == []


def test_a_bad_match_is_refused(db: database.Database, data_dir: Path) -> None:
    with pytest.raises(errors.InvalidInput, match="match must be"):
        search.search(db, data_dir, "tea", match="some")  # type: ignore[arg-type]


def test_the_migration_to_stemmed_terms_indexes_every_message_again(
    db: database.Database, data_dir: Path
) -> None:
    """A store from before stemming (schema 0009): migrating makes its terms again."""
    from alembic import command

    file_id = session(db, data_dir, "pre", ["we decided on retries", "数据 in old files"])
    with db.engine.begin() as conn:
        config = schema.alembic_config()
        config.attributes["connection"] = conn
        catalog.clear(conn)  # as good as terms the stemmed queries do not find
    assert search.search(db, data_dir, "deciding") == []
    with db.engine.begin() as conn:
        config.attributes["connection"] = conn
        command.downgrade(config, "0009")
    integrity.migrate(db.engine, data_dir=data_dir)
    found = search.search(db, data_dir, "deciding", match="all")
    assert [h.source_ref for h in found] == [f"{file_id}:1"]
    assert integrity.fsck(db, data_dir) == []


# ---------------------------------------------------------------------------------------------
# long messages: every word found, on both databases (docs/search.md, "Long messages")

#: 676 different two-letter words, each about 30 times in 20,000
_PAIRS = [a + b for a in "bcdfghjklmnpqrstvwxz" for b in "aeiouy"] * 6


def _two_letter_words(n: int) -> str:
    return " ".join(_PAIRS[i % len(_PAIRS)] for i in range(n))


def test_a_phrase_past_postgresqls_last_position_is_found(
    db: database.Database, data_dir: Path
) -> None:
    """A tsvector keeps positions up to 16,383 and 256 of a term: past either, a phrase was
    not found on PostgreSQL."""
    varied = _two_letter_words(20_000) + " crimson walrus"  # 60,000 characters
    same = " ".join(["ab"] * 1_000) + " crimson walrus ab"  # "ab" a thousand times first
    assert len(varied) < 100_000
    file_id = session(db, data_dir, "long", ["crimson, then a walrus", varied, same, "walrus"])

    def refs(q: str, match: Any = "all") -> list[str]:
        return [r.source_ref for r in search.search(db, data_dir, q, limit=10, match=match)]

    assert sorted(refs('"crimson walrus"')) == [f"{file_id}:2", f"{file_id}:3"]
    # ranked, the turn after them too: the phrase is in its context terms (the turns before)
    ranked_refs = refs('"crimson walrus"', "any")
    assert sorted(ranked_refs) == [f"{file_id}:{s}" for s in (2, 3, 4)]
    assert refs('"walrus crimson"') == []
    assert refs('"ab crimson walrus ab"') == [f"{file_id}:3"]
    snippets = [h.snippet for h in search.search(db, data_dir, '"crimson walrus"', match="all")]
    assert all("crimson walrus" in s for s in snippets) and len(snippets) == 2


def test_a_message_of_a_million_bytes_of_hashes_is_indexed_whole(
    db: database.Database, data_dir: Path
) -> None:
    """16,000 unique 64-character words are more than one tsvector takes (1 MiB)."""
    hashes = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(16_000)]
    file_id = session(db, data_dir, "hashes", [" ".join(hashes) + " crimson walrus"])
    for q in (
        '"crimson walrus"',
        f"{hashes[0]} {hashes[-1]}",
        f'"{hashes[14491]} {hashes[14492]}"',
    ):
        found = search.search(db, data_dir, q, match="all")
        assert [h.source_ref for h in found] == [f"{file_id}:1"]


def test_text_past_the_first_100000_characters_is_searchable(
    db: database.Database, data_dir: Path, file_locks: locks.FileLocks
) -> None:
    """Every word of a long message or upload is indexed: words far apart in it match a
    query together, and a redaction, an erasure and a reindex keep its terms in step."""
    text = "zephyr opens " + _two_letter_words(60_000) + " then the quartz obelisk stands"
    assert len(text) > 180_000
    file_id = session(db, data_dir, "doc", ["a quartz mention", text, "an obelisk mention"])
    upload = journal.ingest_upload(
        db, {"agent_id": "hermes", "filename": "big.md", "content": text.replace("zephyr", "x")}
    )
    journal.flush(db, data_dir, upload.file_id)

    def refs(q: str, match: Any = "all") -> list[str]:
        return [r.source_ref for r in search.search(db, data_dir, q, limit=10, match=match)]

    long, uploaded = f"{file_id}:2", f"{upload.file_id}:1"
    assert sorted(refs('"quartz obelisk"')) == sorted([long, uploaded])
    assert refs('zephyr "quartz obelisk" stands') == [long]  # words 60,000 terms apart
    assert refs("zephyr mention") == []  # every word in one message, not across messages
    assert sorted(refs('"quartz obelisk"', "any")[:2]) == sorted([long, uploaded])
    hit = search.search(db, data_dir, '"obelisk stands" zephyr', limit=1, match="all")[0]
    assert hit.source_ref == long and "quartz obelisk stands" in hit.snippet
    # the filters hold for a long message as for any other
    doc = catalog.Filters(agent_id="hermes", session_key="doc", role="user")
    found = search.search(db, data_dir, "zephyr obelisk", doc, limit=1, match="all")
    assert [h.source_ref for h in found] == [long]
    assert ranked(db, data_dir, '"quartz obelisk"', session_key="doc")[0] == long
    assert ranked(db, data_dir, '"quartz obelisk"', agent_id="nobody") == []
    assert refs("zephyr") == [long]
    assert search.search(db, data_dir, "zephyr", catalog.Filters(role="tool"), match="all") == []

    redaction.redact(db, file_locks, data_dir, long, rewrite.Who("t", "asked"))
    assert refs('"quartz obelisk"') == [uploaded]
    assert refs("zephyr") == []
    erasure.erase_file(db, file_locks, data_dir, upload.file_id, rewrite.Who("t", "asked"))
    assert refs('"quartz obelisk"') == []
    assert refs("quartz") == [f"{file_id}:1"]
    if db.postgres:
        with db.reading() as conn:
            parts = conn.execute(sa.text("SELECT count(*) FROM message_term_parts")).scalar()
        assert parts == 0

    again = session(db, data_dir, "again", [text])
    with db.transaction() as conn:
        catalog.clear(conn)
    assert refs('"quartz obelisk"') == []
    integrity.reindex(db, file_locks, data_dir)
    assert refs('zephyr "quartz obelisk"') == [f"{again}:1"]
    assert integrity.fsck(db, data_dir) == []


def test_fsck_finds_a_long_message_whose_segments_are_gone(
    db: database.Database, data_dir: Path, file_locks: locks.FileLocks
) -> None:
    """On PostgreSQL a long message's terms are all in its segments: fsck finds one that lost
    them (or a message whose words are missing from its one tsvector), and a reindex brings
    them back. A message without words, whose tsvector is empty too, is not taken for one."""
    text = "zephyr " + _two_letter_words(20_000)
    file_id = session(db, data_dir, "doc", ["a first turn", text, "?!", "short words here"])
    assert integrity.fsck(db, data_dir) == []
    if not db.postgres:
        return  # SQLite keeps any message's terms in its one row
    with db.transaction() as conn:
        conn.execute(sa.text("DELETE FROM message_term_parts WHERE part > 0"))
    found = integrity.fsck(db, data_dir)
    assert [(p.file_id, p.kind) for p in found] == [
        (file_id, integrity.Finding.SEARCH_INDEX_MISSING)
    ]
    assert "1 messages lack search terms, first at seq 2" in found[0].detail
    integrity.reindex(db, file_locks, data_dir)
    assert integrity.fsck(db, data_dir) == []
    with db.transaction() as conn:  # a short message's terms emptied
        conn.execute(
            sa.text(
                "UPDATE message_terms SET tsv = ''::tsvector WHERE id = (SELECT id FROM "
                "messages WHERE file_id = :f AND seq = 4)"
            ),
            {"f": file_id},
        )
    found = integrity.fsck(db, data_dir)
    assert [p.detail for p in found] == [
        "1 messages lack search terms, first at seq 4 (run sgme reindex)"
    ]


def test_a_long_message_keeps_its_speaker_and_context_beside_its_segments(
    db: database.Database, data_dir: Path, file_locks: locks.FileLocks
) -> None:
    """A long message (in segments on PostgreSQL) is still its speaker's under speaker=, is
    found by the turn before it through its context terms, and a redaction of that turn makes
    its terms again, segments and all."""
    long = "Mel: " + _two_letter_words(20_000) + " then the quartz obelisk"
    said = ["Caroline: the garnet lantern is lit", long, "Caroline: fine"]
    messages = [
        {"role": "assistant" if i == 1 else "user", "content": text, "ts": ts(i)}
        for i, text in enumerate(said)
    ]
    body = {
        "agent_id": "hermes",
        "session_key": "long-dialogue",
        "metadata": {"speakers": ["Caroline", "Mel"]},
        "messages": messages,
    }
    file_id = journal.ingest(db, body).file_id
    journal.flush(db, data_dir, file_id)
    first, long_ref, last = (f"{file_id}:{s}" for s in (1, 2, 3))

    def refs(q: str, match: Any = "any", **filters: Any) -> list[str]:
        f = catalog.Filters(**filters)
        found = search.search(db, data_dir, q, f, limit=10, match=match, neighbours="none")
        return [h.source_ref for h in found]

    def parts() -> int:
        with db.reading() as conn:
            query = sa.text("SELECT count(*) FROM message_term_parts")
            return int(conn.execute(query).scalar_one())

    if db.postgres:
        assert parts() > 1
    assert refs('"quartz obelisk"', "all", speaker="Mel") == [long_ref]
    assert refs('"quartz obelisk"', "all", speaker="Caroline") == []
    assert refs('"quartz obelisk"', speaker="Mel") == [long_ref]
    assert refs('"quartz obelisk"', speaker="Caroline") == [last]  # by its context
    assert refs("mel", "all") == []  # the leading name is a tag, not a word
    # the long message by its context: the turn before it named the lantern
    lantern = refs('"garnet lantern"')
    assert lantern[0] == first and sorted(lantern) == [first, long_ref, last]
    assert refs('"garnet lantern"', speaker="Mel") == [long_ref]

    redaction.redact(db, file_locks, data_dir, first, rewrite.Who("test", "asked"))
    assert refs("garnet lantern") == []
    assert refs('"quartz obelisk"', "all") == [long_ref]
    assert refs('"quartz obelisk"', "all", speaker="Mel") == [long_ref]
    if db.postgres:
        assert parts() > 1
    assert integrity.fsck(db, data_dir) == []


def test_sqlite_and_postgres_rank_long_messages_alike(tmp_path: Path, postgres_url: str) -> None:
    """A long message is one message to BM25 on both: the same matches, the same scores."""
    corpus = [
        "the quartz obelisk in the garden",
        _two_letter_words(30_000) + " quartz obelisk " + _two_letter_words(500),
        " ".join(["quartz"] * 600) + " obelisk garden",
        "garden party notes",
        _two_letter_words(2_000) + " garden quartz",
    ]
    queries = ['"quartz obelisk"', "quartz garden", "obelisk", '"obelisk garden"', "ba ce"]
    answers, scores = [], []
    for url in (f"sqlite:///{tmp_path / 'index.sqlite3'}", postgres_url):
        db = database.Database.from_url(url)
        database.migrate(db.engine)
        if db.postgres:
            with db.engine.begin() as conn:
                catalog.clear(conn)
                conn.execute(sa.text("TRUNCATE raw_files, append_journal, append_keys CASCADE"))
        data_dir = tmp_path / f"data-{db.dialect.name}"
        session(db, data_dir, "long", corpus)
        answers.append(
            [sorted(h.seq for h in search.search(db, data_dir, q, match="all")) for q in queries]
        )
        scores.append(
            [[(h.seq, round(h.score, 4)) for h in search.search(db, data_dir, q)] for q in queries]
        )
        db.dispose()
    assert answers[0] == answers[1]
    assert answers[0] == [[1, 2, 3], [1, 3, 5], [1, 2, 3], [3], [2, 5]]
    assert scores[0] == scores[1]


def test_the_migration_to_whole_messages_indexes_every_message_again(
    db: database.Database, data_dir: Path
) -> None:
    """A store from before (schema 0013), its long messages cut: migrating indexes them whole."""
    from alembic import command

    file_id = session(db, data_dir, "pre", ["x " * 60_000 + "crimson walrus"])
    with db.engine.begin() as conn:
        config = schema.alembic_config()
        config.attributes["connection"] = conn
        catalog.clear(conn)  # as good as terms cut after 100,000 characters
        command.downgrade(config, "0013")
    integrity.migrate(db.engine, data_dir=data_dir)
    found = search.search(db, data_dir, '"crimson walrus"', match="all")
    assert [h.source_ref for h in found] == [f"{file_id}:1"]
    assert integrity.fsck(db, data_dir) == []


def test_the_migration_to_context_terms_indexes_every_message_again(
    db: database.Database, data_dir: Path
) -> None:
    """A store from before context terms (schema 0014): migrating makes every message's terms
    again, with the turns before it; without the data directory, reindex does."""
    from alembic import command

    file_id = session(db, data_dir, "ctx", ["which tea do you like?", "Oolong, always", "ok"])

    def downgraded() -> None:
        with db.engine.begin() as conn:
            config = schema.alembic_config()
            config.attributes["connection"] = conn
            command.downgrade(config, "0014")

    def answers() -> list[str]:
        hits = search.search(db, data_dir, "tea", neighbours="none")
        return [h.source_ref for h in hits]

    everything = [f"{file_id}:{s}" for s in (1, 2, 3)]
    assert answers() == everything
    downgraded()
    integrity.migrate(db.engine, data_dir=data_dir)
    assert answers() == everything
    assert integrity.fsck(db, data_dir) == []
    downgraded()
    database.migrate(db.engine)  # no data directory: the terms wait for reindex
    assert answers() == []
    integrity.reindex(db, locks.FileLocks(db, data_dir, timeout=5), data_dir)
    assert answers() == everything
