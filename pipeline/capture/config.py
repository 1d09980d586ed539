"""What live capture reads from its environment — not the server's settings: capture is a
client of a server over HTTP, wherever that runs.

This is the one place outside :mod:`pipeline.settings` that reads the environment, on
purpose: a capture runs inside an agent's hook with a budget of about a second, and
``pipeline.settings`` imports the server's domain modules (the index, the journal), which
alone take a good part of that. The server's address, the token and the agent's id it shares
with ``sgme mcp``'s :class:`settings.Remote <pipeline.settings.Remote>`: both read them
through :mod:`pipeline.remote`.
"""

from __future__ import annotations

import dataclasses
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pipeline import remote

#: the token file's name in ``$XDG_CONFIG_HOME/sgme/`` (default ``~/.config/sgme/``)
TOKEN_FILE = "token"


@dataclasses.dataclass(frozen=True)
class Agent:
    """What a client running beside an agent (``sgme capture``) reads from its environment —
    not the server's settings: it talks to a server over HTTP, wherever that runs."""

    url: str  #: ``SGME_URL``, default ``http://127.0.0.1:8765``
    token: str | None  #: ``SGME_TOKEN``, else the token file's first line
    agent_id: str  #: ``SGME_AGENT_ID``, default the agent's own name
    spool_dir: Path  #: ``SGME_SPOOL_DIR``, default ``~/.local/state/sgme/spool``
    spool_max_bytes: int  #: ``SGME_SPOOL_MAX_BYTES``, default 256 MiB
    seconds: float  #: ``SGME_CAPTURE_SECONDS``: one capture's time budget, default 10
    #: ``SGME_SPOOL_REJECTED_MAX_BYTES``: what ``rejected/`` keeps at most, default 16 MiB
    rejected_max_bytes: int = 16 * 1024 * 1024
    #: where the token came from: ``SGME_TOKEN``, the token file's path, or "" (none)
    token_source: str = ""
    #: why the token file was not read (readable by others, not a file), or None
    token_problem: str | None = None
    invalid: tuple[str, ...] = ()  #: variables whose value was refused (defaults used)


def agent(default_agent_id: str, environ: Mapping[str, str] | None = None) -> Agent:
    """The client's settings from the environment. A value that is not valid is reported in
    ``invalid`` and its default used: a hook must run whatever its environment holds."""
    env = os.environ if environ is None else environ
    invalid: list[str] = []

    def number(name: str, default: float, kind: type[int] | type[float]) -> Any:
        raw = env.get(name, "").strip()
        try:
            value = kind(raw) if raw else default
        except ValueError:
            value = -1
        if value > 0:
            return value
        invalid.append(f"{name}={raw!r}")
        return default

    state = Path(env.get("XDG_STATE_HOME", "").strip() or Path.home() / ".local" / "state")
    token, source, problem = remote.token(env), "SGME_TOKEN", None
    if token is None:
        path = token_file(env)
        token, problem = read_token(path)
        source = str(path) if token else ""
    return Agent(
        url=remote.url(env).rstrip("/"),
        token=token,
        agent_id=remote.agent_id(env, default_agent_id),
        spool_dir=Path(env.get("SGME_SPOOL_DIR", "").strip() or state / "sgme" / "spool"),
        spool_max_bytes=number("SGME_SPOOL_MAX_BYTES", 256 * 1024 * 1024, int),
        seconds=number("SGME_CAPTURE_SECONDS", 10.0, float),
        rejected_max_bytes=number("SGME_SPOOL_REJECTED_MAX_BYTES", 16 * 1024 * 1024, int),
        token_source=source,
        token_problem=problem,
        invalid=tuple(invalid),
    )


def token_file(environ: Mapping[str, str] | None = None) -> Path:
    """Where a hook reads its token when ``SGME_TOKEN`` is not set: ``SGME_TOKEN_FILE``,
    default ``$XDG_CONFIG_HOME/sgme/token`` (``~/.config/sgme/token``)."""
    env = os.environ if environ is None else environ
    given = env.get("SGME_TOKEN_FILE", "").strip()
    if given:
        return Path(given).expanduser()
    config = env.get("XDG_CONFIG_HOME", "").strip()
    return (Path(config) if config else Path.home() / ".config") / "sgme" / TOKEN_FILE


