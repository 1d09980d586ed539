"""Bearer tokens over HTTP (docs/design.md §7), on SQLite and PostgreSQL: every endpoint ×
{no token, malformed, unknown, revoked, wrong agent, missing scope, right token, admin}, the
404s for another agent's data byte for byte those for data that does not exist, listings that
never show another agent's files or items (a property test), the Host allowlist, the bearer
scheme in /openapi.json, and open mode (no token made) on loopback."""

from __future__ import annotations

import dataclasses
import json
import secrets
import uuid
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import helpers
import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.exceptions import StarletteDeprecationWarning

from pipeline import auth, database, ingest, l1
from pipeline.api import app as api_app
from pipeline.api import security
from pipeline.service import Service
from pipeline.settings import Settings

with warnings.catch_warnings():
    warnings.simplefilter("ignore", StarletteDeprecationWarning)
    from fastapi.testclient import TestClient

TS = "2026-08-03T11:18:06Z"
ALICE, BOB = "alice", "bob"
EVERY_SCOPE = ("append", "read", "refine")


def make_service(db: database.Database, data_dir: Path, database_url: str, **extra: Any) -> Service:
    """A service whose API answers TestClient's Host and sees token changes at once."""
    options: dict[str, Any] = {"allowed_hosts": ("testserver",), "token_cache_seconds": 0.0}
    options.update(extra)
    settings = Settings.load(environ={}, data_dir=data_dir, database_url=database_url, **options)
    return helpers.service(db, settings, helpers.RecordingQueue())


def append_body(agent_id: str, session_key: str = "s1", content: str = "hello") -> dict[str, Any]:
    return {
        "agent_id": agent_id,
        "session_key": session_key,
        "messages": [{"role": "user", "content": content, "ts": TS}],
    }


def make_file(service: Service, agent_id: str, session_key: str = "s1") -> str:
    """A flushed session of ``agent_id`` with two L1 items; its file_id."""
    result: ingest.AppendResult = helpers.append(
        service, append_body(agent_id, session_key, f"hi from {agent_id}")
    ).result
    service.flush(result.file_id)
    add_items(service.db, agent_id, result.file_id, 2)
    return result.file_id


def add_items(db: database.Database, agent_id: str, file_id: str, count: int) -> None:
    items = [
        {
            "file_id": file_id,
            "agent_id": agent_id,
            "kind": "fact",
            "content": f"item {n} of {file_id}",
            "source_refs": json.dumps([f"{file_id}:1"]),
            "refiner": "test",
            "segment_lo": 0,
            "segment_hi": 1,
            "item_hash": uuid.uuid4().hex,
        }
        for n in range(count)
    ]
    with db.transaction() as conn:
        l1.add_items(conn, items, now=db.now())


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def assert_problem(r: Any, status: int, kind: str) -> dict[str, Any]:
    assert r.status_code == status, (r.request.method, r.request.url, r.status_code, r.text)
    assert r.headers["content-type"].startswith("application/problem+json"), r.headers
    body = dict(r.json())
    assert body["type"] == f"urn:sgme:problem:{kind}", body
    assert body["status"] == status and body["title"] and body["detail"], body
    return body


# ---------------------------------------------------------------------------------------------
# the world of the matrix: alice's and bob's files, and one token per case


@dataclasses.dataclass
class World:
    client: TestClient
    service: Service
    file_a: str  #: alice's
    file_b: str  #: bob's
    tokens: dict[str, str]  #: case → secret


