"""``sgme capture install``: the hooks merged into settings that already have hooks and other
keys — everything else kept, a backup made, a second install adding nothing — and
``--uninstall`` taking out only ours; a file that does not parse is left as it is."""

from __future__ import annotations

import json
import socket
import tomllib
from pathlib import Path
from typing import Any

import pytest

from pipeline import cli
from pipeline.capture import install

CLAUDE_SETTINGS: dict[str, Any] = {
    "model": "opus",
    "permissions": {"allow": ["Bash(ls:*)"], "deny": []},
    "env": {"FOO": "1"},
    "hooks": {
        "Stop": [{"hooks": [{"type": "command", "command": "notify-send done", "timeout": 5}]}],
        "PreToolUse": [
            {"matcher": "Bash", "hooks": [{"type": "command", "command": "./guard.sh"}]}
        ],
    },
    "statusLine": {"type": "command", "command": "status.sh"},
}


@pytest.fixture(autouse=True)
def nowhere(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The installer's check of the server meets a port nothing listens on, and no token."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for name in ("SGME_TOKEN", "SGME_TOKEN_FILE", "SGME_AGENT_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SGME_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(["capture", "install", *args])
    out, err = capsys.readouterr()
    return code, out, err


def ours(settings: dict[str, Any], event: str) -> list[str]:
    return [
        hook["command"]
        for group in settings["hooks"].get(event, [])
        for hook in group["hooks"]
        if hook["command"].endswith("capture claude-code")
    ]


def test_claude_code_user_settings_keep_everything_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "claude"
    home.mkdir()
    path = home / "settings.json"
    original = json.dumps(CLAUDE_SETTINGS, indent=4)
    path.write_text(original)
    path.chmod(0o640)
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(home))

    code, out, _ = run(capsys, "claude-code")
    assert code == 0
    settings = json.loads(path.read_text())
    for event in install.EVENTS["claude-code"]:
        assert len(ours(settings, event)) == 1, event
    (entry,) = [h for g in settings["hooks"]["SessionEnd"] for h in g["hooks"]]
    assert entry["type"] == "command" and entry["timeout"] == 30
    assert Path(entry["command"].split()[0]).name == "sgme"
    # everything that was there is there, in its order; ours come after
    assert settings["hooks"]["Stop"][0] == CLAUDE_SETTINGS["hooks"]["Stop"][0]
    assert settings["hooks"]["PreToolUse"] == CLAUDE_SETTINGS["hooks"]["PreToolUse"]
    assert {k: v for k, v in settings.items() if k != "hooks"} == {
        k: v for k, v in CLAUDE_SETTINGS.items() if k != "hooks"
    }
    assert list(settings) == list(CLAUDE_SETTINGS)
    assert path.stat().st_mode & 0o777 == 0o640
    (backup,) = home.glob("settings.json.sgme-backup-*")
    assert backup.read_text() == original
    assert str(path) in out and "Stop, SubagentStop, PreCompact, SessionEnd" in out
    assert "SGME_URL" in out and "--uninstall" in out
    # how to give the hook its token without a file others may read, and whether it is let in
    assert "umask 077" in out and str(tmp_path / "config" / "sgme" / "token") in out
    assert "does not answer now" in out and "keeps turns in its spool" in out

    # again: nothing added, nothing written
    code, out, _ = run(capsys, "claude-code")
    assert code == 0 and "Nothing to change" in out
    assert all(
        len(ours(json.loads(path.read_text()), e)) == 1 for e in install.EVENTS["claude-code"]
    )

    code, out, _ = run(capsys, "claude-code", "--uninstall")
    assert code == 0 and "removed from" in out
    assert json.loads(path.read_text()) == CLAUDE_SETTINGS
    code, out, _ = run(capsys, "claude-code", "--uninstall")
    assert "Nothing to remove" in out


def test_claude_code_project_settings_are_made_when_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "claude-code", "--project", str(tmp_path))
    assert code == 0
    path = tmp_path / ".claude" / "settings.json"
    settings = json.loads(path.read_text())
    assert set(settings["hooks"]) == set(install.EVENTS["claude-code"])
    assert not list(path.parent.glob("*.sgme-backup-*"))  # there was nothing to back up
    assert f"--project {tmp_path} --uninstall" in out
    run(capsys, "claude-code", "--project", str(tmp_path), "--uninstall")
    assert json.loads(path.read_text()) == {}


def test_a_file_that_does_not_parse_is_left_as_it_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / ".claude" / "settings.json"
    path.parent.mkdir()
    path.write_text('{"hooks": {')
    code, _, err = run(capsys, "claude-code", "--project", str(tmp_path))
    assert code == 2 and "not readable JSON" in err and "left as it is" in err
    assert path.read_text() == '{"hooks": {'
    path.write_text('{"hooks": {"Stop": {}}}')
    code, _, err = run(capsys, "claude-code", "--project", str(tmp_path))
    assert code == 2 and "hooks.Stop" in err


