"""``sgme capture``: live capture run by the agents' hooks, and its installer.

- ``sgme capture claude-code`` — a Claude Code command hook (the hook's JSON on stdin);
- ``sgme capture codex [NOTIFICATION]`` — Codex's ``Stop`` hook (JSON on stdin) or its
  ``notify`` program (the JSON as the argument);
- ``sgme capture install {claude-code,codex} [--project DIR] [--uninstall]`` — merge the hooks
  into the agent's settings (see :mod:`pipeline.capture.install`).

Configured by ``SGME_URL``, ``SGME_TOKEN``, ``SGME_AGENT_ID`` (default: the agent's name),
``SGME_SPOOL_DIR`` (default ``~/.local/state/sgme/spool``), ``SGME_SPOOL_MAX_BYTES`` and
``SGME_CAPTURE_SECONDS``. A capture run prints nothing on stdout (an agent may read a hook's
stdout as instructions) and always exits 0; what went wrong goes to stderr and to
``capture.log`` in the spool directory (an agent shows its hooks' stderr only when asked).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline import errors
from pipeline.capture import config

if TYPE_CHECKING:
    from pipeline.cli.context import Add, Context

AGENTS = ("claude-code", "codex")
MAX_PAYLOAD = 1024 * 1024  #: bytes of hook input read at most
LOG_BYTES = 1024 * 1024  #: capture.log is rotated past this size (one old file kept)


TEXT = "live capture for Claude Code and Codex (run by their hooks)"


def main(argv: list[str]) -> int:
    """``sgme capture ARGS``, parsed and run without the other commands' modules (a hook's
    budget is about a second; see :func:`pipeline.cli.main`)."""
    parser = argparse.ArgumentParser(prog="sgme capture", description=TEXT)
    _declare(parser)
    return run(parser.parse_args(argv))


def cmd_capture(ctx: Context) -> int:
    """A capture run, or the installer (when reached through the full parser)."""
    return run(ctx.args)


def run(args: argparse.Namespace) -> int:
    """The installer (exit 2 with one line on an error), or a capture run (exit 0, always)."""
    if args.what == "install":
        try:
            return _install(args)
        except errors.SgmeError as exc:
            print(f"sgme capture: {exc.detail}", file=sys.stderr)
            return 2
        except OSError as exc:
            print(f"sgme capture: {exc}", file=sys.stderr)
            return 2
    with contextlib.suppress(Exception):
        _run(args.what, args.notification)
    return 0


def _run(agent: str, notification: str | None) -> None:
    from pipeline.capture import hooks, runner

    env = config.agent(agent)
    log = _logger(env.spool_dir)
    for bad in env.invalid:
        log.warning("sgme capture: %s is not valid: its default is used", bad)
    hook = hooks.payload(notification if notification is not None else _stdin())
    if agent == "claude-code":
        targets = hooks.claude_code_targets(hook)
        seconds = hooks.claude_code_seconds(hook, env.seconds)
    else:
        targets = hooks.codex_targets(hook, config.agent_home("codex"))
        seconds = env.seconds
    summary = runner.capture(env, targets, seconds=seconds)
    for problem in summary.problems:
        log.warning("sgme capture %s: %s", agent, problem)


def _stdin() -> str:
    if sys.stdin is None or sys.stdin.isatty():
        return ""
    return sys.stdin.read(MAX_PAYLOAD)


def _logger(spool_dir: Path) -> logging.Logger:
    """Warnings to stderr and to ``capture.log`` beside the spool (best effort)."""
    log = logging.getLogger("sgme.capture")
    log.propagate = False
    log.setLevel(logging.WARNING)
    if not log.handlers:
        log.addHandler(logging.StreamHandler(sys.stderr))
        with contextlib.suppress(OSError):
            spool_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            path = spool_dir / "capture.log"
            if path.exists() and path.stat().st_size > LOG_BYTES:
                path.replace(path.with_suffix(".log.1"))
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
            handler = logging.FileHandler(path, encoding="utf-8")
            handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
            log.addHandler(handler)
    return log


def _install(args: argparse.Namespace) -> int:
    from pipeline.capture import install

    agent = args.agent
    project = Path(args.project).expanduser() if args.project else None
    if agent == "claude-code":
        folder = project / ".claude" if project else config.agent_home("claude-code")
        notify = None
        where = folder / "settings.json"
    else:
        home = config.agent_home("codex")
        folder = project / ".codex" if project else home
        notify = home / "config.toml" if project is None else None
        where = folder / "hooks.json"
    changes = install.install(agent, where, uninstall=args.uninstall, notify_config=notify)
    if not changes:
        print(f"Nothing to {'remove' if args.uninstall else 'change'}: {where} is as it should be")
    for change in changes:
        print(f"{change.path}: {change.what}")
        if change.backup is not None:
            print(f"  (the file as it was: {change.backup})")
    if not args.uninstall:
        print(_next_steps(agent, project))
    return 0


def _next_steps(agent: str, project: Path | None) -> str:
    name = "Claude Code" if agent == "claude-code" else "Codex"
    extra = ""
    if agent == "codex":
        extra = (
            "\nCodex runs hooks when they are enabled (the default in recent versions; older ones"
            "\nneed `[features]` `codex_hooks = true` in config.toml). "
        )
    return f"""
{name} now runs `sgme capture {agent}` at the end of each turn. It sends to SGME_URL
(default http://127.0.0.1:8765) as SGME_AGENT_ID (default {agent}); set them, and SGME_TOKEN
once the server has tokens, in the environment {name} starts from, e.g.:
  export SGME_URL=http://127.0.0.1:8765
  export SGME_TOKEN=$(sgme token create --agent-id {agent} --scope append --name {agent} \\
      | tail -n 1)
Turns the server cannot take wait in ~/.local/state/sgme/spool (SGME_SPOOL_DIR) and go with a
later turn; problems are logged to capture.log there.{extra}
Undo: sgme capture install {agent}{f" --project {project}" if project else ""} --uninstall"""


def register(add: Add) -> None:
    """Declare ``sgme capture`` (a client of a server over HTTP: no data dir, no index)."""
    _declare(add("capture", cmd_capture, TEXT, common=False))


def _declare(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="what", required=True, metavar="AGENT")
    sub.add_parser(
        "claude-code",
        help="capture what a Claude Code transcript gained (a hook: its JSON on stdin)",
        description="Run by Claude Code's Stop, SubagentStop, PreCompact and SessionEnd hooks.",
    ).set_defaults(notification=None)
    codex = sub.add_parser(
        "codex",
        help="capture what a Codex rollout gained (Stop hook: JSON on stdin; notify: argument)",
        description="Run by Codex's Stop hook or as its notify program.",
    )
    codex.add_argument(
        "notification", nargs="?", help="the notify program's JSON (agent-turn-complete)"
    )
    installer = sub.add_parser(
        "install",
        help="merge the capture hooks into an agent's settings (or take them out)",
        description="Merge the capture hooks into Claude Code's settings.json or Codex's "
        "hooks.json (and config.toml's notify), keeping everything else; a backup first.",
    )
    installer.add_argument("agent", choices=AGENTS, help="the agent whose settings to change")
    installer.add_argument(
        "--project",
        metavar="DIR",
        help="a project's settings (DIR/.claude/settings.json, DIR/.codex/hooks.json) "
        "instead of the user's",
    )
    installer.add_argument(
        "--uninstall", action="store_true", help="take the capture hooks out again"
    )
