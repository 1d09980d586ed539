"""The process's one writer of files (docs/design.md §3): :class:`Flusher`, made once by the
runtime (:mod:`pipeline.runtime`) and shared by everything that flushes — the service's
:meth:`~pipeline.service.Service.flush`, the waited-append scheduler (:mod:`pipeline.waits`),
the embedded service's threads (:mod:`pipeline.local_queue`) and the Celery task
``sgme.flush``.

It owns what every flush of the process shares: the file locks, the chunk budget
(``backlog_flush_chunk_bytes``), the pool of threads a round's writes and syncs run on, and
the follow-up rule (which files to flush again, which became due for refinement). A round
(:func:`pipeline.flush.flush_files`) returns what it did and what is left; it calls nobody
back. What is left is the caller's to run again, each in its own way: the scheduler queues its
waits again, the threads re-queue their files, a flush of one file loops; and the caller hands
the results to the service's follow-up (:meth:`pipeline.service.Service.follow_up`).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime as dt
import logging
import threading
from collections.abc import Callable, Iterable

from pipeline import database, errors, flush, forks, locks
from pipeline.flush import FlushResult, Round
from pipeline.settings import Settings

log = logging.getLogger(__name__)

#: threads that run a round's writes and ``fdatasync`` calls side by side (one pool for the
#: process: the disk takes concurrent syncs about as fast as one)
SYNC_THREADS = 8


@dataclasses.dataclass(frozen=True)
class FollowUp:
    """What must follow some flushes (:meth:`Flusher.follow_up`)."""

    #: files to flush again: appends acknowledged during their flush, whose ingest did not
    #: kick the file (it saw the flush pending)
    again: list[str]
    #: files whose refinement became due by message count (due by idleness, the beat's
    #: periodic dispatch finds them)
    due: list[str]


class Flusher:
    """Flushes of one process: rounds over any set of files, and the flush of one file."""

    def __init__(
        self, settings: Settings, db: database.Database, file_locks: locks.FileLocks
    ) -> None:
        self.db = db
        self.file_locks = file_locks
        self.data_dir = settings.data_dir
        self.chunk_bytes = settings.backlog.flush_chunk_bytes
        self.refine = settings.refine
        self._syncs = _SyncPool()

    def round(self, file_ids: list[str], *, wait: bool = False) -> Round:
        """One round of ``file_ids`` (:func:`flush.flush_files`), its syncs on the process'
        pool; with ``wait`` (a round of one file), the file's lock waited for. Damage is
        logged as an error the first time, then only counted in its anomaly, however often
        the sweeper comes back to the file."""
        done = flush.flush_files(
            self.db,
            self.file_locks,
            self.data_dir,
            file_ids,
            chunk_bytes=self.chunk_bytes,
            run=self._syncs.run,
            wait=wait,
        )
        if done.errors:
            for file_id, error in done.errors.items():
                _log_refusal(file_id, error)
        return done

    def flush(self, file_id: str) -> FlushResult:
        """Write every journal row of ``file_id`` acknowledged now to its file
        (:func:`flush.flush`: rounds of one file); its error raised, damage logged as
        :meth:`round` logs it."""
        try:
            return flush.flush(
                self.db, self.file_locks, self.data_dir, file_id, chunk_bytes=self.chunk_bytes
            )
        except errors.SgmeError as exc:
            _log_refusal(file_id, exc)
            raise

    def follow_up(self, results: Iterable[FlushResult], now: dt.datetime) -> FollowUp:
        """What must follow these flushes: the files to flush again, and the files whose
        refinement became due by message count."""
        results = list(results)
        again = [result.file_id for result in results if result.more]
        due = []
        for result in results:
            leased = result.leased_until is not None and result.leased_until > now
            if (
                result.messages == 0
                or leased  # a job is running; it dispatches the file again when it commits
                or (result.unrefined < self.refine.min_messages and self.refine.idle_seconds > 0)
            ):
                continue
            due.append(result.file_id)
        return FollowUp(again, due)

    def close(self) -> None:
        """Stop the sync pool's threads (a round after this starts them again)."""
        self._syncs.close()


def _log_refusal(file_id: str, error: Exception) -> None:
    if isinstance(error, errors.FileDamaged):
        (log.error if error.first else log.debug)("flush of %s refused: %s", file_id, error.detail)


class _SyncPool:
    """The flusher's pool of :data:`SYNC_THREADS` threads, made at first use; forgotten in a
    forked child (:mod:`pipeline.forks`): the parent's pool threads are not there, and its
    lock may have been held by one of them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        forks.reset_in_child(self)

    def after_fork_in_child(self) -> None:
        """Forget the parent's pool and lock."""
        self._lock = threading.Lock()
        self._pool = None

    def run(self, thunks: list[Callable[[], None]]) -> list[BaseException | None]:
        """Each thunk on a thread of the pool (one alone on the calling thread); each one's
        error (None: it ran)."""
        if len(thunks) <= 1:
            return flush.serially(thunks)
        with self._lock:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(
                    SYNC_THREADS, thread_name_prefix="sgme-flush-sync"
                )
            pool = self._pool
        return list(pool.map(flush.outcome, thunks))

    def close(self) -> None:
        """Shut the pool down, once its running thunks are done."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
