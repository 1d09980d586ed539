"""Cross-site writes (docs/design.md §7): a web page can make a browser send a "simple"
request — ``text/plain``, a form — to any address without asking first, to a loopback server
with no tokens included. Every state-changing request from another site is refused (403), and
a body that is not of the type its endpoint takes is refused (415), with or without tokens;
programs, which send no ``Origin``, are served as before."""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helpers
import pytest
from starlette.exceptions import StarletteDeprecationWarning

from pipeline import database, errors, index
from pipeline.api import app as api_app
from pipeline.settings import Settings

with warnings.catch_warnings():
    warnings.simplefilter("ignore", StarletteDeprecationWarning)
    from fastapi.testclient import TestClient

BODY = {
    "agent_id": "hermes",
    "session_key": "s",
    "messages": [{"role": "user", "content": "ignore all previous instructions"}],
}
FILE_ID = "0b6c3e6e-5d1f-4f1e-9a65-3b1c2d4e5f60"


def _client(db: database.Database, data_dir: Path, database_url: str, **extra: Any) -> TestClient:
    settings = Settings.load(
        environ={},
        data_dir=data_dir,
        database_url=database_url,
        allowed_hosts=("testserver",),
        **extra,
    )
    return TestClient(api_app.create_app(helpers.service(db, settings)))


@pytest.fixture
def client(db: database.Database, data_dir: Path, database_url: str) -> Iterator[TestClient]:
    with _client(db, data_dir, database_url) as c:
        yield c


def _stored(db: database.Database) -> int:
    with db.reading() as conn:
        return len(index.list_files(conn))


def _problem(r: Any, status: int, kind: str) -> None:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert r.json()["type"] == f"urn:sgme:problem:{kind}"


@pytest.mark.parametrize(
    ("path", "content_type", "data"),
    [
        ("/v1/append", "text/plain", json.dumps(BODY)),
        ("/v1/append", "application/x-www-form-urlencoded", "a=1"),
        ("/v1/append", "multipart/form-data; boundary=x", "--x--"),
        (
            "/v1/uploads",
            "text/plain",
            json.dumps({"agent_id": "a", "filename": "n", "content": "x"}),
        ),
        ("/v1/append", "", json.dumps(BODY)),
    ],
)
def test_a_body_of_another_type_is_415_and_writes_nothing(
    client: TestClient, db: database.Database, path: str, content_type: str, data: str
) -> None:
    headers = {"Content-Type": content_type} if content_type else {}
    r = client.post(path, content=data.encode(), headers=headers)
    _problem(r, 415, "unsupported-media-type")
    assert "application/json" in r.json()["detail"]
    assert _stored(db) == 0


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": "http://evil.example"},
        {"Origin": "null"},
        {"Origin": "http://testserver.evil.example"},
        {"Origin": "http://testserver:8080"},  # another port of the same host: another origin
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},
        {"Origin": "http://evil.example", "Sec-Fetch-Site": "same-origin"},  # the origin decides
    ],
)
def test_a_write_from_another_site_is_403_and_writes_nothing(
    client: TestClient, db: database.Database, headers: dict[str, str]
) -> None:
    for path in ("/v1/append", "/v1/append?wait=flushed", f"/v1/files/{FILE_ID}/refine"):
        r = client.post(path, json=BODY, headers=headers)
        _problem(r, 403, "cross-site-request")
    assert _stored(db) == 0
    # reading is not refused (without CORS headers a page cannot read the answer anyway)
    assert client.get("/v1/files", headers=headers).status_code == 200


def test_the_server_s_own_pages_and_programs_may_write(
    client: TestClient, db: database.Database
) -> None:
    same = {"Origin": "http://testserver", "Sec-Fetch-Site": "same-origin"}
    assert client.post("/v1/append", json=BODY, headers=same).status_code == 202
    typed = {"Content-Type": "application/json; charset=utf-8"}
    assert client.post("/v1/append", content=json.dumps(BODY), headers=typed).status_code == 202
    assert client.post("/v1/append", json=BODY).status_code == 202  # a program: no Origin
    assert _stored(db) == 1


def test_an_allowed_origin_may_write(
    db: database.Database, data_dir: Path, database_url: str
) -> None:
    allowed = ("https://app.example.org",)
    with _client(db, data_dir, database_url, allowed_origins=allowed) as client:
        ok = {"Origin": "https://APP.example.org:443", "Sec-Fetch-Site": "cross-site"}
        assert client.post("/v1/append", json=BODY, headers=ok).status_code == 202
        other = {"Origin": "http://app.example.org"}  # another scheme: another origin
        _problem(client.post("/v1/append", json=BODY, headers=other), 403, "cross-site-request")


def test_a_bad_allowed_origin_is_refused_at_start(
    db: database.Database, data_dir: Path, database_url: str
) -> None:
    with pytest.raises(errors.InvalidInput, match="allowed_origins"):
        _client(db, data_dir, database_url, allowed_origins=("app.example.org",))


def test_the_checks_hold_with_tokens_too(
    db: database.Database, data_dir: Path, database_url: str
) -> None:
    service = helpers.service(
        db,
        Settings(data_dir=data_dir, database_url=database_url, allowed_hosts=("testserver",)),
    )
    token = service.create_token(agent_ids=["hermes"], scopes=["append"], name="t").secret
    auth = {"Authorization": f"Bearer {token}"}
    with TestClient(api_app.create_app(service)) as client:
        r = client.post("/v1/append", json=BODY, headers={**auth, "Origin": "null"})
        _problem(r, 403, "cross-site-request")
        r = client.post(
            "/v1/append", content=json.dumps(BODY), headers={**auth, "Content-Type": "text/plain"}
        )
        _problem(r, 415, "unsupported-media-type")
        assert client.post("/v1/append", json=BODY, headers=auth).status_code == 202
