"""``sgme mcp``: the MCP server on stdio, for an agent's MCP config
(``{"command": "sgme", "args": ["mcp"]}``). It is a client of the HTTP API
(:mod:`pipeline.client`), so it works against a local ``make run`` and a remote deployment
alike, and the server stays the one writer of the files.

Configured by ``SGME_URL``, ``SGME_TOKEN`` and ``SGME_AGENT_ID`` (:class:`settings.Remote`),
its answers bounded by the ``mcp_*`` settings; ``save_memory`` appends as ``SGME_AGENT_ID``.
Nothing but the protocol goes to stdout: logs go to stderr.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import anyio
from mcp.server.mcpserver import Context

from pipeline import client
from pipeline.mcp import tools
from pipeline.mcp.memory import Memory
from pipeline.settings import Mcp, Remote

DEFAULT_AGENT = "mcp"  #: ``SGME_AGENT_ID`` when unset


class Configured:
    """The tools' :class:`tools.Link` for stdio: one client of the configured server."""

    names_agent = "SGME_AGENT_ID"

    def __init__(self, remote: Remote, sgme: client.AsyncClient) -> None:
        self.remote = remote
        self.sgme = sgme

    @contextlib.asynccontextmanager
    async def connect(self, ctx: Context) -> AsyncIterator[Memory]:
        """The one client (its connections are kept between calls)."""
        yield self.sgme

    def agent_id(self, ctx: Context) -> str:
        """``SGME_AGENT_ID``."""
        return self.remote.agent_id


async def serve(remote: Remote, bounds: Mcp) -> None:
    """Answer MCP on stdin/stdout until stdin closes."""
    async with client.AsyncClient(remote.url, token=remote.token) as sgme:
        await tools.build(Configured(remote, sgme), bounds).run_stdio_async()


def run(remote: Remote, bounds: Mcp) -> None:
    """:func:`serve`, from synchronous code (the ``sgme mcp`` command)."""
    anyio.run(serve, remote, bounds)