CODEX_CONFIG = """model = "gpt-5-codex"

[features]
codex_hooks = true

[mcp_servers.docs]
command = "docs-mcp"
"""


def test_codex_hooks_and_notify(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "codex"
    home.mkdir()
    (home / "config.toml").write_text(CODEX_CONFIG)
    other = {"hooks": {"Stop": [{"hooks": [{"type": "command", "command": "say done"}]}]}}
    (home / "hooks.json").write_text(json.dumps(other))
    monkeypatch.setenv("CODEX_HOME", str(home))

    code, out, _ = run(capsys, "codex")
    assert code == 0
    hooks = json.loads((home / "hooks.json").read_text())
    commands = [h["command"] for g in hooks["hooks"]["Stop"] for h in g["hooks"]]
    assert commands[0] == "say done" and commands[1].endswith("capture codex")
    config = tomllib.loads((home / "config.toml").read_text())
    assert config["notify"][-2:] == ["capture", "codex"]
    assert config["features"] == {"codex_hooks": True} and config["model"] == "gpt-5-codex"
    assert "notify program set" in out
    assert len(list(home.glob("config.toml.sgme-backup-*"))) == 1

    code, out, _ = run(capsys, "codex")
    assert "Nothing to change" in out

    code, out, _ = run(capsys, "codex", "--uninstall")
    assert json.loads((home / "hooks.json").read_text()) == other
    assert (home / "config.toml").read_text() == CODEX_CONFIG


def test_codex_notify_that_is_someone_else_s_is_left_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "codex"
    home.mkdir()
    (home / "config.toml").write_text('notify = ["notify-send", "Codex"]\n')
    monkeypatch.setenv("CODEX_HOME", str(home))
    code, out, _ = run(capsys, "codex")
    assert code == 0 and "left as it is" in out
    assert (home / "config.toml").read_text() == 'notify = ["notify-send", "Codex"]\n'
    assert json.loads((home / "hooks.json").read_text())["hooks"]["Stop"]


def test_a_settings_file_that_is_a_symlink_stays_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dotfiles = tmp_path / "dotfiles" / "claude-settings.json"
    dotfiles.parent.mkdir()
    dotfiles.write_text('{"model": "opus"}')
    link = tmp_path / ".claude" / "settings.json"
    link.parent.mkdir()
    link.symlink_to(dotfiles)
    code, _, _ = run(capsys, "claude-code", "--project", str(tmp_path))
    assert code == 0 and link.is_symlink()
    assert set(json.loads(dotfiles.read_text())["hooks"]) == set(install.EVENTS["claude-code"])


def test_the_check_says_whether_the_server_lets_the_hook_in(tmp_path: Path) -> None:
    import httpx

    from pipeline.capture import config
    from pipeline.cli import capture

    def answer(status: int, kind: str) -> httpx.MockTransport:
        problem = {"type": f"urn:sgme:problem:{kind}", "title": kind, "status": status}
        return httpx.MockTransport(
            lambda request: httpx.Response(status, json={**problem, "detail": "no"})
        )

    env = config.agent("claude-code", {"SGME_URL": "http://sgme", "HOME": str(tmp_path)})
    both = httpx.MockTransport(
        lambda request: (
            httpx.Response(200, json={"sessions": []})
            if request.method == "GET"
            else httpx.Response(422, json={"type": "urn:sgme:problem:invalid-input", "status": 422})
        )
    )
    said = capture.check(env, transport=both)
    assert "takes appends from the hook (no token); it reads them back" in said
    # a token that may append and not read: the check says the injection will be empty
    appends = httpx.MockTransport(
        lambda request: httpx.Response(
            403 if request.method == "GET" else 422,
            json={"type": "urn:sgme:problem:x", "status": 403 if request.method == "GET" else 422},
        )
    )
    said = capture.check(env, transport=appends)
    assert "takes appends" in said and "may not read them back" in said
    assert "--scope append,read --agent-id claude-code" in said
    assert "needs a token and the hook has none" in capture.check(
        env, transport=answer(401, "unauthorized")
    )
    given = config.agent("claude-code", {"SGME_URL": "http://sgme", "SGME_TOKEN": "sgme_x"})
    assert "refuses the token from SGME_TOKEN (401)" in capture.check(
        given, transport=answer(401, "unauthorized")
    )
    assert "may not append for claude-code" in capture.check(
        given, transport=answer(403, "forbidden")
    )
