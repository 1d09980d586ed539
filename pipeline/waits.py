"""The waited-append scheduler: the flushes that appends wait for (``wait=flushed``),
combined (docs/design.md §3).

An append that waits is answered once its messages are in the file. Flushed on each caller's
own thread, the waits of concurrent sessions each pay a read snapshot, a commit and a share of
the process' GIL of their own. :class:`Waits` combines them as the group committer combines
commits: a caller queues its file, and the caller that finds no flush running *leads* one
flush round (:meth:`pipeline.flusher.Flusher.round`: one snapshot, the files' syncs in
parallel, one commit) of every file queued so far, while the others wait for it. There is no
timer: a round is whatever queued while the previous one ran, so a lone caller's flush starts
at once.

A caller whose file the round did not reach far enough (past the round's byte budget, or one
chunk written and more left before its seq) queues it again at the front, for the next
round; a file the round hands back to run on its own (busy, or its write failed in a round
of several) gets a round of its own at once, from the same leader, and its waiters that
round's answer or error. A lone caller's round is a round of one file, which waits for the
file's lock. The round calls nobody back: the leader returns the results of the rounds it
led with its own (:class:`Joined`), and its caller runs what follows them
(:meth:`pipeline.service.Service.follow_up`).

As in the group committer, each caller waits on an event of its own: after a round the
leader wakes the callers it settled and hands the lead to the first caller still queued,
and nobody else. (One condition notified for all woke every waiting caller after every
round, to find, most of them, that it had to wait again: at 16 sessions 25.0–26.2 context
switches a waited append against 21.8–23.1 now: the twelfth throughput pass, in the
history of docs/benchmarks.md.)
"""

from __future__ import annotations

import dataclasses
import threading

from pipeline import forks
from pipeline.flush import FlushResult
from pipeline.flusher import Flusher

Outcome = FlushResult | BaseException


@dataclasses.dataclass(frozen=True)
class Joined:
    """What :meth:`Waits.join` is answered with."""

    outcome: Outcome  #: the flush that put the caller's seq in its file, or its error
    #: every result of the rounds this caller led (the caller runs what follows them)
    led: list[FlushResult]

    def result(self) -> FlushResult:
        """The flush's result; its error raised."""
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        return self.outcome


@dataclasses.dataclass(eq=False)
class _Wait:
    file_id: str
    seq: int  #: the last seq the caller appended: flushed once the file's flushed_seq reaches it
    outcome: Outcome | None = None
    #: set when the wait is settled (:attr:`outcome`), or when its caller is to lead a round
    woken: threading.Event = dataclasses.field(default_factory=threading.Event)


class Waits:
    """The waited-append scheduler: combined flushes of the files that appends wait for (one
    per service, over the process' :class:`Flusher`)."""

    def __init__(self, flusher: Flusher):
        self._flusher = flusher
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
        """Whether a round is running."""
        with self._lock:
            return self._leading

    def join(self, file_id: str, seq: int) -> Joined:
        """Join the next round of flushes until ``file_id`` is in its file up to ``seq``: the
        result of the round that put it there, or that round's error for the file
        (:class:`errors.SgmeError`, or a bug), with the results of the rounds this caller led
        on the way."""
        mine = _Wait(file_id, seq)
        led: list[FlushResult] = []
        with self._lock:
            self._queue.append(mine)
            follower = self._leading
            self._leading = True
        while True:
            if follower:
                mine.woken.wait()
                mine.woken.clear()
            if mine.outcome is not None:
                return Joined(mine.outcome, led)
            # the lead is this caller's (its wait is queued): a round of everything queued
            with self._lock:
                batch, self._queue = self._queue, []
            self._lead(batch, led)
            follower = True  # settled by it (woken already), or queued again

    def _lead(self, batch: list[_Wait], led: list[FlushResult]) -> None:
        """One round for ``batch`` (its results added to ``led``); each wait settled, or
        queued again for the next round. Afterwards the first wait queued (if any) leads the
        next round: only the callers whose wait settled, and that one, are woken."""
        outcomes: dict[str, Outcome] = {}
        failure: BaseException | None = None
        try:
            outcomes = self._outcomes([*dict.fromkeys(wait.file_id for wait in batch)], led)
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

    def _outcomes(self, file_ids: list[str], led: list[FlushResult]) -> dict[str, Outcome]:
        """A round of ``file_ids``, then a round of its own for each file it handed back to
        run so; each file's result or error (none for a file past the round's budget). A
        lone file's round waits for its lock, as a waited append's flush always did."""
        done = self._flusher.round(file_ids, wait=len(file_ids) == 1)
        outcomes: dict[str, Outcome] = {**done.results, **done.errors}
        for file_id in done.again:
            alone = self._flusher.round([file_id], wait=True)
            outcomes.update(alone.results)
            outcomes.update(alone.errors)
            led.extend(alone.results.values())
        led.extend(done.results.values())
        return outcomes


def _short(got: Outcome, seq: int) -> bool:
    """Whether a flush stopped short of ``seq`` with more of the file to write (a round
    writes one chunk a file). One that says nothing is left is taken as it is, as a flush
    of one file's answer always was: waiting again could not bring ``seq`` any closer."""
    return isinstance(got, FlushResult) and got.flushed_seq < seq and got.more
