"""A Hermes conversation with rewinds (/undo), through the sgme provider inside the real
hermes-agent 0.19.0 and through ``sgme import hermes`` of the ``state.db`` Hermes' own SessionDB
kept meanwhile: the same stored messages, in order — the rewound turns kept, a rewind marker
before the turn that goes on from before them — and the import of the final database into the
provider's store writes nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import hermes_env
import httpx
from test_provider import AGENT, files, harness, stored, wait_for

from pipeline import database, document, exchange, journal
from pipeline.importers import convention, reader, runner

S = "20260803_140000_cccccc"
T0 = 1785765600.0  # 2026-08-03T14:00:00Z


class Conversation:
    """Hermes' side of a session: each turn persisted to state.db as the agent does it, then
    ``sync_turn`` with the live transcript; /undo as the CLI does it."""

    def __init__(self, driver: hermes_env.Driver, session: str = S) -> None:
        self.driver = driver
        self.session = session
        self.history: list[dict[str, Any]] = [{"role": "system", "content": "You are Hermes."}]
        self.clock = T0

    def say(self, question: str, answer: str, *, tool: str = "") -> None:
        self.clock += 10
        new: list[dict[str, Any]] = [{"role": "user", "content": question, "timestamp": self.clock}]
        if tool:
            call = {
                "id": tool,
                "type": "function",
                "function": {"name": "terminal", "arguments": '{"command": "ls"}'},
            }
            new.append({"role": "assistant", "content": "", "tool_calls": [call]})
            new.append(
                {
                    "role": "tool",
                    "tool_name": "terminal",
                    "content": "a.txt",
                    "tool_call_id": call["id"],
                }
            )
        new.append({"role": "assistant", "content": answer})
        self.history += new
        self.driver("persist", session_id=self.session, messages=new)
        self.driver(
            "turn",
            user=question,
            assistant=answer,
            session_id=self.session,
            messages=list(self.history),
        )

    def undo(self, n: int = 1) -> None:
        users = [i for i, m in enumerate(self.history) if m["role"] == "user"]
        del self.history[users[-n] :]
        assert self.driver("undo", session_id=self.session, n=n)["rewound_rows"] > 0

    def compact(self, keep: int) -> None:
        """Compaction in place: a summary exchange and the last ``keep`` messages, live."""
        self.clock += 10
        kept: list[dict[str, Any]] = [
            {k: v for k, v in m.items() if k != "timestamp"} for m in self.history[-keep:]
        ]
        summary: list[dict[str, Any]] = [
            {"role": "user", "content": "[summary of earlier turns]", "timestamp": self.clock},
            {"role": "assistant", "content": "Noted."},
        ]
        self.history = [self.history[0], *summary, *kept]
        self.driver("compact", session_id=self.session, messages=summary + kept)


def answer(response: httpx.Response) -> Any:
    """An append's answer, its error raised as the client raises it (409: the key is there)."""
    if response.is_error:
        raise exchange.error_from(response)
    return response.json()


def marker(places: list[int]) -> tuple[str, str, None]:
    return ("system", convention.rewound(places, None)["content"], None)


