"""Thin Celery tasks: decode arguments → one :class:`pipeline.service.Service` call.

Tasks carry only ids and numbers (and the append body); the journal and the index hold the
state, so a lost, repeated or reordered task message delays work but never loses or repeats
it. Retries are declared once per task kind: every :class:`errors.TransientError` is retried
with exponential backoff and jitter, limits from the settings; nothing else is.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from celery import Celery, Task
from celery.exceptions import Reject

from pipeline import errors, refine
from pipeline.service import Service
from workers import deployment

log = logging.getLogger(__name__)
BACKOFF_MAX = 300  #: seconds: the longest wait between two retries


def _retries(max_retries: int, backoff: int) -> dict[str, Any]:
    return {
        "shared": False,
        "bind": True,
        "autoretry_for": (errors.TransientError,),
        "retry_backoff": max(1, backoff),
        "retry_backoff_max": BACKOFF_MAX,
        "retry_jitter": True,
        "max_retries": max_retries,
    }


def register(app: Celery, service: Service, *, deployment_id: str) -> None:
    """Define the tasks on ``app``, each calling into ``service`` (not ``shared``: Celery
    would hand a shared task to every app made later, and this one belongs to ``app``).

    A message whose deployment header names another deployment is not run here, and not
    dropped: it is passed on to that deployment's own queue, which its workers consume
    (:mod:`workers.deployment`), and recorded as a ``foreign_task`` anomaly. A message without
    the header (an ingestion service that does not stamp its ``sgme.append`` tasks) is run."""

    class Guarded(Task):  # type: ignore[misc]
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            other = self.request.get(deployment.HEADER)
            if other and other != deployment_id:
                self._pass_on(str(other), args, kwargs)
                service.refuse_foreign(str(other), self.name, deployment.queue(str(other)))
                return None
            return super().__call__(*args, **kwargs)

        def _pass_on(self, other: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            """The same task (id, arguments, header, retries so far) into ``other``'s queue;
            should that fail, the message goes back to the broker, to be taken again."""
            try:
                self.apply_async(
                    args,
                    kwargs,
                    queue=deployment.queue(other),
                    headers={deployment.HEADER: other},
                    task_id=self.request.id,
                    retries=self.request.retries,
                )
            except Exception as exc:
                raise Reject(exc, requeue=True) from exc

    s = service.settings
    flushes = {**_retries(s.flush_max_retries, s.flush_retry_backoff), "base": Guarded}
    appends = {**_retries(s.append_max_retries, s.append_retry_backoff), "base": Guarded}
    plain = {"shared": False, "base": Guarded}
    # A refine job is acknowledged only when it ends, and given back if its worker dies, so a
    # lost job comes back from the broker; the claim's short lease covers a wiped broker.
    refines = {
        **_retries(s.refine.max_retries, s.refine.retry_backoff),
        "acks_late": True,
        "reject_on_worker_lost": True,
        "base": Guarded,
    }

    @app.task(name="sgme.flush", **flushes)
    def flush(self: Task, file_id: str) -> None:
        """Write a file's pending journal rows, then dispatch its refinement if it is due; in
        one round with the flush tasks other threads of this worker run at the moment."""
        # A damaged file is recorded as an anomaly and logged (once) by the flusher; a retry
        # would change nothing, and the sweeper comes back to it anyway.
        with contextlib.suppress(errors.FileDamaged):
            service.wait_flushed(file_id)

    @app.task(name="sgme.append", **appends)
    def append(self: Task, **body: Any) -> None:
        """Ingest an append sent over Celery (the body of ``POST /v1/append``, with an
        ``idempotency_key``); an invalid one is recorded as an anomaly, not retried. One
        whose ``sequence`` is ahead of its session's is held in the index (not retried here:
        a worker killed meanwhile would keep it from the others) until its predecessor lands
        or ``order_wait_seconds`` pass (:mod:`pipeline.ordering`)."""
        service.append_queued(body)

    @app.task(name="sgme.sweep", **plain)
    def sweep(age: float | None = None) -> int:
        """Re-kick flushes of journal rows older than ``age`` seconds."""
        return len(service.sweep(age))

    @app.task(name="sgme.dispatch_refinements", **plain)
    def dispatch_refinements() -> int:
        """Claim due files and enqueue one ``refine_segment`` per claim."""
        return len(service.dispatch())

    @app.task(name="sgme.refine_segment", **refines)
    def refine_segment(self: Task, file_id: str, lo: int, hi: int, epoch: int) -> bool:
        """Refine messages ``lo < seq <= hi`` and commit them if the claim still holds."""
        c = refine.Claim(file_id, lo, hi, epoch)
        return service.refine_segment(c, final=self.request.retries >= self.max_retries)

    @app.task(name="sgme.embed", **plain)
    def embed() -> int:
        """One embedding round (docs/search.md): vectors for flushed messages that have none
        of the configured model. An embedder that is down waits for the next round."""
        try:
            return service.hybrid.embed_round()
        except errors.EmbedderUnavailable as exc:
            log.warning("embedding round stopped: %s", exc.detail)
            return 0

    @app.task(name="sgme.archive_cold_files", **plain)
    def archive_cold_files() -> int:
        """Daily: compress cold, fully refined files; flag cold unrefined ones."""
        report = service.upkeep.archive_cold()
        for file_id, detail in report.failed:
            log.error("archiving %s failed: %s", file_id, detail)
        return report.files
