"""The leases of the refinement jobs running in this process, renewed by one thread
(docs/design.md §4).

A job holds its claim's lease while the refiner works, and the lease is short
(``refine_lease_seconds``) so that a job lost with its worker frees its file soon. One thread
renews the lease of every running job a third of a lease after it was taken or last renewed.
A thread of its own for each job cost a thread start and join per claim: about 6% of a
claim's CPU in a profile of ``bench/bench_refine.py``, and more wall time while other threads
hold the GIL (a third of a job's, in ``sgme serve`` under load).
The thread ends after :data:`IDLE_SECONDS` without a job; the next job starts it again.

A lease's renewals are timed by its database's clock (:attr:`database.Database.clock`), the
clock its expiry is stamped by: the thread waits until the earliest lease is due by its own
clock, and a clock that jumps (:class:`~pipeline.clock.ManualClock`) wakes it, so a test moves
time through a lease instead of sleeping through it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import logging
import math
import threading
import time
from collections.abc import Iterator

from pipeline import database, errors, forks, index

log = logging.getLogger(__name__)

IDLE_SECONDS = 30.0  #: the renewing thread ends after this long without a running job


@dataclasses.dataclass(eq=False)
class _Lease:
    db: database.Database
    file_id: str
    epoch: int
    lease_seconds: float
    due: dt.datetime  #: its next renewal, by its database's clock

    def left(self) -> float:
        """Seconds until its next renewal, by its database's clock."""
        return (self.due - self.db.now()).total_seconds()

    def plan(self) -> None:
        """Its next renewal: a third of a lease from now."""
        self.due = self.db.now() + dt.timedelta(seconds=self.lease_seconds / 3)


class Keeper:
    """The running jobs' leases of one process (:data:`KEEPER`), and the thread renewing
    them while there are any."""

    def __init__(self) -> None:
        self._reset()
        forks.reset_in_child(self)

    def _reset(self) -> None:
        self._changed = threading.Condition(threading.Lock())
        self._leases: set[_Lease] = set()
        self._thread: threading.Thread | None = None
        self._last = time.monotonic()  #: when the last job ended (or the keeper was made)
        #: when the thread looks at the leases next, ``time.monotonic()`` (a lease due earlier
        #: must wake it)
        self._wakes = math.inf

    def after_fork_in_child(self) -> None:
        """A child renews none of its parent's leases: those jobs run in the parent."""
        self._reset()

    @contextlib.contextmanager
    def holding(
        self, db: database.Database, file_id: str, *, epoch: int, lease_seconds: float
    ) -> Iterator[None]:
        """Renew the lease of ``file_id``'s claim ``epoch`` every third of ``lease_seconds``
        while the block runs, until a renewal finds the claim replaced."""
        lease = _Lease(db, file_id, epoch, lease_seconds, db.now())
        lease.plan()
        with self._changed:
            db.clock.watch(self._changed)
            self._leases.add(lease)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="sgme-leases", daemon=True)
                self._thread.start()
            elif time.monotonic() + lease.left() < self._wakes:  # due before the thread looks
                self._changed.notify()
        try:
            yield
        finally:
            with self._changed:  # not notified: when it wakes, the thread finds the lease gone
                self._leases.discard(lease)
                self._last = time.monotonic()

    def _run(self) -> None:
        while True:
            with self._changed:
                due = self._due()
                if due is None:
                    self._thread = None
                    return
            for lease in due:
                self._renew(lease)

    def _due(self) -> list[_Lease] | None:
        """The leases to renew now, once there are any (the lock held); None once the keeper
        has been idle for :data:`IDLE_SECONDS`."""
        while True:
            if not self._leases:
                idle = time.monotonic() - self._last
                if idle >= IDLE_SECONDS:
                    return None
                self._wait(IDLE_SECONDS - idle)
                continue
            left = {lease: lease.left() for lease in self._leases}
            due = [lease for lease, seconds in left.items() if seconds <= 0]
            if due:
                self._wakes = time.monotonic()  # renewing: a lease added meanwhile is next
                return due
            self._wait(min(left.values()))

    def _wait(self, seconds: float) -> None:
        """Wait ``seconds`` (by the earliest lease's clock: a clock that jumps notifies), or
        until a lease or a jump of a clock wakes the thread."""
        self._wakes = time.monotonic() + seconds
        self._changed.wait(seconds)

    def _renew(self, lease: _Lease) -> None:
        lease.plan()
        db = lease.db
        try:
            with db.transaction() as conn:
                held = index.renew_lease(
                    conn,
                    lease.file_id,
                    epoch=lease.epoch,
                    lease_seconds=lease.lease_seconds,
                    now=db.now(),
                )
        except errors.SgmeError as exc:  # tried again a third of a lease later
            log.warning("could not renew the lease of %s: %s", lease.file_id, exc.detail)
            return
        if not held:  # replaced (a full re-refine, an expired lease): the commit is fenced
            with self._changed:
                self._leases.discard(lease)

    def renewing(self) -> int:
        """How many leases are being renewed (tests)."""
        with self._changed:
            return len(self._leases)

    def wakes(self) -> float:
        """When the thread looks at the leases next, unless a lease due earlier or a clock's
        jump wakes it (``time.monotonic()``; tests)."""
        with self._changed:
            return self._wakes

    def running(self) -> bool:
        """Whether the renewing thread runs (tests)."""
        with self._changed:
            return self._thread is not None


KEEPER = Keeper()  #: this process's
