"""Recovery: ``sgme reindex`` (``integrity.reindex``) rebuilding a lost index from the files, on
SQLite and on PostgreSQL, and ``fsck`` of the same store.

    .venv/bin/python bench/bench_reindex.py [--files 50000] [--store DIR] [--no-postgres]
                                            [--baseline SRC] [--rounds N]

``--baseline SRC`` also runs the reindex of another checkout's ``pipeline`` (``git worktree``
or ``git archive main | tar -x -C SRC``) on SQLite, in the same run, for a ratio. ``--rounds
N`` runs SQLite's reindex N times, alternating with the baseline's, and reports each one's
fastest round, its least CPU times and its largest RSS (fsck runs once, on this code's index).

The store is ``--files`` session files of 5 messages each (bench_parse's chat-like sessions,
fixed seed: about 5 KB a file, 261 MB for 50,000), written once (``--store DIR`` keeps it for
the next run). Each contender runs in a process of its own on an empty, migrated index:
files/s, messages/s and peak RSS (``RSS MB`` of the command's own process, ``worker`` of the
largest of its worker processes); then ``fsck`` over the rebuilt index. Wall-clock time: on a
shared machine, compare only numbers from one run.

CPU time (``time.process_time``), which load on a shared machine disturbs less: ``main`` and
``workers`` are the CPU microseconds per file of the command's process and of its worker
processes (their start included); ``read`` those of reading one file for the index in one
process (``recovery.read``: parse, hash chain, rows and search terms), over the first
:data:`CPU_FILES` files, after reading them once.

PostgreSQL: ``SGME_TEST_POSTGRES_URL`` (an admin URL; a scratch database is made and dropped).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import sqlalchemy as sa

# the checkout measured: this one, or --baseline's (before anything of ours is imported)
_SRC = sys.argv[sys.argv.index("--src") + 1] if "--src" in sys.argv else None
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
if _SRC:
    sys.path.insert(0, _SRC)

# integrity is imported where a contender runs (child), not here: reindex's worker processes
# import this module again (spawn), and should import what ``sgme reindex``'s do — the
# command's lazy main module and recovery — not integrity's imports (flush, metrics, vectors,
# numpy, httpx: 0.3 s of CPU a worker)
from pipeline import database, locks, recovery  # noqa: E402

SEED = 20261201
MESSAGES = 5  #: per file
TARGET_FILES_PER_SECOND = 2_000  #: on SQLite
CPU_FILES = 2_000  #: files read for the CPU time of ``recovery.read``
POSTGRES_ADMIN_URL = os.environ.get(
    "SGME_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)


def make_store(data_dir: Path, files: int) -> int:
    """Write ``files`` session files (unless a finished store of that size is there); the
    store's bytes."""
    done = data_dir / f".bench-{files}"
    folder = data_dir / "raw" / "sessions"
    if not done.exists():
        import bench_parse  # here: it puts this checkout first on sys.path (see --src)

        folder.mkdir(parents=True, exist_ok=True)
        rng = random.Random(SEED)
        for _ in range(files):
            text, _ = bench_parse.session_file(rng, MESSAGES, reads=False)
            file_id = text.split('file_id: "', 1)[1].split('"', 1)[0]
            (folder / f"{file_id}.md").write_text(text, encoding="utf-8")
        done.touch()
    return sum(p.stat().st_size for p in folder.iterdir())


