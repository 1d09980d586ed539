"""The HTTP API in-process for tests outside test_api.py: a TestClient over the app of a
test's index, what a worker would do when kicked, and the problem+json check."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import helpers
from starlette.exceptions import StarletteDeprecationWarning

from pipeline import database, journal
from pipeline.api import app as api_app
from pipeline.settings import Limits, Settings

with warnings.catch_warnings():
    # Starlette 1.x warns at import that it would rather use httpx2; the project uses httpx.
    warnings.simplefilter("ignore", StarletteDeprecationWarning)
    from fastapi.testclient import TestClient


class Api:
    """A TestClient over the app, plus direct access for checks."""

    def __init__(
        self,
        db: database.Database,
        data_dir: Path,
        database_url: str,
        limits: Limits | None = None,
    ) -> None:
        self.db = db
        self.data_dir = data_dir
        self.queue = helpers.RecordingQueue()
        settings = Settings(
            data_dir=data_dir,
            database_url=database_url,
            limits=limits or Limits(),
            allowed_hosts=("testserver",),  # TestClient's Host
        )
        self.client = TestClient(api_app.create_app(helpers.service(db, settings, self.queue)))

    def append(self, payload: dict[str, Any], *, wait: bool = False) -> dict[str, Any]:
        url = "/v1/append?wait=flushed" if wait else "/v1/append"
        r = self.client.post(url, json=payload)
        assert r.status_code == (200 if wait else 202), r.text
        return dict(r.json())

    def flush(self, file_id: str) -> None:
        """What the worker does when kicked."""
        journal.flush(self.db, self.data_dir, file_id, lock_timeout=5)

    def row(self, file_id: str) -> dict[str, Any]:
        r = self.client.get(f"/v1/files/{file_id}")
        assert r.status_code == 200, r.text
        return dict(r.json())

    def disk(self, file_id: str) -> bytes:
        return bytes((self.data_dir / self.row(file_id)["path"]).read_bytes())

    def messages(self, file_id: str, **params: Any) -> list[dict[str, Any]]:
        r = self.client.get(f"/v1/files/{file_id}/messages", params=params)
        assert r.status_code == 200, r.text
        return list(r.json()["messages"])

    def close(self) -> None:
        self.client.close()


def assert_problem(r: Any, status: int, kind: str, *needles: str) -> dict[str, Any]:
    """An RFC 9457 problem document with a stable type and a detail naming the fault."""
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json"), r.headers
    problem = r.json()
    assert problem["type"] == f"urn:sgme:problem:{kind}", problem
    assert problem["status"] == status
    for needle in needles:
        assert needle in problem["detail"], problem
    return dict(problem)
