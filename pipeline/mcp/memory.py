"""What the MCP tools read and write through: a :class:`Memory`, the seven operations they
use, with the HTTP client's arguments and the API's own answer models
(:mod:`pipeline.answers`).

- ``sgme mcp`` on stdio: :class:`pipeline.client.AsyncClient` is one — the operations are
  calls of the HTTP API, so the server stays the one writer of the files.
- ``/mcp`` on the API: :class:`pipeline.mcp.local.Local` — the ``/v1`` routes' own functions,
  called in the API's process with the caller the ``/mcp`` guard verified.

This module imports no server code: ``sgme mcp`` is a client.
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping, Sequence
from typing import Any, Protocol

from pipeline import answers, vocabulary


class Memory(Protocol):
    """The operations the tools use (each awaited), named and answered as the client's."""

    def search(
        self,
        query: str,
        *,
        session_key: str | None,
        since: str | None,
        until: str | None,
        limit: int,
        role: vocabulary.Role | None,
        agent_id: str | None,
        context: int,
        speaker: str | None,
        mode: vocabulary.SearchMode | None,
    ) -> Awaitable[answers.Hits]:
        """``GET /v1/search``: the best hits first."""
        ...

    def ref(self, source_ref: str, *, context: int) -> Awaitable[answers.Ref]:
        """``GET /v1/refs/{ref}``: a message with its neighbours."""
        ...

    def sessions(
        self, *, agent_id: str | None, since: str | None, limit: int
    ) -> Awaitable[answers.Sessions]:
        """``GET /v1/sessions``: newest first."""
        ...

    def messages(self, file_id: str, *, after_seq: int, limit: int) -> Awaitable[answers.Messages]:
        """``GET /v1/files/{file_id}/messages``: a page of a file's messages."""
        ...

    def file(self, file_id: str) -> Awaitable[answers.File]:
        """``GET /v1/files/{file_id}``: a file's row."""
        ...

    def append(
        self,
        *,
        agent_id: str,
        session_key: str,
        messages: Sequence[Mapping[str, Any]],
        wait: bool,
    ) -> Awaitable[answers.Appended]:
        """``POST /v1/append``; with ``wait``, answered once the messages are in the file."""
        ...

    def raw(self, file_id: str) -> Awaitable[bytes]:
        """``GET /v1/files/{file_id}/raw``: the file's bytes."""
        ...
