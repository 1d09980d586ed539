"""What a hook's input asks a capture run to read: the transcripts of a Claude Code hook, each
with the answer its hook says it ends with; the rollout of a Codex thread, found by its id
compared as text (a thread id is never a pattern); the token a hook reads from its file only
when no one else may read it."""

from __future__ import annotations

import os
from pathlib import Path

from pipeline.capture import config, hooks


def test_claude_code_targets_and_the_answer_each_should_end_with(tmp_path: Path) -> None:
    main = tmp_path / "s1.jsonl"
    folder = tmp_path / "s1" / "subagents"
    folder.mkdir(parents=True)
    for name in ("agent-b.jsonl", "agent-a.jsonl", "notes.txt"):
        (folder / name).write_text("")
    stop = {
        "session_id": "s1",
        "transcript_path": str(main),
        "hook_event_name": "Stop",
        "last_assistant_message": "Done.",
    }
    found = hooks.claude_code_targets(stop)
    assert [(t.path.name, t.expect) for t in found] == [
        ("s1.jsonl", "Done."),
        ("agent-a.jsonl", None),
        ("agent-b.jsonl", None),
    ]
    sub = {
        **stop,
        "hook_event_name": "SubagentStop",
        "agent_transcript_path": str(folder / "agent-b.jsonl"),
        "last_assistant_message": "X is 42.",
    }
    assert [(t.path.name, t.expect) for t in hooks.claude_code_targets(sub)] == [
        ("s1.jsonl", None),
        ("agent-a.jsonl", None),
        ("agent-b.jsonl", "X is 42."),
    ]
    assert hooks.claude_code_seconds({"hook_event_name": "SessionEnd"}, 10) == 1.0
    assert hooks.claude_code_targets({}) == []


def test_a_codex_thread_id_is_matched_as_text(tmp_path: Path) -> None:
    home = tmp_path / "codex"
    older = home / "sessions" / "2026" / "08" / "02"
    newer = home / "sessions" / "2026" / "08" / "03"
    for folder, thread in ((older, "a1c"), (newer, "a?c"), (newer, "abc"), (older, "a[b]c")):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"rollout-2026-08-03T11-18-00-{thread}.jsonl").write_text("")
    (home / "archived_sessions").mkdir()
    (home / "archived_sessions" / "rollout-2026-07-01T00-00-00-zzz.jsonl.zst").write_bytes(b"")
    assert hooks.rollout(home, "a?c") == newer / "rollout-2026-08-03T11-18-00-a?c.jsonl"
    assert hooks.rollout(home, "a[b]c") == older / "rollout-2026-08-03T11-18-00-a[b]c.jsonl"
    assert hooks.rollout(home, "a1c") == older / "rollout-2026-08-03T11-18-00-a1c.jsonl"
    assert hooks.rollout(home, "*") is None  # no glob, no error
    assert hooks.rollout(home, "a*c") is None
    assert hooks.rollout(home, "../x") is None
    assert hooks.rollout(home, "zzz") == (
        home / "archived_sessions" / "rollout-2026-07-01T00-00-00-zzz.jsonl.zst"
    )
    [target] = hooks.codex_targets({"thread-id": "abc", "last-assistant-message": "ok"}, home)
    assert (target.path.name, target.kind, target.expect) == (
        "rollout-2026-08-03T11-18-00-abc.jsonl",
        "codex",
        "ok",
    )


def test_the_token_file_is_read_only_when_only_its_owner_may(tmp_path: Path) -> None:
    env = {"XDG_CONFIG_HOME": str(tmp_path), "HOME": str(tmp_path)}
    path = config.token_file(env)
    assert path == tmp_path / "sgme" / "token"
    assert (config.agent("codex", env).token, config.agent("codex", env).token_problem) == (
        None,
        None,
    )
    path.parent.mkdir()
    path.write_text("sgme_secret\n")
    os.chmod(path, 0o640)
    found = config.agent("codex", env)
    assert found.token is None and "may be read by others (-rw-r-----)" in str(found.token_problem)
    os.chmod(path, 0o600)
    found = config.agent("codex", env)
    assert (found.token, found.token_source, found.token_problem) == (
        "sgme_secret",
        str(path),
        None,
    )
    given = config.agent("codex", {**env, "SGME_TOKEN": "sgme_env"})
    assert (given.token, given.token_source) == ("sgme_env", "SGME_TOKEN")
    other = tmp_path / "elsewhere"
    other.mkdir()
    assert config.agent("codex", {**env, "SGME_TOKEN_FILE": str(other)}).token_problem == (
        f"the token file {other} is not a file"
    )
    bad = config.agent("codex", {**env, "SGME_SPOOL_REJECTED_MAX_BYTES": "lots"})
    assert bad.invalid == ("SGME_SPOOL_REJECTED_MAX_BYTES='lots'",)
