"""Tokens themselves (issue 9), on SQLite and PostgreSQL: ``sgme token create | ls | revoke``
and their output; what the index keeps (a sha256, never the secret); a running server sees new
and revoked tokens within ``token_cache_seconds`` and writes ``last_used_at`` at most once a
minute; and a secret never shows in logs, in ``sgme token ls`` or anywhere in the database."""

from __future__ import annotations

import hashlib
import json
import logging
import re
import secrets
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import helpers
import pytest
import sqlalchemy as sa
from conftest import Run, Sgme, assert_one_line_error

from pipeline import auth, database, errors, tables
from pipeline.api import app as api_app
from pipeline.settings import Settings

with warnings.catch_warnings():
    from starlette.exceptions import StarletteDeprecationWarning

    warnings.simplefilter("ignore", StarletteDeprecationWarning)
    from fastapi.testclient import TestClient

SECRET = re.compile(r"^sgme_[A-Za-z0-9_-]{43}$")


def create(run: Sgme, *args: str) -> Run:
    done = run("token", "create", *args)
    assert done.code == 0, done
    return done


# ---------------------------------------------------------------------------------------------
# the command


def test_create_prints_the_secret_once_on_the_last_line(sgme: Sgme, db: database.Database) -> None:
    done = create(sgme, "--agent-id", "hermes", "--agent-id", "codex", "--scope", "append,read")
    lines = done.out.decode().splitlines()
    secret = lines[-1]
    assert SECRET.match(secret), lines
    assert done.out.decode().count(secret) == 1
    assert any(line.startswith("token_id:") for line in lines)
    (token,) = auth.list_tokens(db)
    assert token.agent_ids == ("hermes", "codex") and token.scopes == ("append", "read")
    assert f"token_id:  {token.token_id}" in lines
    with db.transaction() as conn:
        assert auth.lookup(conn, secret) == token
        stored = conn.execute(sa.select(tables.api_tokens.c.token_hash)).scalar_one()
    assert stored == hashlib.sha256(secret.encode()).hexdigest()


def test_create_json_has_exactly_the_fixed_keys(sgme: Sgme, db: database.Database) -> None:
    done = create(
        sgme,
        "--agent-id",
        "*",
        "--scope",
        "read",
        "--scope",
        "admin,read",
        "--name",
        "ops",
        "--json",
    )
    made = done.json()
    assert set(made) == {"token_id", "token", "agent_ids", "scopes", "name"}
    assert SECRET.match(made["token"])
    assert (made["agent_ids"], made["scopes"], made["name"]) == (["*"], ["read", "admin"], "ops")
    assert [t.token_id for t in auth.list_tokens(db)] == [made["token_id"]]


def test_two_tokens_never_share_a_secret_or_an_id(sgme: Sgme) -> None:
    made = [create(sgme, "--agent-id", "a", "--scope", "read", "--json").json() for _ in range(5)]
    assert len({m["token"] for m in made}) == len({m["token_id"] for m in made}) == 5


def test_ls_shows_every_token_and_never_a_secret(sgme: Sgme) -> None:
    made = [
        create(
            sgme, "--agent-id", "hermes", "--scope", "read", "--name", "reader", "--json"
        ).json(),
        create(sgme, "--agent-id", "*", "--scope", "admin", "--json").json(),
    ]
    revoked = sgme("token", "revoke", made[0]["token_id"])
    assert revoked.code == 0 and made[0]["token_id"] in revoked.out.decode()
    listed = sgme("token", "ls", "--json")
    assert listed.code == 0
    rows = listed.json()
    assert [r["token_id"] for r in rows] == [m["token_id"] for m in made]
    assert rows[0]["revoked_at"] is not None and rows[1]["revoked_at"] is None
    assert rows[0]["name"] == "reader" and rows[1]["agent_ids"] == ["*"]
    plain = sgme("token", "ls")
    assert plain.code == 0
    for m in made:
        assert m["token_id"] in plain.out.decode()
    for output in (listed, plain, revoked):
        text = output.out.decode() + output.err
        for m in made:
            assert_secret_absent(m["token"], text)


