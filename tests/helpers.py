"""What many tests need, written once: a queue that records what would be enqueued, a service
over a test's index, a flushed session, polling for a condition, the index row of a file, a
deterministic embedder and an HTTP server on a thread."""

from __future__ import annotations

import contextlib
import http.server
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pipeline import database, embeddings, errors, index, journal, refine, tables, validation
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


class FakeEmbedder:
    """A deterministic embedder for the tests: each text's vector is its words, hashed into 64
    dimensions (so equal texts have equal vectors), made unit length. It counts what it
    embedded and can be told to fail."""

    def __init__(self, model: str = "fake-1") -> None:
        self.model = model
        self.embedded: list[str] = []
        self.down = False

    def _vector(self, text: str) -> np.ndarray[Any, Any]:
        v = np.zeros(64, np.float32)
        for word in text.lower().split():
            v[zlib.crc32(word.encode()) % 64] += 1.0
        v[63] += 0.01
        return v / np.linalg.norm(v)

    def passages(self, texts: Sequence[str]) -> embeddings.Vectors:
        if self.down:
            raise errors.EmbedderUnavailable("the fake is down")
        self.embedded.extend(texts)
        return np.stack([self._vector(t) for t in texts]).astype(np.float32)

    def query(self, text: str) -> embeddings.Vectors:
        if self.down:
            raise errors.EmbedderUnavailable("the fake is down")
        return self._vector(text).astype(np.float32)


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


def flushed_session(
    db: database.Database, data_dir: Path, key: str, contents: list[str], *, agent: str = "hermes"
) -> str:
    """A flushed session of ``contents`` (user messages); its file_id."""
    messages = [{"role": "user", "content": c} for c in contents]
    appended = journal.ingest(db, {"agent_id": agent, "session_key": key, "messages": messages})
    journal.flush(db, data_dir, appended.file_id)
    return appended.file_id


@contextlib.contextmanager
def http_server(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[str]:
    """``handler`` served on a thread at a free port of 127.0.0.1 while the block runs: its
    base URL, up to ``/v1``."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