@pytest.fixture
def world(db: database.Database, data_dir: Path, database_url: str) -> Iterator[World]:
    # No cooldown here: the matrix re-refines one file many times (tested on its own below).
    service = make_service(db, data_dir, database_url, refine_cooldown_seconds=0)
    file_a = make_file(service, ALICE)
    file_b = make_file(service, BOB)

    def make(agents: list[str], scopes: list[str]) -> auth.Created:
        return auth.create(db, agent_ids=agents, scopes=scopes, name="test")

    made = {
        "right": make([ALICE], list(EVERY_SCOPE)),
        "wrong agent": make([BOB], list(EVERY_SCOPE)),
        "admin": make(["*"], ["admin"]),
        "revoked": make([ALICE], list(EVERY_SCOPE)),
        **{f"no {s}": make([ALICE], [x for x in EVERY_SCOPE if x != s]) for s in EVERY_SCOPE},
        # the routes that need admin: admin for one agent, and every scope but admin
        "right admin": make([ALICE], ["admin"]),
        "wrong agent admin": make([BOB], ["admin"]),
        "no admin": make([ALICE], list(EVERY_SCOPE)),
    }
    auth.revoke(db, made["revoked"].token.token_id)
    tokens = {case: m.secret for case, m in made.items()}
    with TestClient(api_app.create_app(service), raise_server_exceptions=True) as client:
        yield World(client, service, file_a, file_b, tokens)


@dataclasses.dataclass(frozen=True)
class Endpoint:
    """One route as the matrix calls it: ``path`` of a file_id, the scope it needs (None:
    open), and its kind: ``item`` (one agent's data: 404 for another agent), ``list``
    (filtered), ``write`` (403 for an agent_id the token lacks) or ``open``."""

    name: str
    method: str
    path: Callable[[str], str]
    scope: str | None
    kind: str
    ok: int
    body: Callable[[str], dict[str, Any]] | None = None


def _upload(agent_id: str) -> dict[str, Any]:
    return {"agent_id": agent_id, "filename": "notes.txt", "content": "a document"}


def _append(agent_id: str) -> dict[str, Any]:
    return append_body(agent_id, f"matrix-{uuid.uuid4().hex}")


def _agent_path(file_id: str) -> str:
    """The policy routes name an agent, not a file (the matrix's coverage check asks for the
    route's template with ``{file_id}``)."""
    agent = "{agent_id}" if file_id == "{file_id}" else ALICE
    return f"/v1/agents/{agent}/policy"


ENDPOINTS = [
    Endpoint("append", "POST", lambda f: "/v1/append", "append", "write", 202, _append),
    Endpoint("upload", "POST", lambda f: "/v1/uploads", "append", "write", 201, _upload),
    Endpoint("files", "GET", lambda f: "/v1/files", "read", "list", 200),
    Endpoint("files-of-alice", "GET", lambda f: f"/v1/files?agent_id={ALICE}", "read", "list", 200),
    Endpoint("file", "GET", lambda f: f"/v1/files/{f}", "read", "item", 200),
    Endpoint("raw", "GET", lambda f: f"/v1/files/{f}/raw", "read", "item", 200),
    Endpoint("messages", "GET", lambda f: f"/v1/files/{f}/messages", "read", "item", 200),
    Endpoint("ref", "GET", lambda f: f"/v1/refs/{f}:1", "read", "item", 200),
    Endpoint("refine", "POST", lambda f: f"/v1/files/{f}/refine", "refine", "item", 202),
    Endpoint("l1", "GET", lambda f: "/v1/l1", "read", "list", 200),
    Endpoint("l1-of-alice", "GET", lambda f: f"/v1/l1?agent_id={ALICE}", "read", "list", 200),
    Endpoint("l1-of-a-file", "GET", lambda f: f"/v1/l1?file_id={f}", "read", "list", 200),
    Endpoint("search", "GET", lambda f: "/v1/search?q=hi", "read", "list", 200),
    Endpoint(
        "search-of-alice", "GET", lambda f: f"/v1/search?q=hi&agent_id={ALICE}", "read", "list", 200
    ),
    Endpoint(
        "search-in-a-file", "GET", lambda f: f"/v1/search?q=hi&file_id={f}", "read", "list", 200
    ),
    Endpoint("sessions", "GET", lambda f: "/v1/sessions", "read", "list", 200),
    Endpoint(
        "sessions-of-alice", "GET", lambda f: f"/v1/sessions?agent_id={ALICE}", "read", "list", 200
    ),
    Endpoint(
        "redact",
        "POST",
        lambda f: f"/v1/refs/{f}:1/redact",
        "admin",
        "item",
        200,
        lambda agent: {"reason": "test"},
    ),
    # the erasure's "admin" case comes after "right" erased the file: 410 (check below)
    Endpoint("erase", "DELETE", lambda f: f"/v1/files/{f}", "admin", "item", 204),
    Endpoint("audit", "GET", lambda f: "/v1/audit", "admin", "list", 200),
    Endpoint("policy", "GET", lambda f: _agent_path(f), "admin", "write", 200),
    Endpoint(
        "set-policy",
        "PUT",
        lambda f: _agent_path(f),
        "admin",
        "write",
        200,
        lambda agent: {"redact_secrets": None},
    ),
    Endpoint("health", "GET", lambda f: "/v1/health", None, "open", 200),
    Endpoint("metrics", "GET", lambda f: "/metrics", None, "open", 200),
]


