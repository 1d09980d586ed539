"""Reading the memory as a person does, on SQLite and PostgreSQL: the sessions listing
(newest first, titles, time filters, "N of M"), ``GET /v1/sessions`` with tokens, the web view
without a browser (open on loopback without tokens, its headers, the login's rules), and the
command line: ``ls``, ``show``, ``l1``, ``search`` with several words and filters, ``refine``'s
counts, ``token ls``, and help on every option."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helpers
import pytest
from conftest import Sgme
from starlette.exceptions import StarletteDeprecationWarning

from pipeline import anomalies, cli, database, sessions
from pipeline.api import app as api_app
from pipeline.service import Service
from pipeline.settings import Settings

with warnings.catch_warnings():
    warnings.simplefilter("ignore", StarletteDeprecationWarning)
    from fastapi.testclient import TestClient


def body(agent: str, key: str, *messages: tuple[str, ...], **extra: Any) -> str:
    """An append body; each message ``(role, content, ts[, tool_name])``."""
    fields = ("role", "content", "ts", "tool_name")
    return json.dumps(
        {
            "agent_id": agent,
            "session_key": key,
            "messages": [dict(zip(fields, m, strict=False)) for m in messages],
            **extra,
        }
    )


@pytest.fixture
def store(sgme: Sgme) -> dict[str, str]:
    """Four sessions of two agents and an upload; their file_ids by name."""
    made = {}
    made["old"] = sgme(
        "append",
        stdin=body(
            "alpha",
            "old-one",
            ("system", "You are a helpful agent.", "2026-01-01T09:00:00Z"),
            (
                "user",
                "  Which   database\nfor the audit log, Postgres or SQLite?",
                "2026-01-01T09:01:00Z",
            ),
            (
                "assistant",
                "We decided on Postgres, with a monthly partitioned audit table.",
                "2026-01-01T09:05:00Z",
            ),
        ),
    ).json()["file_id"]
    made["titled"] = sgme(
        "append",
        stdin=body(
            "alpha",
            "titled",
            ("user", "hello", "2026-03-01T10:00:00Z"),
            metadata={
                "title": "Kitchen [bold]plan[/bold]",
                "cwd": "/home/ana",
                "importer": "codex",
            },
        ),
    ).json()["file_id"]
    made["beta"] = sgme(
        "append",
        stdin=body(
            "beta", "b", ("user", "beta talks about Postgres audit", "2026-02-01T10:00:00Z")
        ),
    ).json()["file_id"]
    made["calls"] = sgme(
        "append",
        stdin=body(
            "alpha",
            "calls",
            ("assistant", '**tool call**: read_file\n\n{"path": "a.md"}', "2026-04-01T10:00:00Z"),
            ("tool", "line one\nline two\nline three", "2026-04-01T10:00:01Z", "read_file"),
            ("assistant", "**thinking**\n\nthe user wants it short", "2026-04-01T10:00:02Z"),
            ("assistant", "Done: \x1b[31mred\x1b[0m text", "2026-04-01T10:00:03Z"),
        ),
    ).json()["file_id"]
    return made


def listing(db: database.Database, data_dir: Path, **filters: Any) -> sessions.Page:
    return sessions.list_sessions(db, data_dir, sessions.Filters(**filters), limit=200)


def test_sessions_newest_first_with_titles_filters_and_counts(
    store: dict[str, str], data_dir: Path, db: database.Database
) -> None:
    page = listing(db, data_dir)
    assert [s.file_id for s in page.sessions] == [
        store["calls"],
        store["titled"],
        store["beta"],
        store["old"],
    ]
    assert page.total == 4 and page.next_offset is None
    by = {s.file_id: s for s in page.sessions}
    # the source's title; else the first user message's first words, on one line
    assert by[store["titled"]].title == "Kitchen [bold]plan[/bold]"
    assert by[store["old"]].title == "Which database for the audit log, Postgres or SQLite?"
    assert by[store["calls"]].title.startswith('read_file {"path": "a.md"}')
    assert (by[store["titled"]].cwd, by[store["titled"]].origin) == ("/home/ana", "codex")
    old = by[store["old"]]
    assert (old.message_count, old.started_at, old.ended_at) == (
        3,
        dt.datetime(2026, 1, 1, 9, 0),
        dt.datetime(2026, 1, 1, 9, 5),
    )
    assert sessions.span(old) == "2026-01-01 09:00 – 09:05"

    two = sessions.list_sessions(db, data_dir, limit=2, offset=1)
    assert [s.file_id for s in two.sessions] == [store["titled"], store["beta"]]
    assert (two.total, two.next_offset) == (4, 3)

    alpha = listing(db, data_dir, agents=frozenset({"alpha"}))
    assert alpha.total == 3 and {s.agent_id for s in alpha.sessions} == {"alpha"}
    assert listing(db, data_dir, agents=frozenset()).total == 0
    feb = listing(db, data_dir, since=dt.datetime(2026, 2, 1), until=dt.datetime(2026, 3, 31))
    assert [s.file_id for s in feb.sessions] == [store["titled"], store["beta"]]
    assert listing(db, data_dir, source_type="upload").total == 0
    assert listing(db, data_dir, session_key="titled").total == 1


@pytest.fixture
def service(
    store: dict[str, str], db: database.Database, data_dir: Path, database_url: str
) -> Service:
    """The service over the stored sessions, as a test client's server has it."""
    settings = Settings.load(
        environ={},
        data_dir=data_dir,
        database_url=database_url,
        allowed_hosts=("testserver",),
        token_cache_seconds=0.0,
        ui_page_sessions=3,
        ui_page_messages=2,
    )
    return helpers.service(db, settings)


