"""``sgme mcp``: what an agent runs to read and write its memory (the MCP server on stdio)."""

from __future__ import annotations

from pipeline.cli.context import Add, Context


def cmd_mcp(ctx: Context) -> int:
    """Serve MCP on stdin/stdout as a client of the HTTP API."""
    import logging

    from pipeline.mcp import stdio
    from pipeline.settings import Remote

    # stderr is the agent's log: a line per HTTP call would drown what matters
    logging.getLogger("httpx").setLevel(logging.WARNING)
    stdio.run(Remote.load(agent_id=stdio.DEFAULT_AGENT), ctx.settings().mcp)
    return 0


def register(add: Add) -> None:
    """Declare ``sgme mcp``."""
    add(
        "mcp",
        cmd_mcp,
        "the MCP server on stdin/stdout, for an agent's MCP config; a client of the HTTP API "
        "at SGME_URL (default http://127.0.0.1:8765) with SGME_TOKEN, saving as SGME_AGENT_ID "
        "(default mcp)",
    )
