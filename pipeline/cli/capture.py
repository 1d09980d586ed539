"""``sgme capture``: live capture run by the agents' hooks, its installer and its status.

- ``sgme capture claude-code`` — a Claude Code command hook (the hook's JSON on stdin);
- ``sgme capture codex [NOTIFICATION]`` — Codex's ``Stop`` hook (JSON on stdin) or its
  ``notify`` program (the JSON as the argument);
- ``sgme capture install {claude-code,codex} [--project DIR] [--uninstall]`` — merge the hooks
  into the agent's settings (see :mod:`pipeline.capture.install`), then check that the hook
  will be let in by the server, and say how to give it its token;
- ``sgme capture status [--json]`` — per agent, what waits in the spool, the last delivery and
  the last error;
- ``sgme capture preview {claude-code,codex} [--prompt TEXT] [--cwd DIR]`` — what the
  SessionStart / UserPromptSubmit hooks would inject (:mod:`pipeline.capture.inject`).

On SessionStart and UserPromptSubmit a run captures first, then prints the block of memory
the agent adds to the model's context (its only output on stdout), configured by
``SGME_INJECT_*`` (docs/clients.md).

Configured by ``SGME_URL``, ``SGME_TOKEN`` (else the token file ``SGME_TOKEN_FILE``, default
``~/.config/sgme/token``, readable by its owner only), ``SGME_AGENT_ID`` (default: the agent's
name), ``SGME_SPOOL_DIR`` (default ``~/.local/state/sgme/spool``), ``SGME_SPOOL_MAX_BYTES``,
``SGME_SPOOL_REJECTED_MAX_BYTES`` and ``SGME_CAPTURE_SECONDS``. A capture run prints nothing on
stdout (an agent may read a hook's stdout as instructions) and always exits 0; what went wrong
— and why a run could not deliver — goes to ``capture.log`` in the spool directory, and one
line to stderr when it is a terminal (an agent keeps its hooks' stderr out of sight).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline import errors
from pipeline.capture import config

if TYPE_CHECKING:
    from pipeline.capture import runner
    from pipeline.cli.context import Add, Context

AGENTS = ("claude-code", "codex")
MAX_PAYLOAD = 1024 * 1024  #: bytes of hook input read at most
LOG_BYTES = 1024 * 1024  #: capture.log is rotated past this size (one old file kept)
CHECK_SECONDS = 5.0  #: what the installer's check of the server may take
#: seconds a process may have run before ``sgme capture`` starts and still count as a hook's
FRESH_SECONDS = 2.0


TEXT = "live capture for Claude Code and Codex (run by their hooks)"


def main(argv: list[str]) -> int:
    """``sgme capture ARGS``, parsed and run without the other commands' modules (a hook's
    budget is about a second; see :func:`pipeline.cli.main`)."""
    started = process_start()
    parser = argparse.ArgumentParser(prog="sgme capture", description=TEXT)
    _declare(parser)
    return run(parser.parse_args(argv), started=started)


def process_start() -> float:
    """When this process started, on ``time.monotonic()``'s clock: the agent waits for the
    interpreter's start too (a tenth of a second, several on a loaded machine), so a hook's
    budget counts from it. From ``/proc`` (Linux); elsewhere — or in a process that has run
    for longer than :data:`FRESH_SECONDS`, which is not a hook's (a test's, say) — now."""
    try:
        with open("/proc/self/stat", "rb") as stat:
            # the fields after the command's name, which may hold spaces and parentheses;
            # the 22nd field of the line, starttime, is the 20th of these (clock ticks)
            ticks = int(stat.read().rsplit(b")", 1)[1].split()[19])
        with open("/proc/uptime", "rb") as uptime:
            since_boot = float(uptime.read().split()[0])
        age = since_boot - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.monotonic()
    return time.monotonic() - (age if 0.0 <= age <= FRESH_SECONDS else 0.0)


def cmd_capture(ctx: Context) -> int:
    """A capture run, or the installer (when reached through the full parser)."""
    return run(ctx.args)


def run(args: argparse.Namespace, *, started: float | None = None) -> int:
    """The installer (exit 2 with one line on an error), the status, or a capture run (exit 0,
    always) whose budget counts from ``started`` (``time.monotonic()``; default now): what the
    command took to start is part of what the agent waits for."""
    if args.what in ("install", "status", "preview"):
        try:
            command = {"install": _install, "status": _status, "preview": _preview}[args.what]
            return command(args)
        except errors.SgmeError as exc:
            print(f"sgme capture: {exc.detail}", file=sys.stderr)
            return 2
        except OSError as exc:
            print(f"sgme capture: {exc}", file=sys.stderr)
            return 2
    with contextlib.suppress(Exception):
        _run(args.what, args.notification, time.monotonic() if started is None else started)
    return 0


def _run(agent: str, notification: str | None, started: float) -> None:
    from pipeline.capture import hooks, inject, runner, state

    env = config.agent(agent)
    log = _logger(env.spool_dir)
    for bad in env.invalid:
        log.warning("sgme capture %s: %s is not valid: its default is used", agent, bad)
    if env.token_problem:
        log.warning("sgme capture %s: %s", agent, env.token_problem)
    hook = hooks.payload(notification if notification is not None else _stdin())
    if agent == "claude-code":
        targets = hooks.claude_code_targets(hook)
        seconds = hooks.claude_code_seconds(hook, env.seconds)
    else:
        targets = hooks.codex_targets(hook, config.agent_home("codex"))
        seconds = env.seconds
    event = hook.get("hook_event_name")
    injecting = event in inject.EVENTS
    settings = config.injection() if injecting else config.Injection()
    if injecting:
        # a session that starts has no transcript yet: nothing to capture, nothing to log
        targets = [t for t in targets if t.path.exists()]
        # the user waits for these two: capture and injection share the injection's budget.
        # Capture comes first and is not at risk: what it cannot send in time it spools,
        # and what it cannot read the next run (this turn's Stop) reads; the injection
        # takes what is left, so it can neither delay nor risk a capture.
        seconds = min(seconds, settings.seconds)
        for bad in settings.invalid:
            log.warning("sgme capture %s: %s is not valid: its default is used", agent, bad)
    seconds = max(0.1, seconds - (time.monotonic() - started))
    summary = runner.capture(env, targets, seconds=seconds) if targets else runner.Summary()
    if injecting:
        _inject(env, settings, hook, started, log)
    for problem in summary.problems:
        log.warning("sgme capture %s: %s", agent, problem)
    for path in summary.lagging:
        log.warning(
            "sgme capture %s: %s did not hold the hook's last answer in time: it goes with the "
            "next run",
            agent,
            path,
        )
    if summary.erased:
        log.warning(
            "sgme capture %s: %d messages were erased from SGME earlier: not stored again",
            agent,
            summary.erased,
        )
    failed = _failure(summary, env)
    if failed:
        log.warning("sgme capture %s: %s", agent, failed)
    if failed or summary.problems:
        _say(f"sgme capture {agent}: {failed or summary.problems[0]} (see {_log_path(env)})")
    with contextlib.suppress(OSError):
        now = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        state.State(env.spool_dir).note(agent, at=now, delivered=summary.sent, error=failed)


def _inject(
    env: config.Agent,
    settings: config.Injection,
    hook: dict[str, Any],
    started: float,
    log: logging.Logger,
) -> None:
    """Print the block of memory a SessionStart or UserPromptSubmit hook injects, when there
    is one and it is ready within the injection's budget (counted from the hook's start)."""
    from pipeline.capture import inject

    call = inject.Call.from_hook(hook)
    found = inject.inject(env, settings, call, deadline=started + settings.seconds)
    if found.block:
        sys.stdout.write(inject.output(call.event, found.block) + "\n")
        sys.stdout.flush()
    elif found.failed:
        log.warning("sgme capture: nothing injected on %s: %s", call.event, found.why)


def _preview(args: argparse.Namespace) -> int:
    """What a hook would inject for a prompt (or a session's start) in a directory: the block
    as the model would read it, or on stderr why there is none."""
    from pipeline.capture import inject

    env = config.agent(args.agent)
    settings = config.injection()
    for bad in settings.invalid:
        print(f"sgme capture preview: {bad} is not valid: its default is used", file=sys.stderr)
    event = args.event or ("UserPromptSubmit" if args.prompt else "SessionStart")
    call = inject.Call(
        event=event,
        session_id=args.session,
        cwd=str(Path(args.cwd).expanduser().absolute()),
        prompt=args.prompt or "",
        source=args.source,
    )
    # a person waits longer than an agent's hook: the budget's shortness is not previewed
    seconds = max(settings.seconds, CHECK_SECONDS)
    found = inject.inject(env, settings, call, deadline=time.monotonic() + seconds, remember=False)
    if not found.block:
        print(f"Nothing would be injected: {found.why}", file=sys.stderr)
        return 0
    print(found.block)
    print(
        f"\n({len(found.block)} characters of {settings.chars}; {found.took:.2f} s)",
        file=sys.stderr,
    )
    return 0


def _failure(summary: runner.Summary, env: config.Agent) -> str | None:
    """Why what this run had could not all be delivered (None: it was)."""
    if summary.delivered and not summary.spooled:
        return None
    if summary.failure is None:
        return None
    return f"cannot deliver: {summary.failure}; what is left waits in {env.spool_dir}"


def _log_path(env: config.Agent) -> Path:
    return env.spool_dir / "capture.log"


def _say(line: str) -> None:
    """One line on stderr, when a person reads it (a terminal): an agent keeps its hooks'
    stderr out of sight, or shows it as an error."""
    with contextlib.suppress(Exception):
        if sys.stderr is not None and sys.stderr.isatty():
            print(line, file=sys.stderr)


def _stdin() -> str:
    if sys.stdin is None or sys.stdin.isatty():
        return ""
    return sys.stdin.read(MAX_PAYLOAD)


def _logger(spool_dir: Path) -> logging.Logger:
    """Warnings to ``capture.log`` beside the spool (best effort: a spool directory that
    cannot be written has no log, and the terminal line says what happened)."""
    log = logging.getLogger("sgme.capture")
    log.propagate = False
    log.setLevel(logging.WARNING)
    path = spool_dir / "capture.log"
    if not any(getattr(h, "baseFilename", None) == str(path.absolute()) for h in log.handlers):
        for handler in list(log.handlers):  # another spool's (a second run in one process)
            log.removeHandler(handler)
            handler.close()
        log.addHandler(logging.NullHandler())
        with contextlib.suppress(OSError):
            spool_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            if path.exists() and path.stat().st_size > LOG_BYTES:
                path.replace(path.with_suffix(".log.1"))
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
            handler = logging.FileHandler(path, encoding="utf-8")
            handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
            log.addHandler(handler)
    return log


def _status(args: argparse.Namespace) -> int:
    """What waits in the spool, per agent, with the last delivery and the last error."""
    from pipeline.capture import spool as spooling
    from pipeline.capture import state

    env = config.agent("claude-code")
    waiting = spooling.Spool(env.spool_dir).waiting()
    saved = state.State(env.spool_dir)
    followed = saved.transcripts()
    agents: dict[str, Any] = {}
    for agent in AGENTS:
        agent_env = config.agent(agent)
        found = saved.status(agent)
        agents[agent] = {
            "agent_id": agent_env.agent_id,
            "waiting": waiting.by_agent.get(agent_env.agent_id, 0),
            "transcripts": sum(1 for t in followed if t.get("kind") == agent),
            "last_delivery": found.get("last_delivery"),
            "last_error": found.get("last_error"),
        }
    oldest = None
    if waiting.oldest is not None:
        oldest = dt.datetime.fromtimestamp(waiting.oldest, dt.UTC).isoformat(timespec="seconds")
    report: dict[str, Any] = {
        "spool_dir": str(env.spool_dir),
        "url": env.url,
        "token": env.token_source or None,
        "token_problem": env.token_problem,
        "waiting": {
            "appends": waiting.bodies,
            "files": waiting.files,
            "bytes": waiting.bytes,
            "oldest": oldest,
            "by_agent_id": waiting.by_agent,
        },
        "rejected": waiting.rejected,
        "agents": agents,
    }
    if args.json:
        print(json.dumps(report, ensure_ascii=False))
        return 0
    token = env.token_source or f"none ({env.token_problem or 'no SGME_TOKEN, no token file'})"
    print(f"spool {env.spool_dir}: {waiting.bodies} appends waiting ({waiting.bytes} bytes)")
    if oldest:
        print(f"  the oldest since {oldest}")
    print(f"  {waiting.rejected} set aside in {env.spool_dir / 'rejected'}")
    print(f"server {env.url}, token: {token}")
    for agent, found in agents.items():
        delivery = found["last_delivery"]
        error = found["last_error"]
        print(
            f"{agent} (agent id {found['agent_id']}): {found['waiting']} waiting, "
            f"{found['transcripts']} transcripts followed"
        )
        print(
            "  last delivery: "
            + (f"{delivery['at']} ({delivery['bodies']} appends)" if delivery else "none")
        )
        print("  last error: " + (f"{error['at']}: {error['detail']}" if error else "none"))
    return 0


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
        print(check(config.agent(agent)))
    return 0


def check(env: config.Agent, *, transport: Any = None) -> str:
    """Whether the server lets a hook with this environment in — a request it refuses
    before it writes anything (an append with no messages: 422 once the token is taken) — and,
    when not, what to do. ``transport``: an httpx transport in place of the network (tests)."""
    from pipeline import client

    source = f"the token from {env.token_source}" if env.token else "no token"
    try:
        with client.Client(
            env.url,
            token=env.token,
            timeout=CHECK_SECONDS,
            retry=client.NO_RETRY,
            transport=transport,
        ) as probe:
            probe.append(agent_id=env.agent_id, session_key="sgme-capture-check", messages=[])
    except errors.InvalidInput:
        return f"Check: the server at {env.url} takes appends from the hook ({source}); " + (
            _read_check(env, transport=transport)
        )
    except errors.Unauthorized:
        if env.token is None:
            why = env.token_problem or "no SGME_TOKEN here and no token file"
            return (
                f"Check: the server at {env.url} needs a token and the hook has none ({why}): "
                "it will keep turns in its spool until it has one (see above)."
            )
        return (
            f"Check: the server at {env.url} refuses {source} (401): it will keep turns in its "
            "spool until it has one the server knows."
        )
    except errors.Forbidden as exc:
        return (
            f"Check: {source} may not append for {env.agent_id} ({exc.detail}): give the hook a "
            f"token with --scope append,read --agent-id {env.agent_id}."
        )
    except errors.SgmeError as exc:
        return (
            f"Check: the server at {env.url} does not answer now ({exc.detail}): the hook keeps "
            "turns in its spool until it does."
        )
    return f"Check: the server at {env.url} answered a check with no messages as an append?"


def _read_check(env: config.Agent, *, transport: Any = None) -> str:
    """Whether the hook may read its agent's memory back (the injection), as it reads it."""
    from pipeline.capture import inject

    reader = inject.Reader(env, deadline=time.monotonic() + CHECK_SECONDS, transport=transport)
    try:
        reader.get("/v1/sessions", {"agent_id": env.agent_id, "limit": 1})
    except inject.Away as exc:
        if exc.status == 403:
            return (
                "it may not read them back, so SessionStart and UserPromptSubmit inject nothing: "
                f"give it a token with --scope append,read --agent-id {env.agent_id}, or set "
                "SGME_INJECT_SESSION_START=off and SGME_INJECT_PROMPT=off."
            )
        return f"whether it may read them back is not known ({exc})."
    finally:
        reader.close()
    return "it reads them back at a session's start and with each prompt."


def _next_steps(agent: str, project: Path | None) -> str:
    name = "Claude Code" if agent == "claude-code" else "Codex"
    token = config.token_file()
    extra = ""
    if agent == "codex":
        extra = (
            "\nCodex runs hooks when they are enabled (the default in recent versions; older ones"
            "\nneed `[features]` `codex_hooks = true` in config.toml). "
        )
    return f"""
{name} now runs `sgme capture {agent}` at the end of each turn, and at a session's start
and with each prompt, where it also brings back memory (`sgme capture preview {agent}
--prompt TEXT --cwd DIR` shows what; SGME_INJECT_* settings). It sends to SGME_URL
(default http://127.0.0.1:8765) as SGME_AGENT_ID (default {agent}); set them in the
environment {name} starts from. Once the server has tokens the hook needs one of its own:
keep it in a file only you can read (not in a shell profile others may read), e.g.
  (umask 077; mkdir -p {token.parent} && sgme token create --agent-id {agent} \\
      --scope append,read --name {agent} | tail -n 1 > {token})
The hook reads {token} (SGME_TOKEN_FILE names another; SGME_TOKEN, when set, comes first)
and refuses a token file others may read.
Turns the server cannot take wait in ~/.local/state/sgme/spool (SGME_SPOOL_DIR) and go with a
later turn; why a run could not deliver is logged to capture.log there, and
`sgme capture status` shows what waits.{extra}
Undo: sgme capture install {agent}{f" --project {project}" if project else ""} --uninstall"""


def register(add: Add) -> None:
    """Declare ``sgme capture`` (a client of a server over HTTP: no data dir, no index)."""
    _declare(add("capture", cmd_capture, TEXT, common=False))


def _declare(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="what", required=True, metavar="AGENT")
    sub.add_parser(
        "claude-code",
        help="capture what a Claude Code transcript gained (a hook: its JSON on stdin)",
        description="Run by Claude Code's Stop, SubagentStop, PreCompact and SessionEnd hooks "
        "(capture), and SessionStart and UserPromptSubmit (capture, then memory injected).",
    ).set_defaults(notification=None)
    codex = sub.add_parser(
        "codex",
        help="capture what a Codex rollout gained (Stop hook: JSON on stdin; notify: argument)",
        description="Run by Codex's Stop hook or as its notify program (capture), and its "
        "SessionStart and UserPromptSubmit hooks (capture, then memory injected).",
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
    preview = sub.add_parser(
        "preview",
        help="print what the hooks would inject for a prompt (or a session's start) in DIR",
        description="Print the block of memory a UserPromptSubmit hook (with --prompt) or a "
        "SessionStart hook (without) would inject, with the same settings (SGME_INJECT_*) and "
        "token; nothing is recorded as injected.",
    )
    preview.add_argument("agent", choices=AGENTS, help="whose hook to play")
    preview.add_argument("--prompt", metavar="TEXT", help="the prompt the user submits")
    preview.add_argument("--cwd", metavar="DIR", default=".", help="the project's directory")
    preview.add_argument("--session", metavar="ID", help="the current session's id (left out)")
    preview.add_argument(
        "--event", choices=("SessionStart", "UserPromptSubmit"), help="the hook's event"
    )
    preview.add_argument(
        "--source",
        choices=("startup", "resume", "clear", "compact"),
        default="startup",
        help="SessionStart's source",
    )
    status = sub.add_parser(
        "status",
        help="what waits in the spool, per agent, and the last delivery and error",
        description="Per agent: the appends waiting in the spool, the last delivery and the "
        "last error of the capture hooks; the token the hooks would use.",
    )
    status.add_argument("--json", action="store_true", help="print JSON")
