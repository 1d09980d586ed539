"""What an agent's hook says, turned into the transcripts to capture.

**Claude Code** runs ``sgme capture claude-code`` as a command hook with one JSON object on
stdin: ``session_id``, ``transcript_path``, ``cwd``, ``hook_event_name`` and per event
``stop_hook_active`` (Stop, SubagentStop), ``agent_id`` / ``agent_transcript_path``
(SubagentStop, since 2.0.42), ``trigger`` (PreCompact: ``manual`` or ``auto``), ``reason``
(SessionEnd). The main transcript is ``transcript_path``; its subagents' transcripts are
``<dir>/<session_id>/subagents/agent-*.jsonl``. What each event means for a transcript's last
turn (:class:`~pipeline.importers.claude_code.Tail`):

=============  ==========================  ==========================
event          main transcript             subagent transcripts
=============  ==========================  ==========================
Stop           settled (the turn is over)  settled
SubagentStop   open (its turn waits)       the one that stopped: finished; others settled
PreCompact     manual: settled; auto: open settled
SessionEnd     finished                    finished
=============  ==========================  ==========================

**Codex** runs ``sgme capture codex`` as a ``Stop`` hook (JSON on stdin: ``session_id``,
``turn_id``, ``transcript_path`` — the rollout, or null — and ``last_assistant_message``) or as
its ``notify`` program (the JSON as the last argument: ``{"type": "agent-turn-complete",
"thread-id", "turn-id", "cwd", …}``). The rollout is ``transcript_path``, else the file under
``$CODEX_HOME/sessions/YYYY/MM/DD/`` (or ``archived_sessions/``) whose name ends with the
thread id; the turn the hook names counts as complete once it ends with the assistant's text,
even before Codex records ``task_complete``.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pipeline.capture.runner import Target
from pipeline.importers import claude_code, codex

#: seconds a SessionEnd hook may take at most: Claude Code may give it as little as 1.5 s, and
#: starting ``sgme`` takes part of that
SESSION_END_SECONDS = 1.0


def payload(text: str) -> dict[str, Any]:
    """The hook's JSON object ({} when there is none or it is not an object)."""
    try:
        found = json.loads(text) if text.strip() else {}
    except (ValueError, RecursionError):
        return {}
    return found if isinstance(found, dict) else {}


def _path(value: Any) -> Path | None:
    return Path(value).expanduser() if isinstance(value, str) and value.strip() else None


def claude_code_targets(hook: Mapping[str, Any]) -> list[Target]:
    """The transcripts a Claude Code hook call asks to capture, main first."""
    event = hook.get("hook_event_name")
    main = _path(hook.get("transcript_path"))
    stopped = _path(hook.get("agent_transcript_path"))
    finished = event == "SessionEnd"
    if finished:
        main_tail = claude_code.Tail.FINISHED
    elif event == "SubagentStop" or (event == "PreCompact" and hook.get("trigger") == "auto"):
        main_tail = claude_code.Tail.OPEN
    else:
        main_tail = claude_code.Tail.SETTLED
    sub_tail = claude_code.Tail.FINISHED if finished else claude_code.Tail.SETTLED
    targets: list[Target] = []
    if main is not None:
        targets.append(_claude(main, main_tail))
    subagents: list[Path] = []
    session = hook.get("session_id")
    if main is not None and isinstance(session, str) and session and "/" not in session:
        folder = main.parent / session / "subagents"
        if folder.is_dir():
            subagents = sorted(p for p in folder.glob("*.jsonl") if p.is_file())
    if stopped is not None and stopped not in subagents:
        subagents.append(stopped)
    for path in subagents:
        tail = claude_code.Tail.FINISHED if path == stopped else sub_tail
        targets.append(_claude(path, tail))
    return targets


def _claude(path: Path, tail: claude_code.Tail) -> Target:
    read = functools.partial(claude_code.read, tail=tail, live=True)
    return Target(path=path, read=read, policy=tail.value)


def claude_code_seconds(hook: Mapping[str, Any], budget: float) -> float:
    """The run's budget for this event."""
    return (
        min(budget, SESSION_END_SECONDS) if hook.get("hook_event_name") == "SessionEnd" else budget
    )


def codex_targets(hook: Mapping[str, Any], home: Path) -> list[Target]:
    """The rollout a Codex Stop hook or notification names."""
    thread = hook.get("session_id") or hook.get("thread-id") or hook.get("thread_id")
    turn = hook.get("turn_id") or hook.get("turn-id")
    path = _path(hook.get("transcript_path"))
    if path is None and isinstance(thread, str) and thread:
        path = rollout(home, thread)
    if path is None:
        return []
    done = turn if isinstance(turn, str) and turn else None
    read = functools.partial(codex.read, done_turn=done, live=True)
    return [Target(path=path, read=read, policy=f"turn={done}")]


def rollout(home: Path, thread: str) -> Path | None:
    """The rollout file of a Codex thread: the newest whose name ends with its id."""
    if "/" in thread or not thread.strip():
        return None
    found: list[Path] = []
    for pattern in (
        f"sessions/*/*/*/rollout-*{thread}.jsonl*",
        f"archived_sessions/rollout-*{thread}.jsonl*",
    ):
        found += [p for p in home.glob(pattern) if p.is_file()]
    return max(found, key=lambda p: (p.parent.as_posix(), p.name), default=None)
