"""The injection's pieces without a server: its settings from the environment, what a hook's
JSON asks, what is printed, and the bounded memory of what a session was given."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from pipeline.capture import config, inject


def test_the_settings_and_what_is_not_valid() -> None:
    assert config.injection({}) == config.Injection()
    found = config.injection(
        {
            "SGME_INJECT_PROMPT": "off",
            "SGME_INJECT_SESSION_START": "0",
            "SGME_INJECT_CHARS": "3000",
            "SGME_INJECT_MIN_SCORE": "4.5",
            "SGME_INJECT_SECONDS": "0.8",
            "SGME_INJECT_SCOPE": "Project-Only",
            "SGME_INJECT_AGENTS": "token",
            "SGME_INJECT_HITS": "3",
            "SGME_INJECT_SESSIONS": "0",
            "SGME_INJECT_SNIPPET_CHARS": "120",
        }
    )
    assert (found.prompt, found.session_start, found.chars, found.min_score) == (
        False,
        False,
        3000,
        4.5,
    )
    assert (found.seconds, found.scope, found.agents, found.hits, found.sessions) == (
        0.8,
        "project-only",
        "token",
        3,
        0,
    )
    assert found.snippet_chars == 120 and found.invalid == ()
    bad = config.injection(
        {
            "SGME_INJECT_PROMPT": "maybe",
            "SGME_INJECT_CHARS": "10",
            "SGME_INJECT_MIN_SCORE": "nan",
            "SGME_INJECT_SECONDS": "-1",
            "SGME_INJECT_SCOPE": "everywhere",
            "SGME_INJECT_HITS": "many",
        }
    )
    assert bad == config.Injection(invalid=bad.invalid)
    assert [v.split("=")[0] for v in bad.invalid] == [
        "SGME_INJECT_PROMPT",
        "SGME_INJECT_CHARS",
        "SGME_INJECT_MIN_SCORE",
        "SGME_INJECT_SECONDS",
        "SGME_INJECT_SCOPE",
        "SGME_INJECT_HITS",
    ]


def test_a_hook_call_and_what_it_prints() -> None:
    call = inject.Call.from_hook(
        {
            "hook_event_name": "UserPromptSubmit",
            "session_id": "s",
            "cwd": "/src",
            "prompt": "why?",
            "source": 3,
        }
    )
    assert call == inject.Call("UserPromptSubmit", "s", "/src", "why?", None)
    assert inject.Call.from_hook({}) == inject.Call("", None, None)
    settings = config.Injection(prompt=False)
    assert not inject.wanted(settings, "UserPromptSubmit")
    assert inject.wanted(settings, "SessionStart") and not inject.wanted(settings, "Stop")
    printed = inject.output("SessionStart", "## block\n“é”")
    assert "\n" not in printed
    assert json.loads(printed) == {
        "hookSpecificOutput": {
            "hookEventName": "SessionStart",
            "additionalContext": "## block\n“é”",
        }
    }


def test_off_or_without_a_server_nothing_and_never_an_exception(tmp_path: Path) -> None:
    env = config.agent(
        "claude-code",
        {"SGME_URL": "http://127.0.0.1:9", "SGME_SPOOL_DIR": str(tmp_path / "spool")},
    )
    call = inject.Call("UserPromptSubmit", "s", "/src", "the cache decision")
    off = inject.inject(env, config.Injection(prompt=False), call, deadline=time.monotonic() + 1)
    assert off.block == "" and not off.failed and "off" in off.why
    away = inject.inject(env, config.Injection(), call, deadline=time.monotonic() + 1)
    assert away.block == "" and away.failed and "no answer" in away.why
    late = inject.inject(env, config.Injection(), call, deadline=time.monotonic() - 1)
    assert late.block == "" and late.failed and "time" in late.why
    empty = inject.Call("UserPromptSubmit", "s", "/src", "?!")
    assert "no word" in inject.inject(env, config.Injection(), empty, deadline=1e12).why


def test_what_a_session_was_given_is_remembered_within_bounds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(inject, "MAX_REFS", 5)
    monkeypatch.setattr(inject, "MAX_SESSIONS", 3)
    given = inject.Injected(tmp_path, "claude-code", "s-0")
    given.add([f"f:{n}" for n in range(4)])
    given.add(["f:2", "f:9", "f:10"])  # a ref given again is not kept twice
    assert inject.Injected(tmp_path, "claude-code", "s-0").refs == [
        "f:1",
        "f:2",
        "f:3",
        "f:9",
        "f:10",
    ]
    # another agent's session of the same id is another memory
    assert inject.Injected(tmp_path, "codex", "s-0").refs == []
    # the sessions written least recently are forgotten past the bound
    assert given.path is not None
    os.utime(given.path, (1000.0, 1000.0))
    for n in range(1, 5):
        inject.Injected(tmp_path, "claude-code", f"s-{n}").add([f"g:{n}"])
        path = inject.Injected(tmp_path, "claude-code", f"s-{n}").path
        assert path is not None
        os.utime(path, (1000.0 + n, 1000.0 + n))  # written one after the other
    inject.Injected(tmp_path, "claude-code", "s-5").add(["g:5"])
    kept = [n for n in range(6) if inject.Injected(tmp_path, "claude-code", f"s-{n}").refs]
    assert kept == [3, 4, 5]
    files = sorted(p.name for p in (tmp_path / "state").iterdir())
    assert len(files) == 3 and all(name.startswith("i-") for name in files)
    assert (tmp_path / "state").stat().st_mode & 0o777 == 0o700
    # no session id: nothing is remembered, and nothing written
    nobody = inject.Injected(tmp_path / "other", "claude-code", None)
    nobody.add(["f:1"])
    assert not (tmp_path / "other").exists()
