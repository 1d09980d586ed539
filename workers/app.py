"""The Celery application, configured from Settings.

Production: ``celery -A workers.app worker -Q append`` (and ``-Q refine,archive``),
``celery -A workers.app beat`` — exactly one beat. The broker is ``SGME_BROKER_URL``
(Redis in production); ``sgme serve`` runs a worker and beat inside its own process on the
in-memory broker instead.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import sqlalchemy as sa
from celery import Celery, signals

from pipeline import index, refine
from pipeline.settings import Settings
from workers import schedule

QUEUES = ("append", "refine", "archive")
TASK_TIME_LIMIT = 600  #: seconds; must stay below the broker's visibility timeout
VISIBILITY_TIMEOUT = 3600  #: seconds before Redis redelivers an unacknowledged task

app = Celery("sgme", include=["workers.tasks"])


def configure(settings: Settings) -> None:
    """(Re)configure :data:`app` and the task runtime from ``settings``."""
    memory = settings.broker_url.startswith("memory://")
    transport: dict[str, Any] = {"visibility_timeout": VISIBILITY_TIMEOUT}
    if memory:
        # The virtual transport polls; its 1 s default caps an embedded worker at ~2 tasks/s.
        transport["polling_interval"] = 0.005
    app.conf.update(
        broker_url=settings.broker_url,
        broker_transport_options=transport,
        broker_connection_retry_on_startup=True,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        worker_cancel_long_running_tasks_on_connection_loss=True,
        task_time_limit=TASK_TIME_LIMIT,
        task_soft_time_limit=TASK_TIME_LIMIT - 60,
        task_serializer="json",
        accept_content=["json"],
        result_serializer="json",
        task_ignore_result=True,
        result_backend=None,
        worker_send_task_events=True,
        task_send_sent_event=True,
        # A kick that cannot be published is not an error: the sweeper re-kicks from the journal.
        task_publish_retry_policy={"max_retries": 2, "interval_start": 0, "interval_step": 0.2},
        task_default_queue="append",
        task_routes={
            "sgme.append": {"queue": "append"},
            "sgme.flush": {"queue": "append"},
            "sgme.sweep": {"queue": "append"},
            "sgme.dispatch_refinements": {"queue": "refine"},
            "sgme.refine_segment": {"queue": "refine"},
            "sgme.archive_cold_files": {"queue": "archive"},
        },
        beat_schedule=schedule.beat_schedule(settings),
        timezone="UTC",
    )
    # Make this the app every thread falls back to: a task's retry resolves the app through
    # the thread's current app, and a worker thread that fell back to Celery's default app
    # published its retries where no consumer of ours ever saw them.
    app.set_default()
    app.set_current()
    global _runtime
    _runtime = Runtime(settings)


@dataclasses.dataclass
class Runtime:
    """What tasks need in this process: settings, an engine and a refiner (made on first use)."""

    settings: Settings
    _engine: sa.Engine | None = None
    _refiner: refine.Refiner | None = None
    _lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    @property
    def engine(self) -> sa.Engine:
        with self._lock:
            if self._engine is None:
                self._engine = index.create_engine(
                    self.settings.index_url, busy_timeout=self.settings.sqlite_busy_timeout
                )
            return self._engine

    @engine.setter
    def engine(self, engine: sa.Engine) -> None:
        self._engine = engine

    @property
    def refiner(self) -> refine.Refiner:
        with self._lock:
            if self._refiner is None:
                self._refiner = refine.load_refiner(
                    self.settings.refiner, self.settings.refiner_options
                )
            return self._refiner

    def reset(self) -> None:
        """Drop connections inherited over a fork."""
        with self._lock:
            if self._engine is not None:
                self._engine.dispose(close=False)


_runtime: Runtime | None = None


def runtime() -> Runtime:
    """The runtime of this process."""
    if _runtime is None:
        configure(Settings.load())
    assert _runtime is not None
    return _runtime


@signals.worker_process_init.connect
def _after_fork(**_: Any) -> None:
    if _runtime is not None:
        _runtime.reset()


@signals.worker_ready.connect
def _metrics_server(**_: Any) -> None:
    port = runtime().settings.worker_metrics_port
    if port:
        from prometheus_client import start_http_server

        start_http_server(port)


configure(Settings.load())
