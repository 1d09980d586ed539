"""The peer side of bench/bench_peers.py, run with ``.venv-hermes/bin/python`` (Hermes Agent's
own environment): ``SessionDB.append_message`` with the database made durable like ours (WAL,
``synchronous=FULL``), one stream and ``--threads`` threads each with its own session. Prints
one JSON object: messages/s per case."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

from hermes_state import SessionDB


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, required=True)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--size", type=int, required=True)
    args = parser.parse_args()
    body = ("x" * (args.size - 1)) + "."
    rates = {}
    with tempfile.TemporaryDirectory(prefix="hermes-peer-") as tmp:
        db = SessionDB(Path(tmp) / "state.db")
        db._conn.execute("PRAGMA synchronous=FULL")  # durable: fsync at each commit, as ours
        mode = db._conn.execute("PRAGMA journal_mode").fetchone()[0]
        sync = db._conn.execute("PRAGMA synchronous").fetchone()[0]
        assert (mode, sync) == ("wal", 2), (mode, sync)
        db.create_session("one", source="cli")
        started, cpu = time.perf_counter(), time.process_time()
        for _ in range(args.messages):
            db.append_message("one", "user", body)
        rates["one stream"] = args.messages / (time.perf_counter() - started)
        rates["cpu one stream"] = (time.process_time() - cpu) / args.messages * 1e6

        per = args.messages // args.threads
        for t in range(args.threads):
            db.create_session(f"s{t}", source="cli")

        def stream(t: int) -> None:
            for _ in range(per):
                db.append_message(f"s{t}", "user", body)

        threads = [threading.Thread(target=stream, args=(t,)) for t in range(args.threads)]
        started, cpu = time.perf_counter(), time.process_time()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        rates[f"{args.threads} sessions"] = per * args.threads / (time.perf_counter() - started)
        rates[f"cpu {args.threads} sessions"] = (
            (time.process_time() - cpu) / (per * args.threads) * 1e6
        )
        db.close()
    json.dump(rates, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
