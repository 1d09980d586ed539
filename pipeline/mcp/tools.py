"""The MCP tools and the resource an agent reads and writes its memory with (docs/design.md
§7, docs/views.md), over either transport. Each tool is a named function of this module
(:func:`search`, :func:`open_message`, :func:`list_recent`, :func:`read_page`, :func:`save`,
:func:`raw_file`) over a :class:`pipeline.mcp.memory.Memory`, reached through a :class:`Link`
that says which memory and which agent: ``sgme mcp`` on stdio calls the configured server's
HTTP API; ``/mcp`` on the API calls the ``/v1`` routes' own functions in process, as the
caller its guard verified. :func:`build` declares them to the MCP SDK.

So the rules of the HTTP API — scopes, another agent's data answering 404, every limit — are
the tools' rules too. Every answer is bounded (the ``mcp_*`` settings,
:class:`pipeline.settings.Mcp`): an LLM's context is small, and a message may be 8 MiB. A
refused call is a tool error whose text says what to do (``is_error`` in the result), never a
crash of the session.
"""

# No ``from __future__ import annotations`` here: the tools' parameters are bounded by the
# settings given to :func:`build`, and the SDK reads a tool's annotations when it is declared
# (a string annotation could not see those bounds).

import datetime as dt
import json
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Annotated, Any, Literal, Protocol, TypeVar

from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ResourceError, ResourceNotFoundError, ToolError
from mcp.types import CallToolResult, TextContent
from pydantic import Field, ValidationError

from pipeline import convention, errors, validation, vocabulary
from pipeline.mcp.memory import Memory
from pipeline.settings import Mcp

T = TypeVar("T")

NAME = "sgme"

INSTRUCTIONS = """\
SGME keeps every conversation turn this agent (and the others the token may read) ever had, \
word for word, in append-only session files. Use it to remember: search_memory finds earlier \
messages by words or phrases (any language) and gives each hit's source_ref \
("file_id:seq"); open_memory shows one message whole with its neighbours; list_sessions and \
read_session browse whole conversations; save_memory keeps a note for later. Times are UTC."""


class Link(Protocol):
    """Where the tools' calls go: the memory for the current request, and the agent a saved
    memory belongs to."""

    #: what names the agent a saved memory belongs to, for a refusal to point at
    names_agent: str

    def connect(self, ctx: Context) -> AbstractAsyncContextManager[Memory]:
        """The memory, acting for this request's caller."""
        ...

    def agent_id(self, ctx: Context) -> str:
        """The agent_id ``save_memory`` appends as (a :class:`ToolError` saying what to do
        when the caller must name one)."""
        ...


def refusal(exc: errors.SgmeError) -> str:
    """What the model reads when a call is refused: what happened and what to do."""
    if isinstance(exc, errors.NotFound):
        return f"not found: {exc.detail}"
    if isinstance(exc, errors.Unauthorized | errors.Forbidden):
        return f"not allowed: {exc.detail}"
    if isinstance(exc, errors.TransientError):
        return f"SGME cannot answer right now ({exc.detail}); try again in a moment"
    return exc.detail


Answer = Annotated[CallToolResult, dict[str, Any]]


def answer(data: dict[str, Any]) -> CallToolResult:
    """A tool's answer: ``data`` as structured content, and as compact JSON text for the
    model (the SDK's own text is indented JSON, longer for nothing in a small context)."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=data)


class Server(MCPServer[Any]):
    """The SDK's server, its refusals of arguments said as the API says them: one line per
    problem (``limit: Input should be greater than or equal to 1``), without pydantic's
    links to its own documentation."""

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Context[Any, Any] | None = None
    ) -> Any:
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            cause = exc.__cause__
            if not isinstance(cause, ValidationError):
                raise
            said = validation.describe(cause)
            raise ToolError(f"Error executing tool {name}: {said}") from cause


def cut(text: str, limit: int) -> tuple[str, int]:
    """``text`` cut to ``limit`` characters, and how many were left out."""
    if len(text) <= limit:
        return text, 0
    return text[:limit], len(text) - limit


def _message(message: Any, limit: int) -> dict[str, Any]:
    content, left = cut(message.content, limit)
    shown: dict[str, Any] = {
        "source_ref": message.source_ref,
        "seq": message.seq,
        "ts": message.ts,
        "role": message.role,
        "content": content,
    }
    if message.tool_name:
        shown["tool_name"] = message.tool_name
    if left:
        shown["truncated_chars"] = left
    return shown


def _turns(hit: Any, context: int) -> dict[str, Any]:
    """A search hit's turns around it (``context``), as search_memory shows them: none asked,
    none shown."""
    if not context:
        return {}
    return {
        side: [
            {"source_ref": t.source_ref, "ts": t.ts, "role": t.role, "text": t.text}
            for t in getattr(hit, side, None) or []
        ]
        for side in ("before", "after")
    }


# ---------------------------------------------------------------------------------------------
# the tools, each a function of the memory it reads; an error is a pipeline.errors class


async def _where(memory: Memory, file_ids: set[str]) -> dict[str, str | None]:
    """The working directory of each file's session, where its source recorded one."""
    found: dict[str, str | None] = {}
    for file_id in sorted(file_ids):
        try:
            found[file_id] = convention.cwd((await memory.file(file_id)).metadata)
        except (errors.NotFound, errors.Gone):  # erased since the search: none to show
            found[file_id] = None
    return found


