"""Where a client of the HTTP API finds its server and who it is: ``SGME_URL``, ``SGME_TOKEN``
and ``SGME_AGENT_ID``, read here and nowhere else.

Both kinds of client read them — a command of ours (``sgme mcp``: :class:`settings.Remote
<pipeline.settings.Remote>`) and a capture hook (:mod:`pipeline.capture.config`) — and a hook
has about a second, so this module imports nothing but the standard library (not
:mod:`pipeline.settings`, which loads the server's domain modules).
"""

from __future__ import annotations

from collections.abc import Mapping

DEFAULT_URL = "http://127.0.0.1:8765"  #: the server a client talks to by default


def url(env: Mapping[str, str]) -> str:
    """``SGME_URL``, else :data:`DEFAULT_URL`."""
    return env.get("SGME_URL", "").strip() or DEFAULT_URL


def token(env: Mapping[str, str]) -> str | None:
    """``SGME_TOKEN``, or None when it is unset or blank."""
    return env.get("SGME_TOKEN", "").strip() or None


def agent_id(env: Mapping[str, str], default: str) -> str:
    """``SGME_AGENT_ID``, else ``default`` (the client's own name for its agent)."""
    return env.get("SGME_AGENT_ID", "").strip() or default
