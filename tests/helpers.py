"""What many tests need, written once: a queue that records what would be enqueued, a service
over a test's index, polling for a condition, and the index row of a file."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from pipeline import database, index, refine, tables, validation
from pipeline.runtime import Runtime
from pipeline.service import Service
from pipeline.settings import Settings


class RecordingQueue:
    """A :class:`pipeline.service.Queue` that records kicks and claims (raises while
    ``broken``, as a broker that is down does)."""

    def __init__(self) -> None:
        self.kicks: list[str] = []
        self.claims: list[refine.Claim] = []
        self.broken = False

    def kick(self, file_id: str) -> None:
        if self.broken:
            raise ConnectionError("broker down")
        self.kicks.append(file_id)

    def submit(self, claim: refine.Claim) -> None:
        if self.broken:
            raise ConnectionError("broker down")
        self.claims.append(claim)


def service(db: database.Database, settings: Settings, queue: Any = None) -> Service:
    """The service a runtime over ``db`` and ``settings`` makes, sending work to ``queue``."""
    return Runtime(settings, db).service(queue)


def append(service: Service, body: dict[str, Any], *, wait: bool = False) -> Any:
    """:meth:`Service.append` of an append body, parsed with the service's limits."""
    return service.append(validation.parse_append(body, service.settings.limits), wait=wait)


def wait_for(
    condition: Callable[[], Any],
    *,
    timeout: float = 30.0,
    what: str = "",
    check: Callable[[], None] | None = None,
    poll: float = 0.01,
) -> Any:
    """Poll ``condition`` until it returns something truthy, and return that; fail naming
    ``what`` after ``timeout`` seconds. ``check`` runs before each poll and may raise (a
    child process that died, say) to fail early."""
    deadline = time.monotonic() + timeout
    while True:
        if check is not None:
            check()
        found = condition()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what or condition}")
        time.sleep(poll)


def file_row(db: database.Database, file_id: str) -> tables.FileRow:
    """The index row of ``file_id`` (it must exist)."""
    with db.reading() as conn:
        row = index.get_file(conn, file_id)
    assert row is not None, f"no row for {file_id}"
    return row
