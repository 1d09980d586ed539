"""The MCP server driven by the SDK's own client session, against a running ``sgme serve``
with tokens: streamable HTTP at ``/mcp`` (the API's tokens, scopes per tool, another agent's
data invisible) and ``sgme mcp`` on stdio (a client of the same server's HTTP API). Each of
the five tools and the resource is called on each transport; a refused call is a tool error
(``is_error``) or, for the resource, a JSON-RPC error."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import harness
import httpx
import httpx2
import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

TOOLS = {"search_memory", "open_memory", "list_sessions", "read_session", "save_memory"}


@dataclasses.dataclass(frozen=True)
class Server:
    """A running ``sgme serve`` with tokens, and what was stored in it."""

    url: str
    tokens: dict[str, str]  #: admin, alpha_read, alpha_write, beta_read, pair_write
    alpha_file: str
    beta_file: str


def _token(procs: harness.Procs, data_dir: Path, agent: str, scope: str) -> str:
    agents = [arg for one in agent.split(",") for arg in ("--agent-id", one)]
    out = procs.run(
        ["token", "create", "--data-dir", str(data_dir), *agents, "--scope", scope],
        harness.clean_env(),
    )
    return out.strip().splitlines()[-1]


def _append(client: httpx.Client, token: str, agent: str, key: str, *texts: str) -> str:
    r = client.post(
        "/v1/append",
        params={"wait": "flushed"},
        headers={"Authorization": f"Bearer {token}"},
        json={
            "agent_id": agent,
            "session_key": key,
            "metadata": {"title": f"{agent} talk", "cwd": f"/home/{agent}/audit"},
            "messages": [
                {"role": "user" if i % 2 == 0 else "assistant", "content": t}
                for i, t in enumerate(texts)
            ],
        },
    )
    assert r.status_code == 200, r.text
    return str(r.json()["file_id"])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("mcp")
    data_dir = root / "data"
    procs = harness.Procs(root / "logs")
    try:
        procs.run(["migrate", "--data-dir", str(data_dir)], harness.clean_env())
        tokens = {
            "admin": _token(procs, data_dir, "*", "admin"),
            "alpha_read": _token(procs, data_dir, "alpha", "read"),
            "alpha_write": _token(procs, data_dir, "alpha", "append,read"),
            "beta_read": _token(procs, data_dir, "beta", "read"),
            "pair_write": _token(procs, data_dir, "alpha,beta", "append,read"),
        }
        port = harness.free_port()
        argv = ["serve", "--data-dir", str(data_dir), "--port", str(port), "--log-level", "warning"]
        proc = procs.start("serve", argv, harness.clean_env())
        url = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=url, timeout=10.0) as client:
            harness.wait_healthy(client, proc, timeout=60)
            alpha = _append(
                client,
                tokens["admin"],
                "alpha",
                "alpha-1",
                "Which database should the audit log use?",
                "Postgres, with the audit table partitioned by month.",
                "And the retention?",
                "Seven years, then archived.",
            )
            beta = _append(
                client, tokens["admin"], "beta", "beta-1", "The beta audit secret is 4711."
            )
        yield Server(url, tokens, alpha, beta)
    finally:
        procs.close()


@contextlib.asynccontextmanager
async def over_http(server: Server, token: str | None) -> AsyncIterator[ClientSession]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=30.0) as http,
        streamable_http_client(f"{server.url}/mcp", http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


@contextlib.asynccontextmanager
async def over_stdio(server: Server, token: str, tmp: Path) -> AsyncIterator[ClientSession]:
    env = harness.clean_env()
    env.update({"SGME_URL": server.url, "SGME_TOKEN": token, "SGME_AGENT_ID": "alpha"})
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "pipeline.cli", "mcp"], env=env, cwd=harness.ROOT
    )
    with (tmp / "mcp-stderr.log").open("w") as errlog:
        async with (
            stdio_client(params, errlog=errlog) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            yield session


async def call(session: ClientSession, tool: str, **arguments: Any) -> dict[str, Any]:
    """A tool's structured answer; fails on a tool error."""
    result = await session.call_tool(tool, arguments)
    assert not result.is_error, result.content
    assert result.structured_content is not None
    # the text the model reads is the same answer, compact
    text = getattr(result.content[0], "text", "")
    assert json.loads(text) == result.structured_content
    assert text == json.dumps(result.structured_content, separators=(",", ":"), ensure_ascii=False)
    return dict(result.structured_content)


async def refused(session: ClientSession, tool: str, **arguments: Any) -> str:
    """The text of a tool error."""
    result = await session.call_tool(tool, arguments)
    assert result.is_error, result
    return str(getattr(result.content[0], "text", ""))


