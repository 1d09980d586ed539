"""The MCP tools as named functions (:mod:`pipeline.mcp.tools`) over the API's in-process
memory (:class:`pipeline.mcp.local.Local`): the service called as a verified caller, its
scopes and agents checked as the ``/v1`` routes check them, each answer bounded by the
``mcp_*`` settings. tests/e2e/test_mcp.py drives the same tools through the SDK's client."""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import anyio
import helpers
import pytest

from pipeline import auth, database, errors, validation
from pipeline.mcp import tools
from pipeline.mcp.local import Local
from pipeline.service import Service
from pipeline.settings import Mcp, Settings

T = TypeVar("T")


def _caller(*scopes: str) -> auth.Caller:
    """A verified token of agent alpha holding ``scopes``."""
    return auth.Caller(token_id="t1", agents=frozenset({"alpha"}), scopes=frozenset(scopes))


ALPHA = _caller("read", "append")
READER = _caller("read")
APPENDER = _caller("append")


def run(work: Callable[[], Awaitable[T]]) -> T:
    """``work`` run to its end on an event loop of its own."""
    return anyio.run(work)


@pytest.fixture
def service(db: database.Database, data_dir: Path, database_url: str) -> Service:
    settings = Settings(data_dir=data_dir, database_url=database_url)
    return helpers.service(db, settings, helpers.RecordingQueue())


def _store(service: Service, agent: str, key: str, *texts: str, cwd: str | None = None) -> str:
    body: dict[str, Any] = {
        "agent_id": agent,
        "session_key": key,
        "messages": [
            {"role": "user" if i % 2 == 0 else "assistant", "content": t}
            for i, t in enumerate(texts)
        ],
    }
    if cwd is not None:
        body["metadata"] = {"cwd": cwd}
    parsed = validation.parse_append(body, service.settings.limits)
    return str(service.append(parsed, wait=True).result.file_id)


def test_search_finds_the_callers_agents_only_with_where_each_session_ran(
    service: Service,
) -> None:
    alpha = _store(service, "alpha", "a-1", "Which tea?", "Green tea, no sugar.", cwd="/home/a")
    beta = _store(service, "beta", "b-1", "The beta tea is black.")
    memory = Local(service, ALPHA)
    found = run(lambda: tools.search(memory, "tea"))
    assert {h["source_ref"].split(":")[0] for h in found["hits"]} == {alpha}
    assert found["count"] == len(found["hits"]) == 2
    assert {h["cwd"] for h in found["hits"]} == {"/home/a"}
    only_user = run(lambda: tools.search(memory, "tea", role="user"))
    assert [h["source_ref"] for h in only_user["hits"]] == [f"{alpha}:1"]
    # another agent's session is as absent as one that does not exist
    with pytest.raises(errors.NotFound, match=f"no file {beta}"):
        run(lambda: tools.open_message(memory, Mcp(), f"{beta}:1"))
    admin = Local(service, auth.OPEN)
    everyone = run(lambda: tools.search(admin, "tea"))
    assert {h["agent_id"] for h in everyone["hits"]} == {"alpha", "beta"}


def test_times_and_refs_are_refused_in_the_apis_words(service: Service) -> None:
    memory = Local(service, ALPHA)
    with pytest.raises(errors.InvalidInput, match=r"^since: must be an RFC 3339 date-time"):
        run(lambda: tools.search(memory, "tea", since="20260803"))
    with pytest.raises(errors.InvalidInput, match=r"UUID of version 1.*UUID4"):
        run(lambda: tools.open_message(memory, Mcp(), "0d3d3e7f-2620-1d14-8725-c195f73040e8:1"))
    with pytest.raises(errors.InvalidInput, match="not a source_ref"):
        run(lambda: tools.open_message(memory, Mcp(), "nonsense"))
    with pytest.raises(errors.InvalidInput, match="has no word to search for"):
        run(lambda: tools.search(memory, "!!!"))