def test_rewinds_captured_and_imported_alike(procs: Any, tmp_path: Path) -> None:
    hermes_env.python()
    server, _, url = hermes_env.serve(procs, tmp_path / "data")
    home = hermes_env.make_home(tmp_path / "hermes-home")
    env = hermes_env.hermes_env(home, SGME_URL=url, SGME_AGENT_ID=AGENT)
    with httpx.Client(base_url=url, timeout=10) as client:
        harness.wait_healthy(client, server)
        driver = hermes_env.Driver(home, env, tmp_path / "driver.log")
        try:
            driver("load")
            driver("init", session_id=S)
            talk = Conversation(driver)
            talk.say("list files", "One file: a.txt", tool="call_1")
            talk.say("delete it", "Deleted.")
            talk.undo()  # "delete it" taken back ...
            talk.say("copy it", "Copied.")  # ... and the conversation goes on from before it
            talk.say("rename it", "Renamed.", tool="call_2")
            talk.undo()
            talk.say("rename it to b.txt", "Renamed to b.txt.")
            talk.say("show it", "a")
            talk.say("count it", "1")
            talk.undo()
            talk.undo()  # two turns back, one at a time
            talk.say("done", "Bye.")
            expected = [
                ("user", "list files", None),
                (
                    "assistant",
                    convention.call_body("terminal", '{"command": "ls"}', "call_1"),
                    "terminal",
                ),
                ("tool", convention.result_body("a.txt", "call_1"), "terminal"),
                ("assistant", "One file: a.txt", None),
                ("user", "delete it", None),
                ("assistant", "Deleted.", None),
                marker([1, 2]),
                ("user", "copy it", None),
                ("assistant", "Copied.", None),
                ("user", "rename it", None),
                (
                    "assistant",
                    convention.call_body("terminal", '{"command": "ls"}', "call_2"),
                    "terminal",
                ),
                ("tool", convention.result_body("a.txt", "call_2"), "terminal"),
                ("assistant", "Renamed.", None),
                marker([1, 2, 3, 4]),
                ("user", "rename it to b.txt", None),
                ("assistant", "Renamed to b.txt.", None),
                ("user", "show it", None),
                ("assistant", "a", None),
                ("user", "count it", None),
                ("assistant", "1", None),
                marker([1, 2, 3, 4]),
                ("user", "done", None),
                ("assistant", "Bye.", None),
            ]
            captured = wait_for(client, S, len(expected))
            assert captured == expected
            assert driver("shutdown")["drain"]["abandoned_writes"] == 0
        finally:
            driver.close()

        state_db = home / "state.db"
        # the final state.db into the provider's store: every unit is already there
        report = runner.run(
            reader("hermes"),
            state_db,
            agent_id=AGENT,
            ingest=lambda body: answer(client.post("/v1/append", json=body)),
        )
        assert report.errors == []
        assert (report.messages, report.replayed) == (0, len(expected))
        assert stored(client, S) == expected
        assert list(files(client)) == [S]

    # and into an empty store: the same messages, in the same order
    db = database.Database.from_url(f"sqlite:///{tmp_path / 'index.sqlite3'}")
    database.migrate(db.engine)
    data_dir = tmp_path / "imported"
    data_dir.mkdir()
    try:
        first = runner.run(
            reader("hermes"),
            state_db,
            agent_id=AGENT,
            ingest=lambda body: journal.ingest(db, body),
            flush=lambda file_id: journal.flush(db, data_dir, file_id),
        )
        assert (first.messages, first.skipped) == (len(expected), 0)
        (md,) = (data_dir / "raw" / "sessions").glob("*.md")
        doc = document.parse(md.read_text(encoding="utf-8"), file_id=md.stem)
        assert [(m.role, m.content) for m in doc.messages] == [(r, c) for r, c, _ in expected]
    finally:
        db.dispose()


def test_rewinds_around_an_in_place_compaction(procs: Any, tmp_path: Path) -> None:
    """A rewind before an in-place compaction and one after it: the rewound turns keep the
    provider's numbers in the import (the compacted turns count before them; the compaction's
    live set starts again from 1) and the marker after the compaction names only what it took
    back. What the import adds to the provider's store is the compaction's own: its live set
    (summary and kept turns, renumbered) and the pre-compaction history as `#compacted`."""
    hermes_env.python()
    server, _, url = hermes_env.serve(procs, tmp_path / "data")
    home = hermes_env.make_home(tmp_path / "hermes-home")
    env = hermes_env.hermes_env(home, SGME_URL=url, SGME_AGENT_ID=AGENT)
    with httpx.Client(base_url=url, timeout=10) as client:
        harness.wait_healthy(client, server)
        driver = hermes_env.Driver(home, env, tmp_path / "driver.log")
        try:
            driver("load")
            driver("init", session_id=S)
            talk = Conversation(driver)
            talk.say("one", "1")
            talk.say("two", "2")
            talk.undo()
            talk.say("two again", "2 again")
            talk.say("three", "3")
            talk.compact(keep=2)  # a summary exchange, and "three" kept
            talk.say("four", "4")
            talk.undo()
            talk.say("four again", "4 again")
            captured = [
                ("user", "one", None),
                ("assistant", "1", None),
                ("user", "two", None),
                ("assistant", "2", None),
                marker([1, 2]),
                ("user", "two again", None),
                ("assistant", "2 again", None),
                ("user", "three", None),
                ("assistant", "3", None),
                ("user", "four", None),
                ("assistant", "4", None),
                marker([1, 2]),  # "four" only: what was stored before the compaction is not live
                ("user", "four again", None),
                ("assistant", "4 again", None),
            ]
            assert wait_for(client, S, len(captured)) == captured
            assert driver("shutdown")["drain"]["abandoned_writes"] == 0
        finally:
            driver.close()

        report = runner.run(
            reader("hermes"),
            home / "state.db",
            agent_id=AGENT,
            ingest=lambda body: answer(client.post("/v1/append", json=body)),
        )
        assert report.errors == []
        # "two" (rewound before the compaction), "four", its marker and "four again" replay
        after = [
            *captured,
            ("user", "[summary of earlier turns]", None),
            ("assistant", "Noted.", None),
            ("user", "three", None),
            ("assistant", "3", None),
        ]
        assert wait_for(client, S, len(after)) == after
        assert wait_for(client, S + "#compacted", 6) == [
            ("user", "one", None),
            ("assistant", "1", None),
            ("user", "two again", None),
            ("assistant", "2 again", None),
            ("user", "three", None),
            ("assistant", "3", None),
        ]
        assert (report.messages, report.replayed) == (4 + 6, 2 + 2 + 1 + 2)
