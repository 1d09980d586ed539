"""``sgme capture install``: the capture hooks merged into an agent's own settings, and taken
out again.

- **Claude Code**: ``settings.json`` — the user's (``$CLAUDE_CONFIG_DIR``, default
  ``~/.claude``) or a project's (``DIR/.claude/settings.json``) — gets one command hook
  ``sgme capture claude-code`` under each of ``Stop``, ``SubagentStop``, ``PreCompact`` and
  ``SessionEnd`` (capture) and ``SessionStart`` and ``UserPromptSubmit`` (capture, then the
  memory it injects: :mod:`.inject`).
- **Codex**: ``$CODEX_HOME/hooks.json`` (default ``~/.codex``; a project's ``DIR/.codex``) gets a
  ``Stop``, ``SessionStart`` and ``UserPromptSubmit`` hook ``sgme capture codex``; the user's
  ``config.toml`` gets ``notify = [sgme, "capture", "codex"]`` when it has no ``notify`` yet
  (Codex runs one notify program; one that is set is left alone — the hook captures without
  it).

Everything else in those files is kept as it was: other hooks (in the same events too), other
keys, their order. A hook is ours when its command runs ``sgme capture <agent>``; installing
again replaces ours instead of adding a second, and ``--uninstall`` removes only ours (and a
group or event it leaves empty). Each file that changes is first copied to
``<name>.sgme-backup-<UTC time>``, then written whole (temporary file, rename) with its mode
kept. A file that is not valid JSON (or TOML) is not touched: the command stops and says why.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import re
import shlex
import shutil
import sys
import tomllib
from pathlib import Path
from typing import Any

from pipeline import errors

#: the events our hook is set in: the capture's, and the two that inject memory
EVENTS = {
    "claude-code": (
        "Stop",
        "SubagentStop",
        "PreCompact",
        "SessionEnd",
        "SessionStart",
        "UserPromptSubmit",
    ),
    "codex": ("Stop", "SessionStart", "UserPromptSubmit"),
}
#: seconds the agents give our hook at most (the run keeps to its own, smaller, budget)
HOOK_TIMEOUT = 30
NOTIFY_MARK = "# sgme capture: sgme capture install codex (remove with --uninstall)"


@dataclasses.dataclass
class Change:
    """What an install or uninstall did to one file."""

    path: Path
    what: str  #: a sentence for the user
    backup: Path | None = None


def command(agent: str, program: str | None = None) -> str:
    """The hook command: this ``sgme`` by its absolute path (agents run hooks with their own
    PATH, where a virtualenv's ``sgme`` may not be), then ``capture <agent>``."""
    return f"{shlex.quote(program or sgme_program())} capture {agent}"


def sgme_program() -> str:
    """The path of the running ``sgme``, else the one on PATH, else ``sgme``."""
    argv0 = Path(sys.argv[0])
    if argv0.name == "sgme" and argv0.exists():
        return str(argv0.absolute())
    return shutil.which("sgme") or "sgme"


def ours(hook: Any, agent: str) -> bool:
    """Whether a hook entry is a capture hook of ours for ``agent``."""
    if not isinstance(hook, dict) or not isinstance(hook.get("command"), str):
        return False
    try:
        words = shlex.split(hook["command"])
    except ValueError:
        return False
    return len(words) >= 3 and Path(words[-3]).name == "sgme" and words[-2:] == ["capture", agent]


def merge(settings: dict[str, Any], agent: str, hook_command: str | None) -> list[str]:
    """Put our hook (``hook_command``) under each event, or take ours out (None); the events
    changed. Other entries, groups and events are left as they are."""
    hooks = settings.get("hooks")
    if hooks is None:
        if hook_command is None:
            return []
        hooks = settings["hooks"] = {}
    if not isinstance(hooks, dict):
        raise errors.InvalidInput('its "hooks" is not an object: fix it by hand first')
    changed: list[str] = []
    for event in EVENTS[agent]:
        groups = hooks.get(event)
        if groups is None:
            groups = []
        if not isinstance(groups, list):
            raise errors.InvalidInput(f'its "hooks.{event}" is not a list: fix it by hand first')
        before = json.dumps(groups, sort_keys=True)
        kept = []
        for group in groups:
            if isinstance(group, dict) and isinstance(group.get("hooks"), list):
                entries = [h for h in group["hooks"] if not ours(h, agent)]
                if not entries and group["hooks"]:
                    continue  # a group that held only ours goes with it
                group = {**group, "hooks": entries}
            kept.append(group)
        if hook_command is not None:
            entry = {"type": "command", "command": hook_command, "timeout": HOOK_TIMEOUT}
            kept.append({"hooks": [entry]})
        if kept:
            hooks[event] = kept
        else:
            hooks.pop(event, None)
        if json.dumps(kept, sort_keys=True) != before:
            changed.append(event)
    if not hooks:
        settings.pop("hooks")
    return changed


def _backup(path: Path) -> Path:
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S%fZ")
    backup = path.with_name(f"{path.name}.sgme-backup-{stamp}")
    shutil.copy2(path, backup)
    return backup


def _write(path: Path, text: str) -> Path | None:
    """``text`` into ``path`` whole, mode kept; the backup of what was there. A symlink (a
    dotfiles repository's, say) stays one: its target is written."""
    if path.is_symlink():
        path = path.resolve()
    backup = _backup(path) if path.exists() else None
    mode = path.stat().st_mode & 0o777 if path.exists() else 0o600
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.sgme-tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)
        out.flush()
        os.fsync(out.fileno())
    os.chmod(tmp, mode)
    os.replace(tmp, path)
    return backup