def call(w: World, e: Endpoint, headers: dict[str, str], file_id: str | None = None) -> Any:
    """Call ``e`` about ``file_id`` (alice's file by default) with alice's body."""
    body = e.body(ALICE) if e.body else None
    return w.client.request(e.method, e.path(file_id or w.file_a), headers=headers, json=body)


def listed(r: Any) -> list[dict[str, Any]]:
    data = r.json()
    for key in ("files", "items", "hits", "records", "sessions"):
        if key in data:
            return list(data[key])
    raise AssertionError(f"not a listing: {data}")


def count_files(db: database.Database) -> int:
    with db.transaction() as conn:
        return int(conn.execute(sa.text("SELECT COUNT(*) FROM raw_files")).scalar_one())


def check(w: World, e: Endpoint, case: str, headers: dict[str, str]) -> None:
    """What ``case`` must get from ``e``."""
    r = call(w, e, headers)
    if e.kind == "open":
        assert r.status_code == 200, (case, r.text)
        return
    if case in ("no token", "not bearer", "malformed", "unknown", "revoked"):
        assert_problem(r, 401, "unauthorized")
        challenge = r.headers["www-authenticate"]
        assert challenge.startswith('Bearer realm="sgme"'), challenge
        invalid = case != "no token"
        assert ('error="invalid_token"' in challenge) is invalid, (case, challenge)
        return
    if case == "missing scope":
        assert_problem(r, 403, "forbidden")
        assert f'scope="{e.scope}"' in r.headers["www-authenticate"]
        return
    if case == "wrong agent":
        if e.kind == "write":
            before = count_files(w.service.db)
            r = call(w, e, headers)
            assert ALICE in assert_problem(r, 403, "forbidden")["detail"]
            assert count_files(w.service.db) == before  # nothing written
        elif e.kind == "list":
            assert r.status_code == 200, r.text
            rows = listed(r)
            assert all(row["agent_id"] == BOB for row in rows), rows
            # bob's own are there
            assert bool(rows) is (e.name in ("files", "l1", "search", "sessions")), rows
        else:
            assert_indistinguishable(w, e, headers, r)
        return
    if e.name == "erase" and case == "admin":  # "right" erased it just before
        assert_problem(r, 410, "gone")
        return
    assert r.status_code == e.ok, (case, r.text)
    if e.kind == "list":
        rows = listed(r)
        agents = {row["agent_id"] for row in rows}
        everyone = case == "admin" and e.name in ("files", "l1", "search", "sessions")
        if e.name == "audit":  # nothing was redacted or erased in this world
            assert rows == [], rows
            return
        assert agents == ({ALICE, BOB} if everyone else {ALICE}), (case, rows)
    if e.name in ("file", "ref", "refine"):
        assert r.json()["agent_id"] == ALICE


