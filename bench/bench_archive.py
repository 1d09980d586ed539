"""Archive throughput and ratio: ``archive.compress`` (the whole protocol: chain check, temp
file, fsync, decompress + sha256 verify, rename, index update, delete) against the ``zstd``
command line compressing the same files at the same level, in the same run.

    .venv/bin/python bench/bench_archive.py [--quick] [--level 10] [--repeat 3] [--workers 2]
                                            [--baseline SRC]

The corpus is bench_parse's generated agent transcripts (fixed seed). The command line gets
every file in one invocation (no per-process cost) with one thread (``-T1``). The contenders
run in turn ``--repeat`` times, each time on fresh copies of the files; the best time of each
counts (on a shared machine the slow runs measure the neighbours), and each run's CPU time is
printed too. ``compress_many`` runs in a process of its own, with ``--workers`` files at a
time; ``--baseline SRC`` also runs another checkout's (``git worktree`` or ``git archive main
| tar -x -C SRC``) the same way, in the same rounds, for a ratio.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# the checkout measured: this one, or --baseline's (before anything of ours is imported);
# bench_parse comes from it too, as it puts its own checkout first on sys.path
_SRC = sys.argv[sys.argv.index("--src") + 1] if "--src" in sys.argv else None
_ROOT = Path(_SRC).resolve() if _SRC else Path(__file__).resolve().parent.parent
sys.path.insert(0, str(_ROOT))
sys.path.insert(0, str(_ROOT / "bench"))

import bench_parse  # noqa: E402

from pipeline import archive, database, integrity, locks, tables  # noqa: E402
from pipeline.settings import Archive  # noqa: E402

TARGET_SPEED = 0.9  #: archive.compress MB/s >= 0.9x the command line's
TARGET_RATIO_GAP = 0.02  #: compression ratio within 2% of the command line's


def prepare(data_dir: Path, texts: list[str]) -> tuple[database.Database, locks.FileLocks]:
    """Write the corpus as live files, index them and mark them fully refined and cold. Their
    lock files are made, as the flushes that wrote the files would have made them; the locks
    returned are a new process's (they open the lock files, they do not create them)."""
    folder = data_dir / "raw" / "sessions"
    folder.mkdir(parents=True)
    paths = []
    for text in texts:
        file_id = text.split('file_id: "', 1)[1].split('"', 1)[0]
        path = folder / f"{file_id}.md"
        path.write_text(text, encoding="utf-8")
        paths.append(path)
    db = database.Database.from_url(f"sqlite:///{data_dir / 'index.sqlite3'}")
    database.migrate(db.engine)
    file_locks = locks.FileLocks(db, data_dir, timeout=30)
    integrity.reindex(db, file_locks, data_dir)
    with db.transaction() as conn:
        f = tables.raw_files.c
        conn.execute(
            tables.raw_files.update().values(
                last_refined_seq=f.flushed_seq, status="refined", flushed_at=db.now()
            )
        )
    for path in paths:
        with file_locks.hold(path.stem):
            pass
    file_locks.close()
    return db, locks.FileLocks(db, data_dir, timeout=30)


