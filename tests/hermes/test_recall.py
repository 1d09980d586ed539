"""Recall through the sgme provider inside the real hermes-agent 0.19.0, against a real
``sgme serve`` with tokens: ``prefetch`` finds what another session said earlier, with its
source_refs, and leaves out the current session's latest turns; ``queue_prefetch`` carries a
recall to the next turn; the ``sgme_search`` and ``sgme_open`` tools answer JSON; a token
without the read scope, a server that is down and one that never answers give an empty
recall at once (within the provider's bound), never an error."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import hermes_env
import httpx

harness = hermes_env.harness

AGENT = "hermes-recall"
S1 = "20260803_111806_aaaaaa"
S2 = "20260804_090000_bbbbbb"
T0 = 1785755886.0  # 2026-08-03T11:18:06Z
#: seconds a recall before a turn may take (the provider's PREFETCH_TIMEOUT), and the slack a
#: loaded test machine gets on top
PREFETCH_TIMEOUT = 1.5
SLACK = 1.0


def turn(driver: hermes_env.Driver, session: str, user: str, assistant: str, **extra: Any) -> None:
    """One completed turn of ``session``, as Hermes' MemoryManager hands it over."""
    transcript = [
        {"role": "system", "content": "You are Hermes."},
        {"role": "user", "content": user, **extra},
        {"role": "assistant", "content": assistant},
    ]
    driver("turn", user=user, assistant=assistant, session_id=session, messages=transcript)


def stored(client: httpx.Client, session: str, count: int) -> str:
    """The file_id of ``session`` once ``count`` messages are in it (flushed: searchable)."""

    def ready() -> str | None:
        answer = client.get("/v1/files", params={"agent_id": AGENT, "limit": 1000})
        assert answer.status_code == 200, answer.text
        for row in answer.json()["files"]:
            if row["session_key"] == session and row["flushed_seq"] >= count:
                return str(row["file_id"])
        return None

    found: str = harness.wait_until(ready, timeout=60, what=f"{count} messages in {session}")
    return found


def hit_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("- ")]


def test_recall_in_hermes(procs: Any, tmp_path: Path) -> None:
    hermes_env.python()
    data_dir = tmp_path / "data"
    common = ["--data-dir", str(data_dir)]
    env = harness.clean_env()
    procs.run(["migrate", *common], env)

    def token(agent: str, scope: str) -> str:
        made = procs.run(
            ["token", "create", "--agent-id", agent, "--scope", scope, "--json", *common], env
        )
        return str(json.loads(made)["token"])

    admin, provider, appender = (
        token("*", "admin"),
        token(AGENT, "append,read"),
        token(AGENT, "append"),
    )
    port = harness.free_port()
    url = f"http://127.0.0.1:{port}"
    serve = ["serve", *common, "--port", str(port), "--log-level", "warning"]
    server = procs.start("serve", serve, env)
    home = hermes_env.make_home(tmp_path / "hermes-home")
    driver_env = hermes_env.hermes_env(home, SGME_URL=url, SGME_AGENT_ID=AGENT, SGME_TOKEN=provider)
    auth = {"Authorization": f"Bearer {admin}"}
    with httpx.Client(base_url=url, timeout=10, headers=auth) as client:
        harness.wait_healthy(client, server)
        driver = hermes_env.Driver(home, driver_env, tmp_path / "driver.log")
        try:
            driver("load")
            driver("init", session_id=S1)
            offered = driver("tools")
            assert offered["names"] == ["sgme_open", "sgme_search"]
            assert "sgme_search" in offered["system_prompt"]

            # Session 1, days ago: a preference. Session 2, now: its latest turn is about tea
            # too, and Hermes has it in context.
            turn(
                driver,
                S1,
                "I prefer green tea over coffee in the morning.",
                "Noted: green tea, not coffee.",
                timestamp=T0,
            )
            old = stored(client, S1, 2)
            driver("switch", session_id=S2)
            turn(driver, S2, "Which tea should the office buy?", "Any tea the team likes.")
            new = stored(client, S2, 2)

            # The user's question shares one word with each session: only session 1 comes back.
            recalled = driver("prefetch", query="What kind of tea do I like?", session_id=S2)
            lines = hit_lines(recalled["text"])
            said = (
                f"- 2026-08-03 11:18 user, session {S1} [{old}:1]: "
                "I prefer green tea over coffee in the morning."
            )
            assert len(lines) == 2 and said in lines
            answered = next(line for line in lines if line != said)  # at the time it completed
            assert answered.endswith(
                f" assistant, session {S1} [{old}:2]: Noted: green tea, not coffee."
            )
            assert "sgme_open" in recalled["text"].splitlines()[0]
            assert new not in recalled["text"]
            # Hermes passes no session_id before a turn: the provider's own session counts.
            again = driver("prefetch", query="What kind of tea do I like?")
            assert again["text"] == recalled["text"]

            # queue_prefetch (after a turn, on Hermes' worker) recalls for the next turn; the
            # next prefetch shows it once: the message with every word and the answer after
            # it (which says "coffee" and holds the question's words as its context terms,
            # docs/search.md: either may rank first), nothing of the current session.
            driver("queue_prefetch", query="coffee in the morning", session_id=S2)
            carried = driver("prefetch", query="hello", session_id=S2)["text"]
            refs = [line.split("[")[1].split("]")[0] for line in hit_lines(carried)]
            assert sorted(refs) == [f"{old}:1", f"{old}:2"]
            assert driver("prefetch", query="hello", session_id=S2)["text"] == ""

            # The search tool: every hit with its source_ref, time, role, session and snippet;
            # the current session too (the model asked), after the hits with both words.
            found = driver("tool", name="sgme_search", args={"query": "green tea"})["result"]
            hits = found["hits"]
            assert found["count"] == len(hits) == 4
            assert {h["source_ref"] for h in hits[:2]} == {f"{old}:1", f"{old}:2"}
            assert {h["source_ref"] for h in hits[2:]} == {f"{new}:1", f"{new}:2"}
            first = next(h for h in hits if h["source_ref"] == f"{old}:1")
            assert first == {
                "source_ref": f"{old}:1",
                "time": "2026-08-03T11:18:06Z",
                "role": "user",
                "session": S1,
                "snippet": "I prefer green tea over coffee in the morning.",
            }
            narrowed = {"query": "tea", "session": S2, "role": "assistant"}
            only = driver("tool", name="sgme_search", args=narrowed)["result"]["hits"]
            assert [(h["source_ref"], h["snippet"]) for h in only] == [
                (f"{new}:2", "Any tea the team likes.")
            ]

            # sgme_open: a hit's message with its neighbours; a bad ref is an error, in JSON.
            opened = driver("tool", name="sgme_open", args={"source_ref": f"{old}:2"})["result"]
            assert (opened["source_ref"], opened["session"]) == (f"{old}:2", S1)
            assert [(m["source_ref"], m["role"], m["content"]) for m in opened["messages"]] == [
                (f"{old}:1", "user", "I prefer green tea over coffee in the morning."),
                (f"{old}:2", "assistant", "Noted: green tea, not coffee."),
            ]
            bad = driver("tool", name="sgme_open", args={"source_ref": "nope"})["result"]
            assert set(bad) == {"error"} and "422" in bad["error"]

            # A token that may only append: turns still go in; recall is empty, the tool says
            # what the token lacks.
            check_append_only_token(tmp_path, url, appender, client)

            # The server goes away: an empty recall at once, and the tool says so.
            server.stop()
            down = driver(
                "prefetch", query="green tea", session_id=S2, timeout=PREFETCH_TIMEOUT + 10
            )
            assert down["text"] == ""
            assert down["seconds"] < PREFETCH_TIMEOUT
            failed = driver("tool", name="sgme_search", args={"query": "green tea"})["result"]
            assert set(failed) == {"error"} and "did not answer" in failed["error"]
            driver("shutdown")
        finally:
            driver.close()