@pytest.fixture
def api(service: Service) -> Iterator[TestClient]:
    with TestClient(api_app.create_app(service)) as client:
        yield client


def test_the_api_and_the_view_without_tokens(api: TestClient, store: dict[str, str]) -> None:
    r = api.get("/v1/sessions", params={"limit": 2})
    assert r.status_code == 200
    page = r.json()
    assert (page["total"], page["offset"], page["next_offset"]) == (4, 0, 2)
    assert [s["file_id"] for s in page["sessions"]] == [store["calls"], store["titled"]]
    assert api.get("/v1/sessions", params={"limit": 0}).status_code == 422
    assert api.get("/v1/sessions", params={"since": "yesterday"}).status_code == 422

    # loopback without tokens: the view is open, as the API is; its pages as long as the
    # ui_page_* settings say (3 sessions, 2 messages here)
    r = api.get("/ui")
    assert r.status_code == 200
    assert "default-src 'none'" in r.headers["content-security-policy"]
    assert r.headers["x-frame-options"] == "DENY" and r.headers["cache-control"] == "no-store"
    assert "1–3 of 4 sessions" in r.text and store["old"] not in r.text
    assert "Kitchen [bold]plan[/bold]" in r.text
    assert "<script" not in r.text
    assert "4–4 of 4 sessions" in api.get("/ui", params={"offset": 3}).text
    r = api.get(f"/ui/files/{store['calls']}")
    assert r.status_code == 200 and 'id="seq-2"' in r.text and 'id="seq-3"' not in r.text
    assert "<details>" in r.text and "tool call · read_file" in r.text
    r = api.get(f"/ui/files/{store['calls']}", params={"after": 2})
    assert 'id="seq-4"' in r.text and 'id="seq-2"' not in r.text
    assert api.get("/ui", params={"since": "soon"}).status_code == 422
    # a time an offset carries past the year 1 is clamped there, not a 500
    r = api.get("/ui", params={"since": "0001-01-01T00:00:00+00:01"})
    assert r.status_code == 200 and "1–3 of 4 sessions" in r.text
    r = api.get("/ui/search", params={"q": "Postgres audit", "until": "0001-01-01T00:00+00:01"})
    assert r.status_code == 200 and 'class="hit"' not in r.text
    assert api.get("/ui/status").status_code == 200
    assert api.get("/ui/search", params={"q": "Postgres audit"}).text.count('class="hit"') == 3
    # the login form's rules hold with auth off too: the API's own checks of a write (its
    # body type, its origin), then the form's size (ui_max_form_bytes)
    r = api.post("/ui/login", content="token=x", headers={"Content-Type": "text/plain"})
    assert r.status_code == 415
    assert r.json()["type"] == "urn:sgme:problem:unsupported-media-type"
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    hostile = {**form, "Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"}
    r = api.post("/ui/login", content="token=x", headers=hostile)
    assert r.status_code == 403
    assert r.json()["type"] == "urn:sgme:problem:cross-site-request"
    r = api.post("/ui/login", content="token=" + "x" * 5000, headers=form)
    assert r.status_code == 413 and "at most 4096 bytes" in r.text
    own = {**form, "Origin": "http://testserver", "Sec-Fetch-Site": "same-origin"}
    r = api.post("/ui/login", content="token=sgme_nope", headers=own)
    assert r.status_code == 401 and "unknown, revoked or malformed token" in r.text


