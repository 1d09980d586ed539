"""The flushes that appends wait for (``wait=flushed``), combined (docs/design.md §3).

An append that waits is answered once its messages are in the file. Flushed on each caller's
own thread, the waits of concurrent sessions each pay a read snapshot, a commit and a share of
the process' GIL of their own. :class:`Waits` combines them as the group committer combines
commits: a caller queues its file, and the caller that finds no flush running *leads* one
flush round (:func:`pipeline.flush.flush_many`: one snapshot, the files' syncs in parallel,
one commit) of every file queued so far, while the others wait for it. There is no timer: a
round is whatever queued while the previous one ran, so a lone caller's flush starts at once.

A caller whose file the round did not reach far enough (past the round's byte budget, or one
chunk written and more left before its seq) queues it again at the front, for the next
round; a file the round hands back (damaged, busy, archived) is flushed on its own by the
leader, and its waiters get that flush's answer or error.

As in the group committer, each caller waits on an event of its own: after a round the
leader wakes the callers it settled and hands the lead to the first caller still queued,
and nobody else. (One condition notified for all woke every waiting caller after every
round, to find, most of them, that it had to wait again: at 16 sessions 25.0–26.2 context
switches a waited append against 21.8–23.1 now: the twelfth throughput pass, in the
history of docs/benchmarks.md.)
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import threading
from collections.abc import Callable

from pipeline import errors, flush, forks
from pipeline.flush import FlushResult, Round, Runner

#: threads that run a round's writes and ``fdatasync`` calls side by side (one process-wide
#: pool: the disk takes concurrent syncs about as fast as one)
SYNC_THREADS = 8

#: ``flush_round(file_ids, run)``: one round, its syncs through ``run``
RoundFunction = Callable[[list[str], Runner], Round]
Outcome = FlushResult | BaseException


@dataclasses.dataclass(eq=False)
class _Wait:
    file_id: str
    seq: int  #: the last seq the caller appended: flushed once the file's flushed_seq reaches it
    outcome: Outcome | None = None
    #: set when the wait is settled (:attr:`outcome`), or when its caller is to lead a round
    woken: threading.Event = dataclasses.field(default_factory=threading.Event)


class Waits:
    """Combined flushes of the files that appends wait for (one per service)."""

    def __init__(self, flush_round: RoundFunction, flush_alone: Callable[[str], FlushResult]):
        self._round = flush_round
        self._alone = flush_alone
        self._lock = threading.Lock()
        self._queue: list[_Wait] = []
        self._leading = False
        #: rounds led and the waits they settled (tests and benchmarks read these)
        self.rounds = 0
        self.settled = 0
        forks.reset_in_child(self)

    def after_fork_in_child(self) -> None:
        """A child forked while a thread of the parent led a round waits for nobody."""
        self._lock = threading.Lock()
        self._queue, self._leading = [], False

    def queued(self) -> int:
        """Waits queued for the next round (not the ones a round is flushing)."""
        with self._lock:
            return len(self._queue)

    def leading(self) -> bool:
        """Whether a round (or the flush of a lone file) is running."""
        with self._lock:
            return self._leading

    def join(self, file_id: str, seq: int) -> FlushResult:
        """Join the next round of flushes until ``file_id`` is in its file up to ``seq``:
        the result of the flush that put it there (in a round, or on its own); the error of
        that flush raised (:class:`errors.SgmeError`, or a bug)."""
        mine = _Wait(file_id, seq)
        with self._lock:
            self._queue.append(mine)
            follower = self._leading
            self._leading = True
        while True:
            if follower:
                mine.woken.wait()
                mine.woken.clear()
            if mine.outcome is not None:
                if isinstance(mine.outcome, BaseException):
                    raise mine.outcome
                return mine.outcome
            # the lead is this caller's (its wait is queued): a round of everything queued
            with self._lock:
                batch, self._queue = self._queue, []
            self._lead(batch)
            follower = True  # settled by it (woken already), or queued again

    def _lead(self, batch: list[_Wait]) -> None:
        """One round for ``batch``; each wait settled, or queued again for the next round.
        Afterwards the first wait queued (if any) leads the next round: only the callers
        whose wait settled, and that one, are woken."""
        outcomes: dict[str, Outcome] = {}
        failure: BaseException | None = None
        try:
            outcomes = self._flush([*dict.fromkeys(wait.file_id for wait in batch)])
        except BaseException as exc:  # every wait of the batch is answered with it
            failure = exc
            raise
        finally:
            settled = []
            with self._lock:
                again = []
                for wait in batch:
                    got = failure or outcomes.get(wait.file_id)
                    if got is None or _short(got, wait.seq):
                        again.append(wait)  # not reached: the next round's first
                    else:
                        wait.outcome = got
                        settled.append(wait)
                self._queue[:0] = again
                self.rounds += 1
                self.settled += len(settled)
                if self._queue:
                    self._queue[0].woken.set()  # leads the next round (_leading stays)
                else:
                    self._leading = False
            for wait in settled:
                wait.woken.set()

    def _flush(self, file_ids: list[str]) -> dict[str, Outcome]:
        """A round of ``file_ids``, then the files it handed back one by one; each file's
        result or error (none for a file past the round's budget). One file is flushed on
        its own at once, as a waited append always was: a round of one shares nothing (and
        measured 11–15 µs more CPU an append: the tenth throughput pass, in the history of
        docs/benchmarks.md)."""
        done = self._round(file_ids, _run) if len(file_ids) > 1 else Round(alone=file_ids)
        outcomes: dict[str, Outcome] = dict(done.results)
        for file_id in done.alone:
            try:
                outcomes[file_id] = self._alone(file_id)
            except errors.SgmeError as exc:
                outcomes[file_id] = exc
        return outcomes


def _short(got: Outcome, seq: int) -> bool:
    """Whether a flush stopped short of ``seq`` with more of the file to write (a round
    writes one chunk a file). One that says nothing is left is taken as it is, as a flush
    of one file's answer always was: waiting again could not bring ``seq`` any closer."""
    return isinstance(got, FlushResult) and got.flushed_seq < seq and got.more


class _SyncPool:
    """The process' pool of :data:`SYNC_THREADS` threads, made at first use; forgotten in a
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
        """Each thunk on a thread of the pool; each one's error (None: it ran)."""
        with self._lock:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(
                    SYNC_THREADS, thread_name_prefix="sgme-wait-sync"
                )
            pool = self._pool
        return list(pool.map(flush.outcome, thunks))


_SYNCS = _SyncPool()


def _run(thunks: list[Callable[[], None]]) -> list[BaseException | None]:
    """The :data:`Runner` of waited rounds: one thunk on the calling thread, more on the
    process' sync pool."""
    if len(thunks) <= 1:
        return flush.serially(thunks)
    return _SYNCS.run(thunks)
