"""Group commit (docs/design.md §3): concurrent transactions of one process share one commit.

A durable commit costs a sync to disk (an fsync of SQLite's WAL, a WAL sync on PostgreSQL),
whatever it holds. So the transactions that arrive while one commits do not each wait for a
sync of their own: they queue, and the next one to commit takes everything queued into
one transaction (a *group*), each piece of work in a savepoint of its own, and commits once.
Work that fails (a bad request, a conflict, a full backlog) rolls back to its savepoint and
fails alone; the rest commit. Every caller gets its answer only after its group's commit. On
PostgreSQL, where a savepoint and its release are two round trips, a group runs first
without them (*optimistic*): a piece that fails then fails alone, the transaction rolls
back, and the rest run again in savepoints.

There is no timer: a group is whatever queued while the previous one committed, so a lone
caller commits at once, and under load groups grow by themselves. The caller that finds no
commit running becomes the *leader*: it runs groups until its own work is committed, then
hands the lead to the first caller still queued and returns.

Work is a function of a Connection; it may run more than once (a group whose transaction
failed on a deadlock is run again from the start, and work that raises :class:`Again` is
queued for the next group), so it must only touch the database.

A group runs its pieces in the order of their *keys* (the file whose row each one locks),
pieces without a key first, pieces of one key in the order they came: every group of every
process then takes the row locks of PostgreSQL in one order, so two groups never wait for
each other in a circle. In arrival order they did: on PostgreSQL + Redis the API's groups of
appends and a worker's groups of flushes and refinement commits deadlocked about once a
second, each deadlock held both for ``deadlock_timeout`` (docs/benchmarks.md). A group whose
every run deadlocked anyway (a piece without a key that locks a row) is run one piece at a
time: alone, a piece holds only its own locks, so it cannot wait in a circle with another
group through a piece of its own.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import threading
from collections.abc import Callable, Sequence
from typing import Any, Generic, Protocol, TypeVar

import sqlalchemy as sa

from pipeline import errors
from pipeline.database import engines, statements

T = TypeVar("T")
MAX_GROUP = 256  #: pieces of work in one transaction at most
#: runs of a group whose transaction the database aborted (:class:`errors.TransactionAborted`:
#: a deadlock, a serialization failure)
DEADLOCK_ATTEMPTS = 3


class Transactions(Protocol):
    """What a group commits through (:class:`pipeline.database.Database`)."""

    def committing(
        self, *, durable: bool = True
    ) -> contextlib.AbstractContextManager[sa.Connection]:
        """One write transaction on the connection the group holds (one leader at a time)."""
        ...


class Again(Exception):
    """Raised by work that must run again in a later group (it met the uncommitted or just
    committed work of another transaction: a same-key race)."""


@dataclasses.dataclass(eq=False)
class _Work(Generic[T]):
    run: Callable[[sa.Connection], T]
    durable: bool
    #: the file whose row the work locks (the group's order), or None
    key: str | None = None
    #: set when the work is finished, or when its caller must take the lead; only a caller
    #: that queued behind a leader waits (a leader's own work needs none)
    wake: threading.Event | None = None
    finished: bool = False
    value: Any = None
    error: BaseException | None = None

    def succeed(self, value: T) -> None:
        self.value, self.finished = value, True

    def fail(self, error: BaseException) -> None:
        self.error, self.finished = engines.mapped(error), True

    def outcome(self) -> T:
        if self.error is not None:
            raise self.error
        return self.value  # type: ignore[no-any-return]


class Group:
    """The group committer of one database handle. Work is durable (its commit is on stable storage
    before it returns: an acknowledgement) or lazy (:func:`database.transaction`'s
    ``durable``); a group's commit is durable when any of its work is, so lazy work that
    queues behind an acknowledgement rides on its sync and costs no commit of its own."""

    def __init__(
        self, db: Transactions, *, max_group: int = MAX_GROUP, optimistic: bool = False
    ) -> None:
        self.db = db
        self.max_group = max_group
        #: whether a group runs first without savepoints (PostgreSQL: a savepoint and its
        #: release are two round trips a piece; on SQLite two calls of a few µs, and a piece
        #: that fails would cost the group a second run)
        self.optimistic = optimistic
        self._mutex = threading.Lock()
        self._queue: collections.deque[_Work[Any]] = collections.deque()
        self._leading = False
        #: groups committed and pieces of work in them (tests and benchmarks read these)
        self.groups = 0
        self.works = 0
        #: runs of a group that the database aborted (a deadlock, a serialization failure)
        self.aborted = 0

    def run(
        self, work: Callable[[sa.Connection], T], *, durable: bool = True, key: str | None = None
    ) -> T:
        """Run ``work`` in a transaction shared with whatever else is queued; its value once
        that transaction committed, or its error (database errors as :mod:`pipeline.errors`).
        ``key``: the file whose row it locks, where it is known (the order of the group)."""
        mine: _Work[T] = _Work(work, durable, key)
        with self._mutex:
            self._queue.append(mine)
            follower = self._leading
            self._leading = True
            if follower:
                mine.wake = threading.Event()
        if mine.wake is not None:
            mine.wake.wait()
            if mine.finished:
                return mine.outcome()
        try:
            while not mine.finished:
                self._commit_next()
        finally:
            self._hand_over()
        return mine.outcome()

    def run_many(
        self,
        works: list[Callable[[sa.Connection], T]],
        *,
        durable: bool = True,
        keys: Sequence[str | None] | None = None,
    ) -> list[T | BaseException]:
        """:meth:`run` for several pieces of work from one caller, queued together (one
        thread hand-off for all, where :meth:`run` from as many threads makes one each): each
        one's value once its transaction committed, or its error, in order. ``keys``: each
        one's key, as :meth:`run` takes it."""
        keyed = [None] * len(works) if keys is None else keys
        mine: list[_Work[T]] = [
            _Work(work, durable, key) for work, key in zip(works, keyed, strict=True)
        ]
        if not mine:
            return []
        with self._mutex:
            self._queue.extend(mine)
            follower = self._leading
            self._leading = True
            if follower:
                for work in mine:
                    work.wake = threading.Event()
        lead = not follower
        for work in mine if follower else ():
            assert work.wake is not None
            work.wake.wait()
            if not work.finished:  # the lead was handed to it: ours now
                lead = True
                break
        if lead:
            try:
                while not all(work.finished for work in mine):
                    self._commit_next()
            finally:
                self._hand_over()
        return [work.error if work.error is not None else work.value for work in mine]

    def _hand_over(self) -> None:
        with self._mutex:
            if self._queue:
                _wake(self._queue[0])
            else:
                self._leading = False

    def _commit_next(self) -> None:
        with self._mutex:
            group = [self._queue.popleft() for _ in range(min(len(self._queue), self.max_group))]
        again: list[_Work[Any]] = []
        try:
            again = self._commit(group)
        except BaseException as exc:  # an interrupt: nobody may be left waiting
            for work in group:
                if not work.finished:
                    work.fail(exc)
            raise
        finally:
            if again:
                with self._mutex:
                    self._queue.extendleft(reversed(again))
            for work in group:
                if work.finished:
                    _wake(work)

    def _commit(self, group: list[_Work[Any]]) -> list[_Work[Any]]:
        """Run a group in one transaction and settle each piece of work; the pieces to run
        again. A lone piece runs without a savepoint (its failure is its transaction's), and
        so does an :attr:`optimistic` group at first: when one of its pieces fails, that
        piece is settled with its failure, the transaction rolls back, and the rest run again
        in savepoints."""
        group = sorted(group, key=_lock_order)
        early: list[tuple[_Work[Any], str, Any]] = []  #: settled by a run without savepoints
        bare = self.optimistic and len(group) > 1
        attempt = 0
        outcomes: list[tuple[_Work[Any], str, Any]] = []
        while group:
            last = attempt + 1 == DEADLOCK_ATTEMPTS
            outcomes = []
            try:
                durable = any(work.durable for work in group)
                with self.db.committing(durable=durable) as conn:
                    if len(group) == 1:
                        outcomes.append((group[0], *_alone(conn, group[0].run)))
                    else:
                        for i, work in enumerate(group):
                            ran = (
                                _bare(conn, work) if bare else in_savepoint(conn, f"g{i}", work.run)
                            )
                            outcomes.append((work, *ran))
            except _Undone as undone:
                if undone.work is not None:  # failed without a savepoint: the rest with them
                    early.append((undone.work, undone.kind, undone.error))
                    group = [work for work in group if work is not undone.work]
                    bare = False
                    continue
                if undone.kind == "failed" and _aborted(undone.error):
                    self._count_abort()
                    if not last:
                        attempt += 1
                        continue
                outcomes = [(group[0], undone.kind, undone.error)]
            except errors.SgmeError as exc:
                if _aborted(exc):
                    self._count_abort()
                    if not last:
                        attempt += 1
                        continue
                again = self._settle(early)
                if _aborted(exc) and len(group) > 1:
                    # Deadlocked every time: the pieces' row locks cross those of another
                    # process's group. Alone, each holds its own locks only, and goes on.
                    return again + [w for work in group for w in self._commit([work])]
                # Nothing committed: every piece that had not failed alone fails with it.
                failed = {id(w): v for w, kind, v in outcomes if kind == "failed"}
                for work in group:
                    work.fail(failed.get(id(work), exc))
                return again
            break
        again = self._settle([*early, *outcomes])
        if len(early) + len(outcomes) > len(again):
            self._count(len(early) + len(outcomes) - len(again))
        return again

    @staticmethod
    def _settle(outcomes: list[tuple[_Work[Any], str, Any]]) -> list[_Work[Any]]:
        """Give each piece its outcome; the pieces to run again."""
        again = []
        for work, kind, value in outcomes:
            if kind == "again":
                again.append(work)
            elif kind == "failed":
                work.fail(value)
            else:
                work.succeed(value)
        return again

    def _count(self, works: int) -> None:
        with self._mutex:
            self.groups += 1
            self.works += works

    def _count_abort(self) -> None:
        with self._mutex:
            self.aborted += 1