def test_the_api_and_the_view_with_tokens(
    api: TestClient, service: Service, store: dict[str, str]
) -> None:
    reader = service.create_token(agent_ids=["alpha"], scopes=["read"]).secret
    r = api.get("/v1/sessions")
    assert r.status_code == 401
    r = api.get("/v1/sessions", headers={"Authorization": f"Bearer {reader}"})
    assert [s["agent_id"] for s in r.json()["sessions"]] == ["alpha"] * 3
    r = api.get(
        "/v1/sessions", params={"agent_id": "beta"}, headers={"Authorization": f"Bearer {reader}"}
    )
    assert r.json()["total"] == 0

    r = api.get("/ui/files/" + store["old"], follow_redirects=False)
    assert r.status_code == 303
    assert r.headers["location"] == f"/ui/login?next=%2Fui%2Ffiles%2F{store['old']}"
    api.cookies.set("sgme_token", reader)
    assert api.get("/ui/files/" + store["old"]).status_code == 200
    assert api.get("/ui/files/" + store["beta"]).status_code == 404
    assert api.get("/ui/status").status_code == 403  # admin only


def test_a_pasted_ref_opens_its_message(
    api: TestClient, service: Service, store: dict[str, str]
) -> None:
    """A ``file_id:seq`` (as a hit, an L1 item or the Hermes recall shows it) pasted into the
    search box, or put after ``/ui/refs/``, opens the page that holds the message, at it."""
    old = store["old"]
    for path in (f"/ui/refs/{old}:3", f"/ui/search?q={old}:3", f"/ui/search?q=+[{old}:3]+"):
        r = api.get(path, follow_redirects=False)
        assert r.status_code == 303, (path, r.text)
        assert r.headers["location"] == f"/ui/files/{old}?after=2#seq-3", path  # 2 a page
    r = api.get(f"/ui/search?q={old}", follow_redirects=False)
    assert (r.status_code, r.headers["location"]) == (303, f"/ui/files/{old}")
    assert api.get(f"/ui/refs/{old}:3").text.count('id="seq-3"') == 1
    assert api.get(f"/ui/refs/{old}:99").status_code == 404
    bad = api.get("/ui/refs/0d3d3e7f-2620-1d14-8725-c195f73040e8:1")
    assert bad.status_code == 422 and "UUID of version 1" in bad.text
    # another agent's message is as absent as one that does not exist
    reader = service.create_token(agent_ids=["beta"], scopes=["read"]).secret
    api.cookies.set("sgme_token", reader)
    assert api.get(f"/ui/refs/{old}:2").status_code == 404
    r = api.get(f"/ui/search?q={old}:2", follow_redirects=False)
    assert r.status_code == 404


def test_the_status_page_shows_an_admin_only_its_agents(
    api: TestClient, service: Service, db: database.Database, store: dict[str, str]
) -> None:
    """An admin token for one agent sees that agent's files, backlog, lag and anomalies on
    ``/ui/status``, as the API scopes it: never another agent's file id, anomaly detail or
    counts, nor the store's events that belong to no file."""
    with db.transaction() as conn:
        now = db.now()
        anomalies.record(conn, store["old"], "refine_failed", "alpha's own trouble", now=now)
        anomalies.record(conn, store["beta"], "file_shrunk", "beta's secret trouble", now=now)
        anomalies.record(conn, None, "append_task_rejected", "session_key='gamma'", now=now)
    hermes = service.create_token(agent_ids=["alpha"], scopes=["admin"]).secret
    everyone = service.create_token(agent_ids=["*"], scopes=["admin"]).secret

    api.cookies.set("sgme_token", hermes)
    page = api.get("/ui/status")
    assert page.status_code == 200
    assert store["old"] in page.text and "alpha&#39;s own trouble" in page.text
    assert store["beta"] not in page.text and "beta" not in page.text
    assert "gamma" not in page.text and "append_task_rejected" not in page.text
    files = {
        status: int(n)
        for status, n in re.findall(r"<td>(\w+)</td><td class=\"n\">(\d+)", page.text)
    }
    assert sum(files.values()) == 3  # alpha's three sessions, not beta's

    api.cookies.set("sgme_token", everyone)
    page = api.get("/ui/status")
    assert store["beta"] in page.text and "beta&#39;s secret trouble" in page.text
    assert "append_task_rejected" in page.text
    files = {
        status: int(n)
        for status, n in re.findall(r"<td>(\w+)</td><td class=\"n\">(\d+)", page.text)
    }
    assert sum(files.values()) == 4


