"""Memory injected by the hooks, played as Claude Code calls them (the hook's JSON for
SessionStart with each ``source`` and for UserPromptSubmit) against the API of a test's own
index (SQLite and PostgreSQL, in this process), over a store with earlier sessions of this
project, of another project, of another agent, one redacted message and one erased session.
The block holds the relevant earlier turn with its ref, keeps to its size, leaves out the
current session, the other agent, the redacted text and the erased session, never repeats a
ref in a session, and is empty — within the time budget — when nothing is relevant or the
server is away or hangs."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helpers
import httpx
import pytest
from api_client import Api

from pipeline import auth, database, validation
from pipeline.capture import config, inject
from pipeline.settings import Settings

URL = "http://testserver"
PROJECT = "/work/flux"
OTHER_PROJECT = "/work/elsewhere"
CURRENT = "cccccccc-0000-4000-8000-000000000001"
PROMPT = "What timeout did we settle on for the flux capacitor?"
ANSWER = "We settled on FLUX_TIMEOUT = 42 seconds in capacitor.yaml"
OTHER_ANSWER = "In this other repo the flux capacitor timeout stays at 7 seconds"
OTHER_AGENT_TEXT = "flux capacitor timeout per the other agent is 99 seconds"
CURRENT_TEXT = "the flux capacitor timeout question again, right now"
SECRET = "hunter2flux"
ERASED_TEXT = "flux capacitor timeout erased zebra note"
FILLER = [
    "let us rename the parser module",
    "the build passed on the second try",
    "add a test for the empty input",
    "lunch was noodles again",
    "the release notes need a line about logging",
    "move the settings into one dataclass",
    "the migration ran in four seconds",
    "please review the pull request about caching",
]


class Network(httpx.BaseTransport):
    """The way from a hook to the app: ``up``, ``down`` or ``hanging`` (every request takes
    its whole timeout)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.mode = "up"

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if self.mode == "down" or (
            self.mode == "no-listing" and request.url.path == "/v1/sessions"
        ):
            raise httpx.ConnectError("connection refused", request=request)
        if self.mode == "hanging":
            time.sleep(request.extensions.get("timeout", {}).get("read") or 5.0)
            raise httpx.ReadTimeout("timed out", request=request)
        answer = self.inner.handle_request(request)
        return httpx.Response(answer.status_code, headers=answer.headers, content=answer.read())


def _body(agent: str, key: str, cwd: str, day: int, turns: list[tuple[str, str]]) -> dict[str, Any]:
    return {
        "agent_id": agent,
        "session_key": key,
        "metadata": {"cwd": cwd, "title": f"session {key}"},
        "messages": [
            {
                "role": role,
                "content": text,
                "ts": f"2026-11-{day:02d}T10:{i // 60:02d}:{i % 60:02d}Z",
            }
            for i, (role, text) in enumerate(turns)
        ],
    }


def _session(
    app: Api, agent: str, key: str, cwd: str, day: int, turns: list[tuple[str, str]]
) -> str:
    ack = app.append(_body(agent, key, cwd, day, turns))
    app.flush(ack["file_id"])
    return str(ack["file_id"])


