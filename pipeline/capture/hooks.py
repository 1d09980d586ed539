"""What an agent's hook says, turned into the transcripts to capture.

**Claude Code** runs ``sgme capture claude-code`` as a command hook with one JSON object on
stdin: ``session_id``, ``transcript_path``, ``cwd``, ``hook_event_name`` and per event
``stop_hook_active`` and ``last_assistant_message`` (Stop, SubagentStop), ``agent_id`` /
``agent_transcript_path`` (SubagentStop, since 2.0.42), ``trigger`` (PreCompact), ``reason``
(SessionEnd). The main transcript is ``transcript_path``; its subagents' transcripts are
``<dir>/<session_id>/subagents/agent-*.jsonl``. Every record of them is a unit of its own
(:mod:`pipeline.importers.claude_code`), so a hook takes whatever is there whatever the event;
the event matters for one thing: Claude Code runs Stop before the turn's last records are in
the transcript, and ``last_assistant_message`` says what they end with — the run waits a little
for it (:data:`runner.LAG_SECONDS`), and leaves what has not come for the next run.

**Codex** runs ``sgme capture codex`` as a ``Stop`` hook (JSON on stdin: ``session_id``,
``turn_id``, ``transcript_path`` — the rollout, or null — and ``last_assistant_message``) or as
its ``notify`` program (the JSON as the last argument: ``{"type": "agent-turn-complete",
"thread-id", "turn-id", "last-assistant-message", …}``). The rollout is ``transcript_path``,
else the newest file under ``$CODEX_HOME/sessions/YYYY/MM/DD/`` (or ``archived_sessions/``)
whose name ends with ``-{thread id}.jsonl`` (or ``.jsonl.zst``), compared as text: a thread id
is never a pattern.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pipeline.capture.runner import Target

#: seconds a SessionEnd hook may take at most: Claude Code may give it as little as 1.5 s, and
#: starting ``sgme`` takes part of that
SESSION_END_SECONDS = 1.0
ROLLOUT_SUFFIXES = (".jsonl", ".jsonl.zst")


def payload(text: str) -> dict[str, Any]:
    """The hook's JSON object ({} when there is none or it is not an object)."""
    try:
        found = json.loads(text) if text.strip() else {}
    except (ValueError, RecursionError):
        return {}
    return found if isinstance(found, dict) else {}


def _path(value: Any) -> Path | None:
    return Path(value).expanduser() if isinstance(value, str) and value.strip() else None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value.strip() else None


def claude_code_targets(hook: Mapping[str, Any]) -> list[Target]:
    """The transcripts a Claude Code hook call asks to capture, main first."""
    event = hook.get("hook_event_name")
    main = _path(hook.get("transcript_path"))
    stopped = _path(hook.get("agent_transcript_path"))
    said = _text(hook.get("last_assistant_message"))
    targets: list[Target] = []
    if main is not None:
        targets.append(Target(main, "claude-code", said if event == "Stop" else None))
    subagents: list[Path] = []
    session = hook.get("session_id")
    if main is not None and isinstance(session, str) and session and "/" not in session:
        folder = main.parent / session / "subagents"
        with contextlib.suppress(OSError):
            if folder.is_dir():
                subagents = sorted(p for p in folder.iterdir() if p.name.endswith(".jsonl"))
    if stopped is not None and stopped not in subagents:
        subagents.append(stopped)
    for path in subagents:
        expect = said if event == "SubagentStop" and path == stopped else None
        targets.append(Target(path, "claude-code", expect))
    return targets


def claude_code_seconds(hook: Mapping[str, Any], budget: float) -> float:
    """The run's budget for this event."""
    return (
        min(budget, SESSION_END_SECONDS) if hook.get("hook_event_name") == "SessionEnd" else budget
    )


def codex_targets(hook: Mapping[str, Any], home: Path) -> list[Target]:
    """The rollout a Codex Stop hook or notification names."""
    thread = hook.get("session_id") or hook.get("thread-id") or hook.get("thread_id")
    path = _path(hook.get("transcript_path"))
    if path is None and isinstance(thread, str) and thread:
        path = rollout(home, thread)
    if path is None:
        return []
    said = _text(hook.get("last_assistant_message") or hook.get("last-assistant-message"))
    return [Target(path, "codex", said)]


def rollout(home: Path, thread: str) -> Path | None:
    """The rollout file of a Codex thread: the newest whose name ends with ``-{thread}`` and
    a rollout's suffix, the thread id compared as text (``?``, ``*`` or ``[a-z]`` in it match
    only themselves). Days are looked at newest first."""
    if "/" in thread or "\\" in thread or not thread.strip():
        return None
    endings = tuple(f"-{thread}{suffix}" for suffix in ROLLOUT_SUFFIXES)

    def match(folder: Path) -> Path | None:
        try:
            names = sorted((p for p in folder.iterdir() if p.name.endswith(endings)), reverse=True)
        except OSError:
            return None
        return next((p for p in names if p.is_file()), None)

    for day in _newest_first(home / "sessions", depth=3):
        found = match(day)
        if found is not None:
            return found
    return match(home / "archived_sessions")


def _newest_first(root: Path, *, depth: int) -> list[Path]:
    """The folders ``depth`` levels under ``root`` (YYYY/MM/DD), newest name first."""
    level = [root]
    for _ in range(depth):
        below: list[Path] = []
        for folder in level:
            with contextlib.suppress(OSError):
                below += sorted((p for p in folder.iterdir() if p.is_dir()), reverse=True)
        level = below
    return level