def _cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def cli_run(zstd: str, root: Path, texts: list[str], level: int) -> tuple[float, float, int]:
    """The command line over its own copy of the files: (seconds, CPU seconds, bytes)."""
    cli_dir = root / "cli"
    cli_dir.mkdir()
    sources = []
    for i, text in enumerate(texts):
        path = cli_dir / f"{i}.md"
        path.write_text(text, encoding="utf-8")
        sources.append(path)
    out = root / "cli-out"
    out.mkdir()
    cpu = _cpu(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(
        [
            zstd,
            f"-{level}",
            "-T1",
            "-q",
            "-k",
            "--check",
            "--output-dir-flat",
            str(out),
            *map(str, sources),
        ],
        check=True,
    )
    seconds = time.perf_counter() - started
    cpu = _cpu(resource.RUSAGE_CHILDREN) - cpu
    return seconds, cpu, sum(p.stat().st_size for p in out.iterdir())


def ours_run(root: Path, texts: list[str], level: int, workers: int) -> tuple[float, float, int]:
    """archive.compress_many over an indexed store of the files, in this process: (seconds,
    CPU seconds, bytes)."""
    data_dir = root / "data"
    db, file_locks = prepare(data_dir, texts)
    file_ids = archive.cold_files(db, older_than_days=0, limit=10**6)
    cpu = _cpu(resource.RUSAGE_SELF)
    started = time.perf_counter()
    written = 0
    options = Archive(level=level, workers=workers)
    for _, outcome in archive.compress_many(db, file_locks, data_dir, file_ids, options):
        assert isinstance(outcome, archive.Outcome), outcome
        written += outcome.bytes_after
    seconds = time.perf_counter() - started
    cpu = _cpu(resource.RUSAGE_SELF) - cpu
    assert len(file_ids) == len(texts)
    db.engine.dispose()
    return seconds, cpu, written


def child(quick: bool, root: Path, level: int, workers: int) -> None:
    """One run of compress_many, in this process (the checkout of ``--src``): prints JSON."""
    texts = [text for text, _ in bench_parse.corpus(quick=quick)]
    seconds, cpu, written = ours_run(root, texts, level, workers)
    print(json.dumps({"seconds": seconds, "cpu": cpu, "bytes": written, "code": archive.__file__}))


def spawn(
    quick: bool, root: Path, level: int, workers: int, src: Path | None
) -> tuple[float, float, int]:
    """:func:`child` in a process of its own: (seconds, CPU seconds, bytes)."""
    args = ["--child", str(root), "--level", str(level), "--workers", str(workers)]
    args += ["--quick"] if quick else []
    args += ["--src", str(src)] if src else []
    out = subprocess.run(
        [sys.executable, __file__, *args], check=True, capture_output=True, text=True
    )
    found = json.loads(out.stdout.strip().splitlines()[-1])
    measured = Path(found["code"]).resolve()
    expected = (src or Path(__file__).parent.parent).resolve()
    assert measured.is_relative_to(expected), f"measured {measured}, not the code of {expected}"
    return float(found["seconds"]), float(found["cpu"]), int(found["bytes"])


def run(quick: bool, level: int, workers: int, repeat: int, baseline: Path | None) -> int:
    zstd = shutil.which("zstd")
    if zstd is None:
        print("the zstd command line is not installed (Debian package zstd); nothing to compare")
        return 2
    texts = [text for text, _ in bench_parse.corpus(quick=quick)]
    total = sum(len(t.encode("utf-8")) for t in texts)
    print(
        f"corpus: {len(texts)} files, {total / 1e6:.1f} MB; zstd level {level}; the command line "
        f"with -T1, archive.compress_many with {workers} files at a time (one zstd thread each)"
    )
    cli_runs: list[tuple[float, float]] = []
    ours_runs: list[tuple[float, float]] = []
    base_runs: list[tuple[float, float]] = []
    for _ in range(repeat):
        with tempfile.TemporaryDirectory(prefix="sgme-bench-archive-") as tmp:
            *times, cli_bytes = cli_run(zstd, Path(tmp), texts, level)
            cli_runs.append((times[0], times[1]))
        with tempfile.TemporaryDirectory(prefix="sgme-bench-archive-") as tmp:
            *times, ours_bytes = spawn(quick, Path(tmp), level, workers, None)
            ours_runs.append((times[0], times[1]))
        if baseline:
            with tempfile.TemporaryDirectory(prefix="sgme-bench-archive-") as tmp:
                *times, base_bytes = spawn(quick, Path(tmp), level, workers, baseline)
                base_runs.append((times[0], times[1]))
    labelled = [("command line", cli_runs), ("compress_many", ours_runs)]
    labelled += [("baseline", base_runs)] if baseline else []
    for label, runs in labelled:
        print(f"{label:>14} runs, s (CPU s): " + ", ".join(f"{w:.2f} ({c:.2f})" for w, c in runs))
    cli_seconds, ours_seconds = min(w for w, _ in cli_runs), min(w for w, _ in ours_runs)

    cli_speed = total / cli_seconds / 1e6
    ours_speed = total / ours_seconds / 1e6
    cli_ratio = total / cli_bytes
    ours_ratio = total / ours_bytes
    print()
    print(f"{'contender':<34}{'seconds':>9}{'MB/s':>9}{'ratio':>8}{'vs zstd':>9}")
    print("-" * 69)
    print(
        f"{'zstd command line':<34}{cli_seconds:>9.2f}{cli_speed:>9.1f}{cli_ratio:>8.3f}"
        f"{'1.00x':>9}"
    )
    print(
        f"{'archive.compress_many (protocol)':<34}{ours_seconds:>9.2f}{ours_speed:>9.1f}"
        f"{ours_ratio:>8.3f}{ours_speed / cli_speed:>8.2f}x"
    )
    if baseline:
        base_seconds = min(w for w, _ in base_runs)
        base_speed = total / base_seconds / 1e6
        print(
            f"{'baseline compress_many':<34}{base_seconds:>9.2f}{base_speed:>9.1f}"
            f"{total / base_bytes:>8.3f}{base_speed / cli_speed:>8.2f}x"
        )
        best_cpu = min(c for _, c in ours_runs), min(c for _, c in base_runs)
        print(
            f"\nagainst the baseline: {base_seconds / ours_seconds:.2f}x the speed; best CPU s "
            f"{best_cpu[0]:.2f} against {best_cpu[1]:.2f}"
        )
    gap = abs(ours_ratio - cli_ratio) / cli_ratio
    speed_ok = ours_speed >= TARGET_SPEED * cli_speed
    print()
    print(
        f"targets: speed >= {TARGET_SPEED}x the command line: {ours_speed / cli_speed:.2f}x "
        f"({'met' if speed_ok else 'NOT met'}); ratio within {TARGET_RATIO_GAP:.0%}: "
        f"{gap:.2%} ({'met' if gap <= TARGET_RATIO_GAP else 'NOT met'})"
    )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a small corpus")
    parser.add_argument("--level", type=int, default=Archive().level)
    parser.add_argument("--workers", type=int, default=Archive().workers, help="files at once")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each; the best counts")
    parser.add_argument("--baseline", type=Path, help="another checkout to compare with")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--src", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.quick, args.child, args.level, args.workers)
        return 0
    return run(args.quick, args.level, args.workers, args.repeat, args.baseline)


if __name__ == "__main__":
    sys.exit(main())
