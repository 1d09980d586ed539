"""Beat's schedule file (``.celerybeat-schedule`` in the data directory) torn by a process
killed while writing it: the scheduler starts it afresh instead of failing, so ``sgme serve``
keeps its beat thread (sweeps, refinement dispatches, the archive)."""

from __future__ import annotations

import shelve
from collections.abc import Iterator
from pathlib import Path

import helpers
import pytest
from celery import Celery, beat

from pipeline.runtime import Runtime
from pipeline.settings import Settings
from workers import app as worker_app
from workers import embedded, schedule


@pytest.fixture
def app(data_dir: Path) -> Iterator[Celery]:
    settings = Settings.load(environ={}, data_dir=data_dir, broker_url="memory://")
    runtime = Runtime.open(settings, migrate=True)
    try:
        yield worker_app.create(runtime)[0]
    finally:
        runtime.close()


def _torn(app: Celery, path: Path) -> bytes:
    """A schedule file as a process killed while writing it leaves it (its entries' pickle cut
    short); the bytes of its data file."""
    made = schedule.Scheduler(app=app, schedule_filename=str(path))
    made.close()
    data = Path(f"{path}.dat")
    whole = data.read_bytes()
    assert len(whole) > 1_000
    torn = whole[:1_000]
    data.write_bytes(torn)
    return torn


def _entries(path: Path) -> set[str]:
    with shelve.open(str(path), flag="r") as store:
        return set(store["entries"])


def test_a_torn_schedule_file_is_started_afresh(app: Celery, data_dir: Path) -> None:
    path = data_dir / ".celerybeat-schedule"
    torn = _torn(app, path)
    with pytest.raises(EOFError):  # what Celery's own scheduler does
        beat.PersistentScheduler(app=app, schedule_filename=str(path))
    Path(f"{path}.dat").write_bytes(torn)

    started = schedule.Scheduler(app=app, schedule_filename=str(path))
    assert {"sweep", "dispatch-refinements", "archive-cold-files"} <= set(started.schedule)
    started.close()
    assert {"sweep", "dispatch-refinements", "archive-cold-files"} <= _entries(path)


def test_the_app_names_the_scheduler_for_sgme_beat(app: Celery) -> None:
    assert app.conf.beat_scheduler == "workers.schedule:Scheduler"


def test_the_embedded_beat_survives_a_torn_schedule_file(app: Celery, data_dir: Path) -> None:
    path = data_dir / ".celerybeat-schedule"
    _torn(app, path)
    runner = embedded.Embedded(app, queues=worker_app.QUEUES, data_dir=data_dir, concurrency=1)
    runner.start()
    try:
        # the scheduler writes its file once it is set up; a beat that failed never does
        helpers.wait_for(
            lambda: _readable(path), timeout=20, what="beat rewriting its schedule file"
        )
        assert runner.beat.is_alive()
        assert isinstance(runner.beat.service.scheduler, schedule.Scheduler)
    finally:
        runner.stop()


def _readable(path: Path) -> bool:
    try:
        return "sweep" in _entries(path)
    except Exception:  # torn still, or being written
        return False
