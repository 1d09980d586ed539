"""The beat schedule: sweep for lost flush kicks, dispatch due refinements, archive
cold files daily, embed new messages (with an embedder set); and the scheduler that keeps it
in the data directory."""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from celery import beat
from celery.schedules import crontab

from pipeline.settings import Settings

log = logging.getLogger(__name__)


def beat_schedule(settings: Settings, *, headers: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Periodic tasks; intervals in seconds from ``settings``; each message carries
    ``headers`` (the deployment)."""
    options = {"headers": headers}
    found = {
        "sweep": {"task": "sgme.sweep", "schedule": settings.sweep_interval, "options": options},
        "dispatch-refinements": {
            "task": "sgme.dispatch_refinements",
            "schedule": settings.refine.dispatch_interval,
            "options": options,
        },
        "archive-cold-files": {
            "task": "sgme.archive_cold_files",
            "schedule": crontab(hour=3, minute=17),
            "options": options,
        },
    }
    if settings.search.embedder != "none":
        # a round left in a queue no worker consumes expires instead of piling up
        interval = settings.embed.interval
        found["embed"] = {
            "task": "sgme.embed",
            "schedule": interval,
            "options": {**options, "expires": max(interval * 2, 10.0)},
        }
    return found


class Scheduler(beat.PersistentScheduler):  # type: ignore[misc]  # celery is untyped
    """Celery's scheduler that keeps when each periodic task last ran in a file
    (``.celerybeat-schedule`` in the data directory), and starts that file afresh when it
    cannot be read. A process killed while the file was written leaves it torn; Celery's own
    scheduler then fails as it starts (``EOFError``, a pickle error), and beat — in
    ``sgme serve`` a thread nobody watches — is gone, with the sweeps, the refinement
    dispatches and the archive it runs. The file holds only last-run times: afresh, each task
    runs at its next due time."""

    def setup_schedule(self) -> None:
        try:
            super().setup_schedule()
        except Exception as exc:  # whatever a torn file raises; a second failure is a bug
            log.warning(
                "beat's schedule file %s could not be read (%r): starting it afresh",
                self.schedule_filename,
                exc,
            )
            store = getattr(self, "_store", None)
            if store is not None:
                with contextlib.suppress(Exception):
                    store.close()
            self._remove_db()
            super().setup_schedule()
