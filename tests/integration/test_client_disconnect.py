"""A client that leaves before its request's body has arrived (a load generator stopping, an
agent killed mid-request) is no error of the server's: nothing is appended or stored, nothing
is logged as a bug, and the next request is served as usual."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import helpers
import pytest
import sqlalchemy as sa

from pipeline import database, tables
from pipeline.api import app as api_app
from pipeline.settings import Settings

BODY = {"agent_id": "a", "session_key": "s", "messages": [{"role": "user", "content": "hello"}]}


def call(app: Any, path: str, chunks: list[bytes], *, length: int) -> list[dict[str, Any]]:
    """Run one request through ``app`` (ASGI): ``chunks`` of its body, then a disconnect if
    they do not add up to ``length``; the messages the app sent."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"testserver"),
            (b"content-type", b"application/json"),
            (b"content-length", str(length).encode()),
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("testserver", 80),
    }
    messages: list[dict[str, Any]] = [
        {"type": "http.request", "body": chunk, "more_body": True} for chunk in chunks
    ]
    if sum(map(len, chunks)) == length:
        messages[-1]["more_body"] = False
    else:
        messages.append({"type": "http.disconnect"})
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    return sent


def status(sent: list[dict[str, Any]]) -> int | None:
    return next((m["status"] for m in sent if m["type"] == "http.response.start"), None)


def count(db: database.Database, table: sa.Table) -> int:
    with db.reading() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(table)).scalar_one())


@pytest.mark.parametrize("path", ["/v1/append", "/v1/uploads"])
def test_a_client_gone_mid_body_is_not_an_error(
    db: database.Database,
    data_dir: Path,
    database_url: str,
    caplog: pytest.LogCaptureFixture,
    path: str,
) -> None:
    settings = Settings(data_dir=data_dir, database_url=database_url, allowed_hosts=("testserver",))
    app = api_app.create_app(helpers.service(db, settings, helpers.RecordingQueue()))
    body = json.dumps(
        BODY if path == "/v1/append" else {"agent_id": "a", "filename": "n.txt", "content": "hi"}
    ).encode()

    with caplog.at_level(logging.DEBUG):
        sent = call(app, path, [body[:10]], length=len(body))
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    # the append path answers no one; another route's answer goes nowhere (uvicorn drops it)
    assert status(sent) in ((None,) if path == "/v1/append" else (400,))
    assert count(db, tables.append_journal) == 0
    assert count(db, tables.raw_files) == 0

    # the whole body, and the same app serves it
    sent = call(app, path, [body[:10], body[10:]], length=len(body))
    assert status(sent) == (202 if path == "/v1/append" else 201)
    assert count(db, tables.raw_files) == 1