def test_open_and_read_are_cut_to_the_bounds(service: Service) -> None:
    texts = [f"message {n} " + "x" * 100 for n in range(1, 7)]
    file_id = _store(service, "alpha", "a-1", *texts)
    memory = Local(service, ALPHA)
    bounds = Mcp(message_chars=50, neighbour_chars=20, page_message_chars=30, page_chars=70)
    opened = run(lambda: tools.open_message(memory, bounds, f"{file_id}:3", context=1))
    assert opened["message"]["content"] == texts[2][:50]
    assert opened["message"]["truncated_chars"] == len(texts[2]) - 50
    assert [(m["seq"], m["content"]) for m in opened["before"]] == [(2, texts[1][:20])]
    assert [m["seq"] for m in opened["after"]] == [4]
    page = run(lambda: tools.read_page(memory, bounds, file_id, limit=5))
    # 30 characters a message, 70 a page: two messages, then the next page
    assert [m["seq"] for m in page["messages"]] == [1, 2]
    assert page["next_after_seq"] == 2 and page["message_count"] == 6
    last = run(lambda: tools.read_page(memory, bounds, file_id, after_seq=5))
    assert [m["seq"] for m in last["messages"]] == [6] and last["next_after_seq"] is None


def test_list_recent_is_newest_first_and_counts(service: Service) -> None:
    first = _store(service, "alpha", "a-1", "one")
    second = _store(service, "alpha", "a-2", "two")
    _store(service, "beta", "b-1", "three")
    listed = run(lambda: tools.list_recent(Local(service, ALPHA)))
    assert [s["file_id"] for s in listed["sessions"]] == [second, first]
    assert listed["total"] == 2
    other = run(lambda: tools.list_recent(Local(service, ALPHA), agent_id="beta"))
    assert other == {"sessions": [], "total": 0}


def test_save_appends_as_the_agent_into_its_file(service: Service) -> None:
    memory = Local(service, ALPHA)
    saved = run(
        lambda: tools.save(memory, "The mug is blue.", agent_id="alpha", today=dt.date(2026, 8, 3))
    )
    assert saved["session_key"] == "saved-2026-08-03" and saved["agent_id"] == "alpha"
    file_id = saved["source_ref"].split(":")[0]
    assert b"The mug is blue." in b"".join(service.raw(file_id)[1])  # in the file: waited
    found = run(lambda: tools.search(memory, "mug blue"))
    assert found["hits"][0]["source_ref"] == saved["source_ref"]


def test_scopes_and_agents_are_checked_per_call(service: Service) -> None:
    _store(service, "alpha", "a-1", "tea")
    with pytest.raises(errors.Forbidden, match="lacks the append scope") as refused:
        run(lambda: tools.save(Local(service, READER), "note", agent_id="alpha"))
    assert refused.value.scope == "append"
    with pytest.raises(errors.Forbidden, match="lacks the read scope"):
        run(lambda: tools.search(Local(service, APPENDER), "tea"))
    with pytest.raises(errors.Forbidden, match="does not hold agent_id 'beta'") as other:
        run(lambda: tools.save(Local(service, ALPHA), "note", agent_id="beta"))
    assert not other.value.scope  # the agent, not a scope: the tool says where it came from
    with pytest.raises(errors.InvalidInput, match="nothing to remember"):
        run(lambda: tools.save(Local(service, ALPHA), " \n ", agent_id="alpha"))


def test_the_resource_is_the_files_bytes_cut_to_its_bound(service: Service) -> None:
    file_id = _store(service, "alpha", "a-1", "y" * 500)
    memory = Local(service, ALPHA)
    whole = run(lambda: tools.raw_file(memory, Mcp(), file_id))
    assert whole.startswith("---\nformat_version: 1\n") and "y" * 500 in whole
    size = len(whole.encode())
    cut = run(lambda: tools.raw_file(memory, Mcp(resource_bytes=100), file_id))
    assert (
        cut
        == whole[:100]
        + f"\n\n<!-- cut: {size - 100} more bytes; read_session pages through all of it -->\n"
    )


