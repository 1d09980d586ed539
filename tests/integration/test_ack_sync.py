"""Every acknowledgement follows the durable sync of its commit, seen from the system calls
(``strace``): the answer of an append never leaves before the disk has the journal row.

Under ``strace -f``, ``ack_child.py`` appends and marks each acknowledgement with a write to
/dev/null. SQLite writes a commit's frames to the WAL (``pwrite64``) and, with
``synchronous=FULL``, syncs it (``fdatasync``) before the commit returns. One stream without
the flusher (every commit durable, nothing concurrent): at every acknowledgement, no WAL write
is left unsynced. Four streams with the embedded service's batched flusher running (group
commits, and lazy commits of the flusher's own, not synced): each acknowledgement comes after
a WAL sync made since that thread's previous one. Skipped where strace is missing or not allowed,
except on CI, where that fails (``.ci/run`` installs strace).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import unavailable

CHILD = Path(__file__).with_name("ack_child.py")
ROOT = Path(__file__).resolve().parents[2]
#: runs of the traced child when strace cannot attach (once seen in a full run, gone on a
#: rerun): on CI a second refusal fails the test, it is not skipped
PTRACE_ATTEMPTS = 2
LINE = re.compile(r"^(\d+) +(\w+)\((\d+)<([^>]*)>")


def _trace(tmp_path: Path, mode: str, threads: int) -> list[tuple[int, str, str, str]]:
    """(thread, call, path, line) of every traced call, in order."""
    if shutil.which("strace") is None:
        unavailable("strace is not installed (.ci/run installs it)")
    out = tmp_path / "trace"
    argv = ["strace", "-f", "-y", "-qq", "-e", "trace=fsync,fdatasync,pwrite64,write"]
    for attempt in range(PTRACE_ATTEMPTS):
        data_dir = tmp_path / f"data-{attempt}"
        data_dir.mkdir()
        done = subprocess.run(
            [*argv, "-o", str(out), sys.executable, str(CHILD), str(data_dir), mode, str(threads)],
            cwd=ROOT,
            env={"PYTHONPATH": f"{ROOT / 'tests'}", "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if done.returncode == 0 or "ptrace" not in done.stderr:
            break
    else:
        unavailable(f"strace cannot trace here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    calls = []
    for line in out.read_text().splitlines():
        match = LINE.match(line)
        if match:
            tid, call, _fd, path = match.groups()
            calls.append((int(tid), call, path, line))
    return calls


def _is_ack(call: str, path: str, line: str) -> bool:
    return call == "write" and path == "/dev/null" and '"ACK ' in line


def test_no_acknowledgement_leaves_with_a_wal_write_unsynced(tmp_path: Path) -> None:
    unsynced = False
    acks = 0
    for _tid, call, path, line in _trace(tmp_path, "ingest", 1):
        if path.endswith("-wal"):
            if call == "pwrite64":
                unsynced = True
            elif call in ("fsync", "fdatasync"):
                unsynced = False
        elif _is_ack(call, path, line):
            acks += 1
            assert not unsynced, f"acknowledged before the WAL was synced: {line}"
    assert acks == 15


def test_with_the_flusher_running_each_acknowledgement_follows_a_sync(tmp_path: Path) -> None:
    syncs = 0  #: WAL syncs so far, by any thread (the group's leader syncs for its followers)
    seen: dict[int, int] = {}  #: per appending thread: ``syncs`` at its last acknowledgement
    acks = files_synced = 0
    for tid, call, path, line in _trace(tmp_path, "service", 4):
        if path.endswith("-wal") and call in ("fsync", "fdatasync"):
            syncs += 1
        elif path.endswith(".md") and call in ("fsync", "fdatasync"):
            files_synced += 1
        elif _is_ack(call, path, line):
            acks += 1
            assert syncs > seen.get(tid, 0), f"no WAL sync during this append: {line}"
            seen[tid] = syncs
    assert acks == 4 * 15
    assert files_synced >= 4  # the flusher wrote and synced the files meanwhile
