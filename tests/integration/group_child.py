"""Driver for test_group_crash.py: threads append (and flush) at once, so ingests share group
commits, until the process SIGKILLs itself inside a group's transaction, after at least one
other request of that group already ran in it.

    python group_child.py DATABASE_URL DATA_DIR SEED KILL_AFTER

Each of ``THREADS`` threads appends seeded-random batches of 1-3 messages to one of three
sessions and flushes after each. The ``KILL_AFTER``-th request that is the second or later of
its group kills the process (SIGKILL) before the group commits. stdout, one JSON object a line,
written as soon as an ingest returned: ``{"ack": source_ref, "content": text}``.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from pipeline import database, ingest, journal

THREADS = 8
SESSIONS = ("one", "two", "three")


def main() -> None:
    url, data_dir, seed, kill_after = sys.argv[1:]
    db = database.Database.from_url(url)
    out = threading.Lock()
    state: dict[str, Any] = {"conn": None, "in_group": 0, "seen": 0}
    real = ingest.apply_append

    def apply_append(conn: sa.Connection, **kwargs: Any) -> ingest.AppendResult | ingest.Held:
        # Only the group's leader runs requests, one group at a time: no lock needed.
        if state["conn"] is conn:
            state["in_group"] += 1
        else:
            state["conn"], state["in_group"] = conn, 1
        if state["in_group"] >= 2:
            state["seen"] += 1
            if state["seen"] >= int(kill_after):
                os.kill(os.getpid(), signal.SIGKILL)
        return real(conn, **kwargs)

    ingest.apply_append = apply_append

    def run(t: int) -> None:
        rng = random.Random(f"{seed}-{t}")
        for batch in range(10_000):
            size = rng.randint(1, 3)
            contents = [f"s{seed} t{t} b{batch} {i + 1}/{size}" for i in range(size)]
            body = {
                "agent_id": "group",
                "session_key": rng.choice(SESSIONS),
                "messages": [{"role": "user", "content": c} for c in contents],
            }
            result = journal.ingest(db, body)
            with out:
                for ref, content in zip(result.source_refs, contents, strict=True):
                    sys.stdout.write(json.dumps({"ack": ref, "content": content}) + "\n")
                sys.stdout.flush()
            journal.flush(db, Path(data_dir), result.file_id)

    threads = [threading.Thread(target=run, args=(t,), daemon=True) for t in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    sys.exit("never killed")


if __name__ == "__main__":
    main()
