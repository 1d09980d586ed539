"""Memory injection played as Claude Code plays it, against a real ``sgme serve`` with tokens:
``sgme capture claude-code`` run as a process with the hook's JSON on stdin, for SessionStart
(each ``source``) and UserPromptSubmit, in a session whose transcript grows meanwhile. What it
prints is one JSON object whose ``additionalContext`` holds the earlier turn that answers the
prompt (by its ref) and none of: the current session's turns (which the same run captures
first), another agent's, another project's session list, redacted or erased text. It prints
nothing — exit 0, within its budget — when nothing is relevant or the server is away."""

from __future__ import annotations

import dataclasses
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import harness
import httpx
import pytest
from agents import ClaudeTranscript

SGME = Path(sys.executable).with_name("sgme")
PROJECT = "/src/app"  #: the cwd the transcripts of tests/agents.py record
SID = "dddddddd-0000-4000-8000-000000000001"
ANSWER = "We settled on a 42 second flux capacitor timeout in capacitor.yaml."
OTHER_AGENT = "codex says the flux capacitor timeout is 99 seconds"
SECRET = "hunter2flux"
ERASED = "flux capacitor timeout zebra erased"
CHATTER = [
    "let us rename the parser module",
    "the build passed on the second try",
    "add a test for the empty input",
    "lunch was noodles again",
    "the release notes need a line about logging",
    "move the settings into one dataclass",
]


@dataclasses.dataclass(frozen=True)
class Server:
    """A running ``sgme serve``, the hooks' tokens (append and read, for ``claude-code`` and
    for ``codex``) and an admin client."""

    url: str
    hook: str
    codex: str
    admin: httpx.Client


def _token(procs: harness.Procs, data_dir: Path, agent: str, scope: str) -> str:
    out = procs.run(
        ["token", "create", "--data-dir", str(data_dir), "--agent-id", agent, "--scope", scope],
        harness.clean_env(),
    )
    return out.strip().splitlines()[-1]


