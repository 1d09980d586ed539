"""The runtime makes one :class:`pipeline.service.Service` for its life: the process's
admission, policy cache, waits and known files are held once."""

from __future__ import annotations

from pathlib import Path

import helpers
import pytest

from pipeline import database, errors
from pipeline.runtime import Runtime
from pipeline.settings import Settings


def test_the_runtime_has_one_service_with_the_first_calls_queue(
    db: database.Database, data_dir: Path, database_url: str
) -> None:
    runtime = Runtime(Settings(data_dir=data_dir, database_url=database_url), db)
    queue = helpers.RecordingQueue()
    service = runtime.service(queue)
    assert runtime.service() is service and runtime.service(queue) is service
    assert service.queue is queue
    assert runtime.deployment == service.deployment()
    with pytest.raises(errors.InternalError, match="made with another queue"):
        runtime.service(helpers.RecordingQueue())


def test_the_deployment_is_read_without_making_the_service(
    db: database.Database, data_dir: Path, database_url: str
) -> None:
    runtime = Runtime(Settings(data_dir=data_dir, database_url=database_url), db)
    assert runtime.deployment  # the store's id, read from its index
    queue = helpers.RecordingQueue()
    assert runtime.service(queue).queue is queue  # the first service is still to be made
