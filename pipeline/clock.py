"""Time, as the index stores it: naive UTC datetimes, from a clock the runtime owns.

Everything that stamps or compares a time in the index (leases, cooldowns, the age of a
journal row or of a held append, archive cutoffs) asks the :class:`Clock` it was given —
:attr:`pipeline.database.Database.clock` — rather than the system, so that a test can move
time forward instead of sleeping through it (:class:`ManualClock`). A thread that waits for a
time by a clock (the lease keeper, :mod:`pipeline.leases`) asks the clock to :meth:`Clock.watch`
its condition: a manual clock wakes it when it is moved, the system's never needs to.
"""

from __future__ import annotations

import datetime as dt
import threading
from typing import Protocol


class Clock(Protocol):
    """Where the time comes from."""

    def now(self) -> dt.datetime:
        """Now, as a naive UTC datetime."""
        ...

    def watch(self, condition: threading.Condition) -> None:
        """Notify ``condition`` whenever this clock's time jumps, so a thread waiting on it
        for a time by this clock looks at the time again."""
        ...


class SystemClock:
    """The system's time."""

    def now(self) -> dt.datetime:
        """Now, as a naive UTC datetime."""
        return dt.datetime.now(dt.UTC).replace(tzinfo=None)

    def watch(self, condition: threading.Condition) -> None:
        """Nothing to do: the system's time never jumps (a wait's timeout measures it)."""


SYSTEM = SystemClock()


def naive_utc(when: dt.datetime) -> dt.datetime:
    """A time a caller gave, as the index compares times: naive UTC (a naive one is UTC already).

    An offset can carry a time past the ends of what ``datetime`` holds
    (``0001-01-01T00:00:00+00:01`` is a minute before the year 1); such a bound is clamped to the
    end it crossed, which selects exactly what the bound itself would.
    """
    if when.tzinfo is None:
        return when
    try:
        return when.astimezone(dt.UTC).replace(tzinfo=None)
    except OverflowError:
        return dt.datetime.min if when.year == dt.MINYEAR else dt.datetime.max


class ManualClock:
    """A clock that stands still until :meth:`advance` moves it (tests and simulations).

    It starts at the system's time, so rows it stamps sort with rows stamped before."""

    def __init__(self, start: dt.datetime | None = None) -> None:
        self._now = start if start is not None else SYSTEM.now()
        self._lock = threading.Lock()
        self._watching: list[threading.Condition] = []

    def now(self) -> dt.datetime:
        """The time the clock was last set to."""
        with self._lock:
            return self._now

    def watch(self, condition: threading.Condition) -> None:
        """Notify ``condition`` after each :meth:`advance` (once, however often it is given)."""
        with self._lock:
            if not any(known is condition for known in self._watching):
                self._watching.append(condition)

    def advance(self, seconds: float) -> dt.datetime:
        """Move the clock forward by ``seconds``, and wake the threads waiting by it; the new
        time."""
        with self._lock:
            self._now += dt.timedelta(seconds=seconds)
            now, watching = self._now, list(self._watching)
        for condition in watching:  # not under the clock's lock: a waiter may read the time
            with condition:
                condition.notify_all()
        return now
