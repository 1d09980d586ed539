"""The provider's write path inside the real hermes-agent, against a real ``sgme serve``:

- one key per turn: what the provider stored, imported again from the ``state.db`` Hermes
  writes for the same transcript, writes nothing — and the reverse;
- a spool that cannot be written loses no turn (held in memory, delivered), a spool file that
  is not an append body and a turn the server forbids (403) are set aside with their reason
  and the rest goes on, the spool is private, and at its bound new turns wait in memory and
  land in order."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import hermes_env
import httpx
import pytest
from test_provider import AGENT, stored, transcript, turn, wait_for

from pipeline import cli
from pipeline.capture import spool as spooling

harness = hermes_env.harness
serve = hermes_env.serve


def write_state_db(home: Path, sessions: dict[str, list[dict[str, Any]]]) -> None:
    done = subprocess.run(
        [
            str(hermes_env.python()),
            str(hermes_env.HERE / "write_state_db.py"),
            str(home / "state.db"),
        ],
        input=json.dumps(sessions),
        env=hermes_env.hermes_env(home),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_the_provider_and_the_importer_write_a_turn_once(
    procs: Any, tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    hermes_env.python()
    data_dir = tmp_path / "data"
    server, _, url = serve(procs, data_dir)
    home = hermes_env.make_home(tmp_path / "hermes-home")
    env = hermes_env.hermes_env(home, SGME_URL=url, SGME_AGENT_ID=AGENT)
    with httpx.Client(base_url=url, timeout=10) as client:
        harness.wait_healthy(client, server)
        driver = hermes_env.Driver(home, env, tmp_path / "driver.log")
        try:
            driver("load")
            driver("init", session_id="by-provider")
            turn(driver, 1, session_id="by-provider")
            turn(driver, 2, session_id="by-provider")
            provided = wait_for(client, "by-provider", 9)

            # Hermes' state.db holds the same conversation, and one the provider never saw
            write_state_db(home, {"by-provider": transcript(2), "by-import": transcript(2)})
            capsysbinary.readouterr()
            argv = ["import", "hermes", str(home), "--agent-id", AGENT, "--data-dir", str(data_dir)]
            assert cli.main([*argv, "--json"]) == 0
            report = json.loads(capsysbinary.readouterr().out.decode().splitlines()[-1])
            assert (report["messages"], report["replayed"]) == (9, 9)  # by-import's only
            assert stored(client, "by-provider") == provided
            imported = wait_for(client, "by-import", 9)
            assert imported == provided

            # the reverse: the provider syncs the turns the import stored
            driver("init", session_id="by-import")
            turn(driver, 1, session_id="by-import")
            turn(driver, 2, session_id="by-import")
            driver("end")
            assert driver("spool")["pending"] == []
            assert stored(client, "by-import") == imported
        finally:
            driver.close()


def test_the_spool_never_loses_a_turn(procs: Any, tmp_path: Path) -> None:
    hermes_env.python()
    data_dir = tmp_path / "data"
    procs.run(["migrate", "--data-dir", str(data_dir)], harness.clean_env())
    token = procs.run(
        [
            "token",
            "create",
            "--agent-id",
            AGENT,
            "--scope",
            "append,read",
            "--name",
            "t",
            "--data-dir",
            str(data_dir),
        ],
        harness.clean_env(),
    ).splitlines()[-1]
    server, args, url = serve(procs, data_dir)
    with httpx.Client(
        base_url=url, timeout=10, headers={"Authorization": f"Bearer {token}"}
    ) as client:
        harness.wait_healthy(client, server)

        # 1. The spool cannot be written (its path is a file): the turns are held in memory
        # and delivered, never counted as sent and dropped.
        home = hermes_env.make_home(tmp_path / "home-1")
        (home / "sgme").mkdir()
        (home / "sgme" / "spool").write_text("not a directory")
        env = hermes_env.hermes_env(home, SGME_URL=url, SGME_AGENT_ID=AGENT, SGME_TOKEN=token)
        driver = hermes_env.Driver(home, env, tmp_path / "driver-1.log")
        try:
            driver("load")
            driver("init", session_id="unspoolable")
            turn(driver, 1, session_id="unspoolable")
            turn(driver, 2, session_id="unspoolable")
            assert len(wait_for(client, "unspoolable", 9)) == 9
            driver("shutdown")
        finally:
            driver.close()

        # 2. A spool left with a file that is not an append body, and a turn spooled under
        # the agent id used before (this token may not write it: 403), before a new turn.
        home = hermes_env.make_home(tmp_path / "home-2")
        box = spooling.Spool(home / "sgme" / "spool")
        old = {
            "agent_id": "old-agent",
            "session_key": "s",
            "idempotency_key": "old-1",
            "messages": [{"role": "user", "content": "from before"}],
        }
        box.put([old])
        (home / "sgme" / "spool" / "00000000000000000001-1-000001.json").write_text("[1, 2]")
        env = hermes_env.hermes_env(
            home, SGME_URL=url, SGME_AGENT_ID=AGENT, SGME_TOKEN=token, SGME_SPOOL_MAX_BYTES="500"
        )
        driver = hermes_env.Driver(home, env, tmp_path / "driver-2.log")
        try:
            driver("load")
            driver("init", session_id="bounded")
            turn(driver, 1, session_id="bounded")
            assert len(wait_for(client, "bounded", 7)) == 7
            rejected = home / "sgme" / "spool" / "rejected"
            reasons = sorted(p.read_text() for p in rejected.glob("*.reason"))
            assert len(reasons) == 2 and len(list(rejected.glob("*.json"))) == 2
            assert reasons[0].startswith("403") and "not an append body" in reasons[1]

            # 3. The server goes away for three turns; the spool is private and at its bound
            # (500 bytes) the next turns wait in memory; all land, in order, when it is back.
            server.stop()
            for n in (2, 3, 4):
                turn(driver, n, session_id="bounded")
            spool = home / "sgme" / "spool"
            pending = driver("spool")["pending"]
            assert len(pending) == 1  # the second turn; the third and fourth are held
            assert spool.stat().st_mode & 0o777 == 0o700
            assert (spool / pending[0]).stat().st_mode & 0o777 == 0o600
            server = procs.start("serve-again", args, harness.clean_env())
            harness.wait_healthy(client, server)
            turn(driver, 5, session_id="bounded")
            found = wait_for(client, "bounded", 7 + 4 * 2)
            users = [content for role, content, _ in found if role == "user"]
            assert users == [f"question {n}" for n in range(1, 6)]
            driver("end")
            assert driver("spool")["pending"] == []
        finally:
            driver.close()


def test_what_was_erased_is_not_stored_again_by_a_replay_or_an_import(
    procs: Any, tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    """The provider stores two turns; the session is erased; a new Hermes process replays the
    same transcript (a resumed session syncs its turns again) and Hermes' state.db is
    imported: nothing comes back, and both say so."""
    hermes_env.python()
    data_dir = tmp_path / "data"
    server, _, url = serve(procs, data_dir)
    home = hermes_env.make_home(tmp_path / "hermes-home")
    env = hermes_env.hermes_env(home, SGME_URL=url, SGME_AGENT_ID=AGENT)
    with httpx.Client(base_url=url, timeout=10) as client:
        harness.wait_healthy(client, server)
        driver = hermes_env.Driver(home, env, tmp_path / "driver.log")
        try:
            driver("load")
            driver("init", session_id="erased")
            turn(driver, 1, session_id="erased")
            turn(driver, 2, session_id="erased")
            wait_for(client, "erased", 9)
            driver("end")
        finally:
            driver.close()
        capsysbinary.readouterr()
        argv = ["erase", "--agent-id", AGENT, "--session-key", "erased", "--yes", "--json"]
        assert cli.main([*argv, "--data-dir", str(data_dir)]) == 0
        erased = json.loads(capsysbinary.readouterr().out)
        assert (erased["files"], erased["messages"], erased["keys"]) == (1, 9, 2)
        assert stored(client, "erased") == []

        again = hermes_env.Driver(home, env, tmp_path / "driver-again.log")
        try:
            again("load")
            again("init", session_id="erased")
            turn(again, 1, session_id="erased")
            turn(again, 2, session_id="erased")
            again("end")
            assert again("spool")["pending"] == []
        finally:
            again.close()
        assert stored(client, "erased") == []
        log = (tmp_path / "driver-again.log").read_text()
        assert log.count("was erased from SGME: not stored again") == 2

        write_state_db(home, {"erased": transcript(2)})
        capsysbinary.readouterr()
        argv = ["import", "hermes", str(home), "--agent-id", AGENT, "--data-dir", str(data_dir)]
        assert cli.main([*argv, "--json"]) == 0
        report = json.loads(capsysbinary.readouterr().out.decode().splitlines()[-1])
        assert (report["messages"], report["erased"], report["files"]) == (0, 9, 0)
        assert stored(client, "erased") == []
        assert "erased" not in files_of(client)


def files_of(client: httpx.Client) -> set[str]:
    answer = client.get("/v1/files", params={"agent_id": AGENT, "limit": 1000})
    return {row["session_key"] for row in answer.json()["files"]}
