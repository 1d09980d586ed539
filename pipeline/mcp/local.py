"""The tools' :class:`pipeline.mcp.memory.Memory` on the API, for ``/mcp``: the ``/v1``
routes' own functions, called in the API's process (on the thread pool the routes run on) as
the caller the ``/mcp`` guard verified. One token check, no request of the app to itself, each
answer made once (the route's record, read as its answer model).

The caller's scopes are checked here as the routes' dependencies check them (``read``, and
``append`` for a saved memory); the routes' functions narrow every read to the caller's
agents, and the service checks what the tools pass on (a file_id, a source_ref, a query), so
another agent's data is as absent here as over HTTP, and a bad value is refused in the same
words.
"""

from __future__ import annotations

import datetime as dt
import functools
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import anyio.to_thread
import pydantic

from pipeline import answers, auth, errors, validation, vocabulary
from pipeline.api import files, searching, sessions
from pipeline.service import Service

T = TypeVar("T")

#: a time parameter read as the API reads ``since``/``until`` (RFC 3339)
_TIME: pydantic.TypeAdapter[dt.datetime | None] = pydantic.TypeAdapter(searching.Time)


def _time(name: str, value: str | None) -> dt.datetime | None:
    """``value`` as the routes read the time parameter ``name``; refused in their words."""
    try:
        return _TIME.validate_python(value)
    except pydantic.ValidationError as exc:
        raise errors.InvalidInput(f"{name}: {validation.describe(exc)}") from None


class Local:
    """A :class:`Memory` in the API's own process, as ``caller`` (already verified)."""

    def __init__(self, service: Service, caller: auth.Caller) -> None:
        self.service = service
        self.caller = caller

    async def _run(self, scope: str, work: Callable[[], T]) -> T:
        """``work`` on the thread pool the routes run on, once the caller holds ``scope``."""
        self.caller.require(scope)
        return await anyio.to_thread.run_sync(work)

    async def search(
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
    ) -> answers.Hits:
        """``GET /v1/search``'s function."""
        work = functools.partial(
            searching.search_messages,
            self.service,
            self.caller,
            query,
            agent_id=agent_id,
            session_key=session_key,
            role=role,
            since=_time("since", since),
            until=_time("until", until),
            limit=limit,
            context=context,
            speaker=speaker,
            mode=mode,
        )
        return answers.Hits.model_validate(await self._run("read", work))

    async def ref(self, source_ref: str, *, context: int) -> answers.Ref:
        """``GET /v1/refs/{ref}``'s function."""
        work = functools.partial(
            files.get_ref, source_ref, self.service, self.caller, context=context
        )
        return answers.Ref.model_validate(await self._run("read", work))

    async def sessions(
        self, *, agent_id: str | None, since: str | None, limit: int
    ) -> answers.Sessions:
        """``GET /v1/sessions``' function."""
        work = functools.partial(
            sessions.list_sessions,
            self.service,
            self.caller,
            agent_id=agent_id,
            since=_time("since", since),
            limit=limit,
        )
        return answers.Sessions.model_validate(await self._run("read", work))

    async def messages(self, file_id: str, *, after_seq: int, limit: int) -> answers.Messages:
        """``GET /v1/files/{file_id}/messages``' function."""
        work = functools.partial(
            files.get_messages,
            file_id,
            self.service,
            self.caller,
            after_seq=after_seq,
            limit=limit,
        )
        return answers.Messages.model_validate(await self._run("read", work))

    async def file(self, file_id: str) -> answers.File:
        """``GET /v1/files/{file_id}``'s function."""
        work = functools.partial(files.get_file, file_id, self.service, self.caller)
        return answers.File.model_validate(await self._run("read", work))

    async def append(
        self,
        *,
        agent_id: str,
        session_key: str,
        messages: Sequence[Mapping[str, Any]],
        wait: bool = False,
    ) -> answers.Appended:
        """``POST /v1/append``: validated with the API's limits, the agent checked against
        the token, with an idempotency key of its own as the client sends."""
        body = {
            "agent_id": agent_id,
            "session_key": session_key,
            "messages": [dict(m) for m in messages],
            "idempotency_key": f"client:{uuid.uuid4().hex}",
        }

        def work() -> dict[str, Any]:
            parsed = validation.parse_append(body, self.service.settings.limits)
            self.caller.require_agent(parsed.agent_id)
            return self.service.append(parsed, wait=wait).to_json()

        return answers.Appended.model_validate(await self._run("append", work))

    async def raw(self, file_id: str) -> bytes:
        """``GET /v1/files/{file_id}/raw``: the file's committed bytes."""

        def work() -> bytes:
            _, chunks = self.service.raw(file_id, agents=self.caller.agents)
            return b"".join(chunks)

        return await self._run("read", work)