def assert_indistinguishable(w: World, e: Endpoint, headers: dict[str, str], r: Any) -> None:
    """Another agent's data answers exactly as data that does not exist: the same status,
    headers and bytes (the id the detail names aside), whoever asks."""
    missing = str(uuid.uuid4())
    absent = call(w, e, headers, file_id=missing)
    body = assert_problem(r, 404, "not-found")
    assert body["detail"] == f"no file {w.file_a}"
    assert r.content == absent.content.replace(missing.encode(), w.file_a.encode())
    assert r.status_code == absent.status_code == 404
    for name in ("content-type", "content-length", "www-authenticate", "retry-after"):
        assert r.headers.get(name) == absent.headers.get(name), name
    # and the owner asking about a file that does not exist gets the same answer
    owner = "right admin" if e.scope == "admin" else "right"
    owners = call(w, e, bearer(w.tokens[owner]), file_id=missing)
    assert owners.content == absent.content


@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=lambda e: e.name)
def test_every_endpoint_answers_every_kind_of_caller(world: World, endpoint: Endpoint) -> None:
    w = world
    suffix = " admin" if endpoint.scope == "admin" else ""
    cases = {
        "no token": {},
        "not bearer": {"Authorization": "Basic YWxpY2U6c2VjcmV0"},
        "malformed": bearer("sgme_too-short"),
        "unknown": bearer(auth.PREFIX + secrets.token_urlsafe(auth.SECRET_BYTES)),
        "revoked": bearer(w.tokens["revoked"]),
        "wrong agent": bearer(w.tokens["wrong agent" + suffix]),
        "right": bearer(w.tokens["right" + suffix]),
        "admin": bearer(w.tokens["admin"]),
    }
    if endpoint.scope is not None:
        cases["missing scope"] = bearer(w.tokens[f"no {endpoint.scope}"])
    for case, headers in cases.items():
        check(w, endpoint, case, headers)


def test_the_matrix_covers_every_route(world: World) -> None:
    paths = world.client.get("/openapi.json").json()["paths"]
    routes = {(method.upper(), path) for path, ops in paths.items() for method in ops}
    called = {
        (e.method, e.path("{file_id}").split("?")[0].replace("{file_id}:1", "{ref}"))
        for e in ENDPOINTS
    }
    assert routes == called


def test_a_refine_only_token_learns_nothing_of_the_row(world: World) -> None:
    """The read scope guards a file's row (its session key, metadata, counts): the answer to
    a re-refine asked with only the refine scope says it was requested, nothing more."""
    secret = auth.create(world.service.db, agent_ids=[ALICE], scopes=["refine"], name="r").secret
    r = world.client.post(f"/v1/files/{world.file_a}/refine", headers=bearer(secret))
    assert r.status_code == 202, r.text
    assert r.json() == {"file_id": world.file_a, "refine": "requested"}
    reader = world.tokens["right"]
    r = world.client.post(f"/v1/files/{world.file_a}/refine", headers=bearer(reader))
    assert r.status_code == 202, r.text
    assert r.json()["session_key"] == "s1" and r.json()["agent_id"] == ALICE


def test_a_scope_is_checked_before_anything_is_looked_up(world: World) -> None:
    """A token without ``read`` learns nothing, not even whether an id is well formed."""
    headers = bearer(world.tokens["no read"])
    for path in (f"/v1/files/{world.file_b}", "/v1/files/not-a-uuid", "/v1/refs/x:0"):
        assert_problem(world.client.get(path, headers=headers), 403, "forbidden")
    for path in ("/v1/files/not-a-uuid", "/v1/files?limit=0"):
        assert_problem(world.client.get(path), 401, "unauthorized")


