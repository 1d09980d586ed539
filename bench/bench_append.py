"""Library-level append benchmark: ``journal.ingest`` + ``journal.flush`` in messages per second,
at 1 and at 100 messages per call, on SQLite (a temp file) and PostgreSQL (a temp database
``sgme_bench_<rand>``, dropped afterwards), against a raw ``write + fsync`` loop writing the same
rendered blocks to the same disk in the same run.

    .venv/bin/python bench/bench_append.py [--quick] [--rounds N] [--no-postgres]
                                           [--postgres ADMIN_URL] [--dir DIR]
    .venv/bin/python bench/bench_append.py --profile sqlite-1   # cProfile of one case
    .venv/bin/python bench/bench_append.py --baseline DIR      # this code against DIR's

Cases, each timed on one open session (the first append, which creates the file, is untimed):

* ``ingest+flush``: every call is acknowledged and then flushed (written + fsynced + committed)
  before the next — the synchronous ``?wait=flushed`` path; compare with ``write+fsync``.
* ``ingest, async flush`` (1 per call only): calls are acknowledged as fast as they come while
  one flusher thread drains the kicks, as the embedded worker does (docs/design.md §3 "coalesced
  kicks"); the clock stops when everything is on disk.

Rounds are interleaved (raw, SQLite, PostgreSQL, raw, …) and the best round of each case is
reported, so a neighbour's burst of disk traffic skews one round, not the ratio.
Targets (SQLite, ``ingest+flush``): >= 1,500 msg/s at 1 per call, >= 30,000 msg/s at 100.

With ``--baseline DIR`` (a tree of other code: ``git archive REV pipeline workers | tar -x -C
DIR``) only ``ingest+flush`` runs, on SQLite and on PostgreSQL (not with ``--no-postgres``), at
1 and 100 messages a call, each round in a fresh subprocess per tree and database, the trees
alternating: the best of each and their ratio, and the CPU
time a message of each (the process's, its threads' too; the least of the rounds), the
figure that moves least with a busy shared disk.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import functools
import json
import math
import os
import pstats
import queue
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa
import subrun

# the code measured: this checkout's, or another tree's (--code, a --baseline round's)
if "--code" in sys.argv:
    sys.path.insert(0, sys.argv[sys.argv.index("--code") + 1])

from pipeline import database, document, journal, locks, terms
from pipeline import flush as flushing

DEFAULT_POSTGRES = os.environ.get(
    "SGME_BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
TARGETS = {("sqlite", "ingest+flush", 1): 1_500.0, ("sqlite", "ingest+flush", 100): 30_000.0}
CONTENT = "The quick brown fox jumps over the lazy dog. " * 4  #: ~180 bytes, a short chat turn
TS = "2026-08-03T11:18:06Z"


@dataclass(frozen=True)
class Result:
    backend: str
    case: str
    batch: int
    messages: int
    seconds: float
    cpu: float = 0.0  #: seconds of the process's CPU time (its threads' too) in the round

    @property
    def rate(self) -> float:
        return self.messages / self.seconds


def message(i: int) -> dict[str, str]:
    return {"role": "user" if i % 2 else "assistant", "content": f"{i} {CONTENT}", "ts": TS}


_LOCKS: dict[tuple[int, Path], locks.FileLocks] = {}


def flush_file(db: database.Database, data_dir: Path, file_id: str) -> flushing.FlushResult:
    """A flush as an embedding program makes it: one set of file locks per data directory
    (built once, as the runtime does), not one per call."""
    found = _LOCKS.get((id(db), data_dir))
    if found is None:
        found = _LOCKS[(id(db), data_dir)] = locks.FileLocks(db, data_dir, timeout=30)
    return flushing.flush(db, found, data_dir, file_id)


def open_session(engine: database.Database, data_dir: Path) -> str:
    """A new session with one flushed message; returns its session_key."""
    session = f"bench-{uuid.uuid4().hex[:12]}"
    first = journal.ingest(
        engine, {"agent_id": "bench", "session_key": session, "messages": [message(0)]}
    )
    flush_file(engine, data_dir, first.file_id)
    return session


def append_bodies(session: str, batch: int, calls: int) -> list[dict[str, Any]]:
    """``calls`` append bodies of ``batch`` messages each for one session."""
    return [
        {
            "agent_id": "bench",
            "session_key": session,
            "messages": [message(call * batch + i) for i in range(batch)],
        }
        for call in range(calls)
    ]


def run_sync(engine: database.Database, data_dir: Path, batch: int, calls: int) -> float:
    """``calls`` appends of ``batch`` messages, each flushed before the next."""
    bodies = append_bodies(open_session(engine, data_dir), batch, calls)
    start = time.perf_counter()
    for body in bodies:
        result = journal.ingest(engine, body)
        flush_file(engine, data_dir, result.file_id)
    return time.perf_counter() - start


def run_async(engine: database.Database, data_dir: Path, batch: int, calls: int) -> float:
    """``calls`` appends acknowledged back to back; one flusher thread follows the kicks."""
    bodies = append_bodies(open_session(engine, data_dir), batch, calls)
    kicks: queue.SimpleQueue[str | None] = queue.SimpleQueue()
    failures: list[BaseException] = []

    def flusher() -> None:
        while (file_id := kicks.get()) is not None:
            try:
                # appends acknowledged during a flush did not kick: flush again while it says so
                while flush_file(engine, data_dir, file_id).more:
                    pass
            except BaseException as exc:  # surfaced below, not lost in the thread
                failures.append(exc)
                return

    thread = threading.Thread(target=flusher)
    start = time.perf_counter()
    thread.start()
    for body in bodies:
        result = journal.ingest(engine, body)
        if result.kick:
            kicks.put(result.file_id)
    kicks.put(None)
    thread.join()
    elapsed = time.perf_counter() - start
    if failures:
        raise failures[0]
    # every kick was followed, so nothing may be left behind
    assert flushing.stale_files(engine, age=0) == []
    return elapsed


def run_raw(directory: Path, batch: int, calls: int) -> float:
    """The floor: the same rendered blocks, ``batch`` of them per ``write`` + ``fsync``."""
    chunk = b"".join(
        document.render_block(
            document.Message(role="user", content=f"{i} {CONTENT}", ts=TS), first=False
        ).encode()
        for i in range(batch)
    )
    path = directory / f"raw-{batch}-{uuid.uuid4().hex[:8]}.md"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
    try:
        start = time.perf_counter()
        for _ in range(calls):
            os.write(fd, chunk)
            os.fsync(fd)
        return time.perf_counter() - start
    finally:
        os.close(fd)
        path.unlink()


@contextlib.contextmanager
def sqlite_engine(root: Path) -> Iterator[database.Database]:
    engine = database.Database.from_url(f"sqlite:///{root / 'index.sqlite3'}")
    database.migrate(engine.engine)
    try:
        yield engine
    finally:
        engine.dispose()


@contextlib.contextmanager
def postgres_engine(admin_url: str) -> Iterator[database.Database]:
    admin = sa.create_engine(database.normalize_url(admin_url), isolation_level="AUTOCOMMIT")
    name = f"sgme_bench_{uuid.uuid4().hex[:10]}"
    try:
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    except sa.exc.OperationalError:
        admin.dispose()
        raise
    engine = database.Database.from_url(admin_url.rsplit("/", 1)[0] + f"/{name}")
    try:
        database.migrate(engine.engine)
        yield engine
    finally:
        engine.dispose()
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


Case = tuple[str, str, int, int, Callable[[], float]]  #: backend, case, batch, calls, run


def cases_for(
    backend: str, engine: database.Database, data_dir: Path, plan: dict[int, int]
) -> list[Case]:
    data_dir.mkdir(parents=True, exist_ok=True)
    cases: list[Case] = []
    for batch, calls in plan.items():
        run_sync(engine, data_dir, batch, 5)  # warm-up, untimed: statement caches, pools
        cases.append(
            (
                backend,
                "ingest+flush",
                batch,
                calls,
                functools.partial(run_sync, engine, data_dir, batch, calls),
            )
        )
    calls = plan[1]
    cases.append(
        (backend, "ingest, async flush", 1, calls, lambda: run_async(engine, data_dir, 1, calls))
    )
    return cases


def unstemmed(cases: list[Case]) -> list[Case]:
    """The ingest+flush cases run with every word its own term (the stems' cache, which
    stems each word it misses, in place of one that gives each word back, cut to a term's
    length)."""

    class Plain(dict[str, str]):
        def __missing__(self, word: str) -> str:
            return word[: terms.MAX_TERM]  # a term is cut there, as the stems' cache cuts it

    def plain(run: Callable[[], float]) -> Callable[[], float]:
        def timed() -> float:
            stems = terms._STEMS
            terms._STEMS = Plain()  # type: ignore[assignment]
            try:
                return run()
            finally:
                terms._STEMS = stems

        return timed

    return [
        (f"{backend} (unstemmed)", name, batch, calls, plain(run))
        for backend, name, batch, calls, run in cases
        if name == "ingest+flush"
    ]


def measure(cases: list[Case], rounds: int) -> list[Result]:
    """Interleaved rounds; the best round of each case."""
    best: dict[tuple[str, str, int], Result] = {}
    for _ in range(rounds):
        for backend, name, batch, calls, run in cases:
            cpu = time.process_time()
            seconds = run()
            cpu = time.process_time() - cpu
            result = Result(backend, name, batch, batch * calls, seconds, cpu)
            key = (backend, name, batch)
            if key not in best or result.rate > best[key].rate:
                best[key] = result
    return list(best.values())


def print_table(results: list[Result]) -> None:
    floor = {r.batch: r.rate for r in results if r.backend == "raw"}
    print(
        f"| {'backend':<8} | {'case':<20} | {'msgs/call':>9} | {'messages':>8} | {'msg/s':>9} "
        f"| {'vs raw':>6} | {'target':>14} |"
    )
    print(f"|{'-' * 10}|{'-' * 22}|{'-' * 11}|{'-' * 10}|{'-' * 11}|{'-' * 8}|{'-' * 16}|")
    for r in results:
        case = f"write+fsync per {r.batch}" if r.backend == "raw" else r.case
        ratio = "1" if r.backend == "raw" else f"{r.rate / floor[r.batch]:.3f}"
        goal = TARGETS.get((r.backend, r.case, r.batch))
        target = "" if goal is None else ("met" if r.rate >= goal else "missed") + f" {goal:,.0f}"
        print(
            f"| {r.backend:<8} | {case:<20} | {r.batch:>9} | {r.messages:>8} | {r.rate:>9,.0f} "
            f"| {ratio:>6} | {target:>14} |"
        )


#: what a profiled function is counted as, by the first rule its file or name matches
PARTS: tuple[tuple[str, Callable[[str, str], bool]], ...] = (
    ("sqlite commits", lambda fn, name: "'commit' of 'sqlite3.Connection'" in name),
    ("fsync / fdatasync of the file", lambda fn, name: "fsync" in name or "fdatasync" in name),
    ("SQLite statements (driver)", lambda fn, name: "sqlite3.Cursor" in name),
    ("SQLAlchemy (connections, transactions, events)", lambda fn, name: "sqlalchemy" in fn),
    ("validation (pydantic)", lambda fn, name: "pydantic" in fn or "/validation.py" in fn),
    ("render and locate blocks (document)", lambda fn, name: "/document.py" in fn),
    ("database.Prepared: binds and rows", lambda fn, name: "/database/statements.py" in fn),
    ("catalog and search terms", lambda fn, name: "/catalog.py" in fn or "/terms.py" in fn),
    ("group committer", lambda fn, name: "/commits.py" in fn or "/transactions.py" in fn),
    (
        "file: lock, open, write, paths (store)",
        lambda fn, name: "/store.py" in fn or "posix" in name or "pathlib" in fn or "fcntl" in name,
    ),
    (
        "ingest, flush, ledger, index logic",
        lambda fn, name: any(
            m in fn for m in ("/ingest.py", "/flush.py", "/ledger.py", "/index.py", "/journal.py")
        ),
    ),
)


def profile(run: Callable[[], float], messages: int) -> None:
    """cProfile ``run``: the 40 costliest calls, then its own time summed by :data:`PARTS`."""
    profiler = cProfile.Profile()
    profiler.enable()
    run()
    profiler.disable()
    stats = pstats.Stats(profiler)
    stats.sort_stats("cumulative").print_stats(40)
    parts: dict[str, float] = {}
    for (fn, _, name), (_, _, own, _, _) in stats.stats.items():  # type: ignore[attr-defined]
        part = next((p for p, rule in PARTS if rule(fn, name)), "other Python")
        parts[part] = parts.get(part, 0.0) + own
    total = sum(parts.values())
    print("| part | µs per message | share |")
    print("|---|---|---|")
    for part, seconds in sorted(parts.items(), key=lambda kv: -kv[1]):
        print(f"| {part} | {seconds / messages * 1e6:.0f} | {seconds / total:.0%} |")
    print(f"| total (under the profiler) | {total / messages * 1e6:.0f} | 100% |")


def against(
    baseline: Path,
    plan: dict[int, int],
    rounds: int,
    where: Path | None,
    backends: dict[str, str | None],
) -> None:
    """Each backend's ingest+flush (``backends``: its name and, for PostgreSQL, the admin URL)
    of this checkout and of ``baseline``, a fresh subprocess per round, tree and backend, the
    trees alternating; the best round of each, and the ratio."""
    trees = {"this code": Path(__file__).resolve().parents[1], "baseline": baseline}
    #: (backend, tree) -> batch -> the best rate, and the least CPU µs a message
    best: dict[tuple[str, str], dict[str, float]] = {}
    cpu: dict[tuple[str, str], dict[str, float]] = {}
    for _ in range(rounds):
        for backend, url in backends.items():
            for name, code in trees.items():
                argv = [sys.executable, __file__, "--case", "--code", str(code)]
                argv += ["--backend", backend] + (["--postgres", url] if url else [])
                argv += ["--quick"] if plan[1] == 300 else []
                argv += ["--dir", str(where)] if where else []
                found = subrun.case(argv, f"the {backend} round of {code}")
                for batch, (rate, us) in found.items():
                    rates = best.setdefault((backend, name), {})
                    rates[batch] = max(rates.get(batch, 0.0), rate)
                    least = cpu.setdefault((backend, name), {})
                    least[batch] = min(least.get(batch, math.inf), us)
    for backend in backends:
        title = "SQLite" if backend == "sqlite" else "PostgreSQL"
        print(
            f"{title} ingest+flush, msg/s, best of {rounds} alternating rounds; baseline {baseline}"
        )
        print()
        print(
            "| msgs/call | this code | baseline | this vs baseline | target "
            "| CPU µs/msg, this code | baseline | this vs baseline |"
        )
        print("|---|---|---|---|---|---|---|---|")
        for batch, mine in best[(backend, "this code")].items():
            theirs = best[(backend, "baseline")][batch]
            goal = TARGETS.get((backend, "ingest+flush", int(batch)))
            met = "–" if goal is None else f"{'met' if mine >= goal else 'missed'} {goal:,.0f}"
            us, base_us = cpu[(backend, "this code")][batch], cpu[(backend, "baseline")][batch]
            print(
                f"| {batch} | {mine:,.0f} | {theirs:,.0f} | {mine / theirs:.2f}x | {met} "
                f"| {us:,.0f} | {base_us:,.0f} | {base_us / us:.2f}x |"
            )
        print()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer messages, one round")
    parser.add_argument("--rounds", type=int, default=None, help="rounds per case (default 3)")
    parser.add_argument("--postgres", default=DEFAULT_POSTGRES, help="admin URL for PostgreSQL")
    parser.add_argument("--no-postgres", action="store_true", help="skip PostgreSQL")
    parser.add_argument("--dir", type=Path, default=None, help="where to put files (a temp dir)")
    parser.add_argument("--profile", choices=["sqlite-1", "sqlite-100"], default=None)
    parser.add_argument(
        "--unstemmed",
        action="store_true",
        help="also each database's ingest+flush with the search terms not stemmed (as before "
        "issue 18), interleaved with the stemmed rounds: the stemmer's cost to appends",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        help="a tree of other code to compare (SQLite, and PostgreSQL unless --no-postgres)",
    )
    parser.add_argument("--case", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--backend", choices=["sqlite", "postgres"], help=argparse.SUPPRESS)
    parser.add_argument("--code", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()

    plan = {1: 300, 100: 20} if args.quick else {1: 2000, 100: 100}  #: calls per batch size
    rounds = args.rounds or (1 if args.quick else 3)
    if args.baseline and not args.case:
        backends: dict[str, str | None] = {"sqlite": None}
        if not args.no_postgres:
            backends["postgres"] = args.postgres
        against(args.baseline, plan, rounds, args.dir, backends)
        return
    root = Path(tempfile.mkdtemp(prefix="sgme-bench-", dir=args.dir))
    try:
        if args.case:  # one round of a backend's ingest+flush, in this process: rates as JSON
            imported = Path(database.__file__).resolve()
            if args.code and not imported.is_relative_to(args.code.resolve()):
                raise SystemExit(f"--code {args.code}: the package came from {imported}")
            backend = args.backend or "sqlite"
            opened = sqlite_engine(root) if backend == "sqlite" else postgres_engine(args.postgres)
            with opened as engine:
                found = measure(cases_for(backend, engine, root / "data", plan)[:-1], 1)
            print(json.dumps({str(r.batch): [r.rate, r.cpu / r.messages * 1e6] for r in found}))
            return
        if args.profile:
            batch = int(args.profile.split("-")[1])
            with sqlite_engine(root) as engine:
                run_sync(engine, root / "data", batch, max(1, plan[batch] // 10))
                profile(
                    lambda: run_sync(engine, root / "data", batch, plan[batch]),
                    messages=batch * plan[batch],
                )
            return

        note = "PostgreSQL skipped (--no-postgres)" if args.no_postgres else ""
        with contextlib.ExitStack() as stack:
            cases: list[Case] = [
                ("raw", "write+fsync", batch, calls, functools.partial(run_raw, root, batch, calls))
                for batch, calls in plan.items()
            ]
            sqlite = stack.enter_context(sqlite_engine(root))
            cases += cases_for("sqlite", sqlite, root / "data-sqlite", plan)
            if args.unstemmed:
                cases += unstemmed(cases_for("sqlite", sqlite, root / "data-sqlite-u", plan))
            if not args.no_postgres:
                try:
                    pg = stack.enter_context(postgres_engine(args.postgres))
                    cases += cases_for("postgres", pg, root / "data-pg", plan)
                    if args.unstemmed:
                        cases += unstemmed(cases_for("postgres", pg, root / "data-pg-u", plan))
                except sa.exc.OperationalError as exc:
                    note = f"PostgreSQL skipped: not reachable at {args.postgres} ({exc.orig})"
            results = measure(cases, rounds)
        print(
            f"$ {Path(sys.executable).name} {' '.join(sys.argv)}   # {rounds} round(s), best "
            f"of each; {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, "
            f"SQLAlchemy {sa.__version__}; files in {root}"
        )
        print_table(results)
        if note:
            print(note)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
