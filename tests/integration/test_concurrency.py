"""Six processes of two threads each append to one session at once (docs/design.md §3): seqs stay
contiguous, no message is lost or repeated, each batch stays in one piece and each writer's
messages keep their order. Again on PostgreSQL without the lock files (``file_locks: false``,
a networked volume): its advisory locks alone keep the flushes apart (docs/scaling.md)."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from pipeline import (
    database,
    document,
    flush,
    index,
    integrity,
    journal,
    ledger,
    refs,
)

CHILD = Path(__file__).with_name("append_child.py")
ROOT = Path(__file__).resolve().parents[2]
PROCESSES = 6
THREADS = 2  #: writers per process (their ingests share group commits)
WRITERS = PROCESSES * THREADS
PER_WRITER = 150
CONTENT = re.compile(r"p(\d+) c(\d{3}) b(\d{3})")


def test_concurrent_appends_to_one_session(
    db: database.Database, database_url: str, data_dir: Path, tmp_path: Path
) -> None:
    run_writers(db, database_url, data_dir, tmp_path, file_lock=True)


def test_concurrent_appends_with_advisory_locks_only(
    postgres_db: database.Database, postgres_database_url: str, data_dir: Path, tmp_path: Path
) -> None:
    run_writers(postgres_db, postgres_database_url, data_dir, tmp_path, file_lock=False)


def run_writers(
    db: database.Database, database_url: str, data_dir: Path, tmp_path: Path, *, file_lock: bool
) -> None:
    prefix = tmp_path / "out"
    errs = [(tmp_path / f"err{p}.txt").open("w") for p in range(PROCESSES)]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(CHILD),
                database_url,
                str(data_dir),
                str(p),
                str(PER_WRITER),
                "1000",
                str(prefix),
                str(THREADS),
                "1" if file_lock else "0",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=errs[p],
            text=True,
            cwd=ROOT,
        )
        for p in range(PROCESSES)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        for proc in procs:  # start line: every worker is connected and waiting
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.close()
        codes = [proc.wait(timeout=120) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            if proc.stdout:
                proc.stdout.close()
        for err in errs:
            err.close()
    assert codes == [0] * PROCESSES, [
        (tmp_path / f"err{p}.txt").read_text() for p in range(PROCESSES)
    ]
    if not file_lock:
        assert not (data_dir / ".locks").exists()  # really without the lock files

    # what each writer was told: (source_ref, content, batch)
    told = {
        w: [tuple(json.loads(line)) for line in Path(f"{prefix}{w}.jsonl").read_text().splitlines()]
        for w in range(WRITERS)
    }
    file_ids = {refs.parse(ref)[0] for rows in told.values() for ref, _, _ in rows}
    assert len(file_ids) == 1  # everyone found the one session file
    (file_id,) = file_ids

    for leftover in flush.stale_files(db, age=0):
        journal.flush(db, data_dir, leftover, file_lock=file_lock)
    total = WRITERS * PER_WRITER
    with db.transaction() as conn:
        row = index.get_file(conn, file_id)
        assert ledger.journal_after(conn, file_id, 0) == []
    assert row is not None
    assert (row.flushed_seq, row.next_seq) == (total, total + 1)

    data = (data_dir / row.path).read_bytes()
    assert len(data) == row.flushed_bytes
    doc = document.parse(data.decode(), file_id=file_id)
    assert [m.seq for m in doc.messages] == list(range(1, total + 1))
    assert data.count(b"\n# ") == 1 and data.count(b"\n## ") == total - 1

    contents = [m.content for m in doc.messages]
    assert len(set(contents)) == total  # every message exactly once
    parsed = [CONTENT.fullmatch(c) for c in contents]
    assert all(parsed)
    position = {c: i for i, c in enumerate(contents)}
    for p, rows in told.items():
        assert len(rows) == PER_WRITER
        # the seq each writer was told is where its message is
        for ref, content, _ in rows:
            assert doc.messages[refs.parse(ref)[1] - 1].content == content
        # its own messages in its own order, and all of them
        mine = [c for c in contents if c.startswith(f"p{p} ")]
        assert mine == [f"p{p} c{i:03d} b{b:03d}" for i, (_, _, b) in enumerate(rows)]
        # each batch contiguous in the file
        batches: dict[int, list[int]] = defaultdict(list)
        for _, content, b in rows:
            batches[b].append(position[content])
        for b, places in batches.items():
            assert places == list(range(places[0], places[0] + len(places))), (p, b)
    # the writers really interleaved: not simply one process after another
    owners = [int(m.group(1)) for m in parsed if m]
    switches = sum(1 for a, b in itertools.pairwise(owners) if a != b)
    assert switches > 2 * WRITERS

    assert integrity.fsck(db, data_dir) == []