def read_token(path: Path) -> tuple[str | None, str | None]:
    """The token a file holds (its first line) and None; or None and why it is not read: a
    token file that others may read is refused, as ssh refuses such a key (a token is a
    password to the agent's memory)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, f"cannot read the token file {path}: {exc.strerror}"
    try:
        found = os.fstat(fd)
        if not stat.S_ISREG(found.st_mode):
            return None, f"the token file {path} is not a file"
        if found.st_mode & 0o077:
            mode = stat.filemode(found.st_mode)
            return None, (
                f"the token file {path} may be read by others ({mode}): not used; chmod 600 {path}"
            )
        with os.fdopen(os.dup(fd), "rb") as stream:
            text = stream.read(4096).decode("utf-8", "replace")
    finally:
        os.close(fd)
    first = text.strip().splitlines()[0].strip() if text.strip() else ""
    return first or None, None


def agent_home(name: str, environ: Mapping[str, str] | None = None) -> Path:
    """Where an agent keeps its settings and transcripts, by its own rule: Claude Code's
    ``$CLAUDE_CONFIG_DIR`` (default ``~/.claude``), Codex's ``$CODEX_HOME`` (``~/.codex``)."""
    env = os.environ if environ is None else environ
    variable, default = {
        "claude-code": ("CLAUDE_CONFIG_DIR", ".claude"),
        "codex": ("CODEX_HOME", ".codex"),
    }[name]
    found = env.get(variable, "").strip()
    return Path(found) if found else Path.home() / default


#: what ``SGME_INJECT_SCOPE`` may say: this project's sessions first then the rest, only this
#: project's, or the search's own order over everything
SCOPES = ("project", "project-only", "all")
#: what ``SGME_INJECT_AGENTS`` may say: the hook's own agent id, or every agent the token reads
AGENT_SCOPES = ("self", "token")


@dataclasses.dataclass(frozen=True)
class Injection:
    """What the hooks bring back to the agent (``SGME_INJECT_*``; docs/clients.md)."""

    session_start: bool = True  #: ``SGME_INJECT_SESSION_START``: on SessionStart
    prompt: bool = True  #: ``SGME_INJECT_PROMPT``: on UserPromptSubmit
    #: ``SGME_INJECT_CHARS``: characters of the block at most — under Claude Code's ~10,000
    #: characters of a hook's output that reach the model whole
    chars: int = 8000
    #: ``SGME_INJECT_MIN_SCORE``: hits scoring less are left out (the relevance floor)
    min_score: float = 2.0
    seconds: float = 1.0  #: ``SGME_INJECT_SECONDS``: from the hook's start; past it, nothing
    scope: str = "project"  #: ``SGME_INJECT_SCOPE``: one of :data:`SCOPES`
    agents: str = "self"  #: ``SGME_INJECT_AGENTS``: one of :data:`AGENT_SCOPES`
    hits: int = 6  #: ``SGME_INJECT_HITS``: turns a prompt's block holds at most
    sessions: int = 5  #: ``SGME_INJECT_SESSIONS``: recent sessions a SessionStart block lists
    snippet_chars: int = 400  #: ``SGME_INJECT_SNIPPET_CHARS``: characters of a turn's snippet
    invalid: tuple[str, ...] = ()  #: variables whose value was refused (defaults used)


def injection(environ: Mapping[str, str] | None = None) -> Injection:
    """The injection's settings from the environment; a value that is not valid is reported
    in ``invalid`` and its default used, as :func:`agent` does."""
    env = os.environ if environ is None else environ
    default = Injection()
    invalid: list[str] = []

    def raw(name: str) -> str:
        return env.get(name, "").strip()

    def switch(name: str, value: bool) -> bool:
        found = raw(name).lower()
        if not found:
            return value
        if found in ("1", "true", "yes", "on"):
            return True
        if found in ("0", "false", "no", "off"):
            return False
        invalid.append(f"{name}={found!r}")
        return value

    def number(name: str, value: Any, kind: type[int] | type[float], least: float) -> Any:
        found = raw(name)
        if not found:
            return value
        try:
            parsed = kind(found)
        except ValueError:
            parsed = None
        if parsed is None or parsed < least or parsed != parsed:  # NaN is not a number here
            invalid.append(f"{name}={found!r}")
            return value
        return parsed

    def choice(name: str, value: str, allowed: tuple[str, ...]) -> str:
        found = raw(name).lower()
        if found and found not in allowed:
            invalid.append(f"{name}={found!r}")
        return found if found in allowed else value

    return Injection(
        session_start=switch("SGME_INJECT_SESSION_START", default.session_start),
        prompt=switch("SGME_INJECT_PROMPT", default.prompt),
        chars=number("SGME_INJECT_CHARS", default.chars, int, 200),
        min_score=number("SGME_INJECT_MIN_SCORE", default.min_score, float, 0.0),
        seconds=number("SGME_INJECT_SECONDS", default.seconds, float, 0.05),
        scope=choice("SGME_INJECT_SCOPE", default.scope, SCOPES),
        agents=choice("SGME_INJECT_AGENTS", default.agents, AGENT_SCOPES),
        hits=number("SGME_INJECT_HITS", default.hits, int, 1),
        sessions=number("SGME_INJECT_SESSIONS", default.sessions, int, 0),
        snippet_chars=number("SGME_INJECT_SNIPPET_CHARS", default.snippet_chars, int, 40),
        invalid=tuple(invalid),
    )
