"""The per-file lock (docs/design.md §3): what keeps two writers off one raw file.

Flush, archive, restore and redaction each hold it while they change a file. It is two locks
taken in one order: the lock file's ``flock`` on the data volume behind an in-process lock
(:class:`store.LockFiles`: processes on one host), then on PostgreSQL a session advisory lock
on the file id (hosts that share a networked volume, where ``flock`` cannot be trusted; with
``file_locks: false`` it is the only one). :class:`FileLocks` is the one place they are put
together.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path

from pipeline import database, errors, index, store, tables


class FileLocks:
    """The per-file locks of one data directory and one index, as this process holds them."""

    def __init__(
        self, db: database.Database, data_dir: Path, *, timeout: float, flock: bool = True
    ) -> None:
        self.db = db
        self.files = store.LockFiles(data_dir)
        self.timeout = timeout  #: seconds to wait for a file's lock
        self.flock = flock  #: whether the lock file is taken (off: the advisory lock alone)

    def close(self) -> None:
        """Close the lock files (none may be held)."""
        self.files.close()

    @contextlib.contextmanager
    def hold(self, file_id: str) -> Iterator[None]:
        """Hold ``file_id``'s lock (:class:`errors.LockTimeout` when it stays taken)."""
        with (
            self.files.lock(file_id, timeout=self.timeout, flock=self.flock),
            database.advisory_lock(self.db.engine, file_id),
        ):
            yield

    @contextlib.contextmanager
    def holding(self, file_id: str) -> Iterator[tables.FileRow]:
        """Hold ``file_id``'s lock (the one flush takes) and yield its row as it is now;
        :class:`errors.NotFound` when the index has none."""
        with self.hold(file_id):
            with self.db.reading() as conn:
                row = index.get_file(conn, file_id)
            if row is None:
                raise errors.NotFound(f"no file {file_id}")
            yield row

    @contextlib.contextmanager
    def hold_many(
        self, file_ids: Sequence[str]
    ) -> Iterator[tuple[list[str], dict[str, errors.LockTimeout]]]:
        """Hold the locks of as many of ``file_ids`` as are free within the timeout, taken in
        a fixed order (:meth:`store.LockFiles.order`; the advisory locks on one connection),
        so two overlapping batches never wait for each other in a circle. Yields the ids
        held, in the order given, and the refusal of each one that was busy."""
        busy: dict[str, errors.LockTimeout] = {}
        with contextlib.ExitStack() as held:
            for file_id in self.files.order(file_ids):
                try:
                    held.enter_context(
                        self.files.lock(file_id, timeout=self.timeout, flock=self.flock)
                    )
                except errors.LockTimeout as exc:
                    busy[file_id] = exc
            locked = [f for f in file_ids if f not in busy]
            held.enter_context(database.advisory_locks(self.db.engine, locked))
            yield locked, busy
