"""The beat schedule: sweep for lost flush kicks, dispatch due refinements, archive
cold files daily."""

from __future__ import annotations

from typing import Any

from celery.schedules import crontab

from pipeline.settings import Settings


def beat_schedule(settings: Settings, *, headers: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Periodic tasks; intervals in seconds from ``settings``; each message carries
    ``headers`` (the deployment)."""
    options = {"headers": headers}
    return {
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
