"""The Claude Code plugin in the repository (``integrations/claude-code``) and the local
marketplace that lists it (``.claude-plugin/marketplace.json``), checked against the plugin
format's documented schema — the ``claude`` binary is not on this machine — and its hook
command run the way Claude Code runs it (through the shell, ``CLAUDE_PLUGIN_ROOT`` set)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest

from pipeline.capture import install

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "integrations" / "claude-code"
SGME = Path(sys.executable).with_name("sgme")
KEBAB = r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$"
SEMVER = r"^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$"
#: the events Claude Code runs hooks on (its hooks reference)
HOOK_EVENTS = [
    "PreToolUse",
    "PostToolUse",
    "Notification",
    "UserPromptSubmit",
    "Stop",
    "SubagentStop",
    "PreCompact",
    "SessionStart",
    "SessionEnd",
]
PATHS: dict[str, Any] = {
    "anyOf": [
        {"type": "string", "pattern": r"^\./"},
        {"type": "array", "items": {"type": "string", "pattern": r"^\./"}},
    ]
}
PERSON = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": {"type": "string", "minLength": 1},
        "email": {"type": "string"},
        "url": {"type": "string"},
    },
    "additionalProperties": False,
}
#: plugin.json: only ``name`` is required; component paths are relative, starting with ./
PLUGIN_SCHEMA = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": {"type": "string", "pattern": KEBAB},
        "version": {"type": "string", "pattern": SEMVER},
        "description": {"type": "string"},
        "author": PERSON,
        "homepage": {"type": "string"},
        "repository": {"type": "string"},
        "license": {"type": "string"},
        "keywords": {"type": "array", "items": {"type": "string"}},
        "commands": PATHS,
        "agents": PATHS,
        "skills": PATHS,
        "hooks": {"anyOf": [PATHS, {"type": "object"}]},
        "mcpServers": {"anyOf": [PATHS, {"type": "object"}]},
        "outputStyles": PATHS,
        "lspServers": {"anyOf": [PATHS, {"type": "object"}]},
    },
    "additionalProperties": False,
}
#: .claude-plugin/marketplace.json: name, owner and plugins required; each plugin a name and
#: a source (a relative path in this repository)
MARKETPLACE_SCHEMA = {
    "type": "object",
    "required": ["name", "owner", "plugins"],
    "properties": {
        "name": {"type": "string", "pattern": KEBAB},
        "owner": PERSON,
        "metadata": {
            "type": "object",
            "properties": {
                "description": {"type": "string"},
                "version": {"type": "string"},
                "pluginRoot": {"type": "string"},
            },
            "additionalProperties": False,
        },
        "plugins": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["name", "source"],
                "properties": {
                    "name": {"type": "string", "pattern": KEBAB},
                    "source": {"type": "string", "pattern": r"^\./"},
                    "description": {"type": "string"},
                    "version": {"type": "string", "pattern": SEMVER},
                    "author": PERSON,
                    "category": {"type": "string"},
                    "keywords": {"type": "array", "items": {"type": "string"}},
                    "tags": {"type": "array", "items": {"type": "string"}},
                    "strict": {"type": "boolean"},
                },
                "additionalProperties": False,
            },
        },
    },
    "additionalProperties": False,
}
#: hooks/hooks.json: event → matcher groups → command hooks
HOOKS_SCHEMA = {
    "type": "object",
    "required": ["hooks"],
    "properties": {
        "description": {"type": "string"},
        "hooks": {
            "type": "object",
            "propertyNames": {"enum": HOOK_EVENTS},
            "additionalProperties": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["hooks"],
                    "properties": {
                        "matcher": {"type": "string"},
                        "hooks": {
                            "type": "array",
                            "minItems": 1,
                            "items": {
                                "type": "object",
                                "required": ["type", "command"],
                                "properties": {
                                    "type": {"const": "command"},
                                    "command": {"type": "string", "minLength": 1},
                                    "timeout": {"type": "number", "exclusiveMinimum": 0},
                                },
                                "additionalProperties": False,
                            },
                        },
                    },
                    "additionalProperties": False,
                },
            },
        },
    },
    "additionalProperties": False,
}
#: .mcp.json: servers by name, each a command with args and env
MCP_SCHEMA = {
    "type": "object",
    "required": ["mcpServers"],
    "properties": {
        "mcpServers": {
            "type": "object",
            "minProperties": 1,
            "additionalProperties": {
                "type": "object",
                "required": ["command"],
                "properties": {
                    "command": {"type": "string"},
                    "args": {"type": "array", "items": {"type": "string"}},
                    "env": {"type": "object", "additionalProperties": {"type": "string"}},
                },
                "additionalProperties": False,
            },
        }
    },
    "additionalProperties": False,
}


def _json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def _in_plugin(command: str) -> Path:
    """The file a command names through ``${CLAUDE_PLUGIN_ROOT}``."""
    word = command.split()[0].strip('"')
    assert word.startswith("${CLAUDE_PLUGIN_ROOT}/"), command
    return PLUGIN / word.removeprefix("${CLAUDE_PLUGIN_ROOT}/")


def test_the_marketplace_lists_the_plugin_by_a_path_in_this_repository() -> None:
    market = _json(ROOT / ".claude-plugin" / "marketplace.json")
    jsonschema.validate(market, MARKETPLACE_SCHEMA)
    (entry,) = market["plugins"]
    source = (ROOT / entry["source"]).resolve()
    assert source == PLUGIN.resolve()
    manifest = _json(source / ".claude-plugin" / "plugin.json")
    assert (entry["name"], entry["version"]) == (manifest["name"], manifest["version"])


def test_the_manifest_and_its_parts_follow_the_documented_layout() -> None:
    manifest = _json(PLUGIN / ".claude-plugin" / "plugin.json")
    jsonschema.validate(manifest, PLUGIN_SCHEMA)
    # only the manifest lives in .claude-plugin/; the parts sit at the plugin's root, where
    # Claude Code finds them without the manifest naming them
    assert sorted(p.name for p in (PLUGIN / ".claude-plugin").iterdir()) == ["plugin.json"]
    assert "hooks" not in manifest and "mcpServers" not in manifest
    project = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert f'version = "{manifest["version"]}"' in project


def test_the_hooks_run_sgme_capture_on_every_event_the_installer_sets() -> None:
    hooks = _json(PLUGIN / "hooks" / "hooks.json")
    jsonschema.validate(hooks, HOOKS_SCHEMA)
    assert set(hooks["hooks"]) == set(install.EVENTS["claude-code"])
    for groups in hooks["hooks"].values():
        (group,) = groups
        (hook,) = group["hooks"]
        assert "matcher" not in group  # SessionStart: every source (startup … compact)
        assert hook["command"].split()[1:] == ["capture", "claude-code"]
        script = _in_plugin(hook["command"])
        assert script.is_file() and os.access(script, os.X_OK)


def test_the_mcp_server_is_sgme_mcp() -> None:
    servers = _json(PLUGIN / ".mcp.json")
    jsonschema.validate(servers, MCP_SCHEMA)
    server = servers["mcpServers"]["sgme"]
    assert server["args"] == ["mcp"]
    assert _in_plugin(server["command"]).is_file()


def _run(
    args: list[str], env: dict[str, str], payload: str = ""
) -> subprocess.CompletedProcess[str]:
    """The plugin's command as Claude Code runs a hook: through the shell."""
    command = f'"${{CLAUDE_PLUGIN_ROOT}}/bin/sgme-run" {" ".join(args)}'
    return subprocess.run(
        ["/bin/sh", "-c", command],
        input=payload,
        env={**env, "CLAUDE_PLUGIN_ROOT": str(PLUGIN)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture
def bare(tmp_path: Path) -> dict[str, str]:
    """An environment with no sgme on PATH and an empty home."""
    (tmp_path / "home").mkdir()
    return {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path / "home")}


def test_the_hook_runs_sgme_and_never_fails_the_session(
    bare: dict[str, str], tmp_path: Path
) -> None:
    payload = json.dumps(
        {
            "session_id": "s-1",
            "transcript_path": str(tmp_path / "none.jsonl"),
            "cwd": str(tmp_path),
            "hook_event_name": "UserPromptSubmit",
            "prompt": "what did we decide about the cache?",
        }
    )
    # no sgme at all: nothing printed, exit 0; the MCP server says what is missing
    missing = _run(["capture", "claude-code"], bare, payload)
    assert (missing.returncode, missing.stdout, missing.stderr) == (0, "", "")
    server = _run(["mcp"], bare)
    assert server.returncode == 1 and "no sgme found" in server.stderr
    # this sgme, a server that is away: the hook prints nothing and exits 0
    env = {
        **bare,
        "SGME_BIN": str(SGME),
        "SGME_URL": "http://127.0.0.1:9",
        "SGME_SPOOL_DIR": str(tmp_path / "spool"),
    }
    away = _run(["capture", "claude-code"], env, payload)
    assert (away.returncode, away.stdout) == (0, "")


def test_the_mcp_server_gets_the_token_file_only_when_private(
    bare: dict[str, str], tmp_path: Path
) -> None:
    fake = tmp_path / "sgme"
    fake.write_text('#!/bin/sh\necho "args=$* token=${SGME_TOKEN:-none}"\n')
    fake.chmod(0o755)
    token = tmp_path / "config" / "sgme" / "token"
    token.parent.mkdir(parents=True)
    token.write_text("sgme_secret\n")
    env = {**bare, "SGME_BIN": str(fake), "XDG_CONFIG_HOME": str(tmp_path / "config")}
    for shared in (0o644, 0o640, 0o604):
        token.chmod(shared)
        assert _run(["mcp"], env).stdout == "args=mcp token=none\n"
    token.chmod(0o600)
    assert _run(["mcp"], env).stdout == "args=mcp token=sgme_secret\n"
    assert _run(["mcp"], {**env, "SGME_TOKEN": "sgme_set"}).stdout == "args=mcp token=sgme_set\n"
    # the hooks read the file themselves: it is not put in their environment
    assert _run(["capture", "claude-code"], env).stdout == "args=capture claude-code token=none\n"