def test_a_refused_append_writes_nothing_and_a_held_agent_appends(world: World) -> None:
    """A token for several agents writes as each of them and as nobody else."""
    db = world.service.db
    both = auth.create(db, agent_ids=[ALICE, "carol"], scopes=["append"]).secret
    for agent in (ALICE, "carol"):
        r = world.client.post("/v1/append", json=append_body(agent, "both"), headers=bearer(both))
        assert r.status_code == 202, r.text
    before = count_files(db)
    r = world.client.post("/v1/append", json=append_body(BOB, "both"), headers=bearer(both))
    assert "'bob'" in assert_problem(r, 403, "forbidden")["detail"]
    # an invalid body is refused as invalid whoever it names
    bad = {**append_body(BOB), "messages": []}
    assert_problem(
        world.client.post("/v1/append", json=bad, headers=bearer(both)), 422, "invalid-input"
    )
    assert count_files(db) == before


# ---------------------------------------------------------------------------------------------
# listings never show another agent's files or items (a property test)

AGENTS = ("a0", "a1", "a2", "a3")


@dataclasses.dataclass
class Population:
    client: TestClient
    db: database.Database
    files: dict[str, str]  #: file_id → agent_id
    items: dict[int, str]  #: L1 item id → agent_id


@pytest.fixture
def population(db: database.Database, data_dir: Path, database_url: str) -> Iterator[Population]:
    service = make_service(db, data_dir, database_url)
    files: dict[str, str] = {}
    for n, agent in enumerate([*AGENTS, *AGENTS[:2], AGENTS[0]]):
        result = helpers.append(service, append_body(agent, f"s{n}")).result
        files[result.file_id] = agent
        add_items(db, agent, result.file_id, 1 + n % 3)
    with db.transaction() as conn:
        items = {i.id: i.agent_id for i in l1.list_items(conn, limit=1000)}
    with TestClient(api_app.create_app(service)) as client:
        yield Population(client, db, files, items)


def page_through(client: TestClient, path: str, params: dict[str, Any], token: str) -> list[Any]:
    """Every row of a paged listing, following its cursor."""
    rows: list[Any] = []
    params = dict(params)
    for _ in range(100):
        r = client.get(path, params=params, headers=bearer(token))
        assert r.status_code == 200, r.text
        data = r.json()
        rows += data["files"] if path == "/v1/files" else data["items"]
        cursor = data.get("next_cursor") or data.get("next_after")
        if cursor is None:
            return rows
        params["cursor" if path == "/v1/files" else "after"] = cursor
    raise AssertionError("the listing did not end")


held_agents = st.one_of(
    st.just(frozenset({"*"})), st.frozensets(st.sampled_from([*AGENTS, "ghost"]), min_size=1)
)
asked_agent = st.one_of(st.none(), st.sampled_from([*AGENTS, "ghost"]))


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    held=held_agents,
    asked=asked_agent,
    scopes=st.sampled_from([["read"], ["admin"], ["read", "append"]]),
    limit=st.integers(1, 4),
    by_file=st.booleans(),
)
def test_listings_show_exactly_the_tokens_agents(
    population: Population,
    held: frozenset[str],
    asked: str | None,
    scopes: list[str],
    limit: int,
    by_file: bool,
) -> None:
    p = population
    token = auth.create(p.db, agent_ids=sorted(held), scopes=scopes).secret

    def shown(agent: str) -> bool:
        return ("*" in held or agent in held) and asked in (None, agent)

    params: dict[str, Any] = {"limit": limit}
    if asked is not None:
        params["agent_id"] = asked
    files = page_through(p.client, "/v1/files", params, token)
    assert sorted(f["file_id"] for f in files) == sorted(f for f, a in p.files.items() if shown(a))
    assert all(f["agent_id"] == p.files[f["file_id"]] for f in files)

    items = page_through(p.client, "/v1/l1", params, token)
    assert sorted(i["id"] for i in items) == sorted(i for i, a in p.items.items() if shown(a))
    if by_file:  # asking for one file's items never reaches past the token's agents
        file_id, agent = next(iter(p.files.items()))
        items = page_through(p.client, "/v1/l1", {**params, "file_id": file_id}, token)
        assert {i["agent_id"] for i in items} <= ({agent} if shown(agent) else set())
        assert bool(items) is shown(agent)