@pytest.fixture
def store(
    db: database.Database, data_dir: Path, database_url: str
) -> Iterator[tuple[Api, dict[str, str], str]]:
    """The app over a store of earlier sessions, the file ids by name, and the hook's token
    (append and read, for ``claude-code`` only)."""
    # the tokens come first: the server then asks every request for one
    token = auth.create(db, name="hook", agent_ids=["claude-code"], scopes=["append", "read"])
    admin = auth.create(db, name="test", agent_ids=["*"], scopes=["append", "read", "admin"])
    app = Api(db, data_dir, database_url, validation.DEFAULT_LIMITS)
    app.client.headers["Authorization"] = f"Bearer {admin.secret}"
    small = [("user", "morning, how are you"), ("assistant", "fine thanks, coffee first")]
    # a store's worth of other talk, so that the question's words are rare in it, as they are
    # in a real one (BM25 gives a word most messages hold next to no weight)
    chatter = [
        (("user", "assistant")[i % 2], f"{FILLER[i % len(FILLER)]} number {i}") for i in range(80)
    ]
    _session(app, "claude-code", "s-chatter", OTHER_PROJECT, 1, chatter)
    files = {
        "answer": _session(
            app,
            "claude-code",
            "s-answer",
            PROJECT,
            2,
            [*small, ("user", "which timeout for the flux capacitor?"), ("assistant", ANSWER)],
        ),
        "subdir": _session(
            app, "claude-code", "s-subdir", PROJECT + "/docs", 3, [("user", "docs only here")]
        ),
        "other-project": _session(
            app,
            "claude-code",
            "s-other",
            OTHER_PROJECT,
            4,
            [("user", "flux capacitor timeout there?"), ("assistant", OTHER_ANSWER)],
        ),
        "other-agent": _session(
            app, "codex", "s-codex", PROJECT, 5, [("assistant", OTHER_AGENT_TEXT)]
        ),
        "current": _session(app, "claude-code", CURRENT, PROJECT, 6, [("user", CURRENT_TEXT)]),
        "redacted": _session(
            app,
            "claude-code",
            "s-redacted",
            PROJECT,
            1,
            [("user", f"the flux capacitor timeout password is {SECRET}")],
        ),
        "erased": _session(app, "claude-code", "s-erased", PROJECT, 1, [("user", ERASED_TEXT)]),
    }
    redacted = app.client.post(f"/v1/refs/{files['redacted']}:1/redact", json={"reason": "pw"})
    assert redacted.status_code == 200, redacted.text
    erased = app.client.delete(f"/v1/files/{files['erased']}", params={"reason": "asked"})
    assert erased.status_code in (200, 204), erased.text
    helpers.service(db, Settings(data_dir=data_dir)).refine_now(files["answer"])
    yield app, files, token.secret
    app.close()


def _env(tmp_path: Path, token: str) -> config.Agent:
    return config.agent(
        "claude-code",
        {"SGME_URL": URL, "SGME_SPOOL_DIR": str(tmp_path / "spool"), "SGME_TOKEN": token},
    )


def _hook(event: str, **more: Any) -> inject.Call:
    """The call Claude Code's hook JSON makes (as read from stdin)."""
    payload = {
        "session_id": CURRENT,
        "transcript_path": f"/home/u/.claude/projects/-work-flux/{CURRENT}.jsonl",
        "cwd": PROJECT,
        "hook_event_name": event,
        **more,
    }
    return inject.Call.from_hook(json.loads(json.dumps(payload)))


def _run(network: Network, env: config.Agent, call: inject.Call, **settings: Any) -> inject.Outcome:
    found = inject.inject(
        env,
        config.Injection(**settings),
        call,
        deadline=time.monotonic() + settings.get("seconds", 1.0),
        transport=network,
    )
    assert found.took < settings.get("seconds", 1.0) + 0.2
    return found


def _refs(block: str) -> list[str]:
    return [line.split("`")[1] for line in block.splitlines() if line.startswith("- ref `")]


def test_a_prompt_gets_the_relevant_earlier_turn_and_nothing_it_must_not(
    store: tuple[Api, dict[str, str], str], tmp_path: Path
) -> None:
    app, files, token = store
    network = Network(app.client._transport)
    env = _env(tmp_path, token)
    found = _run(network, env, _hook("UserPromptSubmit", prompt=PROMPT))
    block = found.block
    assert block, found.why
    assert block.startswith(inject.HEADER) and "open_memory" in block
    refs = _refs(block)
    # the answer of this project comes first, with its ref, time and session
    assert refs[0] == f"{files['answer']}:4", block
    first = block.split("- ref `")[1]
    assert "2026-11-02 10:00 UTC" in first and "session “session s-answer” (this project)" in first
    assert ANSWER in first
    # the other project's turn is still there, after every turn of this project
    assert OTHER_ANSWER in block
    ours = [i for i, r in enumerate(refs) if r.startswith(files["answer"])]
    theirs = [i for i, r in enumerate(refs) if r.startswith(files["other-project"])]
    assert ours and theirs and max(ours) < min(theirs)
    # never: another agent's data, the current session, the redacted or the erased text
    for absent in (OTHER_AGENT_TEXT, CURRENT_TEXT, SECRET, ERASED_TEXT, "zebra"):
        assert absent not in block
    assert not any(r.startswith((files["other-agent"], files["current"])) for r in refs)
    assert len(block) <= config.Injection().chars
    printed = inject.output("UserPromptSubmit", block)
    assert len(printed) < 10_000
    assert json.loads(printed)["hookSpecificOutput"] == {
        "hookEventName": "UserPromptSubmit",
        "additionalContext": block,
    }
    # the same prompt again in this session: nothing already injected comes back
    again = _run(network, env, _hook("UserPromptSubmit", prompt=PROMPT))
    assert not set(_refs(again.block)) & set(refs)
    # another session gets them again
    other = _run(network, env, _hook("UserPromptSubmit", prompt=PROMPT, session_id="new-one"))
    assert _refs(other.block)[0] == refs[0]