def _lock_order(work: _Work[Any]) -> tuple[bool, str]:
    """Pieces without a key first, then by key (``sorted`` keeps the order of equal ones)."""
    return (work.key is not None, work.key or "")


def _wake(work: _Work[Any]) -> None:
    if work.wake is not None:
        work.wake.set()


class _Undone(Exception):
    """A piece of work that failed (``kind`` ``"failed"`` or ``"again"``), alone or in a group
    without savepoints (``work``): raised out of its transaction so that it rolls back."""

    def __init__(
        self, kind: str, error: BaseException | None, work: _Work[Any] | None = None
    ) -> None:
        super().__init__(kind)
        self.kind = kind
        self.error = error
        self.work = work


def _alone(conn: sa.Connection, run: Callable[[sa.Connection], Any]) -> tuple[str, Any]:
    try:
        return "done", run(conn)
    except Again:
        raise _Undone("again", None) from None
    except Exception as exc:
        raise _Undone("failed", engines.mapped(exc)) from exc


def _bare(conn: sa.Connection, work: _Work[Any]) -> tuple[str, Any]:
    """Run one piece of a group without a savepoint: ``("done", value)``, or raised: a lost
    connection or a deadlock as the whole group's error, any other failure as the piece's
    (:class:`_Undone`, the group's transaction rolls back)."""
    try:
        return "done", work.run(conn)
    except Again:
        raise _Undone("again", None, work) from None
    except Exception as exc:
        error = engines.mapped(exc)
        if isinstance(error, errors.IndexUnavailable):  # aborted or lost: so is the group
            raise error from exc
        raise _Undone("failed", error, work) from exc


def in_savepoint(
    conn: sa.Connection, name: str, run: Callable[[sa.Connection], Any]
) -> tuple[str, Any]:
    """Run one piece of work in a savepoint: ``("done", value)``, ``("again", None)`` or
    ``("failed", error)``. A lost connection, a deadlock or a savepoint that cannot be rolled
    back fails the whole group (raised)."""
    statements.savepoint(conn, name, "begin")
    try:
        value = run(conn)
    except Again:
        statements.savepoint(conn, name, "rollback")
        return "again", None
    except Exception as exc:
        error = engines.mapped(exc)
        if isinstance(error, errors.IndexUnavailable):  # aborted or lost: so is the group
            raise error from exc
        statements.savepoint(conn, name, "rollback")
        return "failed", error
    statements.savepoint(conn, name, "release")
    return "done", value


def _aborted(exc: BaseException | None) -> bool:
    """Whether the database rolled the transaction back to resolve a conflict between
    transactions (a deadlock, a serialization failure): the same work may succeed when run
    again."""
    return isinstance(exc, errors.TransactionAborted)