def test_cli_ls_show_l1_search_and_refine(sgme: Sgme, store: dict[str, str]) -> None:
    shown = sgme("ls", "--limit", "2")
    assert shown.code == 0, shown.err
    text = shown.out.decode()
    assert "Kitchen [bold]plan[/bold]" in text  # a title is text, never Rich markup
    assert "1–2 of 4 sessions, newest first (--all for every one)" in text
    assert store["calls"] in text and store["old"] not in text
    every = sgme("ls", "--all").out.decode()
    assert "1–4 of 4 sessions, newest first\n" in every
    listed = sgme("ls", "--json", "--agent-id", "alpha").json()
    assert [r["file_id"] for r in listed] == [store["calls"], store["titled"], store["old"]]
    assert listed[0]["flushed_seq"] == 4 and "title" in listed[0]
    with pytest.raises(SystemExit, match="2"):
        sgme("ls", "--limit", "0")

    show = sgme("show", store["calls"])
    assert show.code == 0, show.err
    out = show.out.decode()
    assert "tool call read_file" in out and '▸ {"path": "a.md"}' in out
    assert "▸ line one line two line three  (3 lines; --full shows them)" in out
    assert "\x1b" not in out and "\\x1b[31mred" in out  # the text's escapes, never sent raw
    full = sgme("show", "calls", "--full").out.decode()
    assert "line one\nline two\nline three" in full
    assert sgme("show", "nope").code == 2
    as_json = sgme("show", "old-one", "--json").json()
    assert [m["seq"] for m in as_json["messages"]] == [1, 2, 3]

    refined = sgme("refine", store["old"])
    assert refined.code == 0, refined.err
    counts = refined.json()
    again = sgme("refine", store["old"]).json()
    assert again["new_items"] == 0 and again["items"] == counts["items"] >= 1
    items = sgme("l1", "--file-id", store["old"], "--json").json()
    assert len(items) == counts["items"]
    assert all(ref.startswith(store["old"] + ":") for i in items for ref in i["source_refs"])
    assert "from " + store["old"] in sgme("l1").out.decode()

    hits = sgme("search", "Postgres", "audit", "--json").json()["hits"]
    assert {h["file_id"] for h in hits} == {store["old"], store["beta"]}
    since = sgme("search", "Postgres", "audit", "--since", "2026-01-15", "--json").json()["hits"]
    assert [h["file_id"] for h in since] == [store["beta"]]
    until = sgme("search", "Postgres", "--until", "2026-01-15T00:00:00Z", "--json").json()
    assert {h["file_id"] for h in until["hits"]} == {store["old"]}
    first = ("--since", "0001-01-01T00:00:00+00:01", "--until", "9999-12-31T23:59:59-00:01")
    every = sgme("search", "Postgres", "audit", *first, "--json").json()["hits"]
    assert {h["file_id"] for h in every} == {store["old"], store["beta"]}
    one = sgme("search", "Postgres", "--file-id", store["beta"], "--json").json()["hits"]
    assert [h["file_id"] for h in one] == [store["beta"]]


def test_show_takes_a_session_key_before_a_file_id(sgme: Sgme) -> None:
    """Claude Code's and Codex's session ids are UUIDs, as file_ids are: the session key wins,
    and a file_id that is no session key still works."""
    sid = "5b6c69aa-0000-4000-8000-000000000001"
    made = sgme(
        "append",
        stdin=json.dumps(
            {
                "agent_id": "claude-code",
                "session_key": sid,
                "messages": [{"role": "user", "content": "hello from a UUID session"}],
            }
        ),
    ).json()
    assert made["file_id"] != sid
    by_session = sgme("show", sid, "--json")
    assert by_session.code == 0, by_session.err
    assert by_session.json()["file_id"] == made["file_id"]
    by_file = sgme("show", made["file_id"], "--json").json()
    assert by_file["session_key"] == sid
    missing = sgme("show", "5b6c69aa-0000-4000-8000-000000000009")
    assert missing.code == 2 and "no session with session_key or file_id" in missing.err


def test_token_ls_shows_names_as_given(sgme: Sgme) -> None:
    made = sgme(
        "token",
        "create",
        "--agent-id",
        "a",
        "--scope",
        "read",
        "--name",
        "[red]x[/red] [link=http://e]",
    )
    assert made.code == 0, made.err
    listed = sgme("token", "ls").out.decode()
    assert "[red]x[/red] [link=http://e]" in listed


def _walk(parser: argparse.ArgumentParser, path: str) -> Iterator[tuple[str, argparse.Action]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _walk(sub, f"{path} {name}")
        elif not isinstance(action, argparse._HelpAction):
            yield path, action


def test_every_option_of_every_command_has_help() -> None:
    missing = [
        f"{path} {action.dest}"
        for path, action in _walk(cli.build_parser(), "sgme")
        if not action.help and path != "sgme"
    ]
    assert missing == []
