"""Live capture played as the agents play it, against a real ``sgme serve``: the transcript
grows between hook calls exactly as Claude Code and Codex write it (``agents.py``), each hook
runs ``sgme capture`` as the agent would (the hook's JSON on stdin, or Codex's notification as
the argument) and every run is checked message by message against what the file says; a
final ``sgme import`` of the same files writes nothing. A server down for three turns: every
hook exits 0 within its budget, the turns wait in the spool and land once, in order, when it
is back."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import harness
import httpx
import pytest
from agents import ClaudeTranscript, CodexRollout, Expected

from pipeline import cli

SGME = Path(sys.executable).with_name("sgme")
BUDGET = 4.0  #: SGME_CAPTURE_SECONDS for these runs


def startup(env: dict[str, str]) -> float:
    """What a run may take on top of its budget on this host now: three times what a run of
    one turn with the server down takes (the process's start, the client's import, a spooled
    turn's fsync — on a busy shared disk that alone can take seconds; in a directory of its
    own, so it touches nothing of the test's), and a second."""
    probe = Path(env["SGME_SPOOL_DIR"] + "-probe")
    transcript = ClaudeTranscript(probe / f"{time.monotonic_ns()}.jsonl", "probe-session")
    transcript.user("probe")
    transcript.assistant("probe", {"type": "text", "text": "probe"})
    payload = {"transcript_path": str(transcript.path), "hook_event_name": "Stop"}
    scratch = {**env, "SGME_SPOOL_DIR": str(probe / "spool"), "SGME_URL": "http://127.0.0.1:9"}
    started = time.monotonic()
    subprocess.run(
        [str(SGME), "capture", "claude-code"],
        input=json.dumps(payload),
        text=True,
        env=scratch,
        timeout=60,
        check=True,
    )
    return 3 * (time.monotonic() - started) + 1.0


def hook(
    agent: str,
    env: dict[str, str],
    payload: dict[str, Any] | None = None,
    *args: str,
    budget: float = BUDGET,
) -> float:
    """Run ``sgme capture AGENT`` as a hook does; its wall time. It must exit 0, print nothing
    on stdout and keep to its budget (with the host's start-up time on top)."""
    slack = startup(env)
    started = time.monotonic()
    done = subprocess.run(
        [str(SGME), "capture", agent, *args],
        input=json.dumps(payload) if payload is not None else "",
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    assert took < budget + slack, f"the hook took {took:.1f} s (budget {budget} + {slack:.1f} s)"
    return took


@pytest.fixture
def server(procs: Any, tmp_path: Path) -> Iterator[tuple[str, Path, httpx.Client]]:
    """A ``sgme serve`` of the test's own: its URL, data dir and a client."""
    data_dir = tmp_path / "data"
    port = harness.free_port()
    args = ["serve", "--data-dir", str(data_dir), "--port", str(port), "--log-level", "warning"]
    proc = procs.start("serve", args, harness.clean_env())
    url = f"http://127.0.0.1:{port}"
    with httpx.Client(base_url=url, timeout=10) as client:
        harness.wait_healthy(client, proc)
        yield url, data_dir, client


def sessions(client: httpx.Client, agent: str) -> dict[str, list[Expected]]:
    """Every session of ``agent`` as /messages shows it."""
    files = client.get("/v1/files", params={"agent_id": agent, "limit": 1000}).json()["files"]
    out = {}
    for row in files:
        answer = client.get(f"/v1/files/{row['file_id']}/messages", params={"limit": 1000})
        out[row["session_key"]] = [
            (m["role"], m["content"], m["tool_name"]) for m in answer.json()["messages"]
        ]
    return out


def settled(
    client: httpx.Client,
    agent: str,
    expected: dict[str, list[Expected]],
    *,
    spool: Path | None = None,
    next_run: Callable[[], None] | None = None,
) -> None:
    """Wait until what is stored is ``expected`` (the server writes files in the background).

    With ``next_run``: a run that found the server too slow for its budget spooled what it
    had, and the next run delivers it (what the agent's next turn does); while the spool is
    not empty, ``next_run`` is called every few seconds. The failure says what was stored and
    what was spooled."""
    ran = [time.monotonic()]

    def deliver() -> None:
        spooled = spool is not None and any(p.is_file() for p in spool.rglob("*"))
        if next_run is not None and spooled and time.monotonic() - ran[0] > 5:
            next_run()
            ran[0] = time.monotonic()

    try:
        harness.wait_until(
            lambda: sessions(client, agent) == expected,
            timeout=30,
            what=f"{agent}'s sessions to be {expected}",
            check=deliver,
        )
    except AssertionError as exc:
        files = sorted(str(p) for p in spool.rglob("*") if p.is_file()) if spool else []
        raise AssertionError(
            f"{exc}; stored: {sessions(client, agent)}; spooled: {files}"
        ) from None


def imported(capsysbinary: pytest.CaptureFixture[bytes], *args: str) -> dict[str, Any]:
    capsysbinary.readouterr()
    assert cli.main(["import", *args, "--json"]) == 0
    report: dict[str, Any] = json.loads(capsysbinary.readouterr().out.decode().splitlines()[-1])
    return report


def test_claude_code_turns_subagents_compaction_and_a_resumed_session(
    server: tuple[str, Path, httpx.Client],
    tmp_path: Path,
    capsysbinary: pytest.CaptureFixture[bytes],
) -> None:
    url, data_dir, client = server
    env = {
        **harness.clean_env(
            url=url, spool_dir=str(tmp_path / "spool"), capture_seconds=str(BUDGET)
        ),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),  # no token file but the test's
    }
    project = tmp_path / "claude" / "projects" / "-src-app"
    sid = "5b6c69aa-0000-4000-8000-000000000001"
    main = ClaudeTranscript(project / f"{sid}.jsonl", sid)

    def fire(event: str, transcript: ClaudeTranscript = main, **extra: Any) -> None:
        payload = {
            "session_id": transcript.session_id,
            "transcript_path": str(transcript.path),
            "cwd": "/src/app",
            "hook_event_name": event,
            **extra,
        }
        hook("claude-code", env, payload)

    def settle(expected: dict[str, list[Expected]], last: ClaudeTranscript = main) -> None:
        # a run that found the server too slow for its budget (a loaded machine) spooled what
        # it had: the agent's next turn, another Stop, delivers it
        settled(
            client,
            "claude-code",
            expected,
            spool=tmp_path / "spool",
            next_run=lambda: fire("Stop", last, stop_hook_active=False),
        )

    # Turn 1: thinking, text and a tool call in one message (a line per block), its result,
    # the answer; the Stop hook runs.
    main.user("Read notes.md")
    main.assistant(
        "msg_1",
        {"type": "thinking", "thinking": "The user wants the file.", "signature": "c2ln"},
        {"type": "text", "text": "Reading it."},
        {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"file_path": "notes.md"}},
    )
    main.result("toolu_1", "Read", "hi there")
    main.assistant("msg_2", {"type": "text", "text": "It says hi there."})
    fire("Stop", stop_hook_active=False)
    settle({sid: main.expected})
    [row] = client.get("/v1/files", params={"agent_id": "claude-code"}).json()["files"]
    ref = client.get(f"/v1/refs/{row['file_id']}:4", params={"context": 1}).json()
    assert (ref["message"]["tool_name"], ref["before"][0]["tool_name"]) == ("Read", None)
    assert ref["after"][0]["tool_name"] == "Read"  # the result

    # Turn 2 asks a subagent: its transcript is its own session; the main turn is not over
    # (and the main file's last line is being written when SubagentStop runs).
    main.user("Ask a helper about X")
    task = {"type": "tool_use", "id": "toolu_2", "name": "Task", "input": {"prompt": "X?"}}
    main.assistant("msg_3", task)
    helper = ClaudeTranscript(
        project / sid / "subagents" / "agent-ab12.jsonl", sid, agent_id="ab12"
    )
    helper.user("X?")
    helper.assistant("sub_1", {"type": "text", "text": "X is 42."})
    answered = main.result_record("toolu_2", "X is 42.")
    main.write(answered, partial=True)
    stored = main.expected[:8]  # every whole line is taken; the half-written one waits
    fire("SubagentStop", agent_id="ab12", agent_transcript_path=str(helper.path))
    settle({sid: stored, f"{sid}/agent-ab12": helper.expected})
    main.finish_partial(answered)
    main.expect_result("toolu_2", "Task", "X is 42.")
    main.assistant("msg_4", {"type": "text", "text": "The helper says 42."})
    fire("Stop", stop_hook_active=False)
    settle({sid: main.expected, f"{sid}/agent-ab12": helper.expected})

    # A manual compaction: PreCompact runs before it is written (nothing new), then the
    # summary and turn 3; the summary is kept, marked as one.
    fire("PreCompact", trigger="manual", custom_instructions="")
    main.compact("Summary: read notes.md, asked a helper about X.")
    main.user("And now?")
    main.assistant("msg_5", {"type": "text", "text": "Done."})
    # two hooks at once (Stop and a late SubagentStop): they take turns, the turn lands once
    payload = {"session_id": sid, "transcript_path": str(main.path), "cwd": "/src/app"}
    both = [
        subprocess.Popen(
            [str(SGME), "capture", "claude-code"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
        )
        for _ in range(2)
    ]
    for proc, event in zip(both, ("Stop", "SubagentStop"), strict=True):
        assert proc.stdin is not None
        proc.stdin.write(json.dumps({**payload, "hook_event_name": event}))
        proc.stdin.close()
    for proc in both:
        assert proc.stdout is not None and proc.stderr is not None
        out, err = proc.stdout.read(), proc.stderr.read()
        assert (proc.wait(60), out) == (0, ""), err
        proc.stdout.close()
        proc.stderr.close()
    settle({sid: main.expected, f"{sid}/agent-ab12": helper.expected})

    # `claude --resume`: a new file with a new id copies every line, then turn 4. The copied
    # turns are the same turns (same keys): only turn 4 is new, in the same L0 session.
    resumed_id = "9d0e1f2a-0000-4000-8000-000000000002"
    resumed = main.resume(project / f"{resumed_id}.jsonl", resumed_id)
    resumed.expected = list(main.expected)
    resumed.user("One more thing")
    resumed.assistant("msg_6", {"type": "text", "text": "Sure."})
    fire("Stop", resumed, stop_hook_active=False)
    expected = {sid: resumed.expected, f"{sid}/agent-ab12": helper.expected}
    settle(expected, resumed)
    hook(
        "claude-code",
        env,
        {
            "session_id": resumed_id,
            "transcript_path": str(resumed.path),
            "hook_event_name": "SessionEnd",
            "reason": "exit",
        },
        budget=1.0,
    )
    settle(expected, resumed)
    assert not list((tmp_path / "spool").glob("*.jsonl"))

    # The same files imported afterwards: every record is already there.
    report = imported(
        capsysbinary,
        "claude-code",
        str(tmp_path / "claude" / "projects"),
        "--data-dir",
        str(data_dir),
    )
    assert (report["messages"], report["errors"]) == (0, [])
    assert report["replayed"] == len(resumed.expected) + len(main.expected) + len(helper.expected)
    settle(expected, resumed)
    # ... and into a store of their own, they make what the hooks stored, message for message
    fresh = tmp_path / "fresh"
    assert cli.main(["migrate", "--data-dir", str(fresh)]) == 0
    imported(
        capsysbinary, "claude-code", str(tmp_path / "claude" / "projects"), "--data-dir", str(fresh)
    )
    for session, messages in expected.items():
        capsysbinary.readouterr()
        assert cli.main(["show", session, "--json", "--data-dir", str(fresh)]) == 0
        shown = json.loads(capsysbinary.readouterr().out.decode())
        assert [(m["role"], m["content"]) for m in shown["messages"]] == [
            (role, content) for role, content, _ in messages
        ]


def test_codex_with_the_server_down_for_three_turns(
    procs: Any, tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    data_dir = tmp_path / "data"
    port = harness.free_port()
    serve = ["serve", "--data-dir", str(data_dir), "--port", str(port), "--log-level", "warning"]
    url = f"http://127.0.0.1:{port}"
    home = tmp_path / "codex"
    spool = tmp_path / "spool"
    env = {
        **harness.clean_env(url=url, spool_dir=str(spool), capture_seconds=str(BUDGET)),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "CODEX_HOME": str(home),
    }
    thread = "0199a213-81c0-7800-8aa1-bbab2a035a53"
    rollout = CodexRollout(home, thread)
    proc = procs.start("serve", serve, harness.clean_env())
    with httpx.Client(base_url=url, timeout=10) as client:
        harness.wait_healthy(client, proc)
        # Turn 1 through the Stop hook, which runs before Codex records task_complete.
        rollout.turn("t1", "list t1", complete=False)
        stop = {
            "session_id": thread,
            "turn_id": "t1",
            "transcript_path": str(rollout.path),
            "cwd": "/src/app",
            "hook_event_name": "Stop",
            "model": "gpt-5-codex",
            "permission_mode": "default",
            "stop_hook_active": False,
            "last_assistant_message": "Found t1.txt.",
        }
        hook("codex", env, stop)

        def again(payload: dict[str, Any] = stop) -> None:
            # a run the loaded machine made too slow for its budget spooled what it had: the
            # next hook delivers it
            hook("codex", env, payload)

        settled(client, "codex", {thread: rollout.expected}, spool=spool, next_run=again)
        rollout.complete("t1", "Found t1.txt.")

        # The server goes away for three turns, each told through `notify` (the rollout
        # found by the thread id): every hook exits 0, quickly, and the turn waits.
        proc.stop()
        for n in (2, 3, 4):
            rollout.turn(f"t{n}", f"list t{n}")
            notification = {
                "type": "agent-turn-complete",
                "thread-id": thread,
                "turn-id": f"t{n}",
                "cwd": "/src/app",
                "input-messages": [f"list t{n}"],
                "last-assistant-message": f"Found t{n}.txt.",
            }
            hook("codex", env, None, json.dumps(notification))
            assert len(list(spool.glob("*.jsonl"))) == n - 1  # one file (one fsync) a run
            assert (spool.stat().st_mode & 0o777, (spool / "state").stat().st_mode & 0o777) == (
                0o700,
                0o700,
            )
            assert all(p.stat().st_mode & 0o777 == 0o600 for p in spool.glob("*.jsonl"))
            log = (spool / "capture.log").read_text()
            assert log.count("cannot deliver: the server at") == n - 1  # says why, each run

        # Back: the next turn's hook delivers the three first, in order, then its own.
        proc = procs.start("serve-again", serve, harness.clean_env())
        harness.wait_healthy(client, proc)
        rollout.turn("t5", "list t5", complete=False)
        fifth = {**stop, "turn_id": "t5", "last_assistant_message": "Found t5.txt."}
        hook("codex", env, fifth)
        settled(
            client, "codex", {thread: rollout.expected}, spool=spool, next_run=lambda: again(fifth)
        )
        assert list(spool.glob("*.jsonl")) == []

        report = imported(
            capsysbinary, "codex", str(home / "sessions"), "--data-dir", str(data_dir)
        )
        assert report["messages"] == 0 and report["errors"] == []
        settled(client, "codex", {thread: rollout.expected})


def test_a_server_that_never_answers_costs_the_budget_and_nothing_is_lost(
    tmp_path: Path,
) -> None:
    """A SessionEnd hook against a server that accepts and never answers: it ends within its
    short budget, and the turn waits in the spool."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    try:
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        spool = tmp_path / "spool"
        env = harness.clean_env(url=url, spool_dir=str(spool))  # the default 10 s budget
        env["XDG_CONFIG_HOME"] = str(tmp_path / "config")
        sid = "aaaaaaaa-0000-4000-8000-000000000003"
        transcript = ClaudeTranscript(tmp_path / "p" / f"{sid}.jsonl", sid)
        transcript.user("hello")
        transcript.assistant("m1", {"type": "text", "text": "hi"})
        payload = {
            "session_id": sid,
            "transcript_path": str(transcript.path),
            "hook_event_name": "SessionEnd",
            "reason": "logout",
        }
        hook("claude-code", env, payload, budget=1.0)
        # A loaded machine can spend SessionEnd's short budget starting the interpreter: the run
        # then reads what its share of the time allows (nothing, or the first record) and the
        # rest waits in the transcript. The next hook (a Stop, the default budget) spools the
        # rest: between the two, each turn is spooled exactly once, in order.
        hook("claude-code", env, {**payload, "hook_event_name": "Stop"}, budget=10.0)
        pending = [
            json.loads(line)
            for spooled in sorted(spool.glob("*.jsonl"), key=lambda p: p.name)
            for line in spooled.read_text().splitlines()
        ]
        assert [[m["content"] for m in body["messages"]] for body in pending] == [["hello"], ["hi"]]
    finally:
        listener.close()