def test_common_options_go_before_or_after_the_action(
    sgme: Sgme, data_dir: Path, database_url: str
) -> None:
    create(sgme, "--agent-id", "a", "--scope", "read")
    before = sgme(
        "token",
        "--data-dir",
        str(data_dir),
        "--database-url",
        database_url,
        "ls",
        "--json",
        common=False,
    )
    assert before.code == 0 and len(before.json()) == 1


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (("--agent-id", "a", "--scope", "read,write"), ("unknown scope", "'write'")),
        (("--agent-id", "a", "--scope", ","), ("at least one scope",)),
        (("--agent-id", "../x", "--scope", "read"), ("agent_id",)),
        (("--agent-id", "a", "--scope", "read", "--name", "x\ny"), ("control",)),
        (("--agent-id", "a", "--scope", "read", "--name", "n" * 201), ("200",)),
    ],
)
def test_create_refuses_bad_input_with_one_line(
    sgme: Sgme, db: database.Database, args: tuple[str, ...], needles: tuple[str, ...]
) -> None:
    assert_one_line_error(sgme("token", "create", *args), *needles)
    assert auth.list_tokens(db) == []


def test_revoke_unknown_is_an_error_and_revoke_twice_is_not(sgme: Sgme) -> None:
    assert_one_line_error(sgme("token", "revoke", "0123456789abcdef"), "no token 0123456789abcdef")
    made = create(sgme, "--agent-id", "a", "--scope", "read", "--json").json()
    first = sgme("token", "revoke", made["token_id"])
    second = sgme("token", "revoke", made["token_id"])
    assert first.code == second.code == 0
    assert first.out == second.out  # the first revocation time stands


def test_star_alone_stands_for_every_agent() -> None:
    assert auth.check_agent_ids(["a", "*", "b", "a"]) == ("*",)
    assert auth.check_agent_ids(["b", "a", "b"]) == ("b", "a")
    assert auth.check_scopes(["admin", "read", "read"]) == ("read", "admin")
    with pytest.raises(errors.InvalidInput):
        auth.check_agent_ids([])


# ---------------------------------------------------------------------------------------------
# a running server: the cache, revocation, last_used_at


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_server_sees_new_and_revoked_tokens_within_the_cache_time(db: database.Database) -> None:
    clock = Clock()
    verifier = auth.Verifier(db, cache_seconds=5, clock=clock)
    assert verifier.caller(None) is auth.OPEN  # no token yet: open
    made = auth.create(db, agent_ids=["a"], scopes=["read"])
    clock.now += 4.9
    assert verifier.caller(None) is auth.OPEN  # what it read 4.9 s ago still stands
    clock.now += 0.2
    with pytest.raises(errors.Unauthorized):
        verifier.caller(None)  # 5.1 s: auth is on
    assert verifier.caller(made.secret).agents == frozenset({"a"})
    auth.revoke(db, made.token.token_id)
    clock.now += 4.9
    assert verifier.caller(made.secret).token_id == made.token.token_id  # cached
    assert verifier.quick(made.secret) is not None  # answered from memory
    clock.now += 0.2
    with pytest.raises(errors.Unauthorized) as caught:
        verifier.caller(made.secret)
    assert caught.value.detail == "unknown or revoked token"


def test_the_cache_is_bounded_to_a_minute() -> None:
    with pytest.raises(errors.Misconfigured, match="token_cache_seconds"):
        auth.Verifier(database.Database(sa.create_engine("sqlite://")), cache_seconds=61)


def test_a_cached_answer_costs_no_database_read(db: database.Database) -> None:
    clock = Clock()
    verifier = auth.Verifier(db, cache_seconds=5, clock=clock)
    made = auth.create(db, agent_ids=["a"], scopes=["read"])
    statements: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        statements.append(statement)

    sa.event.listen(db.engine, "before_cursor_execute", record)
    try:
        verifier.caller(made.secret)  # reads: does a token exist, which one, last_used_at
        reads = len(statements)
        for _ in range(50):
            assert verifier.quick(made.secret) is not None
            verifier.caller(made.secret)
        assert len(statements) == reads
    finally:
        sa.event.remove(db.engine, "before_cursor_execute", record)


def test_last_used_at_is_written_at_most_once_a_minute(db: database.Database) -> None:
    clock = Clock()
    verifier = auth.Verifier(db, cache_seconds=0, clock=clock)
    made = auth.create(db, agent_ids=["a"], scopes=["read"])
    updates: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if statement.lstrip().upper().startswith("UPDATE API_TOKENS"):
            updates.append(statement)

    def last_used() -> Any:
        (token,) = auth.list_tokens(db)
        return token.last_used_at

    sa.event.listen(db.engine, "before_cursor_execute", record)
    try:
        for _ in range(20):
            verifier.caller(made.secret)
            clock.now += 1
        assert len(updates) == 1
        first = last_used()
        assert first is not None
        clock.now += 60  # a minute later (by this process's clock) it is written again ...
        verifier.caller(made.secret)
        assert len(updates) == 2
        # ... but the index refuses to move it twice within a real minute (another process)
        assert last_used() == first
    finally:
        sa.event.remove(db.engine, "before_cursor_execute", record)