def install(
    agent: str,
    settings_path: Path,
    *,
    uninstall: bool = False,
    program: str | None = None,
    notify_config: Path | None = None,
) -> list[Change]:
    """Install (or uninstall) ``agent``'s capture hooks in ``settings_path``, and for Codex
    its notify program in ``notify_config``; what changed."""
    hook_command = None if uninstall else command(agent, program)
    changes: list[Change] = []
    if settings_path.exists():
        try:
            settings = json.loads(settings_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise errors.InvalidInput(
                f"{settings_path} is not readable JSON ({exc}): left as it is"
            ) from None
        if not isinstance(settings, dict):
            raise errors.InvalidInput(f"{settings_path} does not hold a JSON object: left as it is")
    else:
        settings = {}
    try:
        events = merge(settings, agent, hook_command)
    except errors.InvalidInput as exc:
        raise errors.InvalidInput(f"{settings_path}: {exc.detail}") from None
    if events and (settings or settings_path.exists()):
        backup = _write(settings_path, json.dumps(settings, indent=2, ensure_ascii=False) + "\n")
        verb = "removed from" if uninstall else "set in"
        changes.append(Change(settings_path, f"capture hook {verb} {', '.join(events)}", backup))
    if notify_config is not None:
        change = _notify(notify_config, None if uninstall else command(agent, program))
        if change is not None:
            changes.append(change)
    return changes


def _notify(path: Path, hook_command: str | None) -> Change | None:
    """Codex's ``notify`` in ``config.toml``: ours added at the top when there is none (or
    replaced), or ours removed; anyone else's left alone (and said so)."""
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    try:
        tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise errors.InvalidInput(f"{path} is not valid TOML ({exc}): left as it is") from None
    mine = re.compile(rf"^{re.escape(NOTIFY_MARK)}\nnotify = [^\n]*\n\n?", re.MULTILINE)
    base = mine.sub("", text, count=1)
    if hook_command is None:
        if base == text:
            return None
        return Change(path, "notify program removed", _write(path, base))
    current = tomllib.loads(base).get("notify")
    if current is not None:
        return Change(path, f"notify is set to {current!r}: left as it is (the Stop hook captures)")
    line = f"{NOTIFY_MARK}\nnotify = {json.dumps(shlex.split(hook_command))}\n"
    new = line + ("\n" + base if base else "")
    if new == text:
        return None
    return Change(path, "notify program set", _write(path, new))
