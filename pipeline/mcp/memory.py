"""What the MCP tools read and write through: a :class:`Memory`, the seven operations they
use, answered with the API's own answer models (:mod:`pipeline.answers`).

- :class:`OverHttp` — ``sgme mcp`` on stdio: the operations are calls of the HTTP API
  (:class:`pipeline.client.AsyncClient`), so the server stays the one writer of the files.
- :class:`pipeline.mcp.local.Local` — ``/mcp`` on the API: the ``/v1`` routes' own functions,
  called in the API's process with the caller the ``/mcp`` guard verified.

This module imports no server code: ``sgme mcp`` is a client.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, Protocol

from pipeline import answers, client

Role = Literal["user", "assistant", "tool", "system"]


class Memory(Protocol):
    """The operations the tools use, with the HTTP client's arguments and answers."""

    async def search(
        self,
        query: str,
        *,
        session_key: str | None,
        since: str | None,
        until: str | None,
        limit: int,
        role: Role | None,
        agent_id: str | None,
    ) -> answers.Hits:
        """``GET /v1/search``: the best hits first."""
        ...

    async def ref(self, source_ref: str, *, context: int) -> answers.Ref:
        """``GET /v1/refs/{ref}``: a message with its neighbours."""
        ...

    async def sessions(
        self, *, agent_id: str | None, since: str | None, limit: int
    ) -> answers.Sessions:
        """``GET /v1/sessions``: newest first."""
        ...

    async def messages(self, file_id: str, *, after_seq: int, limit: int) -> answers.Messages:
        """``GET /v1/files/{file_id}/messages``: a page of a file's messages."""
        ...

    async def file(self, file_id: str) -> answers.File:
        """``GET /v1/files/{file_id}``: a file's row."""
        ...

    async def append(
        self, *, agent_id: str, session_key: str, messages: Sequence[Mapping[str, Any]]
    ) -> answers.Appended:
        """``POST /v1/append?wait=flushed``: answered once the messages are in the file."""
        ...

    async def raw(self, file_id: str) -> bytes:
        """``GET /v1/files/{file_id}/raw``: the file's bytes."""
        ...


class OverHttp:
    """A :class:`Memory` over the HTTP API: each operation one call of ``sgme``."""

    def __init__(self, sgme: client.AsyncClient) -> None:
        self.sgme = sgme

    async def search(
        self,
        query: str,
        *,
        session_key: str | None,
        since: str | None,
        until: str | None,
        limit: int,
        role: Role | None,
        agent_id: str | None,
    ) -> answers.Hits:
        """``GET /v1/search``."""
        return await self.sgme.search(
            query,
            session_key=session_key,
            since=since,
            until=until,
            limit=limit,
            role=role,
            agent_id=agent_id,
        )

    async def ref(self, source_ref: str, *, context: int) -> answers.Ref:
        """``GET /v1/refs/{ref}``."""
        return await self.sgme.ref(source_ref, context=context)

    async def sessions(
        self, *, agent_id: str | None, since: str | None, limit: int
    ) -> answers.Sessions:
        """``GET /v1/sessions``."""
        return await self.sgme.sessions(agent_id=agent_id, since=since, limit=limit)

    async def messages(self, file_id: str, *, after_seq: int, limit: int) -> answers.Messages:
        """``GET /v1/files/{file_id}/messages``."""
        return await self.sgme.messages(file_id, after_seq=after_seq, limit=limit)

    async def file(self, file_id: str) -> answers.File:
        """``GET /v1/files/{file_id}``."""
        return await self.sgme.file(file_id)

    async def append(
        self, *, agent_id: str, session_key: str, messages: Sequence[Mapping[str, Any]]
    ) -> answers.Appended:
        """``POST /v1/append?wait=flushed``."""
        return await self.sgme.append(
            agent_id=agent_id, session_key=session_key, messages=messages, wait=True
        )

    async def raw(self, file_id: str) -> bytes:
        """``GET /v1/files/{file_id}/raw``."""
        return await self.sgme.raw(file_id)