def check_append_only_token(tmp_path: Path, url: str, token: str, client: httpx.Client) -> None:
    home = hermes_env.make_home(tmp_path / "home-append-only")
    env = hermes_env.hermes_env(home, SGME_URL=url, SGME_AGENT_ID=AGENT, SGME_TOKEN=token)
    driver = hermes_env.Driver(home, env, tmp_path / "driver-append-only.log")
    try:
        driver("load")
        driver("init", session_id="append-only")
        turn(driver, "append-only", "green tea from an append-only token", "stored")
        stored(client, "append-only", 2)
        assert driver("prefetch", query="green tea")["text"] == ""
        refused = driver("tool", name="sgme_search", args={"query": "green tea"})["result"]
        assert set(refused) == {"error"}
        assert "403" in refused["error"] and "read scope" in refused["error"]
        driver("shutdown")
    finally:
        driver.close()


def test_a_server_that_never_answers_costs_a_turn_at_most_the_prefetch_bound(
    tmp_path: Path,
) -> None:
    """A server that takes the connection and never answers (a hung process, a stuck proxy):
    the recall before a turn gives up at its bound with nothing, and so does the tool at its
    own; both answer, neither raises."""
    hermes_env.python()
    with socket.socket() as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen(16)  # the kernel completes connections; nobody ever reads or answers
        url = f"http://127.0.0.1:{hung.getsockname()[1]}"
        home = hermes_env.make_home(tmp_path / "hermes-home")
        env = hermes_env.hermes_env(home, SGME_URL=url, SGME_AGENT_ID=AGENT)
        driver = hermes_env.Driver(home, env, tmp_path / "driver.log")
        try:
            driver("load")
            driver("init", session_id=S1)
            bound = PREFETCH_TIMEOUT + SLACK
            answer = driver("prefetch", query="green tea", timeout=bound + 10)
            assert answer["text"] == ""
            assert answer["seconds"] < bound
            tool = driver("tool", name="sgme_search", args={"query": "green tea"}, timeout=30)
            assert set(tool["result"]) == {"error"} and "did not answer" in tool["result"]["error"]
        finally:
            driver.close()
