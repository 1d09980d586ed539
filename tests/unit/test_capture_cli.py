"""``sgme capture`` as a hook runs it, in this process: it exits 0 and prints nothing on stdout;
a run that cannot deliver says why in capture.log and, on a terminal, in one line of stderr;
``sgme capture status`` shows per agent what waits, the last delivery and the last error."""

from __future__ import annotations

import io
import json
import socket
import sys
from pathlib import Path
from typing import Any

import pytest
from agents import ClaudeTranscript

from pipeline import cli


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    """A server URL nothing listens on, a spool of the test's own, no token."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    for name in ("SGME_TOKEN", "SGME_TOKEN_FILE", "SGME_AGENT_ID", "SGME_CAPTURE_SECONDS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SGME_URL", url)
    monkeypatch.setenv("SGME_SPOOL_DIR", str(tmp_path / "spool"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return url


def hook(monkeypatch: pytest.MonkeyPatch, payload: dict[str, Any]) -> int:
    monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps(payload)))
    return cli.main(["capture", "claude-code"])


def test_a_run_that_cannot_deliver_says_why_and_status_shows_it(
    env: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    sid = "aaaaaaaa-0000-4000-8000-000000000010"
    transcript = ClaudeTranscript(tmp_path / "p" / f"{sid}.jsonl", sid)
    transcript.user("hello")
    payload = {
        "session_id": sid,
        "transcript_path": str(transcript.path),
        "hook_event_name": "Stop",
    }
    assert hook(monkeypatch, payload) == 0
    out, err = capsys.readouterr()
    assert (out, err) == ("", "")  # an agent's pipe: nothing on either
    log = (tmp_path / "spool" / "capture.log").read_text()
    assert f"cannot deliver: the server at {env} is away" in log
    assert f"what is left waits in {tmp_path / 'spool'}" in log

    transcript.assistant("m1", {"type": "text", "text": "hi"})
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert hook(monkeypatch, payload) == 0
    said = terminal.getvalue()
    assert said.count("\n") == 1 and said.startswith("sgme capture claude-code: cannot deliver")
    assert str(tmp_path / "spool" / "capture.log") in said
    monkeypatch.setattr(sys, "stderr", sys.__stderr__)

    capsys.readouterr()
    assert cli.main(["capture", "status", "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["waiting"]["appends"] == 2 and status["waiting"]["files"] == 2
    assert status["waiting"]["by_agent_id"] == {"claude-code": 2}
    found = status["agents"]["claude-code"]
    assert (found["waiting"], found["transcripts"], found["last_delivery"]) == (2, 1, None)
    assert "is away" in found["last_error"]["detail"]
    assert status["token"] is None and status["agents"]["codex"]["waiting"] == 0
    assert cli.main(["capture", "status"]) == 0
    text = capsys.readouterr().out
    assert "2 appends waiting" in text and "last error: " in text and "is away" in text


def test_a_hook_without_input_or_with_garbage_exits_0(
    env: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for given in ("", "not json", "[1, 2]", '{"transcript_path": "/dev/zero"}'):
        monkeypatch.setattr(sys, "stdin", io.StringIO(given))
        assert cli.main(["capture", "claude-code"]) == 0
        assert cli.main(["capture", "codex", given or "{}"]) == 0
    assert capsys.readouterr().out == ""


def test_a_hook_run_loads_nothing_of_the_server(env: str, tmp_path: Path) -> None:
    """A hook runs at the end of every turn: it is a client of the server over HTTP, and
    importing the server's modules (SQLAlchemy, FastAPI) would take a third of a second."""
    import subprocess

    sid = "aaaaaaaa-0000-4000-8000-000000000011"
    transcript = ClaudeTranscript(tmp_path / "p" / f"{sid}.jsonl", sid)
    transcript.user("hello")
    payload = {
        "session_id": sid,
        "transcript_path": str(transcript.path),
        "hook_event_name": "Stop",
    }
    script = (
        "import io, sys\n"
        "from pipeline import cli\n"
        f"sys.stdin = io.StringIO({json.dumps(json.dumps(payload))})\n"
        "assert cli.main(['capture', 'claude-code']) == 0\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('sqlalchemy', 'fastapi')"
        " or m in ('pipeline.tables', 'pipeline.client', 'pipeline.settings')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]", done.stderr
    assert (tmp_path / "spool" / "capture.log").read_text().count("cannot deliver") == 1


@pytest.mark.parametrize("event", ["SessionStart", "UserPromptSubmit"])
def test_an_injecting_hook_loads_nothing_of_the_server_and_keeps_to_its_budget(
    env: str, tmp_path: Path, event: str
) -> None:
    """The injection reads over HTTP with httpx alone (not even pydantic, which
    ``pipeline.exchange`` needs), and with the server away prints nothing, within budget."""
    import subprocess
    import time

    payload = {
        "session_id": "aaaaaaaa-0000-4000-8000-000000000012",
        "transcript_path": str(tmp_path / "p" / "not-yet.jsonl"),
        "cwd": str(tmp_path),
        "hook_event_name": event,
        "source": "startup",
        "prompt": "what did we decide about the cache?",
    }
    script = (
        "import io, sys, time\n"
        "started = time.monotonic()\n"
        "from pipeline import cli\n"
        f"sys.stdin = io.StringIO({json.dumps(json.dumps(payload))})\n"
        "assert cli.main(['capture', 'claude-code']) == 0\n"
        "took = time.monotonic() - started\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('sqlalchemy', 'fastapi',"
        " 'pydantic') or m in ('pipeline.tables', 'pipeline.client', 'pipeline.settings',"
        " 'pipeline.exchange')))\n"
        "print(round(took, 3), file=sys.stderr)\n"
    )
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout == "[]\n", done.stderr
    # the default budget is 1 s from the command's start (with the interpreter's on top)
    assert float(done.stderr.split()[-1]) < 1.0
    assert time.monotonic() - started < 5.0


def test_a_hooks_budget_counts_from_its_process_start() -> None:
    """The agent waits for the interpreter's start too: a fresh process's start is read from
    /proc; a process that has run for long (this one) is no hook's, and counts from now."""
    import subprocess
    import time

    from pipeline.cli import capture

    start = capture.process_start()
    assert 0.0 <= time.monotonic() - start < 0.05
    script = (
        "import time\n"
        "time.sleep(0.4)\n"
        "from pipeline.cli import capture\n"
        "print(time.monotonic() - capture.process_start())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert 0.4 <= float(done.stdout) < capture.FRESH_SECONDS
