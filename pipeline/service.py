"""The pipeline's steps put together, once, for every caller: the Celery tasks, the API and the
``sgme`` command each hold a :class:`Service` and call the same methods.

Work that should happen later goes to a :class:`Queue` (Celery in a deployment, a
:class:`LocalQueue` drained in-process by ``sgme refine``); a failure to enqueue is never an
error, because the journal and the index hold the state and the beat sweeps catch up.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import math
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import sqlalchemy as sa

from pipeline import (
    archive,
    audit,
    database,
    erasure,
    errors,
    index,
    journal,
    ledger,
    metrics,
    ordering,
    privacy,
    redaction,
    refine,
    rewrite,
    store,
    tables,
    validation,
)
from pipeline.settings import Settings

log = logging.getLogger(__name__)


class Queue(Protocol):
    """Where work for later goes."""

    def flush(self, file_id: str) -> None:
        """Enqueue a flush of ``file_id``."""
        ...

    def refine(self, claim: refine.Claim) -> None:
        """Enqueue the job of a refinement claim."""
        ...


class Workers(Protocol):
    """What the ``sgme`` command needs of a task queue implementation (the ``sgme.workers``
    entry point: :mod:`workers.app`), so that :mod:`pipeline` never imports it."""

    def queue(self, settings: Settings, engine: sa.Engine) -> Queue:
        """A queue that sends work to the workers (the API's)."""
        ...

    def worker(
        self,
        settings: Settings,
        engine: sa.Engine,
        *,
        queues: str,
        concurrency: int,
        pool: str,
        loglevel: str,
    ) -> None:
        """Run a worker in the foreground."""
        ...

    def beat(self, settings: Settings, engine: sa.Engine, *, loglevel: str) -> None:
        """Run the scheduler in the foreground."""
        ...

    def embedded(
        self, settings: Settings, engine: sa.Engine, *, concurrency: int
    ) -> contextlib.AbstractContextManager[Queue]:
        """A worker and scheduler inside this process while the context is open."""
        ...


class LocalQueue:
    """Work kept in this process and run by :meth:`drain` (a command with no workers)."""

    def __init__(self) -> None:
        self._work: collections.deque[tuple[str, Any]] = collections.deque()

    def flush(self, file_id: str) -> None:
        """Remember a flush."""
        self._work.append(("flush", file_id))

    def refine(self, claim: refine.Claim) -> None:
        """Remember a refinement job."""
        self._work.append(("refine", claim))

    def drain(self, service: Service) -> None:
        """Run everything queued, and what that queues, until nothing is left; a job that
        fails is not retried (it is the last attempt: the file is marked as DESIGN §4 says)."""
        while self._work:
            kind, arg = self._work.popleft()
            if kind == "flush":
                service.flush(arg)
            else:
                service.refine_segment(arg, final=True)


@dataclasses.dataclass(frozen=True)
class Appended:
    """What an append is answered with, and whether its messages are in the file yet."""

    result: journal.AppendResult
    flushed: bool = False
    status: str = ""
    #: secrets replaced by markers before the append was journaled (how many, never what)
    redacted: int = 0

    def to_json(self) -> dict[str, Any]:
        """The API's response body."""
        answer = self.result.to_json()
        if self.status:
            answer["status"] = self.status
        answer["replayed"] = self.result.replayed
        answer["redacted"] = self.redacted
        return answer


class Admission:
    """Whether the store can take one more append: the journal's backlog under its limit, and
    the backlog plus the append fitting in the data volume's free space (above a reserve),
    so that nothing is acknowledged that the disk cannot hold. Both figures are read at most
    every ``REFRESH`` seconds (a query and a ``statvfs``), not per append."""

    REFRESH = 0.5  #: seconds a measured backlog or free space is reused

    def __init__(self, engine: sa.Engine, data_dir: Path, backlog: journal.Backlog) -> None:
        self.engine = engine
        self.data_dir = data_dir
        self.backlog = backlog
        self._measured = -math.inf
        self._journal_bytes = 0
        self._free_bytes = 0
        self._lock = threading.Lock()

    def check(self, size: int) -> None:
        """Raise :class:`errors.Overloaded` or :class:`errors.InsufficientStorage` (each with
        ``retry_after``) if ``size`` more bytes should not be acknowledged now."""
        journal_bytes, free = self._measure()
        b = self.backlog
        if journal_bytes + size > b.max_total_bytes:
            raise errors.Overloaded(
                f"{journal_bytes} bytes of appends wait to be written; at most "
                f"{b.max_total_bytes} may (backlog_max_total_bytes)",
                retry_after=b.retry_after,
            )
        if journal_bytes + size > free - b.min_free_bytes:
            raise errors.InsufficientStorage(
                f"the data volume has {free} bytes free: not enough for {journal_bytes} bytes "
                f"waiting to be written and this append above the {b.min_free_bytes}-byte "
                "reserve (backlog_min_free_bytes)",
                retry_after=b.retry_after,
            )

    def _measure(self) -> tuple[int, int]:
        with self._lock:
            now = time.monotonic()
            if now - self._measured >= self.REFRESH:
                with database.transaction(self.engine) as conn:
                    # held appends (pipeline.ordering) are waiting to be written as well
                    self._journal_bytes = (
                        ledger.journal_backlog(conn)[2] + ledger.waiting_backlog(conn)[1]
                    )
                self._free_bytes = store.free_bytes(self.data_dir)
                self._measured = now
            return self._journal_bytes, self._free_bytes


class Service:
    """Settings, the index engine, a queue, and the refiner (loaded on first use)."""

    def __init__(self, settings: Settings, engine: sa.Engine, queue: Queue | None = None) -> None:
        self.settings = settings
        self.engine = engine
        #: None: nothing is enqueued and nothing is claimed for refinement (a one-shot command
        #: must not strand a claim that no worker will run)
        self.queue = queue
        self._refiner: refine.Refiner | None = None
        self._lock = threading.Lock()
        self.admission = Admission(engine, settings.data_dir, settings.backlog)
        self.locks = redaction.Locks(settings.lock_timeout, settings.file_locks)
        #: whether each agent's input has its secrets redacted (pipeline.privacy)
        self.policies = privacy.Policies(
            engine, default=settings.redact_secrets, cache_seconds=settings.token_cache_seconds
        )

    @property
    def refiner(self) -> refine.Refiner:
        """The configured refiner, loaded once."""
        with self._lock:
            if self._refiner is None:
                self._refiner = refine.load_refiner(
                    self.settings.refiner, self.settings.refiner_options
                )
            return self._refiner

    # -----------------------------------------------------------------------------------------
    # appends

    def kick(self, file_id: str) -> None:
        """Enqueue a flush; a broker that is down only delays it (the sweeper re-kicks)."""
        if self.queue is None:
            return
        try:
            self.queue.flush(file_id)
        except Exception:
            log.warning("could not enqueue a flush of %s; the sweeper will", file_id, exc_info=True)

    def append(
        self, body: Mapping[str, Any] | bytes | validation.Append, *, wait: bool = False
    ) -> Appended:
        """Ingest an append (the acknowledgement) and enqueue its flush; with ``wait``, flush
        it here and answer once it is in the file — or, if that fails, as acknowledged only
        (the queue finishes the flush; the client must not retry an acknowledged append).

        Refused with a ``Retry-After`` rather than acknowledged when the store cannot keep up
        (DESIGN §3, bounded work): :class:`errors.Overloaded` past a backlog limit,
        :class:`errors.InsufficientStorage` when the disk could not take the backlog."""
        s = self.settings
        append = (
            body if isinstance(body, validation.Append) else validation.parse_append(body, s.limits)
        )
        append, redacted = self._scrub(append)
        self.admission.check(sum(len(m.content) for m in append.messages) + 256)
        result = journal.ingest(self.engine, append, backlog=s.backlog)
        return self._acknowledged(result, wait=wait, redacted=redacted)

    def append_queued(self, body: Mapping[str, Any]) -> Appended | ordering.Held | None:
        """An append that came over Celery (``sgme.append``): ``idempotency_key`` is required,
        so a redelivered task writes nothing twice. One with a ``sequence`` ahead of its
        session's is held in the index until its predecessor lands, one behind it is recorded
        and dropped (:mod:`pipeline.ordering`; the :class:`ordering.Held` says which). A body
        that will never be accepted is recorded as an ``append_task_rejected`` anomaly (there
        is nobody to answer) and dropped; a transient failure is raised for the task to
        retry."""
        who = f"agent_id={body.get('agent_id')!r} session_key={body.get('session_key')!r}"
        s = self.settings
        try:
            if not body.get("idempotency_key"):
                raise errors.InvalidInput("idempotency_key is required for sgme.append tasks")
            append, redacted = self._scrub(validation.parse_append(body, s.limits))
            self.admission.check(sum(len(m.content) for m in append.messages) + 256)
            done = journal.ingest_queued(
                self.engine, append, backlog=s.backlog, wait_seconds=s.order_wait_seconds
            )
            if isinstance(done, ordering.Held):
                if done.kick is not None:
                    self.kick(done.kick)
                return done
            return self._acknowledged(done, wait=False, redacted=redacted)
        except errors.PermanentError as exc:
            with database.transaction(self.engine) as conn:
                index.record_anomaly(conn, None, "append_task_rejected", f"{who}: {exc.detail}")
            log.warning("sgme.append rejected (%s): %s", who, exc.detail)
            return None

    def upload(
        self, body: Mapping[str, Any] | bytes | validation.Upload, *, wait: bool = False
    ) -> Appended:
        """Ingest an upload; like :meth:`append`."""
        upload = (
            body
            if isinstance(body, validation.Upload)
            else validation.parse_upload(body, self.settings.limits)
        )
        redacted = 0
        if self.policies.redacts(upload.agent_id):
            upload, redacted = privacy.scrub_upload(upload)
        self.admission.check(len(upload.content) + 1024)
        result = journal.ingest_upload(self.engine, upload)
        return self._acknowledged(result, wait=wait, redacted=redacted)

    def _scrub(self, append: validation.Append) -> tuple[validation.Append, int]:
        """The append as it may be kept: its secrets replaced, unless its agent opted out
        (DESIGN §5d: before the journal, so no copy is ever on a disk)."""
        if not self.policies.redacts(append.agent_id):
            return append, 0
        return privacy.scrub_append(append)

    def _acknowledged(
        self, result: journal.AppendResult, *, wait: bool, redacted: int = 0
    ) -> Appended:
        """After the commit: kick the flush, or (``wait``) flush here, falling back to a kick."""
        if not wait:
            if result.kick:
                self.kick(result.file_id)
            return Appended(result, redacted=redacted)
        try:
            flushed = self.flush(result.file_id)
        except errors.SgmeError as exc:
            log.warning("flush of %s after its append failed: %s", result.file_id, exc.detail)
            self.kick(result.file_id)
            return Appended(result, redacted=redacted)
        return Appended(result, flushed=True, status=flushed.status, redacted=redacted)

    # -----------------------------------------------------------------------------------------
    # flush, sweep and dispatch

    def flush(self, file_id: str) -> journal.FlushResult:
        """Write the file's pending journal rows, then dispatch its refinement if it became due
        by message count (due by idleness, the beat's periodic dispatch finds it).

        A damaged file is refused (FileDamaged): logged as an error the first time, then only
        counted in its anomaly, however often the sweeper comes back to it."""
        s = self.settings
        try:
            result = journal.flush(
                self.engine,
                s.data_dir,
                file_id,
                lock_timeout=s.lock_timeout,
                chunk_bytes=s.backlog.flush_chunk_bytes,
                file_lock=s.file_locks,
            )
        except errors.FileDamaged as exc:
            (log.error if exc.first else log.debug)("flush of %s refused: %s", file_id, exc.detail)
            raise
        if result.more:  # appends acknowledged during this flush: their ingest did not kick
            self.kick(file_id)
        r = s.refinement
        leased = result.leased_until is not None and result.leased_until > tables.utcnow()
        if (
            result.messages == 0
            or leased  # a job is running; it dispatches the file again when it commits
            or (result.unrefined < r.min_messages and r.idle_seconds > 0)
        ):
            # Not due by count; due by idleness only later, which the beat's dispatch finds.
            return result
        try:
            self.dispatch([file_id])
        except errors.SgmeError as exc:  # the flush stands; the beat dispatch catches up
            log.warning("dispatch after the flush of %s failed: %s", file_id, exc.detail)
        return result

    def sweep(self, age: float | None = None) -> list[str]:
        """Re-kick flushes of journal rows older than ``age`` seconds (default ``sweep_age``):
        lost kicks, a wiped broker, a killed process. Write the held appends that may go now
        (:func:`ordering.settle_waiting`: a gap past ``order_wait_seconds``)."""
        s = self.settings
        age = s.sweep_age if age is None else age
        stale = journal.stale_files(self.engine, age=age)
        for file_id in stale:
            self.kick(file_id)
        # Held appends whose gap has waited long enough are let go here too, so a gap never
        # holds a session back for good, even when no task of the session comes any more.
        try:
            written = ordering.settle_waiting(
                self.engine,
                age=min(age, s.order_wait_seconds),
                write=journal.writer(s.backlog),
                wait_seconds=s.order_wait_seconds,
            )
        except errors.SgmeError as exc:  # the next sweep comes back to them
            log.warning("could not settle the appends waiting for their order: %s", exc.detail)
            return stale
        for file_id in written:
            if file_id not in stale:
                self.kick(file_id)
                stale.append(file_id)
        self.finish_removals()
        return stale

    def finish_removals(self) -> int:
        """Finish the redactions and erasures a crash interrupted (part of every sweep)."""
        try:
            return redaction.finish_interrupted(
                self.engine, self.settings.data_dir, locks=self.locks
            )
        except errors.SgmeError as exc:  # the next sweep comes back to them
            log.warning("could not finish an interrupted redaction or erasure: %s", exc.detail)
            return 0

    def dispatch(self, file_ids: list[str] | None = None) -> list[refine.Claim]:
        """Claim due files (all, or those of ``file_ids``) and enqueue one job per claim."""
        if self.queue is None:
            return []
        r = self.settings.refinement
        claims = refine.dispatch(
            self.engine,
            min_messages=r.min_messages,
            idle_seconds=r.idle_seconds,
            lease_seconds=r.lease_seconds,
            file_ids=file_ids,
        )
        for c in claims:
            self._enqueue(c)
        return claims

    def _enqueue(self, c: refine.Claim) -> None:
        assert self.queue is not None
        try:
            self.queue.refine(c)
        except Exception:  # the claim's lease runs out and the next dispatch claims it again
            log.warning("could not enqueue refinement of %s", c.file_id, exc_info=True)

    # -----------------------------------------------------------------------------------------
    # refinement

    def refine_segment(self, c: refine.Claim, *, final: bool) -> bool:
        """Run a claim's job and commit it if the claim still holds; then dispatch the file
        again (more may have been flushed meanwhile). A transient failure is raised for the
        caller to retry, unless this is the ``final`` attempt: then, as for a permanent one,
        the file becomes ``error`` with a ``refine_failed`` anomaly. True when committed."""
        s = self.settings
        started = time.perf_counter()
        try:
            with refine.heartbeat(self.engine, c, lease_seconds=s.refinement.lease_seconds):
                items = refine.run(
                    self.engine,
                    s.data_dir,
                    self.refiner,
                    c,
                    budget_tokens=s.refinement.window_tokens,
                    overlap=s.refinement.overlap_messages,
                )
            committed = refine.commit(self.engine, c, items, refiner=s.refiner)
        except errors.SgmeError as exc:
            if exc.retry and not final:
                log.warning("refine %s (%d,%d] failed, will retry: %s", *_where(c), exc.detail)
                raise
            log.error("refine %s (%d,%d] failed for good: %s", *_where(c), exc.detail)
            refine.fail(self.engine, c, exc.detail)
            return False
        finally:
            metrics.REFINE_SECONDS.observe(time.perf_counter() - started)
        if committed:
            self.dispatch([c.file_id])
        return committed

    def refine_now(self, file_id: str, *, full: bool = False) -> None:
        """Refine a file in this process, due or not (``sgme refine``): claim its segment,
        run it and whatever it leads to through a :class:`LocalQueue`."""
        if full:
            refine.request_full(self.engine, file_id)
        queue = LocalQueue()
        service = Service(self.settings, self.engine, queue)
        service._refiner = self._refiner
        c = refine.claim(self.engine, file_id, lease_seconds=self.settings.refinement.lease_seconds)
        if c is not None:
            queue.refine(c)
        queue.drain(service)

    # -----------------------------------------------------------------------------------------
    # redaction and erasure (DESIGN §5d)

    def who(self, token_id: str | None, reason: object, *, required: bool = True) -> rewrite.Who:
        """Who asks over HTTP (the token's id and name) and why, as the audit trail keeps it."""
        checked = redaction.check_reason(reason, required=required)
        with database.reading(self.engine) as conn:
            return rewrite.Who(audit.token_actor(conn, token_id), checked, token_id)

    def audit_trail(
        self,
        *,
        agents: Collection[str] | None = None,
        file_id: str | None = None,
        after: int = 0,
        limit: int = 100,
    ) -> list[tables.AuditRow]:
        """The audit trail's rows after the id ``after``, oldest first."""
        with database.reading(self.engine) as conn:
            return audit.listed(
                conn,
                agents=None if agents is None else frozenset(agents),
                file_id=file_id,
                after=after,
                limit=limit,
            )

    def redact(
        self,
        refs: Sequence[str],
        who: rewrite.Who,
        *,
        agents: Collection[str] | None = None,
    ) -> list[tables.AuditRow]:
        """Redact the messages ``refs`` name, in order (each file rewritten under its lock);
        then make the database files forget them. Their audit rows."""
        done = [
            redaction.redact(
                self.engine, self.settings.data_dir, ref, who, agents=agents, locks=self.locks
            )
            for ref in refs
        ]
        redaction.compact(self.engine)
        return done

    def erase_file(
        self, file_id: str, who: rewrite.Who, *, agents: Collection[str] | None = None
    ) -> erasure.Erased:
        """Erase one file and everything derived from it."""
        erased = erasure.erase_file(
            self.engine,
            self.settings.data_dir,
            file_id,
            who,
            agents=agents,
            lock_timeout=self.locks.timeout,
            file_lock=self.locks.files,
        )
        redaction.compact(self.engine)
        return erased

    def erase_agent(
        self,
        agent_id: str,
        who: rewrite.Who,
        *,
        session_key: str | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> tuple[list[erasure.Erased], int]:
        """Erase every file of an agent (of one session), and what waits for it."""
        done = erasure.erase_session(
            self.engine,
            self.settings.data_dir,
            agent_id,
            who,
            session_key=session_key,
            lock_timeout=self.locks.timeout,
            file_lock=self.locks.files,
            progress=progress,
        )
        redaction.compact(self.engine)
        return done

    # -----------------------------------------------------------------------------------------
    # archive

    def archive_cold(self, **kwargs: Any) -> archive.Report:
        """The daily archive run (``older_than_days`` and ``progress`` may be given)."""
        return archive.archive_cold(
            self.engine, self.settings.data_dir, self.settings.archiving, **kwargs
        )


def _where(c: refine.Claim) -> tuple[str, int, int]:
    return c.file_id, c.lo, c.hi