async def search(
    memory: Memory,
    query: str,
    *,
    session_key: str | None = None,
    since: str | None = None,
    until: str | None = None,
    limit: int = 10,
    role: vocabulary.Role | None = None,
    agent_id: str | None = None,
    speaker: str | None = None,
    context: int = 0,
    mode: vocabulary.SearchMode | None = None,
) -> dict[str, Any]:
    """``search_memory``: the best hits, each with where its session ran and the ``context``
    turns around it; the window a date in the query named, when it named one; how they were
    ranked (``mode``: lexical or hybrid, docs/search.md), as the API answered it."""
    found = await memory.search(
        query,
        session_key=session_key,
        since=since,
        until=until,
        limit=limit,
        role=role,
        agent_id=agent_id,
        context=context,
        speaker=speaker,
        mode=mode,
    )
    cwds = await _where(memory, {h.file_id for h in found.hits})
    hits = [
        {
            "source_ref": h.source_ref,
            "ts": h.ts,
            "role": h.role,
            "session_key": h.session_key,
            "agent_id": h.agent_id,
            "cwd": cwds.get(h.file_id),
            "snippet": h.snippet,
            **_turns(h, context),
        }
        for h in found.hits
    ]
    dated = found.window
    window = None if dated is None else {"since": dated.since, "until": dated.until}
    shown: dict[str, Any] = {"hits": hits, "count": len(hits)}
    if window:
        shown["window"] = window
    if found.ranking is not None:
        shown["ranking"] = found.ranking.model_dump()
    return shown


async def open_message(
    memory: Memory, bounds: Mcp, source_ref: str, *, context: int = 2
) -> dict[str, Any]:
    """``open_memory``: one message whole (to ``bounds.message_chars``), its neighbours cut
    to ``bounds.neighbour_chars``."""
    found = await memory.ref(source_ref, context=context)
    return {
        "file_id": found.file_id,
        "session_key": found.session_key,
        "agent_id": found.agent_id,
        "message": _message(found.message, bounds.message_chars),
        "before": [_message(m, bounds.neighbour_chars) for m in found.before],
        "after": [_message(m, bounds.neighbour_chars) for m in found.after],
    }


async def list_recent(
    memory: Memory, *, agent_id: str | None = None, since: str | None = None, limit: int = 20
) -> dict[str, Any]:
    """``list_sessions``: sessions newest first, and how many match."""
    page = await memory.sessions(agent_id=agent_id, since=since, limit=limit)
    listed = [
        {
            "file_id": s.file_id,
            "session_key": s.session_key,
            "title": s.title,
            "agent_id": s.agent_id,
            "source_type": s.source_type,
            "cwd": s.cwd,
            "started_at": s.started_at,
            "ended_at": s.ended_at,
            "message_count": s.message_count,
        }
        for s in page.sessions
    ]
    return {"sessions": listed, "total": page.total}


async def read_page(
    memory: Memory, bounds: Mcp, file_id: str, *, after_seq: int = 0, limit: int = 50
) -> dict[str, Any]:
    """``read_session``: the messages after ``after_seq``, each cut to
    ``bounds.page_message_chars``, the page to ``bounds.page_chars`` (one message at least);
    ``next_after_seq`` is null at the end."""
    page = await memory.messages(file_id, after_seq=after_seq, limit=limit)
    file = await memory.file(file_id)
    shown: list[dict[str, Any]] = []
    used = 0
    for message in page.messages:
        item = _message(message, bounds.page_message_chars)
        used += len(item["content"])
        if shown and used > bounds.page_chars:
            break
        shown.append(item)
    last = shown[-1]["seq"] if shown else None
    more = last is not None and last < file.message_count
    return {
        "file_id": file_id,
        "session_key": file.session_key,
        "cwd": convention.cwd(file.metadata),
        "message_count": file.message_count,
        "messages": shown,
        "next_after_seq": last if more else None,
    }