def _append(client: httpx.Client, agent: str, key: str, cwd: str, *texts: str) -> str:
    answer = client.post(
        "/v1/append",
        params={"wait": "flushed"},
        json={
            "agent_id": agent,
            "session_key": key,
            "metadata": {"title": f"talk {key}", "cwd": cwd},
            "messages": [
                {"role": "user" if i % 2 == 0 else "assistant", "content": text}
                for i, text in enumerate(texts)
            ],
        },
    )
    assert answer.status_code == 200, answer.text
    return str(answer.json()["file_id"])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A ``sgme serve`` with an earlier store."""
    root = tmp_path_factory.mktemp("inject")
    data_dir = root / "data"
    procs = harness.Procs(root / "logs")
    try:
        procs.run(["migrate", "--data-dir", str(data_dir)], harness.clean_env())
        admin = _token(procs, data_dir, "*", "append,read,admin")
        hook = _token(procs, data_dir, "claude-code", "append,read")
        codex = _token(procs, data_dir, "codex", "append,read")
        port = harness.free_port()
        argv = ["serve", "--data-dir", str(data_dir), "--port", str(port), "--log-level", "warning"]
        proc = procs.start("serve", argv, harness.clean_env())
        url = f"http://127.0.0.1:{port}"
        headers = {"Authorization": f"Bearer {admin}"}
        with httpx.Client(base_url=url, timeout=10.0, headers=headers) as client:
            harness.wait_healthy(client, proc, timeout=60)
            chatter = [CHATTER[i % len(CHATTER)] + f" ({i})" for i in range(60)]
            _append(client, "claude-code", "chatter", "/elsewhere", *chatter)
            _append(
                client,
                "claude-code",
                "earlier",
                PROJECT,
                "which flux capacitor timeout did we pick?",
                ANSWER,
            )
            _append(client, "claude-code", "other", "/elsewhere", "flux capacitor timeout?", "7")
            _append(client, "codex", "codex-1", PROJECT, "timeout?", OTHER_AGENT)
            redacted = _append(
                client, "claude-code", "pw", PROJECT, f"flux capacitor timeout pw {SECRET}"
            )
            gone = _append(client, "claude-code", "gone", PROJECT, ERASED)
            done = client.post(f"/v1/refs/{redacted}:1/redact", json={"reason": "password"})
            assert done.status_code == 200, done.text
            done = client.delete(f"/v1/files/{gone}", params={"reason": "asked"})
            assert done.status_code in (200, 204), done.text
            yield Server(url, hook, codex, client)
    finally:
        procs.close()


def hook(env: dict[str, str], payload: dict[str, Any]) -> tuple[str, float]:
    """``sgme capture claude-code`` as Claude Code runs it: its stdout and wall time; it
    exits 0 and its stderr is empty."""
    started = time.monotonic()
    done = subprocess.run(
        [str(SGME), "capture", "claude-code"],
        input=json.dumps(payload),
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    took = time.monotonic() - started
    assert done.returncode == 0 and done.stderr == "", done.stderr
    return done.stdout, took


def context(printed: str, event: str) -> str:
    """The block a hook printed: one JSON object, nothing else."""
    found = json.loads(printed)
    assert list(found) == ["hookSpecificOutput"]
    assert found["hookSpecificOutput"]["hookEventName"] == event
    return str(found["hookSpecificOutput"]["additionalContext"])


def test_claude_code_gets_its_memory_at_session_start_and_with_a_prompt(
    server: Server, tmp_path: Path
) -> None:
    url, token, admin = server.url, server.hook, server.admin
    env = {
        **harness.clean_env(),
        "SGME_URL": url,
        "SGME_TOKEN": token,
        "SGME_SPOOL_DIR": str(tmp_path / "spool"),
    }
    transcript = ClaudeTranscript(tmp_path / "projects" / f"{SID}.jsonl", SID)
    base = {"session_id": SID, "transcript_path": str(transcript.path), "cwd": PROJECT}
    # a new session: its transcript is empty; this project's earlier sessions are listed
    printed, took = hook(env, {**base, "hook_event_name": "SessionStart", "source": "startup"})
    block = context(printed, "SessionStart")
    assert "“talk earlier”" in block and "“talk pw”" in block
    for absent in ("talk other", "talk chatter", "codex", "talk gone", SECRET):
        assert absent not in block
    slack = 2.0  # the interpreter's start on a busy shared machine, on top of the 1 s budget
    assert took < 1.0 + slack
    # the user asks; the turn before it is in the transcript: captured first, never injected
    transcript.user("is the flux capacitor timeout still what we chose?")
    transcript.assistant("m1", {"type": "text", "text": "flux capacitor timeout check pending"})
    prompt = "What flux capacitor timeout did we settle on?"
    payload = {**base, "hook_event_name": "UserPromptSubmit", "prompt": prompt}
    printed, took = hook(env, payload)
    block = context(printed, "UserPromptSubmit")
    assert ANSWER in block and "open_memory" in block
    stored = admin.get("/v1/sessions", params={"agent_id": "claude-code"}).json()["sessions"]
    current = next(s for s in stored if s["session_key"] == SID)
    assert current["message_count"] == 2  # the same run captured the session's turns
    for absent in (current["file_id"], "check pending", OTHER_AGENT, SECRET, "zebra"):
        assert absent not in block
    assert len(block) <= 8000 and took < 1.0 + slack
    first = [line for line in block.splitlines() if line.startswith("- ref `")]
    # what was injected is in the transcript as Claude Code records it (an attachment; older
    # versions: a meta user message): the turn's Stop hook captures the turn, not the block
    transcript.write(
        transcript.record(
            "attachment",
            attachment={"type": "hook_additional_context", "content": [block]},
        )
    )
    transcript.write(transcript.record("user", {"role": "user", "content": block}, isMeta=True))
    transcript.assistant("m2", {"type": "text", "text": "It is 42 seconds."})
    hook(env, {**base, "hook_event_name": "Stop", "last_assistant_message": "It is 42 seconds."})
    deadline = time.monotonic() + 30  # the server writes the file in the background
    while True:
        answer = admin.get(f"/v1/files/{current['file_id']}/messages", params={"limit": 100})
        captured = answer.json()["messages"]
        if captured[-1]["content"] == "It is 42 seconds." or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert captured[-1]["content"] == "It is 42 seconds."
    assert not any("Memory from SGME" in m["content"] for m in captured)
    # the same prompt again: what this session was given is not given again
    again, _ = hook(env, payload)
    if again:
        repeated = context(again, "UserPromptSubmit").splitlines()
        assert not set(first) & set(repeated)
    # after a compaction, a resume or a clear: never the current session in the list
    for source in ("compact", "resume", "clear"):
        printed, took = hook(env, {**base, "hook_event_name": "SessionStart", "source": source})
        block = context(printed, "SessionStart")
        assert "“talk earlier”" in block and SID not in block and took < 1.0 + slack


def test_nothing_is_printed_when_nothing_is_relevant_or_the_server_is_away(
    server: Server, tmp_path: Path
) -> None:
    url, token = server.url, server.hook
    env = {
        **harness.clean_env(),
        "SGME_URL": url,
        "SGME_TOKEN": token,
        "SGME_SPOOL_DIR": str(tmp_path / "spool"),
    }
    base = {"session_id": "s-2", "transcript_path": str(tmp_path / "none.jsonl"), "cwd": "/x"}
    prompt = {**base, "hook_event_name": "UserPromptSubmit", "prompt": "xylophone quasar"}
    assert hook(env, prompt)[0] == ""
    assert hook(env, {**base, "hook_event_name": "SessionStart"})[0] == ""  # no such project
    away = {**env, "SGME_URL": f"http://127.0.0.1:{harness.free_port()}"}
    for payload in (
        {**prompt, "prompt": "flux capacitor timeout"},
        {**base, "cwd": PROJECT, "hook_event_name": "SessionStart"},
    ):
        printed, took = hook(away, payload)
        assert printed == "" and took < 1.0 + 2.0


def test_a_prompt_waits_no_longer_than_the_budget_for_a_server_that_hangs(
    tmp_path: Path,
) -> None:
    """Capture and injection share the injection's budget on the events the user waits for:
    against a server that takes connections and never answers, the hook returns within it,
    and the session's turns wait in the spool for a later run."""
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen(16)  # connections are taken by the kernel, never answered
        env = {
            **harness.clean_env(),
            "SGME_URL": f"http://127.0.0.1:{listening.getsockname()[1]}",
            "SGME_SPOOL_DIR": str(tmp_path / "spool"),
        }
        transcript = ClaudeTranscript(tmp_path / "projects" / f"{SID}.jsonl", SID)
        transcript.user("the flux capacitor again")
        transcript.assistant("m1", {"type": "text", "text": "on it"})
        payload = {
            "session_id": SID,
            "transcript_path": str(transcript.path),
            "cwd": PROJECT,
            "hook_event_name": "UserPromptSubmit",
            "prompt": "flux capacitor timeout?",
        }
        printed, took = hook(env, payload)
    assert printed == "" and took < 1.0 + 2.0
    status = subprocess.run(
        [str(SGME), "capture", "status", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert json.loads(status.stdout)["waiting"]["appends"] == 2


def test_preview_prints_what_would_be_injected_and_records_nothing(
    server: Server, tmp_path: Path
) -> None:
    url, token = server.url, server.hook
    env = {
        **harness.clean_env(),
        "SGME_URL": url,
        "SGME_TOKEN": token,
        "SGME_SPOOL_DIR": str(tmp_path / "spool"),
    }

    def preview(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(SGME), "capture", "preview", "claude-code", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )

    asked = ["--prompt", "What flux capacitor timeout did we settle on?", "--cwd", PROJECT]
    first = preview(*asked, "--session", "s-preview")
    assert ANSWER in first.stdout and first.stdout.startswith("## Memory from SGME")
    assert "characters of 8000" in first.stderr
    # nothing was recorded as injected: the same preview shows the same block
    assert preview(*asked, "--session", "s-preview").stdout == first.stdout
    start = preview("--cwd", PROJECT)
    assert "recent sessions in /src/app" in start.stdout and "“talk earlier”" in start.stdout
    nothing = preview("--prompt", "xylophone quasar", "--cwd", PROJECT)
    assert nothing.stdout == "" and nothing.stderr.startswith("Nothing would be injected: ")


def test_codex_gets_its_own_memory_the_same_way(server: Server, tmp_path: Path) -> None:
    """Codex's SessionStart and UserPromptSubmit hooks take the same JSON and read the same
    ``hookSpecificOutput.additionalContext``: ``sgme capture codex`` injects Codex's memory
    (its agent id, its token), not Claude Code's."""
    url = server.url
    env = {
        **harness.clean_env(),
        "SGME_URL": url,
        "SGME_TOKEN": server.codex,
        "SGME_SPOOL_DIR": str(tmp_path / "spool"),
        "CODEX_HOME": str(tmp_path / "codex"),
    }
    base = {"session_id": "codex-thread-2", "transcript_path": None, "cwd": PROJECT}
    payload = {**base, "hook_event_name": "UserPromptSubmit", "prompt": "timeout seconds?"}
    started = time.monotonic()
    done = subprocess.run(
        [str(SGME), "capture", "codex"],
        input=json.dumps(payload),
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert time.monotonic() - started < 1.0 + 2.0
    block = context(done.stdout, "UserPromptSubmit")
    assert OTHER_AGENT in block and ANSWER not in block
    start = subprocess.run(
        [str(SGME), "capture", "codex"],
        input=json.dumps({**base, "hook_event_name": "SessionStart", "source": "startup"}),
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    listed = context(start.stdout, "SessionStart")
    assert "“talk codex-1”" in listed and "talk earlier" not in listed
