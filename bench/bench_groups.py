"""The group committer on PostgreSQL (docs/design.md §3): concurrent ``journal.ingest`` calls,
whose transactions the group committer combines, with its groups run first without savepoints
(``optimistic``, the default on PostgreSQL) against every piece in a savepoint of its own, in
alternating blocks in one process on one database: appends a second and the process' CPU an
append. A savepoint and its release are two round trips a piece on PostgreSQL.

    .venv/bin/python bench/bench_groups.py [--threads 32] [--per-thread 150] [--blocks 4]

The database is a new one of the run's own (SGME_TEST_POSTGRES_URL names the server), dropped
afterwards.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from conftest import scratch_database  # noqa: E402

from pipeline import database, journal  # noqa: E402


def _body(session_key: str) -> dict[str, Any]:
    return {
        "agent_id": "bench",
        "session_key": session_key,
        "messages": [{"role": "user", "content": "x" * 500}],
    }


def block(db: database.Database, threads: int, per_thread: int) -> tuple[float, float]:
    """``threads`` threads, each appending ``per_thread`` messages to a session of its own:
    appends a second, CPU µs an append."""

    def appending(t: int) -> None:
        for _ in range(per_thread):
            journal.ingest(db, _body(f"s{t}"))

    workers = [threading.Thread(target=appending, args=(t,)) for t in range(threads)]
    started, cpu = time.perf_counter(), time.process_time()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    appends = threads * per_thread
    return appends / (time.perf_counter() - started), (time.process_time() - cpu) / appends * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=32)
    parser.add_argument("--per-thread", type=int, default=150)
    parser.add_argument("--blocks", type=int, default=4, help="alternating blocks of each")
    args = parser.parse_args()
    found: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    with scratch_database("sgme_bench_groups") as url:
        db = database.Database.from_url(url)
        try:
            database.migrate(db.engine)
            for t in range(args.threads):  # the sessions' files exist before the clock starts
                journal.ingest(db, _body(f"s{t}"))
            for _ in range(args.blocks):
                for optimistic in (False, True):
                    db.group.optimistic = optimistic
                    found[optimistic].append(block(db, args.threads, args.per_thread))
        finally:
            db.dispose()
    appends = args.threads * args.per_thread
    print(f"\nPostgreSQL, {args.threads} threads, blocks of {appends} appends, alternating\n")
    print("| groups | appends/s (each block) | CPU µs an append (each block) |")
    print("|---|---|---|")
    for optimistic, name in ((False, "every piece in a savepoint"), (True, "optimistic")):
        rates = ", ".join(f"{rate:,.0f}" for rate, _ in found[optimistic])
        cpus = ", ".join(f"{cpu:,.0f}" for _, cpu in found[optimistic])
        print(f"| {name} | {rates} | {cpus} |")
    ratios = [o[0] / s[0] for o, s in zip(found[True], found[False], strict=True)]
    print(
        "\noptimistic against savepoints, block for block: "
        + ", ".join(f"{r:.2f}x" for r in ratios)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
