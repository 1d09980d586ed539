"""Flushes on this process's own threads: the queue of the embedded service (``sgme serve``).

In the embedded service the API and the worker are one process, so a flush kick need not go
through a broker: a Celery task per kick cost more of the process's time than the flush it
asked for (bench/bench_http.py). :class:`FlushThreads` keeps the files to flush in a set (a file
kicked twice before its flush starts is flushed once; a file kicked while it is being flushed
is flushed again after) and runs them on a few threads, whose commits the group committer
shares (:mod:`pipeline.database.commits`). Refinement jobs still go to the task queue it
wraps.

Nothing here is durable, and nothing needs to be: a kick lost in a crash is found again by
the sweep (the journal holds every acknowledged append).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from pipeline import errors, refine
from pipeline.service import Queue

log = logging.getLogger(__name__)


class FlushThreads:
    """A :class:`pipeline.service.Queue` that flushes kicked files on threads of this process
    and submits refinement jobs to ``jobs``."""

    def __init__(self, jobs: Queue, *, threads: int = 4) -> None:
        self.jobs = jobs
        self.threads = threads
        self._cond = threading.Condition()
        self._pending: dict[str, None] = {}  #: kicked, in kick order
        self._running: set[str] = set()
        self._workers: list[threading.Thread] = []
        self._closed = False
        self._flush: Callable[[str], object] | None = None

    def start(self, flush: Callable[[str], object]) -> None:
        """Start the threads, each running ``flush(file_id)`` for kicked files."""
        self._flush = flush
        for i in range(self.threads):
            thread = threading.Thread(target=self._work, name=f"sgme-flush-{i}", daemon=True)
            thread.start()
            self._workers.append(thread)

    def close(self, timeout: float = 30.0) -> None:
        """Stop taking kicks; the flushes in progress finish (pending ones are left to the
        sweep of the next start)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        for thread in self._workers:
            thread.join(timeout)

    def kick(self, file_id: str) -> None:
        """Flush ``file_id`` soon, on one of the threads."""
        with self._cond:
            if self._closed or file_id in self._pending:
                return
            self._pending[file_id] = None
            self._cond.notify()

    def submit(self, claim: refine.Claim) -> None:
        """Send a refinement job to the task queue."""
        self.jobs.submit(claim)

    def idle(self) -> bool:
        """Whether nothing is kicked or being flushed."""
        with self._cond:
            return not self._pending and not self._running

    def _next(self) -> str | None:
        """The next kicked file no other thread is flushing; None once closed."""
        with self._cond:
            while True:
                if self._closed:
                    return None
                for file_id in self._pending:
                    if file_id not in self._running:
                        del self._pending[file_id]
                        self._running.add(file_id)
                        return file_id
                self._cond.wait()

    def _work(self) -> None:
        assert self._flush is not None
        while (file_id := self._next()) is not None:
            try:
                self._flush(file_id)
            except errors.SgmeError as exc:
                # Logged by the service where it matters; the sweep kicks the file again.
                log.debug("flush of %s failed, the sweep retries it: %s", file_id, exc.detail)
            except Exception:
                log.exception("flush of %s failed, the sweep retries it", file_id)
            finally:
                with self._cond:
                    self._running.discard(file_id)
                    self._cond.notify_all()
