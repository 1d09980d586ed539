"""The Celery application, made from a runtime by :func:`create` (never at import time).

Production runs ``sgme worker --queues append`` (and ``--queues refine,archive``, and with an
embedder ``--queues embed``) and exactly
one ``sgme beat``; ``sgme serve`` runs a worker and beat inside its own process on the
in-memory broker (:mod:`workers.embedded`). The ``sgme`` command finds :data:`backend` through
the ``sgme.workers`` entry point, so :mod:`pipeline` never imports this package.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from celery import Celery, signals
from kombu.transport import redis as kombu_redis
from redis import exceptions as redis_exceptions

from pipeline import local_queue, refine
from pipeline.runtime import Runtime
from pipeline.service import Queue, Service
from workers import deployment, embedded, schedule, tasks

log = logging.getLogger(__name__)


class ChannelGone(redis_exceptions.ConnectionError):
    """A Redis channel whose connection was closed after the broker went away was asked for a
    connection (a late acknowledgement, the channel's own close)."""


_connparams = kombu_redis.Channel._connparams
_close_channel = kombu_redis.Channel.close


def _connparams_while_connected(
    self: kombu_redis.Channel, asynchronous: bool = False
) -> dict[str, Any]:
    """kombu builds a channel's connection pool from its transport's client, which a closed
    connection has set to None: ``'NoneType' object has no attribute 'hostname'``, an
    AttributeError, not a connection error, so it ended the worker instead of being handled
    as one (the acknowledgement of a task that finished after Redis went away, the close of
    its channel: tests/e2e/test_faults.py, Redis stopped for 30 s). Raised as a connection
    error, Celery logs the lost acknowledgement and reconnects."""
    if getattr(self.connection, "client", None) is None:
        raise ChannelGone("the channel's broker connection was closed")
    found: dict[str, Any] = _connparams(self, asynchronous=asynchronous)  # type: ignore[no-untyped-call]
    return found


def _close_orphaned_channel(self: kombu_redis.Channel) -> None:
    """The channel is being thrown away: what is left of its close does not matter once its
    connection is gone."""
    try:
        _close_channel(self)  # type: ignore[no-untyped-call]
    except ChannelGone:
        log.debug("closing a channel whose connection is gone", exc_info=True)


kombu_redis.Channel._connparams = _connparams_while_connected  # type: ignore[method-assign]
kombu_redis.Channel.close = _close_orphaned_channel  # type: ignore[method-assign]
QUEUES = ("append", "refine", "archive", "embed")
TASK_TIME_LIMIT = 600  #: seconds; must stay below the broker's visibility timeout
VISIBILITY_TIMEOUT = 3600  #: seconds before Redis redelivers an unacknowledged task


class CeleryQueue:
    """:class:`pipeline.service.Queue` on a Celery app: tasks carry only ids and numbers, and
    the deployment they belong to."""

    def __init__(self, app: Celery, deployment_id: str) -> None:
        self.app = app
        self.headers = {deployment.HEADER: deployment_id}

    def kick(self, file_id: str) -> None:
        """Enqueue ``sgme.flush``."""
        self.app.tasks["sgme.flush"].apply_async((file_id,), headers=self.headers)

    def submit(self, claim: refine.Claim) -> None:
        """Enqueue ``sgme.refine_segment`` for a claim."""
        args = (claim.file_id, claim.lo, claim.hi, claim.epoch)
        self.app.tasks["sgme.refine_segment"].apply_async(args, headers=self.headers)


def create(runtime: Runtime, *, flush_threads_count: int = 0) -> tuple[Celery, Service]:
    """A Celery app whose tasks call the service it is answered with, made over ``runtime``:
    work for later goes to the app's broker — or, with ``flush_threads_count``, flushes run on
    that many threads of this process (:class:`local_queue.LocalQueue`, the embedded
    service) and only refinement jobs go to the broker."""
    settings = runtime.settings
    ours = runtime.deployment
    app = Celery("sgme", set_as_current=False)
    memory = settings.broker_url.startswith("memory://")
    broker_url = settings.broker_url
    transport: dict[str, Any] = {"visibility_timeout": VISIBILITY_TIMEOUT}
    if memory:
        # The virtual transport polls; its 1 s default caps an embedded worker at ~2 tasks/s.
        transport["polling_interval"] = 0.005
        # kombu warns "No hostname was supplied" for memory:// on every connection it makes;
        # the in-memory transport has no host, so name the one it would assume.
        if broker_url.rstrip("/") == "memory:":
            broker_url = "memory://localhost/"
    app.conf.update(
        broker_url=broker_url,
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
            "sgme.embed": {"queue": "embed"},
        },
        beat_schedule=schedule.beat_schedule(settings, headers={deployment.HEADER: ours}),
        beat_scheduler=f"{schedule.__name__}:{schedule.Scheduler.__name__}",
        timezone="UTC",
    )
    queue: Queue = CeleryQueue(app, ours)
    if flush_threads_count:
        queue = local_queue.LocalQueue(
            queue, threads=flush_threads_count, linger=settings.backlog.flush_linger
        )
    service = runtime.service(queue)
    tasks.register(app, service, deployment_id=ours)
    # Make this the app every thread falls back to: a task's retry resolves the app through
    # the thread's current app, and a worker thread that fell back to Celery's default app
    # published its retries where no consumer of ours ever saw them.
    app.set_default()
    app.set_current()

    def after_fork(**_: Any) -> None:
        # connections inherited over a fork are not ours to use
        runtime.db.engine.dispose(close=False)

    def metrics_server(**_: Any) -> None:
        if settings.worker_metrics_port:
            from prometheus_client import start_http_server

            start_http_server(settings.worker_metrics_port)

    signals.worker_process_init.connect(after_fork, weak=False)
    signals.worker_ready.connect(metrics_server, weak=False)
    return app, service