def check_note(content: str) -> None:
    """Refuse a note with nothing in it: an append may hold an empty message (a tool that
    returned nothing happened), but an empty note is a mistake, kept for ever if stored."""
    if not content.strip():
        raise errors.InvalidInput(
            "content is empty: there is nothing to remember; say what to keep"
        )


async def save(
    memory: Memory,
    content: str,
    *,
    agent_id: str,
    session_key: str | None = None,
    role: Literal["user", "assistant", "system"] = "user",
    today: dt.date | None = None,
) -> dict[str, Any]:
    """``save_memory``: ``content`` appended as a message of ``session_key`` (default:
    ``saved-<today, UTC>``), answered once it is in its file, so the next search finds it."""
    check_note(content)
    day = today or dt.datetime.now(dt.UTC).date()
    key = session_key or f"saved-{day:%Y-%m-%d}"
    messages = [{"role": role, "content": content}]
    # answered once the note is in its file, so the model's next search finds it
    done = await memory.append(agent_id=agent_id, session_key=key, messages=messages, wait=True)
    return {"source_ref": done.source_refs[0], "session_key": key, "agent_id": agent_id}


async def raw_file(memory: Memory, bounds: Mcp, file_id: str) -> str:
    """The ``sgme://files/{file_id}`` resource: the file's Markdown, its first
    ``bounds.resource_bytes`` bytes and a note of what was cut."""
    data = await memory.raw(file_id)
    most = bounds.resource_bytes
    if len(data) <= most:
        return data.decode("utf-8", "replace")
    shown = data[:most].decode("utf-8", "ignore")
    left = len(data) - most
    return f"{shown}\n\n<!-- cut: {left} more bytes; read_session pages through all of it -->\n"


