"""The library's entry points (:mod:`pipeline.journal`) make a lock-file set per flush, and a
database handle per call when given an engine: what each one registers must go with it, and a
forked child must still start with every handle's in-process locks free."""

from __future__ import annotations

import gc
import os
import threading
import tracemalloc
from pathlib import Path

from pipeline import database, journal, store

ROUNDS = 400


def _body() -> dict[str, object]:
    # the same words each time: the stem cache does not grow either
    return {"agent_id": "lib", "session_key": "s", "messages": [{"role": "user", "content": "hi"}]}


def test_library_calls_leave_nothing_behind(tmp_path: Path) -> None:
    db = database.Database.from_url(f"sqlite:///{tmp_path / 'index.sqlite3'}")
    database.migrate(db.engine)
    data_dir = tmp_path / "data"
    try:

        def rounds(count: int) -> None:
            for _ in range(count):
                # an engine: a handle of its own per call; a flush: lock files of its own
                result = journal.ingest(db.engine, _body())
                journal.flush(db.engine, data_dir, result.file_id)

        rounds(100)  # statement caches, stems, pools: filled once
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            rounds(ROUNDS)
            gc.collect()
            grown = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        # A fork hook per handle and per lock-file set, kept for the life of the process,
        # grew this by about 1 KB a round.
        assert grown < ROUNDS * 100, f"{grown} bytes kept after {ROUNDS} ingest+flush calls"
    finally:
        db.dispose()


def test_a_forked_child_starts_with_every_in_process_lock_free(tmp_path: Path) -> None:
    handles = [
        database.Database.from_url(f"sqlite:///{tmp_path / f'index{i}.sqlite3'}") for i in (1, 2)
    ]
    lock_files = [store.LockFiles(tmp_path / f"data{i}") for i in (1, 2)]
    held, release = threading.Event(), threading.Event()

    def holder() -> None:
        with lock_files[0].lock("f1", timeout=5), lock_files[1].lock("f1", timeout=5):
            for db in handles:
                assert db._writer is not None
                db._writer.acquire()
            held.set()
            release.wait(10)
            for db in handles:
                assert db._writer is not None
                db._writer.release()

    thread = threading.Thread(target=holder)
    thread.start()
    try:
        assert held.wait(10)
        pid = os.fork()
        if pid == 0:  # the child: the holding thread is not here
            free = all(db._writer is not None and db._writer.acquire(False) for db in handles)
            forgotten = all(not files._stripes for files in lock_files)
            os._exit(0 if free and forgotten else 1)
    finally:
        release.set()
        thread.join()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    for db in handles:
        db.dispose()
