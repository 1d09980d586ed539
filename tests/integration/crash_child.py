"""Driver for test_crash.py: runs rounds of ingest + flush, each in a forked process that
SIGKILLs itself at a chosen step inside a flush.

    python crash_child.py DATABASE_URL DATA_DIR [FILE_LOCK [rounds]]  < plan.json

``FILE_LOCK`` 0 flushes without the lock files (``file_locks: false``, PostgreSQL only).
``rounds``: every flush is a round of every file with journal rows (``flush.flush_files``, as
the embedded service flushes), and the files it leaves are flushed alone; the fault hook runs
in both.

``plan.json`` is a list of rounds ``{"seed", "appends", "step", "occurrence", "torn"}``. Each
round forks; the fork first flushes whatever earlier rounds left in the journal (a restart),
then makes ``appends`` seeded-random appends to a few sessions, flushing after most of them.
Every flush gets a fault hook that kills the process the ``occurrence``-th time the flush
reaches ``step`` (one of ``journal.FLUSH_STEPS``); with ``torn`` (step ``read``) it first
appends a random prefix of the pending bytes to the file, as a write cut short would.

stdout, one JSON object a line, flushed as written:
    {"ack": source_ref, "role", "content", "tool_name"}  after an ingest returned
    {"round": i, "killed": bool, "status": wait status}  after each round
The driver itself never opens the index, so forking it is safe.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import traceback
from pathlib import Path
from typing import Any

from pipeline import database, index, journal, ledger, locks
from pipeline import flush as flushing

SESSIONS = ("alpha", "beta", "gamma")
SNIPPETS = (
    "plain words",
    "# 2026-01-01T00:00:00Z user",
    "```\n## 2026-08-03T11:18:06Z tool\n```",
    "crlf\r\nline",
    "unicode ✓ 漢字 🎉",
    "\\# escaped already user",
    "---\nnot frontmatter\n---",
    "trailing spaces   ",
)


def emit(record: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


def run_round(
    url: str, data_dir: Path, spec: dict[str, Any], number: int, *, file_lock: bool, rounds: bool
) -> None:
    db = database.Database.from_url(url)
    file_locks = locks.FileLocks(db, data_dir, timeout=10, flock=file_lock)
    rng = random.Random(spec["seed"])
    reached: dict[str, int] = {}
    current: dict[str, str] = {}

    def hook(step: str) -> None:
        reached[step] = reached.get(step, 0) + 1
        if step != spec["step"] or reached[step] != spec["occurrence"]:
            return
        if spec["torn"]:
            file_id = current["file_id"]
            with db.transaction() as conn:
                row = index.get_file(conn, file_id)
                assert row is not None
                pending = ledger.journal_after(conn, file_id, row.flushed_seq)
            data = "".join(entry.data for entry in pending).encode()
            cut = rng.randrange(1, len(data))
            path = data_dir / row.path
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            os.write(fd, data[:cut])
            os.close(fd)
        os.kill(os.getpid(), signal.SIGKILL)

    def flush_one(file_id: str) -> None:
        current["file_id"] = file_id
        journal.flush(db, data_dir, file_id, lock_timeout=10, file_lock=file_lock, fault=hook)

    def flush_some(file_ids: list[str]) -> None:
        if not rounds:
            for file_id in file_ids:
                flush_one(file_id)
            return
        if not file_ids:
            return
        current["file_id"] = file_ids[0]
        done = flushing.flush_files(db, file_locks, data_dir, file_ids, fault=hook)
        for file_id in done.left:
            flush_one(file_id)

    # restart: whatever a killed predecessor left acknowledged but unwritten
    flush_some(flushing.stale_files(db, age=0))
    for i in range(spec["appends"]):
        session = rng.choice(SESSIONS)
        messages = []
        for j in range(rng.randint(1, 4)):
            role = rng.choice(("user", "assistant", "tool"))
            message: dict[str, Any] = {
                "role": role,
                "content": f"r{number} a{i} m{j} {session}\n{rng.choice(SNIPPETS)}",
            }
            if role == "tool":
                message["tool_name"] = rng.choice(("read_file", "shell"))
            messages.append(message)
        result = journal.ingest(
            db, {"agent_id": "crash", "session_key": session, "messages": messages}
        )
        for ref, message in zip(result.source_refs, messages, strict=True):
            emit({"ack": ref, **message})
        if rng.random() < 0.75:
            flush_some(flushing.stale_files(db, age=0) if rounds else [result.file_id])


def main() -> None:
    url, data_dir = sys.argv[1], Path(sys.argv[2])
    file_lock = len(sys.argv) < 4 or sys.argv[3] == "1"
    rounds = len(sys.argv) > 4 and sys.argv[4] == "rounds"
    plan = json.load(sys.stdin)
    for number, spec in enumerate(plan):
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                run_round(url, data_dir, spec, number, file_lock=file_lock, rounds=rounds)
            except BaseException:
                traceback.print_exc()
                sys.stderr.flush()
                code = 1
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        emit({"round": number, "killed": killed, "status": status})
        if not killed and os.waitstatus_to_exitcode(status) != 0:
            sys.exit(f"round {number} failed with status {status}")


if __name__ == "__main__":
    main()