class CeleryWorkers:
    """What the ``sgme`` command needs of the workers (:class:`pipeline.runtime.Workers`).

    Every process claims its broker database for its store at start and asserts the claim
    while it runs (:mod:`workers.deployment`); every worker also consumes its store's own queue,
    where other stores' workers pass on the tasks of this one they took."""

    def service(self, runtime: Runtime) -> Service:
        """The API's service: work goes into the broker (``sgme api``)."""
        _keeper(runtime).start()  # for the life of the process
        return create(runtime)[1]

    def worker(
        self, runtime: Runtime, *, queues: str, concurrency: int, pool: str, loglevel: str
    ) -> None:
        """Run a worker in the foreground (``sgme worker``)."""
        keeper = _keeper(runtime)
        if deployment.shared(runtime.settings.broker_url):
            queues = f"{queues},{deployment.queue(runtime.deployment)}"
        argv = ["worker", "--queues", queues, "--loglevel", loglevel.upper()]
        argv += ["--concurrency", str(concurrency), "--pool", pool, "-E"]
        keeper.start()
        try:
            create(runtime)[0].worker_main(argv)
        finally:
            keeper.stop()

    def beat(self, runtime: Runtime, *, loglevel: str) -> None:
        """Run beat in the foreground (``sgme beat``)."""
        keeper = _keeper(runtime)
        schedule_file = str(runtime.settings.data_dir / ".celerybeat-schedule")
        keeper.start()
        try:
            create(runtime)[0].start(
                ["beat", "--loglevel", loglevel.upper(), "--schedule", schedule_file]
            )
        finally:
            keeper.stop()

    @contextlib.contextmanager
    def embedded(self, runtime: Runtime, *, concurrency: int) -> Iterator[Service]:
        """A worker and beat in this process for as long as the block runs (``sgme serve``),
        and the service the API shares with them. Flushes run on threads of this process (no
        task per kick); refinement, sweeps and the archive run as Celery tasks of the
        in-process worker."""
        keeper = _keeper(runtime)
        queues: tuple[str, ...] = QUEUES
        if deployment.shared(runtime.settings.broker_url):
            queues = (*QUEUES, deployment.queue(runtime.deployment))
        app, service = create(runtime, flush_threads_count=concurrency)
        assert isinstance(service.queue, local_queue.LocalQueue)
        service.queue.start(service.flusher, service.follow_up)
        keeper.start()
        try:
            runner = embedded.Embedded(
                app, queues=queues, data_dir=runtime.settings.data_dir, concurrency=concurrency
            )
            runner.start()
            try:
                yield service
            finally:
                runner.stop()
        finally:
            keeper.stop()
            service.queue.close()


def _keeper(runtime: Runtime) -> deployment.Keeper:
    """The runtime's claim of its broker, made now (``Misconfigured`` when another store holds
    it), and the keeper that asserts it while the process runs."""
    settings = runtime.settings
    deployment.claim(settings.broker_url, runtime.deployment)
    return deployment.Keeper(
        settings.broker_url, runtime.deployment, interval=settings.broker_claim_interval
    )


#: what the ``sgme.workers`` entry point names
backend = CeleryWorkers()
