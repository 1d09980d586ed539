"""The pipeline's use cases, put together once: every caller — the Celery tasks, the API, the
``sgme`` command — holds a :class:`Service` (made by :mod:`pipeline.runtime`) and calls its
methods; none of them opens a transaction or reaches into the index itself.

Work that should happen later goes to a :class:`Queue` (Celery in a deployment, flush threads
in the embedded service); a failure to enqueue is never an error, because the journal and the
index hold the state and the beat's sweeps catch up.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import time
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

from pipeline import (
    anomalies,
    auth,
    backlog,
    batches,
    browsing,
    catalog,
    database,
    dates,
    document,
    errors,
    flush,
    hybrid,
    index,
    ingest,
    l1,
    ledger,
    locks,
    metrics,
    privacy,
    reader,
    refine,
    removals,
    search,
    store,
    tables,
    terms,
    upkeep,
    validation,
    waits,
)
from pipeline.flush import FlushResult
from pipeline.flusher import Flusher
from pipeline.settings import Settings
from pipeline.tables import Kind

log = logging.getLogger(__name__)


class Queue(Protocol):
    """Where work for later goes."""

    def kick(self, file_id: str) -> None:
        """Enqueue a flush of ``file_id``."""
        ...

    def submit(self, claim: refine.Claim) -> None:
        """Enqueue the job of a refinement claim."""
        ...


@dataclasses.dataclass(frozen=True)
class Appended:
    """What an append is answered with, and whether its messages are in the file yet."""

    result: ingest.AppendResult
    flushed: bool = False
    status: str = ""
    #: secrets replaced by markers before the append was journaled (how many, never what)
    redacted: int = 0

    def to_json(self) -> dict[str, Any]:
        """The API's response body."""
        answer = self.result.to_json()
        if self.status:
            answer["status"] = self.status
        answer.update(replayed=self.result.replayed, redacted=self.redacted)
        answer["erased"] = self.result.erased
        return answer


