"""Worker for test_concurrency.py: ``THREADS`` threads (writers ``PROC_ID * THREADS + t``)
each append ``count`` messages to one shared session in seeded random batches of 1–5,
flushing after each append (``FILE_LOCK`` 0: without the lock files, as on a networked
volume).

    python append_child.py DATABASE_URL DATA_DIR PROC_ID COUNT SEED OUT_PREFIX THREADS FILE_LOCK

Prints ``ready`` once imported and connected, then waits for a line on stdin before it starts,
so all workers append at the same time. Each writer writes one JSON line per message to
``OUT_PREFIX{writer}.jsonl``: ``[source_ref, content, batch]``.
"""

from __future__ import annotations

import json
import random
import sys
import threading
from pathlib import Path

from pipeline import database, journal

SESSION = "shared"


def write(
    db: database.Database,
    data_dir: Path,
    writer: int,
    count: int,
    seed: int,
    out: Path,
    *,
    file_lock: bool,
) -> None:
    rng = random.Random(seed + writer)
    results: list[tuple[str, str, int]] = []
    counter = batch = 0
    while counter < count:
        size = min(rng.randint(1, 5), count - counter)
        contents = [f"p{writer} c{counter + i:03d} b{batch:03d}" for i in range(size)]
        result = journal.ingest(
            db,
            {
                "agent_id": "many",
                "session_key": SESSION,
                "messages": [{"role": "user", "content": c} for c in contents],
            },
        )
        results.extend((ref, c, batch) for ref, c in zip(result.source_refs, contents, strict=True))
        journal.flush(db, data_dir, result.file_id, file_lock=file_lock)
        counter += size
        batch += 1
    out.write_text("".join(json.dumps(r) + "\n" for r in results))


def main() -> None:
    url, data_dir, proc, count, seed, prefix, threads, file_lock = sys.argv[1:]
    db = database.Database.from_url(url)
    with db.engine.connect():  # connect before the start line, not inside the race
        pass
    print("ready", flush=True)
    sys.stdin.readline()
    writers = [int(proc) * int(threads) + t for t in range(int(threads))]
    workers = [
        threading.Thread(
            target=write,
            args=(db, Path(data_dir), w, int(count), int(seed), Path(f"{prefix}{w}.jsonl")),
            kwargs={"file_lock": file_lock == "1"},
        )
        for w in writers
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    db.dispose()


if __name__ == "__main__":
    main()