# ---------------------------------------------------------------------------------------------
# open mode, require_auth, /metrics


def test_without_any_token_the_api_is_open(
    db: database.Database, data_dir: Path, database_url: str
) -> None:
    service = make_service(db, data_dir, database_url)
    file_id = make_file(service, ALICE)
    with TestClient(api_app.create_app(service)) as client:
        assert client.get(f"/v1/files/{file_id}").status_code == 200
        # a token presented while auth is off is not looked at
        assert client.get("/v1/files", headers={"Authorization": "Basic eA=="}).status_code == 200
        r = client.post("/v1/append", json=append_body(BOB))
        assert r.status_code == 202, r.text
        # the first token turns auth on in the running server (token_cache_seconds: 0 here)
        secret = auth.create(db, agent_ids=[ALICE], scopes=["read"]).secret
        assert_problem(client.get(f"/v1/files/{file_id}"), 401, "unauthorized")
        assert client.get(f"/v1/files/{file_id}", headers=bearer(secret)).status_code == 200
        assert client.get("/v1/health").status_code == 200


def test_require_auth_needs_a_token_before_any_exists(
    db: database.Database, data_dir: Path, database_url: str
) -> None:
    service = make_service(db, data_dir, database_url, require_auth=True)
    with TestClient(api_app.create_app(service)) as client:
        assert_problem(client.get("/v1/files"), 401, "unauthorized")
        assert_problem(client.post("/v1/append", json=append_body(ALICE)), 401, "unauthorized")
        assert client.get("/v1/health").status_code == 200
        assert client.get("/metrics").status_code == 200


def test_revoking_every_token_keeps_auth_on(
    db: database.Database, data_dir: Path, database_url: str
) -> None:
    service = make_service(db, data_dir, database_url)
    made = auth.create(db, agent_ids=["*"], scopes=["admin"])
    auth.revoke(db, made.token.token_id)
    with TestClient(api_app.create_app(service)) as client:
        assert_problem(client.get("/v1/files"), 401, "unauthorized")
        assert_problem(client.get("/v1/files", headers=bearer(made.secret)), 401, "unauthorized")


def test_metrics_can_require_an_admin_token(
    db: database.Database, data_dir: Path, database_url: str
) -> None:
    service = make_service(db, data_dir, database_url, metrics_require_auth=True)
    reader = auth.create(db, agent_ids=["*"], scopes=["read", "append", "refine"]).secret
    admin = auth.create(db, agent_ids=[ALICE], scopes=["admin"]).secret
    with TestClient(api_app.create_app(service)) as client:
        assert_problem(client.get("/metrics"), 401, "unauthorized")
        assert_problem(client.get("/metrics", headers=bearer("sgme_x")), 401, "unauthorized")
        r = client.get("/metrics", headers=bearer(reader))
        assert 'scope="admin"' in r.headers["www-authenticate"]
        assert_problem(r, 403, "forbidden")
        r = client.get("/metrics", headers=bearer(admin))
        assert r.status_code == 200 and "sgme_index_up" in r.text
        assert client.get("/v1/health").status_code == 200


def test_metrics_need_an_admin_token_even_while_auth_is_off(
    db: database.Database, data_dir: Path, database_url: str
) -> None:
    service = make_service(db, data_dir, database_url, metrics_require_auth=True)
    with TestClient(api_app.create_app(service)) as client:
        assert client.get("/v1/files").status_code == 200  # no token made: open
        assert_problem(client.get("/metrics"), 401, "unauthorized")


# ---------------------------------------------------------------------------------------------
# the Host allowlist


