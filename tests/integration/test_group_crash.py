"""Group commit survives SIGKILL (docs/design.md §3): a process whose threads append at once (their
ingests sharing commits) is killed inside a group's transaction, after some of the group's
requests already ran in it, several times over. Afterwards every acknowledged message is in
its file exactly once, at the seq it was given; nothing of a request is there unless all of it
is; seqs have no gap; and fsck is clean."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from pipeline import database, document, flush, index, integrity, journal, refs

CHILD = Path(__file__).with_name("group_child.py")
ROOT = Path(__file__).resolve().parents[2]
ROUNDS = ((11, 40), (12, 5), (13, 120), (14, 1))  #: (seed, kill after that many grouped)
CONTENT = re.compile(r"s(\d+) t(\d+) b(\d+) (\d+)/(\d+)")


def test_every_acknowledged_append_survives_sigkill_inside_a_group(
    db: database.Database, database_url: str, data_dir: Path
) -> None:
    acked: dict[str, str] = {}  # source_ref -> content
    for seed, kill_after in ROUNDS:
        proc = subprocess.run(
            [sys.executable, str(CHILD), database_url, str(data_dir), str(seed), str(kill_after)],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
            check=False,
        )
        assert proc.returncode == -9, proc.stderr  # killed by its own SIGKILL, in a group
        lines = [json.loads(line) for line in proc.stdout.splitlines()]
        acked.update((line["ack"], line["content"]) for line in lines)

    assert len(acked) > 100  # the rounds did real work before their kills

    # restart: flush what the journal still holds
    for file_id in flush.stale_files(db, age=0):
        journal.flush(db, data_dir, file_id)
    assert flush.stale_files(db, age=0) == []

    by_file: dict[str, dict[int, str]] = defaultdict(dict)
    for ref, content in acked.items():
        file_id, seq = refs.parse(ref)
        by_file[file_id][seq] = content
    assert len(by_file) == 3
    present: list[str] = []
    for file_id, expected in by_file.items():
        with db.transaction() as conn:
            row = index.get_file(conn, file_id)
        assert row is not None
        data = (data_dir / row.path).read_bytes()
        assert len(data) == row.flushed_bytes
        doc = document.parse(data.decode("utf-8"), file_id=file_id)
        # no gap, no repeat, and everything acknowledged is there
        assert [m.seq for m in doc.messages] == list(range(1, row.next_seq))
        assert row.flushed_seq == row.next_seq - 1
        contents = {m.seq: m.content for m in doc.messages}
        assert {seq: contents.get(seq) for seq in expected} == expected
        present += [m.content for m in doc.messages]

    # each request is all there or not at all, its messages adjacent and in order
    assert len(present) == len(set(present))
    batches: dict[tuple[str, ...], list[int]] = defaultdict(list)
    for content in present:
        match = CONTENT.fullmatch(content)
        assert match, content
        round_seed, t, b, part, size = match.groups()
        batches[(round_seed, t, b, size)].append(int(part))
    for (_, _, _, size), parts in batches.items():
        assert sorted(parts) == list(range(1, int(size) + 1))
    assert len(present) >= len(acked)

    assert integrity.fsck(db, data_dir) == []