async def every_tool(session: ClientSession, server: Server, colour: str) -> None:
    """Each tool and the resource, as the token of agent alpha (append and read) sees them;
    the memory it saves names ``colour`` (each run its own)."""
    listed = await session.list_tools()
    assert {t.name for t in listed.tools} == TOOLS
    for tool in listed.tools:
        assert tool.description and len(tool.description) > 80, tool.name
    search = next(t for t in listed.tools if t.name == "search_memory")
    assert set(search.input_schema["properties"]) == {
        "query",
        "session_key",
        "since",
        "until",
        "limit",
        "role",
        "agent_id",
        "speaker",
        "context",
        "mode",
    }

    found = await call(session, "search_memory", query="audit Postgres")
    refs = [h["source_ref"] for h in found["hits"]]
    # ranked: the message with both words and the turn after it (whose context terms hold
    # them) first, then their neighbours; beta's "audit" is not alpha's to see
    assert set(refs[:2]) == {f"{server.alpha_file}:2", f"{server.alpha_file}:3"}, found
    assert all(r.startswith(server.alpha_file) for r in refs), found
    hit = next(h for h in found["hits"] if h["source_ref"] == f"{server.alpha_file}:2")
    assert (hit["role"], hit["session_key"]) == ("assistant", "alpha-1")
    assert hit["cwd"] == "/home/alpha/audit"  # where the session ran, as its source recorded
    asked = await call(session, "search_memory", query="audit Postgres", role="user")
    assert asked["hits"] and {h["role"] for h in asked["hits"]} == {"user"}
    own = await call(session, "search_memory", query="audit", agent_id="alpha")
    assert own["hits"] and {h["agent_id"] for h in own["hits"]} == {"alpha"}
    assert "Postgres" in hit["snippet"] and hit["ts"].endswith("Z")
    around = await call(session, "search_memory", query="audit Postgres", limit=1, context=1)
    top = around["hits"][0]
    seq = int(top["source_ref"].rsplit(":", 1)[1])
    assert [t["source_ref"] for t in top["before"]] == [f"{server.alpha_file}:{seq - 1}"]
    assert [t["source_ref"] for t in top["after"]] == [f"{server.alpha_file}:{seq + 1}"]
    assert top["before"][0]["text"] and "before" not in hit
    none = await call(session, "search_memory", query="audit", session_key="nope")
    lexical = {"mode": "lexical", "model": None, "embedding_lag": None, "fallback": None}
    assert none == {"hits": [], "count": 0, "ranking": lexical}
    words = await call(session, "search_memory", query="audit Postgres", mode="lexical")
    assert words["ranking"] == lexical and words["hits"] == found["hits"]
    # the server has no embedder: a search by meaning ranks by words and says why
    meant = await call(session, "search_memory", query="audit Postgres", mode="hybrid")
    unmet = "no embedder is configured (setting search_embedder)"
    assert meant["ranking"] == {**lexical, "fallback": unmet}
    assert meant["hits"] == found["hits"]

    opened = await call(session, "open_memory", source_ref=hit["source_ref"], context=1)
    assert opened["message"]["content"] == "Postgres, with the audit table partitioned by month."
    assert [m["seq"] for m in opened["before"]] == [1]
    assert [m["seq"] for m in opened["after"]] == [3]

    listing = await call(session, "list_sessions")
    assert {s["agent_id"] for s in listing["sessions"]} == {"alpha"}
    assert listing["total"] == len(listing["sessions"])
    talk = [s for s in listing["sessions"] if s["file_id"] == server.alpha_file]
    assert [(s["title"], s["message_count"]) for s in talk] == [("alpha talk", 4)]
    assert talk[0]["cwd"] == "/home/alpha/audit"

    page = await call(session, "read_session", file_id=server.alpha_file, limit=3)
    assert [m["seq"] for m in page["messages"]] == [1, 2, 3]
    assert page["next_after_seq"] == 3
    rest = await call(session, "read_session", file_id=server.alpha_file, after_seq=3)
    assert [m["content"] for m in rest["messages"]] == ["Seven years, then archived."]
    assert rest["next_after_seq"] is None

    saved = await call(session, "save_memory", content=f"The team's mug is {colour}.")
    assert saved["agent_id"] == "alpha" and saved["session_key"].startswith("saved-")
    again = await call(session, "search_memory", query=f"mug {colour}")
    assert again["hits"][0]["source_ref"] == saved["source_ref"]

    raw = await session.read_resource(f"sgme://files/{server.alpha_file}")
    text = getattr(raw.contents[0], "text", "")
    assert text.startswith("---\nformat_version: 1\n") and "partitioned by month" in text

    # another agent's data is as absent as data that does not exist
    beta_ref = f"{server.beta_file}:1"
    assert await refused(session, "open_memory", source_ref=beta_ref) == (
        f"Error executing tool open_memory: not found: no file {server.beta_file}"
    )
    assert "not found" in await refused(session, "read_session", file_id=server.beta_file)
    with pytest.raises(MCPError, match="not found"):
        await session.read_resource(f"sgme://files/{server.beta_file}")
    # bad input is the API's own message
    assert "source_ref" in await refused(session, "open_memory", source_ref="nonsense")