def build(link: Link, bounds: Mcp) -> MCPServer[Any]:
    """The MCP server: the five tools and the resource template declared to the SDK (their
    parameters bounded by ``bounds``, their descriptions the model's), each call through
    ``link``; a refusal is a tool error saying what to do."""
    server: MCPServer[Any] = Server(NAME, instructions=INSTRUCTIONS, version="0.1.0")

    async def calling(ctx: Context, call: Callable[[Memory], Awaitable[T]]) -> T:
        try:
            async with link.connect(ctx) as memory:
                return await call(memory)
        except errors.SgmeError as exc:
            raise ToolError(refusal(exc)) from None

    @server.tool()
    async def search_memory(
        query: Annotated[
            str,
            Field(
                min_length=1,
                max_length=validation.MAX_QUERY_CHARS,
                description='a question, words or "quoted phrases", in any language; the '
                "messages that best answer it come first (they need not hold every word)",
            ),
        ],
        ctx: Context,
        session_key: Annotated[
            str | None,
            Field(
                max_length=validation.DEFAULT_LIMITS.max_session_key,
                description="only this session (a session_key a hit showed)",
            ),
        ] = None,
        since: Annotated[
            str | None,
            Field(max_length=40, description="only messages at or after this time (RFC 3339)"),
        ] = None,
        until: Annotated[
            str | None,
            Field(max_length=40, description="only messages at or before this time (RFC 3339)"),
        ] = None,
        limit: Annotated[int, Field(ge=1, le=bounds.max_search_hits)] = 10,
        role: Annotated[
            vocabulary.Role | None,
            Field(description="only messages of this role (user: what the person said)"),
        ] = None,
        agent_id: Annotated[
            str | None,
            Field(
                pattern=validation.AGENT_ID_PATTERN,
                description="only this agent's messages (default: all you may read)",
            ),
        ] = None,
        speaker: Annotated[
            str | None,
            Field(
                max_length=64,
                description="only what this person said (a speaker's name the conversation names)",
            ),
        ] = None,
        context: Annotated[
            int,
            Field(
                ge=0,
                le=3,
                description="turns before and after each hit to return with it (an answer "
                "is often the turn after the one that names its subject)",
            ),
        ] = 0,
        mode: Annotated[
            vocabulary.SearchMode | None,
            Field(
                description="lexical: by the words only; hybrid: by words and meaning "
                "(a paraphrase finds the message too; without the server's embedder: by words, "
                "and ranking.fallback says so); "
                "default: hybrid when the server has an embedder"
            ),
        ] = None,
    ) -> Answer:
        """Search every earlier conversation for messages about something: what was decided,
        said, tried or preferred before. Use it whenever the user refers to earlier work, or
        when knowing what was said before would help. Returns the best hits first, each
        with its source_ref ("file_id:seq"), time (UTC), role, session_key, the session's
        working directory (cwd) where it was recorded, and a snippet of the message;
        open_memory with a source_ref shows the message whole, with what was said around it."""
        found = await calling(
            ctx,
            lambda memory: search(
                memory,
                query,
                session_key=session_key,
                since=since,
                until=until,
                limit=limit,
                role=role,
                agent_id=agent_id,
                speaker=speaker,
                context=context,
                mode=mode,
            ),
        )
        return answer(found)

    @server.tool(
        description=f"""Open one remembered message whole (up to {bounds.message_chars:,} \
characters), with the messages just before and after it in its conversation (up to \
{bounds.neighbour_chars:,} characters each), to read a search hit in context. Returns the \
session it belongs to and the messages in order, the opened one marked; read_session pages \
through the whole conversation."""
    )
    async def open_memory(
        source_ref: Annotated[
            str,
            Field(
                max_length=100,
                description='a message\'s "file_id:seq", as a search hit gives it',
            ),
        ],
        ctx: Context,
        context: Annotated[
            int, Field(ge=0, le=bounds.max_context, description="messages to show on each side")
        ] = 2,
    ) -> Answer:
        """Open one message with its neighbours (the description above is the model's)."""
        found = await calling(
            ctx, lambda memory: open_message(memory, bounds, source_ref, context=context)
        )
        return answer(found)

    @server.tool()
    async def list_sessions(
        ctx: Context,
        agent_id: Annotated[
            str | None,
            Field(
                pattern=validation.AGENT_ID_PATTERN,
                description="only this agent's sessions (default: all you may read)",
            ),
        ] = None,
        since: Annotated[
            str | None,
            Field(
                max_length=40, description="only sessions active at or after this time (RFC 3339)"
            ),
        ] = None,
        limit: Annotated[int, Field(ge=1, le=bounds.max_sessions)] = 20,
    ) -> Answer:
        """List conversations, newest first: to see what was worked on recently, or to find
        a session to read. Each has its file_id (for read_session), session_key, title (the
        source's title or its first words), the working directory it ran in (cwd, where it
        was recorded), first and last message times (UTC) and message count; "total" says
        how many match."""
        found = await calling(
            ctx, lambda memory: list_recent(memory, agent_id=agent_id, since=since, limit=limit)
        )
        return answer(found)

    @server.tool(
        description=f"""Read a conversation in order, a page at a time: the messages after \
after_seq, each with its source_ref, time, role and text (long ones cut at \
{bounds.page_message_chars:,} characters; a page holds about {bounds.page_chars:,} characters \
at most). Pass next_after_seq back as after_seq for the next page; it is null at the end."""
    )
    async def read_session(
        file_id: Annotated[
            str, Field(max_length=100, description="a session's file_id (list_sessions gives it)")
        ],
        ctx: Context,
        after_seq: Annotated[
            int, Field(ge=0, description="start after this message number (0: the beginning)")
        ] = 0,
        limit: Annotated[int, Field(ge=1, le=bounds.max_page_messages)] = 50,
    ) -> Answer:
        """Read a page of a conversation (the description above is the model's)."""
        found = await calling(
            ctx,
            lambda memory: read_page(memory, bounds, file_id, after_seq=after_seq, limit=limit),
        )
        return answer(found)

    @server.tool()
    async def save_memory(
        content: Annotated[str, Field(description="what to remember, in plain words")],
        ctx: Context,
        session_key: Annotated[
            str | None,
            Field(description="the session to add it to (default: one session per day of notes)"),
        ] = None,
        role: Literal["user", "assistant", "system"] = "user",
    ) -> Answer:
        """Keep something for later — a decision, a preference, a fact learned — as a message
        in a session of saved memories, stored for good and found by search_memory from then
        on. Returns its source_ref."""
        try:
            check_note(content)  # before the agent is asked for: the first mistake to fix
            agent_id = link.agent_id(ctx)
            async with link.connect(ctx) as memory:
                done = await save(
                    memory, content, agent_id=agent_id, session_key=session_key, role=role
                )
        except errors.Forbidden as exc:
            said = refusal(exc)
            if not exc.scope:  # the agent, not a scope: say where the agent came from
                said += f" (a saved memory belongs to the agent {link.names_agent} names)"
            raise ToolError(said) from None
        except errors.SgmeError as exc:
            raise ToolError(refusal(exc)) from None
        return answer(done)

    @server.resource(
        "sgme://files/{file_id}",
        name="session file",
        description="A session's file: the raw Markdown, exactly as stored (the first "
        f"{bounds.resource_bytes:,} bytes).",
        mime_type="text/markdown",
    )
    async def session_file(file_id: str, ctx: Context) -> str:
        try:
            async with link.connect(ctx) as memory:
                return await raw_file(memory, bounds, file_id)
        except errors.NotFound as exc:
            raise ResourceNotFoundError(refusal(exc)) from None
        except errors.SgmeError as exc:
            raise ResourceError(refusal(exc)) from None

    return server
