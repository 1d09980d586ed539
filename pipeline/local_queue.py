"""The queue of the embedded service (``sgme serve``): flushes on this process's own threads.

In the embedded service the API and the worker are one process, so a flush kick need not go
through a broker: a Celery task per kick cost more of the process's time than the flush it
asked for (bench/bench_http.py). :class:`LocalQueue` keeps the files to flush in a set (a file
kicked twice before its flush starts is flushed once; a file kicked while it is being flushed
is flushed again after). Refinement jobs still go to the task queue it wraps.

Started with the process' :class:`pipeline.flusher.Flusher`, it flushes in *rounds*
(docs/design.md §3, batched flushes): one thread waits for a kick, lingers ``linger`` seconds
so that the kicks of concurrent appends gather, then takes every kicked file (at most
``max_round``) into one round — one read snapshot, the files' syncs in parallel on the
flusher's pool, one commit — and starts over. The round returns what is left: files past its
budget and files written with more acknowledged appends are queued again (kicked), and a
file to run on its own (busy: another thread or process holds its lock; or its write failed
in the round) is flushed by one of ``threads`` other threads (:meth:`Flusher.flush`, which
waits for the lock), so a file that waits for its lock never holds up the others. Every
result goes to the ``follow_up`` it was started with (the service's: refinement that became
due is dispatched).

Nothing here is durable, and nothing needs to be: a kick lost in a crash is found again by
the sweep (the journal holds every acknowledged append).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from pipeline import errors, refine
from pipeline.flush import FlushResult
from pipeline.flusher import Flusher
from pipeline.service import Queue
from pipeline.settings import Backlog

log = logging.getLogger(__name__)

MAX_ROUND = 256  #: files in one round at most

#: what follows flushes (:meth:`pipeline.service.Service.follow_up`)
FollowUp = Callable[[list[FlushResult]], None]


class LocalQueue:
    """A :class:`pipeline.service.Queue` that flushes kicked files on threads of this process
    and submits refinement jobs to ``jobs``."""

    def __init__(
        self,
        jobs: Queue,
        *,
        threads: int = 4,
        linger: float = Backlog.flush_linger,
        max_round: int = MAX_ROUND,
    ) -> None:
        self.jobs = jobs
        self.threads = threads
        self.linger = linger
        self.max_round = max_round
        lock = threading.Lock()
        self._cond = threading.Condition(lock)  #: kicks and ends of flushes: the round waits on it
        #: files a round handed back to run on their own (the threads that flush them wait
        #: on it, so a kick, which only the round takes, wakes only the round)
        self._handed = threading.Condition(lock)
        self._pending: dict[str, None] = {}  #: kicked, in kick order
        self._alone: dict[str, None] = {}  #: handed back by a round: flushed one by one
        self._running: set[str] = set()
        self._workers: list[threading.Thread] = []
        self._closed = False
        self._flusher: Flusher | None = None
        self._follow_up: FollowUp = _nothing
        #: rounds run and files flushed in them (tests and benchmarks read these)
        self.rounds = 0
        self.round_files = 0

    def start(self, flusher: Flusher, follow_up: FollowUp | None = None) -> None:
        """Start the threads: kicked files are flushed in rounds of ``flusher``, and the ones
        a round hands back one by one; every result goes to ``follow_up``."""
        self._flusher = flusher
        self._follow_up = follow_up or _nothing
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

    def kick(self, file_id: str) -> None:
        """Flush ``file_id`` soon, on one of the threads."""
        with self._cond:
            if self._closed or file_id in self._pending:
                return
            self._pending[file_id] = None
            self._cond.notify_all()  # the round

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
        """The next file a round handed back, for a thread that flushes one at a time; None
        once closed."""
        with self._cond:
            while True:
                if self._closed:
                    return None
                for file_id in self._alone:
                    del self._alone[file_id]
                    return file_id  # running since its round took it
                self._handed.wait()

    def _work(self) -> None:
        assert self._flusher is not None
        while (file_id := self._next()) is not None:
            try:
                self._follow_up([self._flusher.flush(file_id)])
            except errors.SgmeError as exc:
                # Logged by the flusher where it matters; the sweep kicks the file again.
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
        assert self._flusher is not None
        while (files := self._take_round()) is not None:
            alone: list[str] = []
            later: list[str] = []
            try:
                done = self._flusher.round(files)
                alone, later = done.again, done.later
                self._follow_up(list(done.results.values()))  # kicks the files with more
            except errors.SgmeError as exc:
                log.debug("flush round failed, its files are flushed alone: %s", exc.detail)
                alone = files
            except Exception:
                log.exception("flush round failed, its files are flushed alone")
                alone = files
            with self._cond:
                self.rounds += 1
                self.round_files += len(files) - len(alone) - len(later)
                handed = set(alone)
                for file_id in files:
                    if file_id in handed:
                        self._alone[file_id] = None  # stays running until flushed alone
                    else:
                        self._running.discard(file_id)
                for file_id in later:  # past the round's budget: the next round's
                    self._pending.setdefault(file_id, None)
                if alone:
                    self._handed.notify_all()
                if later:
                    self._cond.notify_all()


def _nothing(results: list[FlushResult]) -> None:
    return None
