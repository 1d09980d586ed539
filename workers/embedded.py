"""A Celery worker and beat inside the current process, on the in-memory broker — what
``sgme serve`` runs so that the embedded default needs no servers.

The in-memory transport is shared by every connection in the process, so the API thread's
``flush.delay`` reaches the worker thread. A crash loses queued kicks only: the journal holds
every acknowledged append, and the sweep at start (and every few seconds) re-kicks them.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from celery import Celery, beat
from celery.worker import WorkController


class Embedded:
    """Start/stop a threaded worker (all queues) and a threaded beat for ``app``."""

    def __init__(
        self,
        app: Celery,
        *,
        queues: Sequence[str],
        data_dir: Path,
        concurrency: int = 4,
        loglevel: str = "WARNING",
    ) -> None:
        self.app = app
        self._ready = threading.Event()
        self.worker: Any = _ReadyWorker(
            app=app,
            ready_event=self._ready,
            pool="threads",
            concurrency=concurrency,
            queues=list(queues),
            loglevel=loglevel,
            without_heartbeat=True,
            without_mingle=True,
            without_gossip=True,
            hostname="sgme-embedded@localhost",
        )
        self.beat: Any = beat.EmbeddedService(
            app,
            thread=True,
            schedule_filename=str(data_dir / ".celerybeat-schedule"),
            scheduler_cls=app.conf.beat_scheduler,
        )
        self._thread = threading.Thread(target=self.worker.start, name="sgme-worker", daemon=True)

    def start(self, timeout: float = 30.0) -> None:
        """Start the worker, wait until it consumes, sweep once, start beat."""
        self._thread.start()
        if not self._ready.wait(timeout):
            raise RuntimeError("embedded Celery worker did not start")
        # Every row, however young: a crash just lost this process's in-memory queue, so no
        # kick is on its way for any of them (with the default age, rows acknowledged in the
        # last seconds before a crash would wait for the next periodic sweep).
        self.app.tasks["sgme.sweep"].delay(age=0)
        self.app.tasks["sgme.dispatch_refinements"].delay()
        self.beat.start()

    def stop(self) -> None:
        """Stop beat and the worker (the task in progress finishes). A beat thread that died
        is not waited for (its service would never say it stopped)."""
        if self.beat.is_alive():
            self.beat.stop()
        self.worker.stop(in_sighandler=False, exitcode=0)
        self._thread.join(30)


class _ReadyWorker(WorkController):  # type: ignore[misc]
    def __init__(self, *args: Any, ready_event: threading.Event, **kwargs: Any) -> None:
        self._ready_event = ready_event
        super().__init__(*args, **kwargs)

    def on_consumer_ready(self, consumer: Any) -> None:
        super().on_consumer_ready(consumer)
        self._ready_event.set()
