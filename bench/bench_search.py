"""The message catalog and search, measured (issue: the message index).

1. Reads that don't grow with the file: resolving one source_ref (with a neighbour on each
   side) and reading a page of 20 messages near the end, in a file of 10 messages and one of
   20,000, through the catalog (``reader.resolve`` / ``reader.messages``), against what every
   read did before the catalog: read the whole file and ``document.parse`` it — same process,
   same files. Target: the two sizes within 2x of each other.
2. Search latency: p50/p99 of ``search.search`` over ``--messages`` (1,000,000) messages in
   2,000 sessions of 50 agents, English-like text with a tenth in Chinese and Japanese,
   queries drawn from the corpus (single words, two words, phrases, CJK substrings, some with
   an agent filter), on SQLite and on PostgreSQL, every word required (``match=all``). Target
   on SQLite: p50 <= 20 ms, p99 <= 100 ms. Then the ranked search (``match=any``, the default;
   docs/search.md) for natural-language questions of 6-15 words: a few words of a message in
   a question's frame ("what did we say about … last week?"), some with an agent filter.
   Targets (issue 18, at 1,000,000 messages): SQLite p50 <= 30 ms, p99 <= 150 ms; PostgreSQL
   p50 <= 60 ms, p99 <= 300 ms. And the index build rate during ingest (messages/s through
   ``journal.flush``, which writes the catalog and the terms in its commit).
3. The cost of the search index to the append path: one-message appends through
   ``journal.ingest`` + ``journal.flush`` with the catalog as it is, and with the terms left
   out (the flush's ``catalog.add_ready`` writing only the rows, no search rows and no terms
   made), interleaved rounds, best of each. Target: at most 15% fewer appends/s.

    .venv/bin/python bench/bench_search.py [--messages 1000000] [--only reads|search|cost]
        [--keep DIR]  (the search stores kept, and reused by the next run with --keep DIR)
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]

import sqlalchemy as sa  # noqa: E402
from conftest import POSTGRES_ADMIN_URL, scratch_database  # noqa: E402

from pipeline import (  # noqa: E402
    catalog,
    database,
    document,
    journal,
    reader,
    search,
    store,
    tables,
    terms,
)

AGENTS = 50
SESSIONS = 2000
SEED = 7
_CJK = (
    "数据库迁移已经完成我们决定使用索引系统日志服务器配置用户偏好喜欢绿茶咖啡早上"
    "会议记录项目计划测试结果部署失败重试连接网络安全密码更新私はコーヒーよりも緑茶が好きです"
)


def words(rng: random.Random, n: int = 20000) -> list[str]:
    """A vocabulary of pronounceable made-up words."""
    syllables = [c + v for c in "bcdfghjklmnprstvwz" for v in "aeiou"]
    found: set[str] = set()
    while len(found) < n:
        found.add("".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))))
    return sorted(found)


def corpus(rng: random.Random, vocabulary: list[str], count: int) -> Iterator[str]:
    """``count`` messages: Zipf-distributed words, one in ten with a CJK sentence."""
    cumulative = list(itertools.accumulate(1 / (i + 1) for i in range(len(vocabulary))))
    for _ in range(count):
        text = " ".join(rng.choices(vocabulary, cum_weights=cumulative, k=rng.randint(8, 40)))
        if rng.random() < 0.1:
            start = rng.randrange(len(_CJK) - 12)
            text += " " + _CJK[start : start + rng.randint(4, 12)]
        yield text


def timed(func: Callable[[], Any], rounds: int) -> float:
    """The median seconds of ``func`` over ``rounds`` calls."""
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        func()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def fill(engine: Any, data_dir: Path, agent: str, key: str, texts: list[str]) -> str:
    file_id = ""
    for lo in range(0, len(texts), 1000):
        messages = [{"role": "user", "content": t} for t in texts[lo : lo + 1000]]
        body = {"agent_id": agent, "session_key": key, "messages": messages}
        file_id = journal.ingest(engine, body).file_id
    journal.flush(engine, data_dir, file_id)
    return file_id


# ---------------------------------------------------------------------------------------------
# 1. reads


def bench_reads(url: str, data_dir: Path, name: str) -> list[str]:
    engine = database.Database.from_url(url)
    database.migrate(engine.engine)
    rng = random.Random(SEED)
    vocabulary = words(rng, 2000)
    rows = []
    for count in (10, 20_000):
        texts = list(corpus(rng, vocabulary, count))
        file_id = fill(engine, data_dir, "reader", f"reads-{count}", texts)
        row = reader.get_file(engine, file_id)
        ref = f"{file_id}:{count - 1}"

        def whole(row: Any = row, seq: int = count - 1) -> None:
            data = store.read(store.checked(data_dir, row.path), row.flushed_bytes)
            doc = document.parse(data.decode("utf-8"), file_id=row.file_id)
            assert doc.messages[seq - 1].seq == seq

        rounds = 200 if count == 10 else 30
        ref_s = timed(functools.partial(reader.resolve, engine, data_dir, ref, context=1), rounds)
        page = functools.partial(
            reader.messages, engine, data_dir, file_id, after_seq=max(0, count - 20), limit=20
        )
        page_s = timed(page, rounds)
        whole_s = timed(whole, rounds)
        size = row.flushed_bytes
        rows.append((name, count, size, ref_s, page_s, whole_s))
    engine.dispose()
    small, large = rows
    out = [
        f"| {n} | {c:,} | {s / 1e6:.2f} | {r * 1e3:.2f} | {p * 1e3:.2f} | {w * 1e3:.2f} |"
        for n, c, s, r, p, w in rows
    ]
    out.append(
        f"| {name} | 20,000 / 10 | | {large[3] / small[3]:.2f}x | {large[4] / small[4]:.2f}x | "
        f"{large[5] / small[5]:.0f}x |"
    )
    return out


# ---------------------------------------------------------------------------------------------
# 2. search


def queries(rng: random.Random, texts: list[str], count: int) -> list[tuple[str, str | None]]:
    """Queries drawn from the corpus: (q, agent filter or None)."""
    found: list[tuple[str, str | None]] = []
    while len(found) < count:
        text = rng.choice(texts)
        tokens = text.split()
        kind = rng.random()
        if kind < 0.3:
            q = rng.choice(tokens)
        elif kind < 0.55:
            q = " ".join(rng.sample(tokens, min(2, len(tokens))))
        elif kind < 0.8:
            at = rng.randrange(max(1, len(tokens) - 2))
            q = '"' + " ".join(tokens[at : at + 3]) + '"'
        else:
            cjk = [t for t in tokens if not t.isascii()]
            if not cjk:
                continue
            run = cjk[0]
            at = rng.randrange(max(1, len(run) - 3))
            q = run[at : at + rng.randint(2, 4)]
        if not terms.terms(q):
            continue
        found.append((q, f"agent-{rng.randrange(AGENTS)}" if rng.random() < 0.3 else None))
    return found


OPENERS = (
    "what did we say about the",
    "do you remember the",
    "when did I mention",
    "where did we leave the",
    "remind me what happened with",
    "what was decided on",
)
CLOSERS = ("again?", "last week?", "in the meeting?", "?", "before the release?")


def questions(rng: random.Random, texts: list[str], count: int) -> list[tuple[str, str | None]]:
    """Questions of 6-15 words around 2-6 words of a message: (q, agent filter or None)."""
    found: list[tuple[str, str | None]] = []
    while len(found) < count:
        tokens = [t for t in rng.choice(texts).split() if t.isascii()]
        if len(tokens) < 2:
            continue
        picked = rng.sample(tokens, rng.randint(2, min(6, len(tokens))))
        q = " ".join([rng.choice(OPENERS), *picked, rng.choice(CLOSERS)])
        if not 6 <= len(q.split()) <= 15:
            continue
        found.append((q, f"agent-{rng.randrange(AGENTS)}" if rng.random() < 0.3 else None))
    return found


def latency(
    engine: database.Database,
    data_dir: Path,
    asked: list[tuple[str, str | None]],
    match: terms.Match,
) -> tuple[float, float, int]:
    """p50 and p99 ms of ``asked`` (after 50 untimed), and how many had hits."""
    for q, agent in asked[:50]:  # warm the caches
        search.search(engine, data_dir, q, catalog.Filters(agent_id=agent), limit=10, match=match)
    samples, hits = [], 0
    for q, agent in asked:
        begun = time.perf_counter()
        found = search.search(
            engine, data_dir, q, catalog.Filters(agent_id=agent), limit=10, match=match
        )
        samples.append(time.perf_counter() - begun)
        hits += bool(found)
    samples.sort()
    return samples[len(samples) // 2] * 1e3, samples[int(len(samples) * 0.99)] * 1e3, hits


class Built(NamedTuple):
    """What building a search store took, and a sample of its texts (for the questions)."""

    made: int  #: messages in the store
    flush_seconds: float | None  #: seconds in ``journal.flush`` (None: a kept store, reused)
    seconds: float | None  #: seconds ingesting and flushing (None: a kept store, reused)
    sample: list[str]  #: the first texts of each session, up to 20,000


def build(engine: database.Database, data_dir: Path, name: str, total: int) -> Built:
    """The corpus of ``total`` messages ingested and flushed, or, when ``engine``'s index holds
    it already (a ``--keep`` store), its sample drawn again from the same seed."""
    rng = random.Random(SEED)
    vocabulary = words(rng)
    per_session = max(1, total // SESSIONS)
    with engine.reading() as conn:
        there = conn.execute(sa.select(sa.func.count()).select_from(tables.messages)).scalar_one()
    kept = there == per_session * SESSIONS
    if there and not kept:
        raise SystemExit(f"{name}: the kept store holds {there:,} messages, not {total:,}")
    sample: list[str] = []
    started = time.perf_counter()
    flush_seconds = 0.0
    made = 0
    for s in range(SESSIONS):
        texts = list(corpus(rng, vocabulary, per_session))
        made += len(texts)
        if len(sample) < 20_000:
            sample.extend(texts[:10])
        if kept:
            continue
        for lo in range(0, len(texts), 1000):
            messages = [{"role": "user", "content": t} for t in texts[lo : lo + 1000]]
            body = {
                "agent_id": f"agent-{s % AGENTS}",
                "session_key": f"session-{s}",
                "messages": messages,
            }
            file_id = journal.ingest(engine, body).file_id
            flushed = time.perf_counter()
            journal.flush(engine, data_dir, file_id)
            flush_seconds += time.perf_counter() - flushed
        if s % 200 == 199:
            print(
                f"  {name}: {made:,} messages in {time.perf_counter() - started:.0f} s",
                file=sys.stderr,
            )
    if kept:
        return Built(made, None, None, sample)
    build = time.perf_counter() - started
    if engine.postgres:  # what autovacuum does soon after a bulk load (inserts too, since 13)
        with engine.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql("VACUUM ANALYZE")
    return Built(made, flush_seconds, build, sample)


def bench_search(url: str, data_dir: Path, name: str, total: int) -> list[str]:
    engine = database.Database.from_url(url)
    database.migrate(engine.engine)
    built = build(engine, data_dir, name, total)
    asked = queries(random.Random(SEED + 1), built.sample, 500)
    p50, p99, hits = latency(engine, data_dir, asked, "all")
    natural = questions(random.Random(SEED + 2), built.sample, 500)
    r50, r99, rhits = latency(engine, data_dir, natural, "any")
    engine.dispose()
    rates = "kept | kept"
    if built.flush_seconds is not None and built.seconds is not None:
        rates = f"{built.made / built.flush_seconds:,.0f} | {built.made / built.seconds:,.0f}"
    return [
        f"| {name} | {built.made:,} | {rates} | "
        f"{p50:.1f} | {p99:.1f} | {hits}/{len(asked)} | {r50:.1f} | {r99:.1f} | "
        f"{rhits}/{len(natural)} |"
    ]


# ---------------------------------------------------------------------------------------------
# 3. the cost to the append path


@contextlib.contextmanager
def without_terms() -> Iterator[None]:
    """The flush's catalog writing the rows but not the search terms, and no terms made for it
    (the flush makes them before its commit, with ``catalog.ready``)."""
    real_ready, real_add = catalog.ready, catalog.add_ready

    class Rows(NamedTuple):  # what the flush keeps for the file's next is nothing then
        owner: Any
        found: list[Any]
        recent: catalog.Recent = catalog.Recent()

    def rows_ready(owner: Any, found: Any, *, postgres: bool, before: Any = ()) -> Any:
        return Rows(owner, list(found))

    def add_rows(conn: Any, files: Any) -> None:
        for owner, found, _ in files:
            if found:
                catalog.add_rows(conn, owner, found)

    catalog.ready, catalog.add_ready = rows_ready, add_rows
    try:
        yield
    finally:
        catalog.ready, catalog.add_ready = real_ready, real_add


def bench_cost(url: str, data_dir: Path, name: str, appends: int) -> list[str]:
    engine = database.Database.from_url(url)
    database.migrate(engine.engine)
    rng = random.Random(SEED)
    texts = list(corpus(rng, words(rng, 5000), appends))
    rates: dict[str, list[float]] = {"with search": [], "without": []}
    for round_ in range(3):
        for label in ("with search", "without"):
            key = f"cost-{label}-{round_}"
            started = time.perf_counter()
            with without_terms() if label == "without" else contextlib.nullcontext():
                for text in texts:
                    body = {
                        "agent_id": "cost",
                        "session_key": key,
                        "messages": [{"role": "user", "content": text}],
                    }
                    result = journal.ingest(engine, body)
                    journal.flush(engine, data_dir, result.file_id)
            rates[label].append(appends / (time.perf_counter() - started))
    engine.dispose()
    best = {label: max(r) for label, r in rates.items()}
    change = best["with search"] / best["without"] - 1
    return [
        f"| {name} | {best['without']:,.0f} | {best['with search']:,.0f} | {change * 100:+.1f}% |"
    ]


def kept_database(name: str) -> str:
    """The URL of PostgreSQL database ``name``, made when missing and never dropped."""
    admin = sa.create_engine(
        database.normalize_url(POSTGRES_ADMIN_URL), isolation_level="AUTOCOMMIT"
    )
    with admin.connect() as conn:
        if not conn.execute(
            sa.text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": name}
        ).first():
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    return POSTGRES_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--appends", type=int, default=2000)
    parser.add_argument("--only", choices=("reads", "search", "cost"), action="append")
    parser.add_argument("--sqlite-only", action="store_true")
    parser.add_argument(
        "--keep",
        type=Path,
        metavar="DIR",
        help="keep the search stores (SQLite in DIR, PostgreSQL's database "
        "sgme_bench_search_N) and reuse them when they hold the corpus already",
    )
    args = parser.parse_args()
    only = set(args.only or ("reads", "search", "cost"))
    backends = ["sqlite"] if args.sqlite_only else ["sqlite", "postgres"]
    with tempfile.TemporaryDirectory(prefix="sgme-bench-search-") as tmp:
        root = Path(tmp)

        @contextlib.contextmanager
        def url(backend: str, label: str) -> Iterator[str]:
            if backend == "sqlite":
                yield f"sqlite:///{root / f'{label}.sqlite3'}"
            else:
                with scratch_database(f"sgme_bench_{label}") as found:
                    yield found

        if "reads" in only:
            print("## reads: ms per call (median)")
            print("| backend | messages | MB | ref ±1 | page of 20 | whole-file parse |")
            print("|---|---|---|---|---|---|")
            for backend in backends:
                with url(backend, "reads") as u:
                    for line in bench_reads(u, root / f"reads-{backend}", backend):
                        print(line, flush=True)

        def search_store(backend: str) -> contextlib.AbstractContextManager[str]:
            if args.keep is None:
                return url(backend, "search")
            if backend == "sqlite":
                args.keep.mkdir(parents=True, exist_ok=True)
                return contextlib.nullcontext(f"sqlite:///{args.keep / 'search.sqlite3'}")
            return contextlib.nullcontext(kept_database(f"sgme_bench_search_{args.messages}"))

        if "search" in only:
            print(f"\n## search over {args.messages:,} messages (10 best of each query)")
            print(
                "| backend | messages | index build msg/s (flush) | ingest+flush msg/s | "
                "match=all p50 ms | p99 ms | queries with hits | ranked questions p50 ms | "
                "p99 ms | questions with hits |"
            )
            print("|---|---|---|---|---|---|---|---|---|---|")
            for backend in backends:
                data_dir = (args.keep or root) / f"search-{backend}"
                with search_store(backend) as u:
                    for line in bench_search(u, data_dir, backend, args.messages):
                        print(line, flush=True)
        if "cost" in only:
            print(
                f"\n## the search index's cost to one-message appends ({args.appends:,} each, "
                "best of 3)"
            )
            print("| backend | appends/s without terms | with terms | change |")
            print("|---|---|---|---|")
            for backend in backends:
                with url(backend, "cost") as u:
                    for line in bench_cost(u, root / f"cost-{backend}", backend, args.appends):
                        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