def test_the_block_keeps_to_its_size_scope_and_floor(
    store: tuple[Api, dict[str, str], str], tmp_path: Path
) -> None:
    app, files, token = store
    network = Network(app.client._transport)
    env = _env(tmp_path, token)
    call = _hook("UserPromptSubmit", prompt=PROMPT, session_id=None)
    small = _run(network, env, call, chars=560, snippet_chars=60)
    assert 0 < len(small.block) <= 560 and len(_refs(small.block)) >= 1
    only = _run(network, env, call, scope="project-only")
    assert only.block and not any(r.startswith(files["other-project"]) for r in only.refs)
    one = _run(network, env, call, hits=1)
    assert len(_refs(one.block)) == 1
    # words no earlier turn holds, and words of small talk only: nothing, rather than noise
    none = _run(network, env, _hook("UserPromptSubmit", prompt="xylophone quasar marmalade"))
    assert none.block == "" and not none.failed
    floor = _run(network, env, _hook("UserPromptSubmit", prompt=PROMPT), min_score=1e6)
    assert floor.block == "" and "relevant" in floor.why
    # every agent the token may read: still none of the other agent's (the token holds
    # claude-code only), while an open search of the same store would find it
    wide = _run(network, env, call, agents="token")
    assert wide.block and OTHER_AGENT_TEXT not in wide.block
    assert OTHER_AGENT_TEXT in app.client.get("/v1/search", params={"q": PROMPT}).text
    off = _run(network, env, _hook("UserPromptSubmit", prompt=PROMPT), prompt=False)
    assert off.block == "" and "off" in off.why


@pytest.mark.parametrize("source", ["startup", "resume", "clear", "compact"])
def test_a_session_start_lists_this_projects_recent_sessions(
    store: tuple[Api, dict[str, str], str], tmp_path: Path, source: str
) -> None:
    app, files, token = store
    network = Network(app.client._transport)
    found = _run(network, _env(tmp_path, token), _hook("SessionStart", source=source))
    block = found.block
    assert block.startswith(inject.HEADER) and f"recent sessions in {PROJECT}" in block
    listed = [line for line in block.splitlines() if line.startswith("- ")]
    # this project's sessions (a subdirectory too), newest first; never the current one
    # (resumed or compacted: the model has it), another project's or another agent's
    assert [line.split("“")[1].split("”")[0] for line in listed] == [
        "session s-subdir",
        "session s-answer",
        "session s-redacted",
    ]
    for absent in (CURRENT, "s-other", "s-codex", "s-erased", SECRET):
        assert absent not in block
    assert "2026-11-03" in listed[0] and "4 messages" in listed[1]
    # what was decided in them, with refs a model can open
    items = [line for line in block.splitlines() if line.startswith("  - ")]
    assert items and all("refs `" in line for line in items)
    assert any(f"`{files['answer']}:" in line for line in items)
    assert len(block) <= config.Injection().chars


