"""What live capture reads from its environment — not the server's settings: capture is a
client of a server over HTTP, wherever that runs.

This is the one place outside :mod:`pipeline.settings` that reads the environment, on
purpose: a capture runs inside an agent's hook with a budget of about a second, and
``pipeline.settings`` imports the server's domain modules (the index, the journal), which
alone take a good part of that.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any


@dataclasses.dataclass(frozen=True)
class Agent:
    """What a client running beside an agent (``sgme capture``) reads from its environment —
    not the server's settings: it talks to a server over HTTP, wherever that runs."""

    url: str  #: ``SGME_URL``, default ``http://127.0.0.1:8765``
    token: str | None  #: ``SGME_TOKEN``
    agent_id: str  #: ``SGME_AGENT_ID``, default the agent's own name
    spool_dir: Path  #: ``SGME_SPOOL_DIR``, default ``~/.local/state/sgme/spool``
    spool_max_bytes: int  #: ``SGME_SPOOL_MAX_BYTES``, default 256 MiB
    seconds: float  #: ``SGME_CAPTURE_SECONDS``: one capture's time budget, default 10
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
    return Agent(
        url=(env.get("SGME_URL", "").strip() or "http://127.0.0.1:8765").rstrip("/"),
        token=env.get("SGME_TOKEN", "").strip() or None,
        agent_id=env.get("SGME_AGENT_ID", "").strip() or default_agent_id,
        spool_dir=Path(env.get("SGME_SPOOL_DIR", "").strip() or state / "sgme" / "spool"),
        spool_max_bytes=number("SGME_SPOOL_MAX_BYTES", 256 * 1024 * 1024, int),
        seconds=number("SGME_CAPTURE_SECONDS", 10.0, float),
        invalid=tuple(invalid),
    )


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
