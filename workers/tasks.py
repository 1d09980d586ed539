"""Thin Celery tasks: decode arguments → call into ``pipeline`` → retry policy.

Tasks carry only ids and numbers; the journal and the index hold the state, so a lost,
repeated or reordered task message delays work but never loses or repeats it. Whether an
error is retried is decided by its class (``errors.SgmeError.retry``).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from celery import Task

from pipeline import archive, errors, index, journal, metrics, refine
from workers.app import app, runtime

log = logging.getLogger(__name__)
FLUSH_MAX_RETRIES = 8


def _backoff(base: float, retries: int) -> float:
    return float(min(base * (2**retries), 300.0))


@app.task(name="sgme.flush", bind=True, max_retries=FLUSH_MAX_RETRIES)
def flush(self: Task, file_id: str) -> None:
    """Write a file's pending journal rows, then dispatch its refinement if it is due."""
    rt = runtime()
    try:
        journal.flush(
            rt.engine, rt.settings.data_dir, file_id, lock_timeout=rt.settings.lock_timeout
        )
    except errors.SgmeError as exc:
        if exc.retry and self.request.retries < FLUSH_MAX_RETRIES:
            raise self.retry(exc=exc, countdown=_backoff(0.5, self.request.retries)) from exc
        log.error("flush of %s failed: %s", file_id, exc.detail)
        return
    _dispatch(file_ids=[file_id])


@app.task(name="sgme.sweep")
def sweep(age: float | None = None) -> int:
    """Re-kick flushes of journal rows older than ``age`` seconds (default ``sweep_age``):
    lost kicks, a wiped broker, a killed process."""
    rt = runtime()
    stale = journal.stale_files(rt.engine, age=rt.settings.sweep_age if age is None else age)
    for file_id in stale:
        flush.delay(file_id)
    return len(stale)


@app.task(name="sgme.append", bind=True, max_retries=FLUSH_MAX_RETRIES)
def append(self: Task, **body: Any) -> None:
    """Ingest an append sent over Celery (same body as ``POST /v1/append``).

    ``idempotency_key`` is required on this path: a redelivered task then writes nothing
    twice. Invalid bodies are not retried; they land in the anomalies table with the reason.
    """
    rt = runtime()
    who = f"agent_id={body.get('agent_id')!r} session_key={body.get('session_key')!r}"
    try:
        if not body.get("idempotency_key"):
            raise errors.InvalidInput("idempotency_key is required for sgme.append tasks")
        result = journal.ingest(rt.engine, body, limits=rt.settings.limits)
    except errors.SgmeError as exc:
        if exc.retry and self.request.retries < FLUSH_MAX_RETRIES:
            raise self.retry(exc=exc, countdown=_backoff(0.5, self.request.retries)) from exc
        with index.transaction(rt.engine) as conn:
            index.record_anomaly(conn, None, "append_task_rejected", f"{who}: {exc.detail}")
        log.warning("sgme.append rejected (%s): %s", who, exc.detail)
        return
    if result.kick:
        flush.delay(result.file_id)


def _dispatch(file_ids: list[str] | None = None) -> int:
    rt = runtime()
    s = rt.settings
    claims = refine.dispatch(
        rt.engine,
        min_messages=s.refine_min_messages,
        idle_seconds=s.refine_idle_seconds,
        lease_seconds=s.refine_lease_seconds,
        file_ids=file_ids,
    )
    for c in claims:
        refine_segment.delay(c.file_id, c.lo, c.hi, c.epoch)
    return len(claims)


@app.task(name="sgme.dispatch_refinements")
def dispatch_refinements() -> int:
    """Claim due files and enqueue one ``refine_segment`` per claim."""
    return _dispatch()


@app.task(name="sgme.refine_segment", bind=True)
def refine_segment(self: Task, file_id: str, lo: int, hi: int, epoch: int) -> bool:
    """Refine messages ``lo < seq <= hi`` and commit them if the claim still holds.

    Failures retry with exponential backoff; after ``refine_max_retries`` the file is marked
    ``error`` with a ``refine_failed`` anomaly. Other files are not held up meanwhile.
    """
    rt = runtime()
    s = rt.settings
    c = refine.Claim(file_id, lo, hi, epoch)
    started = time.perf_counter()
    try:
        items = refine.run(
            rt.engine,
            s.data_dir,
            rt.refiner,
            c,
            budget_tokens=s.refine_window_tokens,
            overlap=s.refine_overlap_messages,
        )
        committed = refine.commit(rt.engine, c, items, refiner=s.refiner)
    except Exception as exc:  # a refiner plug-in may raise anything
        retry = not isinstance(exc, errors.SgmeError) or exc.retry
        detail = exc.detail if isinstance(exc, errors.SgmeError) else repr(exc)
        if retry and self.request.retries < s.refine_max_retries:
            log.warning("refine %s (%d,%d] failed, retrying: %s", file_id, lo, hi, detail)
            raise self.retry(
                exc=exc,
                countdown=_backoff(s.refine_retry_backoff, self.request.retries),
                max_retries=s.refine_max_retries,
            ) from exc
        log.error("refine %s (%d,%d] failed for good: %s", file_id, lo, hi, detail)
        refine.fail(rt.engine, c, detail)
        return False
    finally:
        metrics.REFINE_SECONDS.observe(time.perf_counter() - started)
    if committed:
        # More may have been flushed meanwhile; a due file is claimed again right away.
        _dispatch(file_ids=[file_id])
    return committed


@app.task(name="sgme.archive_cold_files")
def archive_cold_files() -> int:
    """Daily: compress cold, fully refined files; flag cold unrefined ones."""
    rt = runtime()
    s = rt.settings
    report = archive.archive_cold(
        rt.engine,
        s.data_dir,
        older_than_days=s.archive_after_days,
        level=s.archive_level,
        threads=s.archive_threads,
        workers=s.archive_workers,
        lock_timeout=s.lock_timeout,
    )
    for file_id, detail in report.failed:
        log.error("archiving %s failed: %s", file_id, detail)
    return report.files