async def edges(session: ClientSession, server: Server) -> None:
    """What a model gets wrong, answered with what to do instead (as the token of agent
    alpha, append and read)."""
    long = await refused(session, "search_memory", query="walrus " * 10_000)
    assert "query" in long and "at most 1000 characters" in long, long
    for text in (long, await refused(session, "search_memory", query="x", limit=0)):
        assert "pydantic" not in text and "http" not in text, text
    version_one = "0d3d3e7f-2620-1d14-8725-c195f73040e8:1"
    wrong = await refused(session, "open_memory", source_ref=version_one)
    assert "UUID of version 1" in wrong and "UUID4" in wrong, wrong
    for blank in ("", "  \n "):
        empty = await refused(session, "save_memory", content=blank)
        assert "nothing to remember" in empty, empty
    # a note as large as a message may be (8 MiB) goes through /mcp whole
    big = "word " * 1_000_000  # 5 MB
    saved = await call(session, "save_memory", content=big, session_key="big-notes")
    with httpx.Client(base_url=server.url, timeout=30.0) as client:
        r = client.get(
            f"/v1/refs/{saved['source_ref']}",
            params={"context": 0},
            headers={"Authorization": f"Bearer {server.tokens['admin']}"},
        )
    assert r.status_code == 200 and r.json()["message"]["content"] == big
    too_big = await refused(session, "save_memory", content="x" * 9_000_000)
    assert "8388608" in too_big, too_big[:300]


def test_what_a_model_gets_wrong_is_explained(server: Server) -> None:
    async def scenario() -> None:
        async with over_http(server, server.tokens["alpha_write"]) as session:
            await edges(session, server)
        async with over_http(server, server.tokens["pair_write"]) as session:
            which = await refused(session, "save_memory", content="whose is this?")
            assert "X-SGME-Agent-Id" in which and "alpha" in which and "beta" in which, which

    anyio.run(scenario)


def test_http_tools_scopes_and_isolation(server: Server, tmp_path: Path) -> None:
    async def scenario() -> None:
        async with over_http(server, server.tokens["alpha_write"]) as session:
            await every_tool(session, server, "blue")
        async with over_http(server, server.tokens["alpha_read"]) as session:
            text = await refused(session, "save_memory", content="not allowed")
            assert "lacks the append scope" in text
            found = await call(session, "search_memory", query="audit")
            assert {h["agent_id"] for h in found["hits"]} == {"alpha"}
        async with over_http(server, server.tokens["beta_read"]) as session:
            found = await call(session, "search_memory", query="audit")
            assert [h["source_ref"] for h in found["hits"]] == [f"{server.beta_file}:1"]
            listing = await call(session, "list_sessions", agent_id="alpha")
            assert listing == {"sessions": [], "total": 0}

    anyio.run(scenario)


def test_http_refuses_without_a_token_and_cross_site(server: Server) -> None:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    headers = {"Accept": "application/json, text/event-stream"}
    with httpx.Client(base_url=server.url, timeout=10.0) as client:
        r = client.post("/mcp", json=body, headers=headers)
        assert r.status_code == 401, r.text
        assert r.headers["www-authenticate"] == 'Bearer realm="sgme"'
        assert r.headers["content-type"] == "application/problem+json"
        r = client.post("/mcp", json=body, headers={**headers, "Authorization": "Bearer sgme_x"})
        assert r.status_code == 401
        assert 'error="invalid_token"' in r.headers["www-authenticate"]
        ok = {**headers, "Authorization": f"Bearer {server.tokens['alpha_read']}"}
        # the API's cross-site and body type checks hold at /mcp, token or not
        hostile = {**ok, "Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"}
        r = client.post("/mcp", json=body, headers=hostile)
        assert r.status_code == 403, r.text
        assert r.json()["type"] == "urn:sgme:problem:cross-site-request"
        typed = {**ok, "Content-Type": "text/plain"}
        r = client.post("/mcp", content=json.dumps(body), headers=typed)
        assert r.status_code == 415, r.text
        assert r.json()["type"] == "urn:sgme:problem:unsupported-media-type"
        r = client.post("/mcp", json=body, headers=ok)
        assert r.status_code == 200, r.text
        assert {t["name"] for t in r.json()["result"]["tools"]} == TOOLS
        # a page of the server itself may (its Origin is the server's)
        own = {**ok, "Origin": server.url, "Sec-Fetch-Site": "same-origin"}
        r = client.post("/mcp", json=body, headers=own)
        assert r.status_code == 200, r.text


def test_stdio_is_a_client_of_the_api(server: Server, tmp_path: Path) -> None:
    async def scenario() -> None:
        async with over_stdio(server, server.tokens["alpha_write"], tmp_path) as session:
            await every_tool(session, server, "green")
        async with over_stdio(server, server.tokens["alpha_read"], tmp_path) as session:
            assert "lacks the append scope" in await refused(session, "save_memory", content="x")

    anyio.run(scenario)
