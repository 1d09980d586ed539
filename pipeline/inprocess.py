"""The embedded runner: flushes kicked files and sweeps for lost kicks on background threads,
for ``sgme serve`` when no queue is configured.

The journal makes this safe: a crash loses only kicks, and the sweep at start re-kicks
every file with journal rows.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from pathlib import Path

import sqlalchemy as sa

from pipeline import errors, journal

log = logging.getLogger(__name__)


class Flusher:
    """A queue of file ids (each queued at most once) drained by worker threads."""

    def __init__(
        self,
        engine: sa.Engine,
        data_dir: Path,
        *,
        lock_timeout: float = 30.0,
        sweep_interval: float = 5.0,
        sweep_age: float = 3.0,
        threads: int = 2,
    ) -> None:
        self.engine = engine
        self.data_dir = data_dir
        self.lock_timeout = lock_timeout
        self.sweep_interval = sweep_interval
        self.sweep_age = sweep_age
        self._queue: deque[str] = deque()
        self._queued: set[str] = set()
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._work, name=f"sgme-flush-{i}", daemon=True)
            for i in range(threads)
        ]
        self._threads.append(threading.Thread(target=self._sweep, name="sgme-sweep", daemon=True))

    def start(self) -> None:
        """Sweep everything once (a crash may have lost kicks), then start the threads."""
        for file_id in journal.stale_files(self.engine, age=0):
            self.kick(file_id)
        for thread in self._threads:
            thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Finish the flush in progress and stop."""
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        for thread in self._threads:
            if thread.is_alive():
                thread.join(timeout)

    def kick(self, file_id: str) -> None:
        """Queue a flush of ``file_id`` unless one is queued already."""
        with self._cond:
            if file_id in self._queued:
                return
            self._queued.add(file_id)
            self._queue.append(file_id)
            self._cond.notify()

    def _work(self) -> None:
        while not self._stop.is_set():
            with self._cond:
                while not self._queue and not self._stop.is_set():
                    self._cond.wait()
                if self._stop.is_set():
                    return
                file_id = self._queue.popleft()
                self._queued.discard(file_id)
            try:
                journal.flush(self.engine, self.data_dir, file_id, lock_timeout=self.lock_timeout)
            except errors.TransientError as exc:
                log.warning("flush of %s failed, the sweeper will retry: %s", file_id, exc)
            except errors.SgmeError as exc:
                log.error("flush of %s failed: %s", file_id, exc)
            except Exception:
                log.exception("flush of %s crashed", file_id)

    def _sweep(self) -> None:
        while not self._stop.wait(self.sweep_interval):
            try:
                for file_id in journal.stale_files(self.engine, age=self.sweep_age):
                    self.kick(file_id)
            except errors.SgmeError as exc:
                log.warning("sweep failed: %s", exc)
