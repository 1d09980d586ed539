"""The queue of the embedded service (``sgme serve``): flushes on this process's own threads.

In the embedded service the API and the worker are one process, so a flush kick need not go
through a broker: a Celery task per kick cost more of the process's time than the flush it
asked for (bench/bench_http.py). :class:`LocalQueue` keeps the files to flush in a set (a file
kicked twice before its flush starts is flushed once; a file kicked while it is being flushed
is flushed again after). Refinement jobs still go to the task queue it wraps.

Started with a round function (:meth:`pipeline.service.Service.flush_round`, the embedded
service's way), it flushes in *rounds* (docs/design.md §3, batched flushes): one thread waits
for a kick, lingers ``linger`` seconds so that the kicks of concurrent appends gather, then
takes every kicked file (at most ``max_round``) into one round — one read snapshot, the
files' syncs in parallel on a pool of ``threads`` threads, one commit — and starts over. A
file the round hands back (damaged, busy, archived: anything but a plain append) is flushed on
its own by one of ``threads`` other threads, so a file that waits for its lock never holds up
the others. Started with a flush function alone, each of ``threads`` threads flushes one
kicked file at a time (the group committer shares their commits).

Nothing here is durable, and nothing needs to be: a kick lost in a crash is found again by
the sweep (the journal holds every acknowledged append).
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable

from pipeline import errors, flush, refine
from pipeline.service import Queue

log = logging.getLogger(__name__)

DEFAULT_LINGER = 0.02  #: seconds a round waits for more kicks (``backlog_flush_linger``)
MAX_ROUND = 256  #: files in one round at most

Thunks = list[Callable[[], None]]
#: ``flush_round(file_ids, run=…)``: the files to flush on their own
RoundFunction = Callable[..., list[str]]


class LocalQueue:
    """A :class:`pipeline.service.Queue` that flushes kicked files on threads of this process
    and submits refinement jobs to ``jobs``."""

    def __init__(
        self,
        jobs: Queue,
        *,
        threads: int = 4,
        linger: float = DEFAULT_LINGER,
        max_round: int = MAX_ROUND,
    ) -> None:
        self.jobs = jobs
        self.threads = threads
        self.linger = linger
        self.max_round = max_round
        lock = threading.Lock()
        self._cond = threading.Condition(lock)  #: kicks and ends of flushes: the round waits on it
        #: files handed back by a round (the threads that flush one at a time wait on it, so a
        #: kick, which only the round takes, wakes only the round)
        self._handed = threading.Condition(lock)
        self._pending: dict[str, None] = {}  #: kicked, in kick order
        self._alone: dict[str, None] = {}  #: handed back by a round: flushed one by one
        self._running: set[str] = set()
        self._workers: list[threading.Thread] = []
        self._closed = False
        self._flush: Callable[[str], object] | None = None
        self._round: RoundFunction | None = None
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        #: rounds run and files flushed in them (tests and benchmarks read these)
        self.rounds = 0
        self.round_files = 0

    def start(
        self, flush: Callable[[str], object], flush_round: RoundFunction | None = None
    ) -> None:
        """Start the threads: ``flush(file_id)`` flushes one file; with ``flush_round``, kicked
        files are flushed in rounds and only the ones a round hands back one by one."""
        self._flush, self._round = flush, flush_round
        if flush_round is not None:
            self._pool = concurrent.futures.ThreadPoolExecutor(
                self.threads, thread_name_prefix="sgme-flush-sync"
            )
            self._spawn(self._rounds, "sgme-flush-round")
        for i in range(self.threads):
            self._spawn(self._work, f"sgme-flush-{i}")

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._workers.append(thread)

    def close(self, timeout: float = 30.0) -> None:
        """Stop taking kicks; the flushes in progress finish (pending ones are left to the
        sweep of the next start)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            self._handed.notify_all()
        for thread in self._workers:
            thread.join(timeout)
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    def kick(self, file_id: str) -> None:
        """Flush ``file_id`` soon, on one of the threads."""
        with self._cond:
            if self._closed or file_id in self._pending:
                return
            self._pending[file_id] = None
            self._cond.notify_all()  # the round, or (without rounds) the threads

    def submit(self, claim: refine.Claim) -> None:
        """Send a refinement job to the task queue."""
        self.jobs.submit(claim)

    def idle(self) -> bool:
        """Whether nothing is kicked or being flushed."""
        with self._cond:
            return not self._pending and not self._running and not self._alone

    def _ready(self) -> list[str]:
        return [f for f in self._pending if f not in self._running]

    def _next(self) -> str | None:
        """The next file for a thread that flushes one at a time; None once closed."""
        waiting = self._alone if self._round is not None else self._pending
        wakes = self._handed if self._round is not None else self._cond
        with self._cond:
            while True:
                if self._closed:
                    return None
                for file_id in waiting:
                    if self._round is not None or file_id not in self._running:
                        del waiting[file_id]
                        self._running.add(file_id)
                        return file_id
                wakes.wait()

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

    def _take_round(self) -> list[str] | None:
        """The files of the next round, once some are kicked and the linger passed; None once
        closed."""
        with self._cond:
            while not self._closed and not self._ready():
                self._cond.wait()
        if self.linger > 0:
            time.sleep(self.linger)  # the kicks of appends committing now join this round
        with self._cond:
            if self._closed:
                return None
            files = self._ready()[: self.max_round]
            for file_id in files:
                del self._pending[file_id]
                self._running.add(file_id)
            return files

    def _rounds(self) -> None:
        assert self._round is not None
        while (files := self._take_round()) is not None:
            try:
                alone = set(self._round(files, run=self._run))
            except errors.SgmeError as exc:
                log.debug("flush round failed, its files are flushed alone: %s", exc.detail)
                alone = set(files)
            except Exception:
                log.exception("flush round failed, its files are flushed alone")
                alone = set(files)
            with self._cond:
                self.rounds += 1
                self.round_files += len(files) - len(alone)
                for file_id in files:
                    if file_id in alone:
                        self._alone[file_id] = None  # stays running until flushed alone
                    else:
                        self._running.discard(file_id)
                if alone:
                    self._handed.notify_all()

    def _run(self, thunks: Thunks) -> list[BaseException | None]:
        """Run ``thunks`` on the sync pool (inline when there is one): each one's exception."""
        if len(thunks) <= 1 or self._pool is None:
            return flush.serially(thunks)
        return list(self._pool.map(flush.outcome, thunks))
