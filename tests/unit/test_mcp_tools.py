"""The MCP tools (:mod:`pipeline.mcp.tools`) as a model sees them: the ``mcp_*`` settings they
are built with bound their arguments and are named in their descriptions."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import anyio
from mcp.server.mcpserver import Context

from pipeline.mcp import tools
from pipeline.mcp.memory import Memory
from pipeline.settings import Mcp


class Unused:
    """A :class:`tools.Link` that no call reaches: listing the tools calls nothing."""

    names_agent = "nothing"

    @contextlib.asynccontextmanager
    async def connect(self, ctx: Context) -> AsyncIterator[Memory]:
        raise AssertionError("no tool was called")
        yield  # pragma: no cover

    def agent_id(self, ctx: Context) -> str:
        raise AssertionError("no tool was called")


def _listed(bounds: Mcp) -> dict[str, Any]:
    server = tools.build(Unused(), bounds)

    async def listing() -> dict[str, Any]:
        return {tool.name: tool for tool in await server.list_tools()}

    return anyio.run(listing)


def test_the_settings_bound_the_arguments_and_are_in_the_descriptions() -> None:
    bounds = Mcp(
        max_search_hits=7,
        max_context=3,
        max_sessions=9,
        max_page_messages=11,
        message_chars=1234,
        page_chars=5678,
    )
    listed = _listed(bounds)
    assert set(listed) == {
        "search_memory",
        "open_memory",
        "list_sessions",
        "read_session",
        "save_memory",
    }

    def maximum(tool: str, argument: str) -> Any:
        return listed[tool].input_schema["properties"][argument]["maximum"]

    assert maximum("search_memory", "limit") == 7
    assert maximum("open_memory", "context") == 3
    assert maximum("list_sessions", "limit") == 9
    assert maximum("read_session", "limit") == 11
    assert "up to 1,234 characters" in listed["open_memory"].description
    assert "about 5,678 characters" in listed["read_session"].description
    # the defaults, as docs/views.md states them
    default = _listed(Mcp())
    assert default["search_memory"].input_schema["properties"]["limit"]["maximum"] == 50
    assert "up to 20,000 characters" in default["open_memory"].description


def test_search_memory_takes_a_mode() -> None:
    mode = _listed(Mcp())["search_memory"].input_schema["properties"]["mode"]
    assert mode["anyOf"][0]["enum"] == ["lexical", "hybrid"]
    assert "default: hybrid when the server has an embedder" in mode["description"]