def test_search_gives_turns_around_hits_a_speakers_turns_and_the_dates_window(
    service: Service,
) -> None:
    said = ["Ana: which tea for the trip?", "Bo: the smoky oolong, I think", "Ana: noted"]
    body: dict[str, Any] = {
        "agent_id": "alpha",
        "session_key": "a-1",
        "metadata": {"speakers": ["Ana", "Bo"]},
        "messages": [
            {"role": "user" if i % 2 == 0 else "assistant", "content": t}
            for i, t in enumerate(said)
        ],
    }
    parsed = validation.parse_append(body, service.settings.limits)
    file_id = str(service.append(parsed, wait=True).result.file_id)
    memory = Local(service, ALPHA)
    found = run(lambda: tools.search(memory, "smoky oolong", limit=1, context=1))
    (hit,) = found["hits"]
    assert hit["source_ref"] == f"{file_id}:2"
    assert [t["source_ref"] for t in hit["before"]] == [f"{file_id}:1"]
    assert [t["source_ref"] for t in hit["after"]] == [f"{file_id}:3"]
    assert hit["before"][0]["text"].endswith("which tea for the trip?")
    assert "window" not in found
    plain = run(lambda: tools.search(memory, "smoky oolong", limit=1))
    assert "before" not in plain["hits"][0] and "after" not in plain["hits"][0]
    # Ana never said it: her turn after it holds it in its context terms only
    by_ana = run(lambda: tools.search(memory, "smoky oolong", speaker="ana"))
    assert [h["source_ref"] for h in by_ana["hits"]] == [f"{file_id}:3"]
    dated = run(lambda: tools.search(memory, "the oolong yesterday"))
    assert set(dated["window"]) == {"since", "until"}
    assert dated["window"]["since"] < dated["window"]["until"]


def test_search_takes_a_mode_and_says_how_it_ranked(service: Service) -> None:
    file_id = _store(service, "alpha", "a-1", "the deploy key rotates monthly", "lunch at noon")
    memory = Local(service, ALPHA)
    lexical = {"mode": "lexical", "model": None, "embedding_lag": None, "fallback": None}
    words = run(lambda: tools.search(memory, "deploy key"))
    assert words["ranking"] == lexical and words["hits"][0]["source_ref"] == f"{file_id}:1"
    # no embedder: a hybrid search ranks by words and says why
    unmet = run(lambda: tools.search(memory, "deploy key", mode="hybrid"))
    assert unmet["ranking"] == {
        **lexical,
        "fallback": "no embedder is configured (setting search_embedder)",
    }
    assert unmet["hits"] == words["hits"]
    fake = helpers.FakeEmbedder("fake-mcp")
    service.hybrid.embedder = fake
    waiting = run(lambda: tools.search(memory, "deploy key"))["ranking"]
    assert waiting == {
        "mode": "lexical",
        "model": "fake-mcp",
        "embedding_lag": 2,
        "fallback": "no message has a vector of this model yet",
    }
    assert service.hybrid.embed_round() == 2
    fused = run(lambda: tools.search(memory, "deploy key", mode="hybrid"))
    assert fused["ranking"] == {
        "mode": "hybrid",
        "model": "fake-mcp",
        "embedding_lag": 0,
        "fallback": None,
    }
    assert fused["hits"][0]["source_ref"] == f"{file_id}:1"
    words = run(lambda: tools.search(memory, "deploy key", mode="lexical"))
    assert words["ranking"]["mode"] == "lexical" and words["ranking"]["model"] == "fake-mcp"
    fake.down = True
    down = run(lambda: tools.search(memory, "deploy key"))
    assert down["ranking"]["mode"] == "lexical"
    assert "the fake is down" in down["ranking"]["fallback"]
    assert [h["source_ref"] for h in down["hits"]][:1] == [f"{file_id}:1"]
