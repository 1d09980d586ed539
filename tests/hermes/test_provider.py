"""The sgme memory provider inside the real hermes-agent 0.19.0, against a real ``sgme serve``:
loaded by Hermes' plugin loader from a temporary Hermes home, driven by Hermes' MemoryManager.

Turns with tool calls land once each, in order; a replayed turn writes nothing; a turn sent
while the server is down waits in the spool and lands, in order, when it is back; a session
switch starts a new file; a cron agent writes nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import hermes_env
import httpx

from pipeline.importers import convention

harness = hermes_env.harness

AGENT = "hermes-e2e"
S1 = "20260803_111806_aaaaaa"
S2 = "20260803_120000_bbbbbb"
T0 = 1785755886.0  # 2026-08-03T11:18:06Z


def transcript(turns: int) -> list[dict[str, Any]]:
    """Hermes' transcript after ``turns`` turns: the first has two parallel tool calls."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are Hermes."}]
    for n in range(1, turns + 1):
        messages.append({"role": "user", "content": f"question {n}", "timestamp": T0 + 100 * n})
        if n == 1:
            messages.append(
                {
                    "role": "assistant",
                    "content": "Looking.",
                    "tool_calls": [
                        {
                            "id": "call_a",
                            "type": "function",
                            "function": {"name": "terminal", "arguments": '{"command": "ls"}'},
                        },
                        {
                            "id": "call_b",
                            "type": "function",
                            "function": {"name": "read_file", "arguments": '{"path": "a.txt"}'},
                        },
                    ],
                }
            )
            for call_id, name, output in (
                ("call_a", "terminal", "a.txt"),
                ("call_b", "read_file", "hi"),
            ):
                messages.append(
                    {
                        "role": "tool",
                        "name": name,
                        "tool_name": name,
                        "content": output,
                        "tool_call_id": call_id,
                    }
                )
        messages.append({"role": "assistant", "content": f"answer {n}"})
    return messages


def turn(driver: hermes_env.Driver, n: int, **args: Any) -> None:
    driver("turn", user=f"question {n}", assistant=f"answer {n}", messages=transcript(n), **args)


def files(client: httpx.Client) -> dict[str, dict[str, Any]]:
    answer = client.get("/v1/files", params={"agent_id": AGENT, "limit": 1000})
    assert answer.status_code == 200, answer.text
    return {row["session_key"]: row for row in answer.json()["files"]}


def stored(client: httpx.Client, session_key: str) -> list[tuple[str, str, str | None]]:
    row = files(client).get(session_key)
    if row is None:
        return []
    answer = client.get(f"/v1/files/{row['file_id']}/messages", params={"limit": 1000})
    assert answer.status_code == 200, answer.text
    return [(m["role"], m["content"], m["tool_name"]) for m in answer.json()["messages"]]


def wait_for(
    client: httpx.Client, session_key: str, count: int
) -> list[tuple[str, str, str | None]]:
    def enough() -> list[tuple[str, str, str | None]] | None:
        found = stored(client, session_key)
        return found if len(found) >= count else None

    found: list[tuple[str, str, str | None]] = harness.wait_until(
        enough, timeout=60, what=f"{count} messages in {session_key}"
    )
    return found


TURN_1 = [
    ("user", "question 1", None),
    ("assistant", "Looking.", None),
    ("assistant", convention.call_body("terminal", '{"command": "ls"}', "call_a"), "terminal"),
    ("assistant", convention.call_body("read_file", '{"path": "a.txt"}', "call_b"), "read_file"),
    ("tool", convention.result_body("a.txt", "call_a"), "terminal"),
    ("tool", convention.result_body("hi", "call_b"), "read_file"),
    ("assistant", "answer 1", None),
]


def test_provider_in_hermes(procs: Any, tmp_path: Path) -> None:
    hermes_env.python()
    data_dir = tmp_path / "data"
    server, serve, url = hermes_env.serve(procs, data_dir)
    home = hermes_env.make_home(tmp_path / "hermes-home")
    env = hermes_env.hermes_env(home, SGME_URL=url, SGME_AGENT_ID=AGENT)
    with httpx.Client(base_url=url, timeout=10) as client:
        harness.wait_healthy(client, server)
        driver = hermes_env.Driver(home, env, tmp_path / "driver.log")
        try:
            loaded = driver("load")
            assert ["sgme", True] in loaded["discovered"]
            assert loaded["active"] == "sgme"
            assert (loaded["name"], loaded["class"]) == ("sgme", "SgmeMemoryProvider")
            assert loaded["module"] == "_hermes_user_memory.sgme"  # a user plugin, from the home
            driver("init", session_id=S1)

            turn(driver, 1, session_id=S1)
            turn(driver, 1, session_id=S1)  # Hermes replays a turn: written once
            assert wait_for(client, S1, len(TURN_1)) == TURN_1
            row = files(client)[S1]
            assert row["metadata"] == {"client": "hermes-sgme-provider", "platform": "cli"}

            # The server goes down for one turn: the turn waits in the spool...
            server.stop()
            turn(driver, 2, session_id=S1)
            assert len(driver("spool")["pending"]) == 1
            # ...and lands, before the next one, when the server is back.
            server = procs.start("serve-again", serve, harness.clean_env())
            harness.wait_healthy(client, server)
            turn(driver, 3, session_id=S1)
            expected = [
                *TURN_1,
                ("user", "question 2", None),
                ("assistant", "answer 2", None),
                ("user", "question 3", None),
                ("assistant", "answer 3", None),
            ]
            assert wait_for(client, S1, len(expected)) == expected
            answer = client.get(f"/v1/files/{row['file_id']}/messages", params={"limit": 1})
            assert answer.json()["messages"][0]["ts"] == "2026-08-03T11:19:46Z"  # its own time

            # A new session: a new file; Hermes may pass no session_id after a switch.
            driver("switch", session_id=S2, parent=S1)
            turn(driver, 1, session_id="")
            assert wait_for(client, S2, len(TURN_1)) == TURN_1
            assert files(client)[S2]["metadata"]["parent_session"] == S1
            driver("end")
            assert driver("spool")["pending"] == []
            assert driver("shutdown")["drain"]["abandoned_writes"] == 0
        finally:
            driver.close()

        # Another Hermes process sends turn 1 again (its times differ): nothing is written,
        # and a cron agent writes nothing at all.
        again = hermes_env.Driver(home, env, tmp_path / "driver-2.log")
        try:
            again("load")
            again("init", session_id=S1)
            turn(again, 1, session_id=S1)
            again("init", session_id=S1, agent_context="cron")
            turn(again, 4, session_id=S1)
            again("end")
            assert again("spool")["pending"] == []
            again("shutdown")
        finally:
            again.close()
        assert stored(client, S1) == expected
        assert set(files(client)) == {S1, S2}