class Service:
    """The use cases over one runtime's parts: its settings, index handle, per-file locks and
    refiner, and a queue (None: nothing is enqueued and nothing is claimed for refinement, as a
    one-shot command must not strand a claim no worker will run). It holds the collaborators
    over the same parts: :attr:`browsing` (the sessions listing, the store's overview),
    :attr:`upkeep` (the archive and the index's checks), :attr:`removals` (redaction and
    erasure) and :attr:`hybrid` (the embedding rounds and the search that fuses words with
    meaning)."""

    def __init__(
        self,
        settings: Settings,
        db: database.Database,
        file_locks: locks.FileLocks,
        queue: Queue | None = None,
        *,
        refiners: refine.Refiners | None = None,
        flusher: Flusher | None = None,
    ) -> None:
        self.settings = settings
        self.db = db
        self.file_locks = file_locks
        self.queue = queue
        self.refiners = refiners or refine.Refiners.configured(settings)
        self.admission = backlog.Admission(db, settings.data_dir, settings.backlog)
        #: whether each agent's input has its secrets redacted (pipeline.privacy)
        self.policies = privacy.Policies(
            db, default=settings.redact_secrets, cache_seconds=settings.token_cache_seconds
        )
        #: the process' one writer of files (pipeline.flusher; the runtime's, shared)
        self.flusher = flusher or Flusher(settings, db, file_locks)
        #: the flushes that appends (and flush tasks) wait for, in rounds (pipeline.waits)
        self.waits = waits.Waits(self.flusher)
        #: each session's file, the order of an append's row lock (pipeline.ingest)
        self.known = ingest.KnownFiles(ingest.KNOWN_FILES if db.postgres else 0)
        #: what people and agents browse (pipeline.browsing)
        self.browsing = browsing.Browsing(settings, db)
        #: the cold archive, its restore, the index's check and rebuild (pipeline.upkeep)
        self.upkeep = upkeep.Upkeep(settings, db, file_locks)
        #: redaction, erasure and their audit trail (pipeline.removals)
        self.removals = removals.Removals(settings, db, file_locks)
        #: the embedder, its rounds and the hybrid search (pipeline.hybrid)
        self.hybrid = hybrid.Hybrid(settings, db)

    @property
    def data_dir(self) -> Path:
        """Where the raw files are."""
        return self.settings.data_dir

    # -----------------------------------------------------------------------------------------
    # appends

    def kick(self, file_id: str) -> None:
        """Enqueue a flush; a broker that is down only delays it (the sweeper re-kicks)."""
        if self.queue is None:
            return
        try:
            self.queue.kick(file_id)
        except Exception:
            log.warning("could not enqueue a flush of %s; the sweeper will", file_id, exc_info=True)

    def append(self, body: validation.Append, *, wait: bool = False) -> Appended:
        """Ingest an append (the acknowledgement) and enqueue its flush; with ``wait``, flush
        it here and answer once it is in the file — or, if that fails, as acknowledged only
        (the queue finishes the flush; the client must not retry an acknowledged append).

        Refused with a ``Retry-After`` rather than acknowledged when the store cannot keep up
        (docs/design.md §3, bounded work): :class:`errors.Overloaded` past a backlog limit,
        :class:`errors.InsufficientStorage` when the disk could not take the backlog."""
        body, redacted = self._scrub(body)
        self.admission.check(backlog.estimate(body))
        limits, key = self.settings.backlog, self.known.key(body)
        result = ingest.append(self.db, body, limits=limits, key=key)
        self.known.learn(body, result.file_id)
        return self._acknowledged(result, wait=wait, redacted=redacted)

    def append_many(self, bodies: list[validation.Append]) -> list[Appended | errors.SgmeError]:
        """:meth:`append` (without ``wait``) for appends that arrived together: one hand-off to
        the group committer for all of them, each acknowledged or refused on its own."""
        answers: list[Appended | errors.SgmeError | None] = [None] * len(bodies)
        ready: list[tuple[int, validation.Append, int]] = []
        for i, body in enumerate(bodies):
            try:
                scrubbed, redacted = self._scrub(body)
                self.admission.check(backlog.estimate(scrubbed))
            except errors.SgmeError as exc:
                answers[i] = exc
                continue
            ready.append((i, scrubbed, redacted))
        bodies = [body for _, body, _ in ready]
        keys = [self.known.key(body) for body in bodies]
        done = batches.append_many(self.db, bodies, limits=self.settings.backlog, keys=keys)
        for (i, body, redacted), result in zip(ready, done, strict=True):
            if isinstance(result, ingest.AppendResult):
                self.known.learn(body, result.file_id)
                answers[i] = self._acknowledged(result, wait=False, redacted=redacted)
            elif isinstance(result, errors.SgmeError):
                answers[i] = result
            else:  # a bug: answered as one (logged with its traceback); the others stand
                bug = errors.InternalError("internal error")
                bug.__cause__ = result
                answers[i] = bug
        assert all(answer is not None for answer in answers)
        return answers  # type: ignore[return-value]

    def append_queued(self, body: Mapping[str, Any]) -> Appended | ingest.Held | None:
        """An append that came over Celery (``sgme.append``): ``idempotency_key`` is required,
        so a redelivered task writes nothing twice. One with a ``sequence`` ahead of its
        session's is held in the index until its predecessor lands, one behind it is recorded
        and dropped (:mod:`pipeline.ordering`; the :class:`ingest.Held` says which). A body
        that will never be accepted is recorded as an ``append_task_rejected`` anomaly (there
        is nobody to answer) and dropped; a transient failure is raised for the task to
        retry."""
        who = f"agent_id={body.get('agent_id')!r} session_key={body.get('session_key')!r}"
        s = self.settings
        try:
            if not body.get("idempotency_key"):
                raise errors.InvalidInput("idempotency_key is required for sgme.append tasks")
            append, redacted = self._scrub(validation.parse_append(body, s.limits))
            self.admission.check(backlog.estimate(append))
            wait, key = s.order_wait_seconds, self.known.key(append)
            done = ingest.queued(self.db, append, limits=s.backlog, wait_seconds=wait, key=key)
            if isinstance(done, ingest.Held):
                if done.kick is not None:
                    self.kick(done.kick)
                return done
            self.known.learn(append, done.file_id)
            return self._acknowledged(done, wait=False, redacted=redacted)
        except errors.PermanentError as exc:
            with self.db.transaction() as conn:
                detail = f"{who}: {exc.detail}"
                anomalies.record(conn, None, Kind.APPEND_TASK_REJECTED, detail, now=self.db.now())
            log.warning("sgme.append rejected (%s): %s", who, exc.detail)
            return None

    def upload(self, body: validation.Upload, *, wait: bool = False) -> Appended:
        """Ingest an upload; like :meth:`append`."""
        redacted = 0
        if self.policies.redacts(body.agent_id):
            body, redacted = privacy.scrub_upload(body)
        self.admission.check(len(body.content.encode("utf-8")) + backlog.HEADING_BYTES)
        result = ingest.upload(self.db, body)
        return self._acknowledged(result, wait=wait, redacted=redacted)

    def _scrub(self, append: validation.Append) -> tuple[validation.Append, int]:
        """The append as it may be kept: its secrets replaced, unless its agent opted out
        (docs/privacy.md: before the journal, so no copy is ever on a disk)."""
        if not self.policies.redacts(append.agent_id):
            return append, 0
        return privacy.scrub_append(append)

    def _acknowledged(
        self, result: ingest.AppendResult, *, wait: bool, redacted: int = 0
    ) -> Appended:
        """After the commit: kick the flush, or (``wait``) flush here, falling back to a kick."""
        if not wait:
            if result.kick:
                self.kick(result.file_id)
            return Appended(result, redacted=redacted)
        try:
            flushed = self._joined(result.file_id, result.last_seq)
        except errors.SgmeError as exc:
            log.warning("flush of %s after its append failed: %s", result.file_id, exc.detail)
            self.kick(result.file_id)
            return Appended(result, redacted=redacted)
        return Appended(result, flushed=True, status=flushed.status, redacted=redacted)

    # -----------------------------------------------------------------------------------------
    # flush, sweep and dispatch

    def flush(self, file_id: str) -> FlushResult:
        """Write the file's journal rows acknowledged now (:meth:`Flusher.flush`),
        then what follows (:meth:`follow_up`). A damaged file is refused (FileDamaged):
        logged as an error the first time, then only counted in its anomaly, however often
        the sweeper comes back to it."""
        result = self.flusher.flush(file_id)
        self.follow_up([result])
        return result

    def wait_flushed(self, file_id: str) -> FlushResult:
        """Wait until the journal rows of ``file_id`` acknowledged now are in its file, in one
        round with the files other threads of this process wait for at the same moment (the
        worker's flush tasks on a thread pool), as waited appends share theirs
        (:mod:`pipeline.waits`); at once and on its own when nobody else waits."""
        return self._joined(file_id, 0)

    def _joined(self, file_id: str, seq: int) -> FlushResult:
        """Join the waited rounds until ``file_id`` is in its file up to ``seq``; what follows
        the rounds this caller led is run here, and the file's error raised."""
        joined = self.waits.join(file_id, seq)
        self.follow_up(joined.led)
        return joined.result()

    def follow_up(self, results: list[FlushResult]) -> None:
        """What follows flushes (:meth:`Flusher.follow_up`): the files with appends
        acknowledged during their flush are kicked again, and those whose refinement became
        due are dispatched."""
        if not results:
            return
        after = self.flusher.follow_up(results, self.db.now())
        for file_id in after.again:
            self.kick(file_id)
        if after.due:
            try:
                self.dispatch(after.due)
            except errors.SgmeError as exc:  # the flush stands; the beat dispatch catches up
                log.warning("dispatch after the flush of %s failed: %s", after.due, exc.detail)

    def sweep(self, age: float | None = None) -> list[str]:
        """Re-kick flushes of journal rows older than ``age`` seconds (default ``sweep_age``):
        lost kicks, a wiped broker, a killed process. Write the held appends that may go now
        (:func:`ingest.settle_waiting`: a gap past ``order_wait_seconds``)."""
        s = self.settings
        age = s.sweep_age if age is None else age
        stale = flush.stale_files(self.db, age=age)
        for file_id in stale:
            self.kick(file_id)
        # Held appends whose gap has waited long enough are let go here too, so a gap never
        # holds a session back for good, even when no task of the session comes any more.
        try:
            written = ingest.settle_waiting(
                self.db,
                age=min(age, s.order_wait_seconds),
                limits=s.backlog,
                wait_seconds=s.order_wait_seconds,
            )
        except errors.SgmeError as exc:  # the next sweep comes back to them
            log.warning("could not settle the appends waiting for their order: %s", exc.detail)
            return stale
        for file_id in written:
            if file_id not in stale:
                self.kick(file_id)
                stale.append(file_id)
        self.removals.finish_interrupted()
        return stale

    def dispatch(self, file_ids: list[str] | None = None) -> list[refine.Claim]:
        """Claim due files (all, or those of ``file_ids``) and enqueue one job per claim."""
        if self.queue is None:
            return []
        r = self.settings.refine
        claims = refine.dispatch(
            self.db,
            min_messages=r.min_messages,
            idle_seconds=r.idle_seconds,
            lease_seconds=r.lease_seconds,
            file_ids=file_ids,
        )
        for c in claims:
            try:
                self.queue.submit(c)
            except Exception:  # the claim's lease runs out and the next dispatch claims it again
                log.warning("could not enqueue refinement of %s", c.file_id, exc_info=True)
        return claims

    # -----------------------------------------------------------------------------------------
    # refinement

    def refine_segment(self, c: refine.Claim, *, final: bool) -> bool:
        """Run the claim in the job's turn (:meth:`refine.Refiners.turn`; its lease renewed
        while it waits), commit it if it still holds, dispatch the file again. A transient
        failure is raised for a retry, unless the attempt is ``final``: then the file becomes
        ``error`` with a ``refine_failed`` anomaly, as for a permanent one. True if committed."""
        lease = refine.heartbeat(self.db, c, lease_seconds=self.settings.refine.lease_seconds)
        with lease, self.refiners.turn():
            committed = self._run_claim(c, final=final)
            if committed:
                self.dispatch([c.file_id])
        return committed

    def _run_claim(self, c: refine.Claim, *, final: bool) -> bool:
        r = self.settings.refine
        started = time.perf_counter()
        try:
            items = refine.run(
                self.db,
                self.data_dir,
                self.refiners.get(),
                c,
                budget_tokens=r.window_tokens,
                overlap=r.overlap_messages,
            )
            return refine.commit(self.db, c, items, refiner=self.settings.refiner)
        except errors.SgmeError as exc:
            where = (c.file_id, c.lo, c.hi)
            if exc.retry and not final:
                log.warning("refine %s (%d,%d] failed, will retry: %s", *where, exc.detail)
                raise
            log.error("refine %s (%d,%d] failed for good: %s", *where, exc.detail)
            refine.fail(self.db, c, exc.detail)
            return False
        finally:
            metrics.REFINE_SECONDS.observe(time.perf_counter() - started)

    def refine_now(self, file_id: str, *, full: bool = False) -> int:
        """Refine a file in this process, due or not (``sgme refine``): claim its unrefined
        segment and run it, again until nothing is left or a run fails (it is the last
        attempt: the file is marked as docs/design.md §4 says). The segments committed."""
        if full:
            refine.request_full(self.db, file_id)
        lease, runs = self.settings.refine.lease_seconds, 0
        while (c := refine.claim(self.db, file_id, lease_seconds=lease)) is not None:
            with refine.heartbeat(self.db, c, lease_seconds=lease):
                if not self._run_claim(c, final=True):
                    break
            runs += 1
        return runs

    def request_refine(
        self, file_id: str, *, agents: Collection[str] | None = None
    ) -> tables.FileRow:
        """A full re-refine asked for over the API: ``last_refined_seq = 0`` under the
        ``refine_cooldown_seconds`` rule, then dispatched at once; the file's row."""
        cooldown = self.settings.refine.cooldown_seconds
        refine.request_full(self.db, file_id, cooldown=cooldown, agents=agents)
        self.dispatch([file_id])
        return reader.get_file(self.db, file_id)

    def l1_items(
        self,
        *,
        file_id: str | None = None,
        agents: Collection[str] | None = None,
        after: int = 0,
        limit: int = 100,
    ) -> list[tables.L1Item]:
        """L1 items of ``agents`` (None: all), oldest first, after the id ``after``."""
        with self.db.reading() as conn:
            return l1.list_items(conn, file_id=file_id, agents=agents, after=after, limit=limit)

    # -----------------------------------------------------------------------------------------
    # reads

    def list_files(self, **filters: Any) -> list[tables.FileRow]:
        """Index rows by file_id (:func:`index.list_files`'s filters and paging)."""
        with self.db.reading() as conn:
            return index.list_files(conn, **filters)

    def get_file(self, file_id: str, *, agents: Collection[str] | None = None) -> tables.FileRow:
        """A file's index row (:func:`reader.get_file`)."""
        return reader.get_file(self.db, file_id, agents=agents)

    def raw(
        self, file_id: str, *, agents: Collection[str] | None = None
    ) -> tuple[tables.FileRow, Iterator[bytes]]:
        """A file's row and its committed bytes as a stream (decompressed if archived)."""
        row = reader.get_file(self.db, file_id, agents=agents)
        return row, reader.stream(self.db, self.data_dir, row)

    def messages(self, file_id: str, **options: Any) -> list[document.Message]:
        """Flushed messages of a file by seq (:func:`reader.messages`'s options), within
        ``http_max_page_bytes`` unless ``max_bytes`` says otherwise."""
        options.setdefault("max_bytes", self.settings.http.max_page_bytes)
        return reader.messages(self.db, self.data_dir, file_id, **options)

    def resolve(self, ref: str, **options: Any) -> reader.Ref:
        """The message a source_ref names, with neighbours (:func:`reader.resolve`'s
        options), within ``http_max_page_bytes`` unless ``max_bytes`` says otherwise."""
        options.setdefault("max_bytes", self.settings.http.max_page_bytes)
        return reader.resolve(self.db, self.data_dir, ref, **options)

    def search(
        self,
        q: str,
        filters: catalog.Filters,
        *,
        limit: int,
        match: terms.Match = "any",
        context: int = 0,
        window: dates.Window | None = None,
    ) -> list[search.Result]:
        """Messages that match ``q`` within ``filters``, best first, each with ``context``
        turns around it; ranked, within the ``window`` the question names too
        (:meth:`window`), and fused with the nearest vectors when an embedder is set
        (:attr:`hybrid`; docs/search.md)."""
        found, _ = self.hybrid.ranked(
            q, filters, limit=limit, match=match, context=context, window=window
        )
        return found

    def window(self, q: str, ref_time: dt.datetime | None = None) -> dates.Window | None:
        """The time window a date in question ``q`` names, resolved against ``ref_time``
        (when the question is asked; default now)."""
        return dates.window(q, self.db.now() if ref_time is None else ref_time)

    def health(self) -> dict[str, Any]:
        """Whether the index answers and the data directory is writable (``status`` ok or
        degraded), with the journal's backlog."""
        checks: dict[str, Any] = {"journal_backlog": None, "deployment": None}
        try:
            with self.db.reading() as conn:
                rows, messages, size = ledger.journal_backlog(conn)
                checks["deployment"] = index.deployment_id(conn)
            checks["index"] = "ok"
            checks["journal_backlog"] = {"rows": rows, "messages": messages, "bytes": size}
        except errors.SgmeError as exc:
            checks["index"] = exc.detail
        try:
            store.probe(self.data_dir)
            checks["data_dir"] = "ok"
        except errors.SgmeError as exc:
            checks["data_dir"] = exc.detail
        ok = checks["index"] == "ok" and checks["data_dir"] == "ok"
        return {"status": "ok" if ok else "degraded", **checks}

    def deployment(self) -> str:
        """This store's identity (docs/design.md §8)."""
        with self.db.reading() as conn:
            return index.deployment_id(conn)

    def refuse_foreign(self, deployment: str, task: str, queue: str) -> None:
        """Record a task of another deployment this one's worker passed on to ``queue``, that
        deployment's own, without running it (once per deployment and task name, counted)."""
        who = deployment[:60]
        detail = (
            f"a {task} task of deployment {who} came to a worker of deployment "
            f"{self.deployment()}: passed on to its store's queue {queue}, not run here. Two "
            "stores share one broker database: give each its own (broker_url)"
        )
        with self.db.transaction() as conn:
            key = f"{who}:{task}"
            anomalies.record(conn, None, Kind.FOREIGN_TASK, detail, key=key, now=self.db.now())
        log.error("%s", detail)

    def metrics(self) -> bytes:
        """The Prometheus text exposition: this process's histograms and the index gauges."""
        embedder = self.hybrid.embedder
        model = None if embedder is None else embedder.model
        return metrics.render(self.db, embedding_model=model)

    # -----------------------------------------------------------------------------------------
    # tokens

    def verifier(self) -> auth.Verifier:
        """What the API checks bearer tokens with (one per API process: it caches)."""
        s = self.settings
        return auth.Verifier(
            self.db, require_auth=s.require_auth, cache_seconds=s.token_cache_seconds
        )

    def create_token(self, **options: Any) -> auth.Created:
        """Make a token (:func:`auth.create`'s options); its secret is in the answer only."""
        return auth.create(self.db, **options)

    def list_tokens(self) -> list[auth.Token]:
        """Every token, revoked ones too, oldest first."""
        return auth.list_tokens(self.db)

    def revoke_token(self, token_id: str) -> auth.Token:
        """Revoke a token (its row stays, so auth stays on)."""
        return auth.revoke(self.db, token_id)