@pytest.mark.parametrize(
    ("header", "allowed"),
    [
        ("localhost", True),
        ("localhost:8765", True),
        ("LOCALHOST.:8765", True),
        ("127.0.0.1:8765", True),
        ("[::1]:8765", True),
        ("10.1.2.3:8765", True),  # the bind address
        ("attacker.example", False),
        ("attacker.example:8765", False),
        ("127.0.0.1.attacker.example", False),
        ("localhost@attacker.example", False),
        ("", False),
    ],
)
def test_only_allowed_hosts_are_answered(
    db: database.Database, data_dir: Path, database_url: str, header: str, allowed: bool
) -> None:
    service = make_service(
        db, data_dir, database_url, allowed_hosts=Settings().allowed_hosts, host="10.1.2.3"
    )
    secret = auth.create(db, agent_ids=["*"], scopes=["admin"]).secret
    with TestClient(api_app.create_app(service)) as client:
        for path in ("/v1/health", "/v1/files", "/openapi.json"):
            r = client.get(path, headers={"Host": header, **bearer(secret)})
            if allowed:
                assert r.status_code == 200, (path, r.text)
            else:
                body = assert_problem(r, 400, "host-not-allowed")
                assert "allowed_hosts" in body["detail"]


def test_a_star_allows_any_host(db: database.Database, data_dir: Path, database_url: str) -> None:
    service = make_service(db, data_dir, database_url, allowed_hosts=("*",))
    with TestClient(api_app.create_app(service)) as client:
        r = client.get("/v1/health", headers={"Host": "anything.example"})
        assert r.status_code == 200


@pytest.mark.parametrize("host", ["[::1]evil.com", "127.0.0.1:80@evil.com", "localhost:8765x"])
def test_a_host_header_that_only_starts_like_an_allowed_name_is_refused(
    db: database.Database, data_dir: Path, database_url: str, host: str
) -> None:
    service = make_service(db, data_dir, database_url)
    with TestClient(api_app.create_app(service)) as client:
        r = client.get("/v1/health", headers={"Host": host})
    assert r.status_code == 400, r.text
    assert r.json()["type"] == "urn:sgme:problem:host-not-allowed"


def test_host_names_are_parsed_without_ports() -> None:
    assert security.host_name("[::1]:8765") == "::1"
    assert security.host_name("Example.COM.:80") == "example.com"
    # anything that is not a host and a port is no allowed name at all
    for bad in ("::1", "[::1]evil.com", "127.0.0.1:80@evil.com", "a b", "localhost:8o", ""):
        assert security.host_name(bad) == "", bad
    s = Settings(allowed_hosts=("Api", "[::1]"), host="0.0.0.0")
    assert security.allowed_hosts(s) == frozenset({"api", "::1"})


# ---------------------------------------------------------------------------------------------
# /openapi.json


def test_openapi_declares_the_bearer_scheme_and_the_refusals(world: World) -> None:
    schema = world.client.get("/openapi.json").json()
    scheme = schema["components"]["securitySchemes"]["bearer"]
    assert (scheme["type"], scheme["scheme"]) == ("http", "bearer")
    secured = 0
    for path, operations in schema["paths"].items():
        for method, op in operations.items():
            responses = op["responses"]
            assert "400" in responses, (path, method)
            if path in ("/v1/health", "/metrics"):
                assert not op.get("security"), path
                continue
            assert op["security"] == [{"bearer": []}], (path, method)
            for status in ("401", "403"):
                content = responses[status]["content"]["application/problem+json"]
                assert content["schema"] == {"$ref": "#/components/schemas/Problem"}
            secured += 1
    assert secured == 16  # every /v1 route but health, search, sessions and privacy included
    refine = schema["paths"]["/v1/files/{file_id}/refine"]["post"]["responses"]
    assert "429" in refine


def test_openapi_marks_metrics_protected_when_it_is(
    db: database.Database, data_dir: Path, database_url: str
) -> None:
    service = make_service(db, data_dir, database_url, metrics_require_auth=True)
    with TestClient(api_app.create_app(service)) as client:
        metrics = client.get("/openapi.json").json()["paths"]["/metrics"]["get"]
    assert metrics["security"] == [{"bearer": []}]
    assert {"401", "403"} <= set(metrics["responses"])