# ---------------------------------------------------------------------------------------------
# a secret never leaks


def assert_secret_absent(secret: str, text: str) -> None:
    """Neither the token nor its random part (nor a long piece of it) is in ``text``."""
    random_part = secret.removeprefix(auth.PREFIX)
    for piece in (secret, random_part, random_part[:16], random_part[-16:]):
        assert piece not in text, f"a token secret ({piece[:4]}…) leaked"


def every_text_in_the_index(db: database.Database) -> str:
    """Every value of every column of every table, as text."""
    parts: list[str] = []
    with db.transaction() as conn:
        for name in sa.inspect(conn).get_table_names():
            for row in conn.execute(sa.text(f'SELECT * FROM "{name}"')):
                parts.extend(str(value) for value in row)
    return "\n".join(parts)


def test_a_secret_is_never_logged_listed_or_stored(
    sgme: Sgme,
    db: database.Database,
    data_dir: Path,
    database_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    made = create(sgme, "--agent-id", "hermes", "--scope", "append,read", "--json").json()
    admin = create(sgme, "--agent-id", "*", "--scope", "admin").out.decode().splitlines()[-1]
    revoked = create(sgme, "--agent-id", "hermes", "--scope", "read", "--json").json()
    assert sgme("token", "revoke", revoked["token_id"]).code == 0
    secrets_made = [made["token"], admin, revoked["token"]]
    wrong = auth.PREFIX + secrets.token_urlsafe(auth.SECRET_BYTES)
    settings = Settings(
        data_dir=data_dir,
        database_url=database_url,
        allowed_hosts=("testserver",),
        token_cache_seconds=0,
        metrics_require_auth=True,
    )
    service = helpers.service(db, settings)
    outputs: list[str] = []
    with TestClient(api_app.create_app(service), raise_server_exceptions=False) as client:
        calls: list[tuple[str, str, Callable[[str], dict[str, Any]], Any]] = [
            ("POST", "/v1/append", lambda s: {"Authorization": f"Bearer {s}"}, _body("hermes")),
            ("POST", "/v1/append", lambda s: {"Authorization": f"Bearer {s}"}, _body("bob")),
            ("GET", "/v1/files", lambda s: {"Authorization": f"Bearer {s}"}, None),
            ("GET", "/metrics", lambda s: {"Authorization": f"Bearer {s}"}, None),
            ("GET", "/v1/files", lambda s: {"Authorization": f"Basic {s}"}, None),
            ("GET", "/v1/files", lambda s: {"Authorization": f"Bearer {s}x"}, None),
        ]
        for secret in [*secrets_made, wrong]:
            for method, path, header, body in calls:
                r = client.request(method, path, headers=header(secret), json=body)
                outputs.append(r.text + json.dumps(dict(r.headers)))
    outputs.append(sgme("token", "ls").out.decode())
    outputs.append(sgme("token", "ls", "--json").out.decode())
    logged = caplog.text + "\n".join(str(r.args) + r.getMessage() for r in caplog.records)
    stored = every_text_in_the_index(db)
    for secret in [*secrets_made, wrong]:
        assert_secret_absent(secret, logged)
        assert_secret_absent(secret, "\n".join(outputs))
        assert_secret_absent(secret, stored)
    # the hashes are there (lookups work), and that is all the index knows of a token
    for secret in secrets_made:
        assert auth.digest(secret) in stored
    if database_url.startswith("sqlite"):
        # the database file itself, write-ahead log included
        raw = b"".join(
            p.read_bytes() for p in Path(database_url[10:]).parent.glob("index.sqlite3*")
        )
        for secret in secrets_made:
            assert secret.encode() not in raw
            assert secret.removeprefix(auth.PREFIX)[:16].encode() not in raw


def _body(agent_id: str) -> dict[str, Any]:
    return {
        "agent_id": agent_id,
        "session_key": "leak",
        "messages": [{"role": "user", "content": "hello"}],
    }


# ---------------------------------------------------------------------------------------------
# the settings


def test_a_config_that_still_trusts_the_network_says_what_replaced_it(
    sgme: Sgme, tmp_path: Path
) -> None:
    old = tmp_path / "old.yaml"
    old.write_text("trust_network: true\n", encoding="utf-8")
    assert_one_line_error(
        sgme("ls", "--config", str(old)), "trust_network", "sgme token create", "require_auth"
    )
