"""What a blocking wait costs the Python that runs after it: the CPU time of the same work
run back to back (hot), right after an ``fdatasync`` of a file, and right after a short sleep,
each against hot in the same run.

The waited path (``wait=flushed``) blocks twice a message (the journal's commit, the file's
``fdatasync``) and the acknowledgement once, so the Python between the waits runs after a
wake-up, never hot as in a loop of appends. This measures that difference on the machine it
runs on, with two pieces of an append's own work: ``validation.parse_append`` of a one-message
body and ``terms.terms`` of its 500-character text. The clock is the thread's CPU time
(``time.thread_time_ns``), so the wait itself is not counted, only the work after it.

    .venv/bin/python bench/bench_wake.py [--calls 3000] [--rounds 3] [--dir DIR]

``DIR``: where the synced file goes (a temp directory on the data disk by default: the
current directory's).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline import settings, terms, validation  # noqa: E402

TEXT = ("The quick brown fox decided to keep the index on PostgreSQL. " * 9)[:499] + "."
SLEEP = 0.0003  #: seconds of the sleep case, about one fdatasync on this machine's disk


def _work() -> dict[str, Callable[[], object]]:
    limits = settings.Settings.load(environ={}, data_dir=str(ROOT / "data")).limits
    body = {
        "agent_id": "bench",
        "session_key": "s",
        "messages": [{"role": "user", "content": TEXT}],
    }
    return {
        "parse_append": lambda: validation.parse_append(body, limits),
        "terms": lambda: terms.terms(TEXT),
    }


def _befores(fd: int) -> dict[str, Callable[[], None]]:
    def synced() -> None:
        os.write(fd, b"x" * 500)
        os.fdatasync(fd)

    return {
        "hot (back to back)": lambda: None,
        "after an fdatasync": synced,
        "after a 0.3 ms sleep": lambda: time.sleep(SLEEP),
    }


def measure(work: Callable[[], object], before: Callable[[], None], calls: int) -> float:
    """The median CPU µs of ``work`` run ``calls`` times, each right after ``before``."""
    spent = []
    for _ in range(calls):
        before()
        started = time.thread_time_ns()
        work()
        spent.append(time.thread_time_ns() - started)
    return statistics.median(spent) / 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=Path.cwd())
    args = parser.parse_args()
    works = _work()
    best: dict[tuple[str, str], float] = {}
    with tempfile.TemporaryDirectory(prefix="sgme-wake-", dir=args.dir) as tmp:
        fd = os.open(Path(tmp) / "synced", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            befores = _befores(fd)
            for work in works.values():  # warm: imports, caches, the stemmer's table
                measure(work, befores["hot (back to back)"], 500)
            for _ in range(args.rounds):  # the cases interleaved, the best round of each kept
                for name, work in works.items():
                    for case, before in befores.items():
                        got = measure(work, before, args.calls)
                        best[(name, case)] = min(best.get((name, case), got), got)
        finally:
            os.close(fd)
    print(f"median CPU µs a call over {args.calls} calls, best of {args.rounds} rounds")
    print()
    print("| work | case | CPU µs a call | vs hot |")
    print("|---|---|---|---|")
    for name in works:
        hot = best[(name, "hot (back to back)")]
        for case in _befores(-1):
            got = best[(name, case)]
            print(f"| {name} | {case} | {got:.1f} | {got / hot:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
