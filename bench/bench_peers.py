"""SGME L0 against Hermes Agent's own store, side by side in one run (issue: throughput).

The library append an embedding program makes — ``journal.ingest`` (the acknowledgement)
then ``journal.flush`` (the bytes in the file) — against Hermes Agent's
``SessionDB.append_message`` (hermes-agent 0.19.0, run in its own virtualenv ``.venv-hermes``
by ``bench/peers/hermes_sessiondb.py``), both durable (SQLite WAL, ``synchronous=FULL``),
500-byte messages, each on disk before the next is acknowledged: one stream, and 16 threads
each with a session of its own. Rounds interleave the two, best of each. Targets: >= 1.0x
Hermes on one stream, >= 2.0x with 16 sessions.

Growth: the same one-stream rate in a session that already holds 10,000 messages against one
that holds 10 (target: within 10%): the cost of an append must not grow with its file.

    .venv/bin/python bench/bench_peers.py [--messages 2000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline import database, journal  # noqa: E402

HERMES_PYTHON = ROOT / ".venv-hermes" / "bin" / "python"
THREADS = 16
SIZE = 500


@contextlib.contextmanager
def store(size: int) -> Iterator[Callable[..., None]]:
    """A new durable SQLite store; yields ``append(session_key, count=1)``: ``count`` messages
    of ``size`` bytes in one call, ingested and then flushed (the library's two calls)."""
    text = ("x" * (size - 1)) + "."
    with tempfile.TemporaryDirectory(prefix="sgme-peer-") as tmp:
        data_dir = Path(tmp) / "data"
        engine = database.Database.from_url(f"sqlite:///{Path(tmp) / 'index.sqlite3'}")
        database.migrate(engine.engine)
        with engine.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 2  # FULL

        def append(key: str, count: int = 1) -> None:
            messages = [{"role": "user", "content": text}] * count
            body = {"agent_id": "peer", "session_key": key, "messages": messages}
            journal.flush(engine, data_dir, journal.ingest(engine, body).file_id)

        try:
            yield append
        finally:
            engine.dispose()


def ours(messages: int, threads: int, size: int) -> dict[str, float]:
    rates = {}
    with store(size) as append:
        started = time.perf_counter()
        for _ in range(messages):
            append("one")
        rates["one stream"] = messages / (time.perf_counter() - started)

        per = messages // threads

        def stream(t: int) -> None:
            for _ in range(per):
                append(f"s{t}")

        workers = [threading.Thread(target=stream, args=(t,)) for t in range(threads)]
        started = time.perf_counter()
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        rates[f"{threads} sessions"] = per * threads / (time.perf_counter() - started)
    return rates


def growth(messages: int, size: int) -> dict[str, float]:
    """One-stream appends/s into a session holding 10 messages and one holding 10,000."""
    rates = {}
    with store(size) as append:
        for held in (10, 10_000):
            key = f"held-{held}"
            for _ in range(held // 100 or 1):  # fill it, 100 (or 10) messages a call
                append(key, min(held, 100))
            started = time.perf_counter()
            for _ in range(messages):
                append(key)
            rates[f"at {held:,} messages"] = messages / (time.perf_counter() - started)
    return rates


def hermes(messages: int, threads: int, size: int) -> dict[str, float]:
    if not HERMES_PYTHON.exists():
        raise SystemExit("run `make hermes-env` first: Hermes runs in its own virtualenv")
    done = subprocess.run(
        [
            str(HERMES_PYTHON),
            str(ROOT / "bench" / "peers" / "hermes_sessiondb.py"),
            "--messages",
            str(messages),
            "--threads",
            str(threads),
            "--size",
            str(size),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    rates: dict[str, float] = json.loads(done.stdout)
    return rates


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    best: dict[str, dict[str, float]] = {"hermes": {}, "sgme": {}}
    for _ in range(args.rounds):
        for name, run in (("hermes", hermes), ("sgme", ours)):
            for case, rate in run(args.messages, THREADS, SIZE).items():
                best[name][case] = max(best[name].get(case, 0.0), rate)
    grown: dict[str, float] = {}
    for _ in range(args.rounds):
        for case, rate in growth(args.messages // 2, SIZE).items():
            grown[case] = max(grown.get(case, 0.0), rate)
    targets = {"one stream": 1.0, f"{THREADS} sessions": 2.0}
    print(f"{args.messages} messages of {SIZE} bytes per case, best of {args.rounds} rounds")
    print("| case | Hermes SessionDB msg/s | SGME ingest+flush msg/s | ratio | target |")
    print("|---|---|---|---|---|")
    for case, target in targets.items():
        h, s = best["hermes"][case], best["sgme"][case]
        verdict = "met" if s / h >= target else "**missed**"
        print(f"| {case} | {h:,.0f} | {s:,.0f} | {s / h:.2f}x | {verdict} {target:.1f}x |")
    print()
    small, large = grown["at 10 messages"], grown["at 10,000 messages"]
    verdict = "met" if large >= 0.9 * small else "**missed**"
    print("| session holds | SGME ingest+flush msg/s |")
    print("|---|---|")
    for case, rate in grown.items():
        print(f"| {case.removeprefix('at ')} | {rate:,.0f} |")
    print(f"growth: {large / small:.2f}x the rate at 10 messages ({verdict}: within 10%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