def test_nothing_when_the_server_is_away_or_hangs(
    store: tuple[Api, dict[str, str], str], tmp_path: Path
) -> None:
    app, _, token = store
    network = Network(app.client._transport)
    env = _env(tmp_path, token)
    for mode in ("down", "hanging"):
        network.mode = mode
        for call in (_hook("UserPromptSubmit", prompt=PROMPT), _hook("SessionStart")):
            started = time.monotonic()
            found = _run(network, env, call, seconds=0.5)
            assert found.block == "" and found.failed, (mode, call.event)
            assert time.monotonic() - started < 0.7
    # the project's sessions cannot be listed: the hits stand, in the search's order, unlabelled
    network.mode = "no-listing"
    found = _run(network, env, _hook("UserPromptSubmit", prompt=PROMPT, session_id="s-3"))
    assert ANSWER in found.block and "project)" not in found.block
    only = _run(network, env, _hook("UserPromptSubmit", prompt=PROMPT), scope="project-only")
    assert only.block == "" and only.failed
    network.mode = "up"
    refused = _run(network, _env(tmp_path, "sgme_wrong"), _hook("SessionStart"))
    assert refused.block == "" and "401" in refused.why


def test_the_sessions_listing_keeps_one_projects_sessions(
    store: tuple[Api, dict[str, str], str],
) -> None:
    app, _, _ = store
    _session(app, "claude-code", "s-sibling", PROJECT + "2", 7, [("user", "next door")])
    _session(app, "claude-code", "s-deep", PROJECT + "/a/b_c", 7, [("user", "deep down")])
    _session(app, "claude-code", "s-percent", "/work/fl%x", 7, [("user", "a % in a path")])

    def keys(cwd: str, **more: str) -> list[str]:
        answer = app.client.get("/v1/sessions", params={"cwd": cwd, "limit": 200, **more})
        assert answer.status_code == 200, answer.text
        return [s["session_key"] for s in answer.json()["sessions"]]

    # newest first; the erased session is gone, the other agent's is there for a token of both
    found = keys(PROJECT)
    assert found == ["s-deep", CURRENT, "s-codex", "s-subdir", "s-answer", "s-redacted"]
    assert keys(PROJECT + "/") == found  # a trailing slash names the same directory
    assert keys(PROJECT, agent_id="claude-code") == [k for k in found if k != "s-codex"]
    assert keys(PROJECT + "/a") == ["s-deep"]
    # "_" and "%" are letters, not wildcards; a sibling sharing the prefix is another project
    assert keys("/work/fl_x") == [] and keys("/work/fl%x") == ["s-percent"]
    assert keys(PROJECT + "/a/b%") == [] and keys(PROJECT + "2") == ["s-sibling"]
    # a NUL in another session's metadata (PostgreSQL's jsonb refuses one) fails nobody's listing
    nul = _body("claude-code", "s-nul", PROJECT, 7, [("user", "odd metadata")])
    nul["metadata"] = {"\u0001x": {}, "v\u0000": "y", "cwd": PROJECT}
    app.flush(app.append(nul)["file_id"])
    listed = keys(PROJECT)
    assert "s-nul" in listed and [k for k in listed if k != "s-nul"] == found
    refused = app.client.get("/v1/sessions", params={"cwd": "/work\nflux"})
    assert refused.status_code == 422
    assert refused.headers["content-type"].startswith("application/problem+json")


def test_a_long_session_on_the_same_subject_does_not_hide_the_earlier_answer(
    store: tuple[Api, dict[str, str], str], tmp_path: Path
) -> None:
    app, files, token = store
    turns = [("user", f"{PROMPT} (attempt {n})") for n in range(60)]
    app.append({**_body("claude-code", CURRENT, PROJECT, 6, turns), "idempotency_key": "more"})
    app.flush(files["current"])
    network = Network(app.client._transport)
    asked = app.client.get(
        "/v1/search", params={"q": PROMPT, "agent_id": "claude-code", "limit": 34}
    ).json()["hits"]
    # the first answer holds the current session's turns only: the earlier one is not in it
    assert {h["session_key"] for h in asked} == {CURRENT}
    # (so many turns on it make the subject's words common in this small store: no floor)
    call = _hook("UserPromptSubmit", prompt=PROMPT)
    found = _run(network, _env(tmp_path, token), call, min_score=0.0)
    assert ANSWER in found.block and "attempt" not in found.block
