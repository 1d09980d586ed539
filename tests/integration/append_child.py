"""Worker for test_concurrency.py: appends ``count`` messages to one shared session in seeded
random batches of 1–5, flushing after each append.

    python append_child.py DATABASE_URL DATA_DIR PROC_ID COUNT SEED OUT_FILE

Prints ``ready`` once imported and connected, then waits for a line on stdin before it starts,
so all workers append at the same time. Writes one JSON line per message to OUT_FILE:
``[source_ref, content, batch]``.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

from pipeline import database, journal

SESSION = "shared"


def main() -> None:
    url, data_dir, proc, count, seed, out = sys.argv[1:]
    rng = random.Random(int(seed))
    engine = database.create_engine(url)
    with engine.connect():  # connect before the start line, not inside the race
        pass
    print("ready", flush=True)
    sys.stdin.readline()

    results: list[tuple[str, str, int]] = []
    counter = batch = 0
    while counter < int(count):
        size = min(rng.randint(1, 5), int(count) - counter)
        contents = [f"p{proc} c{counter + i:03d} b{batch:03d}" for i in range(size)]
        result = journal.ingest(
            engine,
            {
                "agent_id": "many",
                "session_key": SESSION,
                "messages": [{"role": "user", "content": c} for c in contents],
            },
        )
        results.extend((ref, c, batch) for ref, c in zip(result.source_refs, contents, strict=True))
        journal.flush(engine, Path(data_dir), result.file_id)
        counter += size
        batch += 1
    Path(out).write_text("".join(json.dumps(r) + "\n" for r in results))
    engine.dispose()


if __name__ == "__main__":
    main()