def peak_rss_mb() -> tuple[float, float]:
    """Peak RSS in MB of this process and of the largest of its children (Linux: KB)."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return own / 1024, children / 1024


def child(task: str, url: str, data_dir: Path) -> None:
    """One contender, in this process: prints its result as JSON."""
    if task == "read":
        print(json.dumps({"read": read_cpu(data_dir)}))
        return
    from pipeline import integrity

    db = database.Database.from_url(url)
    file_locks = locks.FileLocks(db, data_dir, timeout=30)
    started = time.perf_counter()
    cpu = time.process_time()
    if task == "reindex":
        report = integrity.reindex(db, file_locks, data_dir)
        result: dict[str, float] = {"files": report.inserted, "failed": len(report.failed)}
    else:
        problems = integrity.fsck(db, data_dir)
        result = {"files": integrity.count_files(db), "failed": len(problems)}
    result["seconds"] = time.perf_counter() - started
    result["cpu_main"] = (time.process_time() - cpu) / max(result["files"], 1) * 1e6
    workers = resource.getrusage(resource.RUSAGE_CHILDREN)
    result["cpu_workers"] = (workers.ru_utime + workers.ru_stime) / max(result["files"], 1) * 1e6
    result["rss"], result["worker_rss"] = peak_rss_mb()
    print(json.dumps(result))


def read_cpu(data_dir: Path) -> float:
    """CPU microseconds per file of ``recovery.read`` (SQLite's rows), in this process."""
    paths = sorted((data_dir / "raw" / "sessions").iterdir())[:CPU_FILES]
    for path in paths:  # once to warm up (imports, the stem cache), as a worker would be
        recovery.read(data_dir, "session", path, postgres=False)
    cpu = time.process_time()
    for path in paths:
        recovery.read(data_dir, "session", path, postgres=False)
    return (time.process_time() - cpu) / len(paths) * 1e6


def spawn(task: str, url: str, data_dir: Path, src: Path | None = None) -> dict[str, float]:
    more = ["--src", str(src)] if src else []
    out = subprocess.run(
        [sys.executable, __file__, "--child", task, "--url", url, "--store", str(data_dir), *more],
        check=True,
        capture_output=True,
        text=True,
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def migrated(url: str) -> str:
    engine = database.create_engine(url)
    database.migrate(engine)
    engine.dispose()
    return url


def least(one: dict[str, float], other: dict[str, float]) -> dict[str, float]:
    """Two rounds of a contender as one: the faster round's time, the least CPU time of each
    kind, the larger peak RSS (a busy shared machine adds time, not memory)."""
    made = dict(min(one, other, key=lambda r: r["seconds"]))
    for key in ("cpu_main", "cpu_workers", "read"):
        made[key] = min(one[key], other[key])
    for key in ("rss", "worker_rss"):
        made[key] = max(one[key], other[key])
    return made


def run(
    files: int, store_dir: Path | None, postgres: bool, baseline: Path | None, rounds: int
) -> int:
    with tempfile.TemporaryDirectory(prefix="sgme-bench-reindex-") as tmp:
        data_dir = store_dir or Path(tmp) / "data"
        started = time.perf_counter()
        size = make_store(data_dir, files)
        print(
            f"store: {files} session files of {MESSAGES} messages, {size / 1e6:.0f} MB "
            f"(ready in {time.perf_counter() - started:.0f} s); {os.cpu_count()} CPUs"
        )
        rows: list[tuple[str, dict[str, float]]] = []
        contenders: list[tuple[str, Path | None]] = [("reindex, SQLite", None)]
        if baseline:
            contenders.append(("reindex, SQLite, base", baseline))
        best: dict[str, dict[str, float]] = {}
        sqlite_url = ""  # this code's last rebuilt index, which fsck then checks
        for n in range(rounds):  # the contenders alternating, each on an index of its own
            for label, src in contenders:
                name = f"{'base' if src else 'index'}-{n}.sqlite3"
                url = migrated(f"sqlite:///{Path(tmp) / name}")
                found = spawn("reindex", url, data_dir, src)
                found.update(spawn("read", url, data_dir, src))
                best[label] = least(best[label], found) if label in best else found
                if src is None:
                    sqlite_url = url
                # only the index fsck checks is kept (each is the size of a store's index)
                for stale in Path(tmp).glob("*.sqlite3*"):
                    if not stale.name.startswith(f"index-{n}."):
                        stale.unlink()
        rows.append(("reindex, SQLite", best["reindex, SQLite"]))
        rows.append(("fsck, SQLite", spawn("fsck", sqlite_url, data_dir)))
        if baseline:
            rows.append(("reindex, SQLite, base", best["reindex, SQLite, base"]))
        if postgres:
            admin = sa.create_engine(
                database.normalize_url(POSTGRES_ADMIN_URL), isolation_level="AUTOCOMMIT"
            )
            name = f"sgme_bench_reindex_{uuid.uuid4().hex[:8]}"
            with admin.connect() as conn:
                conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
            try:
                url = migrated(POSTGRES_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}")
                rows.append(("reindex, PostgreSQL", spawn("reindex", url, data_dir)))
                rows.append(("fsck, PostgreSQL", spawn("fsck", url, data_dir)))
            finally:
                with admin.connect() as conn:
                    conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
                admin.dispose()

    print()
    print(
        f"{'run':<22}{'seconds':>9}{'files/s':>10}{'msg/s':>10}{'RSS MB':>8}{'worker':>8}"
        f"{'failed':>8}{'CPU us/file: main':>19}{'workers':>9}{'read':>7}"
    )
    print("-" * 110)
    for label, r in rows:
        rate = r["files"] / r["seconds"]
        read = f"{r['read']:>7.0f}" if "read" in r else ""
        print(
            f"{label:<22}{r['seconds']:>9.1f}{rate:>10,.0f}{rate * MESSAGES:>10,.0f}"
            f"{r['rss']:>8.0f}{r['worker_rss']:>8.0f}{int(r['failed']):>8}"
            f"{r['cpu_main']:>19.0f}{r['cpu_workers']:>9.0f}{read}"
        )
    sqlite = rows[0][1]
    rate = sqlite["files"] / sqlite["seconds"]
    if baseline:
        old = rows[2][1]
        rate_of = f"the fastest of {rounds} alternating rounds each" if rounds > 1 else "one round"
        print(
            f"\nagainst the baseline checkout: {old['seconds'] / sqlite['seconds']:.2f}x "
            f"({rate_of}); CPU a file, the least of the rounds: workers "
            f"{old['cpu_workers'] / sqlite['cpu_workers']:.2f}x, main "
            f"{old['cpu_main'] / sqlite['cpu_main']:.2f}x, read {old['read'] / sqlite['read']:.2f}x"
        )
    print()
    print(
        f"target: reindex on SQLite >= {TARGET_FILES_PER_SECOND:,} files/s: {rate:,.0f} "
        f"({'met' if rate >= TARGET_FILES_PER_SECOND else 'NOT met'})"
    )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=50_000, help="session files in the store")
    parser.add_argument("--store", type=Path, help="keep the generated store here")
    parser.add_argument("--no-postgres", action="store_true", help="SQLite only")
    parser.add_argument("--baseline", type=Path, help="another checkout to compare on SQLite")
    parser.add_argument(
        "--rounds", type=int, default=1, help="SQLite reindex rounds, alternating with --baseline"
    )
    parser.add_argument("--child", choices=("reindex", "fsck", "read"), help=argparse.SUPPRESS)
    parser.add_argument("--src", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.url, args.store)
        return 0
    return run(args.files, args.store, not args.no_postgres, args.baseline, args.rounds)


if __name__ == "__main__":
    sys.exit(main())
