"""The composition root: what one process builds from :class:`Settings`, once, and hands to
everything else.

A :class:`Runtime` holds the settings, the index handle (:class:`database.Database`: its
engine, group committer, SQLite write lock and clock), the per-file locks
(:class:`locks.FileLocks`) and the refiner; :meth:`Runtime.service` makes the
:class:`Service` every caller uses, over a queue. Every entry point builds its runtime here:
the ``sgme`` command (:mod:`pipeline.cli`), each API process of ``sgme api --workers N``
(:mod:`pipeline.api.child`), and the Celery worker, beat and embedded service (the
``sgme.workers`` backend, :class:`Workers`, which :mod:`workers.app` implements so that
``pipeline`` never imports ``workers``).
"""

from __future__ import annotations

import contextlib
import functools
import gc
from importlib import metadata as importlib_metadata
from typing import Protocol

from pipeline import database, errors, index, integrity, locks, refine
from pipeline.clock import SYSTEM, Clock
from pipeline.service import Queue, Service
from pipeline.settings import Settings

WORKERS_GROUP = "sgme.workers"  #: the entry point group that names the task queue backend
#: net allocations between two runs of the cyclic collector's youngest generation in a
#: server or worker (:func:`long_running`; Python's default is 700)
GC_THRESHOLD = 7_000


def long_running() -> None:
    """Tune the cyclic garbage collector of a process that is about to serve or work until
    it is stopped (``sgme serve``, ``api``, ``worker``, ``beat``), once everything it keeps
    for its life is built: its modules, settings, app and runtime.

    What exists by then is frozen (:func:`gc.freeze`): the collector's full runs stop going
    through the ~200,000 objects of the loaded modules, which they did every few seconds
    under load (about 150 ms each, holding the GIL: the slowest answers' wait). The youngest
    generation is collected after :data:`GC_THRESHOLD` net allocations: a request's objects
    are freed by their reference counts, and the few cycles wait a little longer. Under
    ``wrk`` the collector's time in ``sgme serve`` went from about 7% of the process' CPU to
    well under 1% (docs/benchmarks.md). A program that embeds the library keeps its own
    settings: only the ``sgme`` processes call this."""
    gc.collect()
    gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(GC_THRESHOLD, middle, oldest)


class Workers(Protocol):
    """What the ``sgme`` command needs of a task queue implementation (the ``sgme.workers``
    entry point: :mod:`workers.app`)."""

    def service(self, runtime: Runtime) -> Service:
        """The service of an API process: work goes to the workers through the broker."""
        ...

    def worker(
        self, runtime: Runtime, *, queues: str, concurrency: int, pool: str, loglevel: str
    ) -> None:
        """Run a worker in the foreground."""
        ...

    def beat(self, runtime: Runtime, *, loglevel: str) -> None:
        """Run the scheduler in the foreground."""
        ...

    def embedded(
        self, runtime: Runtime, *, concurrency: int
    ) -> contextlib.AbstractContextManager[Service]:
        """A worker and scheduler inside this process while the context is open; the service
        they and the API share."""
        ...


class Runtime:
    """One process's settings, index handle, file locks and refiner, and the one
    :class:`Service` over them."""

    def __init__(
        self,
        settings: Settings,
        db: database.Database,
        *,
        workers: Workers | None = None,
    ) -> None:
        self.settings = settings
        self.db = db
        self.file_locks = locks.FileLocks(
            db, settings.data_dir, timeout=settings.lock_timeout, flock=settings.file_locks
        )
        self.refiners = refine.Refiners.configured(settings)
        self._workers = workers
        self._service: Service | None = None

    @classmethod
    def open(
        cls,
        settings: Settings,
        *,
        migrate: bool = False,
        clock: Clock = SYSTEM,
        workers: Workers | None = None,
    ) -> Runtime:
        """The runtime for ``settings``. With ``migrate`` (``sgme migrate``, ``sgme serve``)
        the data directory and the index are created if needed and the schema brought up to
        date; otherwise both must exist already and the schema must be the code's (nothing is
        created or changed, and the error names the directory looked in)."""
        data_dir = settings.data_dir
        if migrate:
            data_dir.mkdir(parents=True, exist_ok=True)
        elif not data_dir.is_dir():
            raise errors.Misconfigured(
                f"no data directory at {data_dir.resolve()}: give --data-dir (or SGME_DATA_DIR) "
                "of an existing store, or run `sgme migrate` to start a new one there"
            )
        db = database.Database.from_url(
            settings.index_url,
            busy_timeout=settings.sqlite_busy_timeout,
            synchronous=settings.sqlite_synchronous.upper(),
            clock=clock,
            create=migrate,
        )
        try:
            if migrate:
                integrity.migrate(db.engine, data_dir=data_dir)
            else:
                database.check_schema(db.engine)
        except BaseException:
            db.dispose()
            raise
        return cls(settings, db, workers=workers)

    @functools.cached_property
    def deployment(self) -> str:
        """This store's identity (its index's ``deployment`` row): the Celery tasks of its
        processes carry it, and its workers refuse tasks that carry another."""
        with self.db.reading() as conn:
            return index.deployment_id(conn)

    def service(self, queue: Queue | None = None) -> Service:
        """The use cases over this runtime: one :class:`Service` for the runtime's life (its
        admission, policy cache, waits and known files are the process's), made on the first
        call, sending work for later to ``queue`` (None: none is sent, nothing is claimed for
        refinement). A later call may name the same queue, or none; not another."""
        if self._service is None:
            self._service = Service(
                self.settings, self.db, self.file_locks, queue, refiners=self.refiners
            )
        elif queue is not None and queue is not self._service.queue:
            raise errors.InternalError(
                "this runtime's service was made with another queue: a process has one service"
            )
        return self._service

    @functools.cached_property
    def workers(self) -> Workers:
        """The task queue backend (the ``sgme.workers`` entry point, or the one given)."""
        if self._workers is not None:
            return self._workers
        found = importlib_metadata.entry_points(group=WORKERS_GROUP, name="celery")
        if not found:
            raise errors.Misconfigured(
                f"no task queue backend is installed (entry point group {WORKERS_GROUP})"
            )
        backend: Workers = next(iter(found)).load()
        return backend

    def close(self) -> None:
        """Close the embedder's connections, the index's pooled connections and the lock
        files."""
        if self._service is not None:
            self._service.hybrid.close()
        self.file_locks.close()
        self.db.dispose()
