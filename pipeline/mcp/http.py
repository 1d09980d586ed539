"""The MCP server on the API, at ``/mcp`` (streamable HTTP), with the API's own bearer tokens.

* **Auth.** A request to ``/mcp`` presents the same token as ``/v1`` (``Authorization:
  Bearer sgme_…``) and is checked by the same verifier before the MCP SDK sees it: while auth
  is on, no token (or a bad one) is the API's 401 with its ``WWW-Authenticate: Bearer``
  challenge. While it is off (no token made, loopback only), ``/mcp`` is open as ``/v1`` is.
* **Scopes and agents, per tool.** Each tool calls the ``/v1`` routes' own functions in
  process (:class:`pipeline.mcp.local.Local`) as the caller the guard verified — the token is
  checked once, per request — so ``read`` and ``append`` are checked per call as they are for
  a client, and another agent's data answers as if it did not exist.
* **Stateless.** Every POST is answered on its own (JSON, no session to keep): ``sgme api
  --workers N`` runs several processes behind one port, and an MCP session kept in one of them
  would be unknown to the next.
* **Cross-site requests** from a browser are refused, and a body that is not JSON, by the
  API's own :class:`pipeline.api.security.SameOrigin` (403, 415), before this module sees
  them: a web page must not save memories through a visitor's loopback server.
* **A plug-in of the API** (entry point group ``sgme.api``, :data:`pipeline.api.app.PLUGINS`):
  the tools build on the API's routes, so the API cannot import them; it loads :func:`mount`
  by name instead.

``save_memory`` appends as the agent the request names in ``X-SGME-Agent-Id``, else the
token's only agent, else :data:`DEFAULT_AGENT`.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp
from mcp.server.transport_security import TransportSecuritySettings
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from pipeline import auth, errors, validation
from pipeline.api import security
from pipeline.mcp import tools
from pipeline.mcp.local import Local
from pipeline.service import Service

PATH = "/mcp"
AGENT_HEADER = "x-sgme-agent-id"
AGENT_HEADER_NAME = "X-SGME-Agent-Id"  #: as a person writes it in a client's config
DEFAULT_AGENT = "mcp"  #: the agent a saved memory belongs to when nothing names one
_CALLER = "sgme_caller"  #: where the verified caller waits in the request's state


class Guard:
    """ASGI: the API's bearer token checked (and the caller kept for the tools) before the
    MCP transport answers."""

    def __init__(self, app: ASGIApp, refuse: Callable[[errors.SgmeError], Response]) -> None:
        self.app = app
        self.refuse = refuse

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        try:
            caller = await security.caller(request)
        except errors.SgmeError as exc:
            await self.refuse(exc)(scope, receive, send)
            return
        scope.setdefault("state", {})[_CALLER] = caller
        await self.app(scope, receive, send)


class InProcess:
    """The tools' :class:`tools.Link` on the API: the service of this app, as the caller of
    the MCP request (verified by :class:`Guard`)."""

    names_agent = "the X-SGME-Agent-Id header (else the token's only agent, else 'mcp')"

    def __init__(self, service: Service) -> None:
        self.service = service

    @staticmethod
    def _request(ctx: Context) -> Request:
        request = ctx.request_context.request
        assert isinstance(request, Request), "the /mcp tools run only over HTTP"
        return request

    @staticmethod
    def _caller(request: Request) -> auth.Caller:
        caller: auth.Caller = getattr(request.state, _CALLER)  # the Guard put it there
        return caller

    @contextlib.asynccontextmanager
    async def connect(self, ctx: Context) -> AsyncIterator[Local]:
        """The service, as this request's caller."""
        yield Local(self.service, self._caller(self._request(ctx)))

    def agent_id(self, ctx: Context) -> str:
        """``X-SGME-Agent-Id``, else the token's only agent, else :data:`DEFAULT_AGENT` (a
        token of every agent, or no token while auth is off); a token of several agents must
        name one in the header."""
        request = self._request(ctx)
        named = request.headers.get(AGENT_HEADER)
        if named:
            try:
                validation.check_agent_id(named)
            except errors.InvalidInput as exc:
                raise ToolError(f"{AGENT_HEADER_NAME}: {exc.detail}") from None
            return named
        caller = self._caller(request)
        if caller.agents is not None:
            if len(caller.agents) == 1:
                return next(iter(caller.agents))
            held = ", ".join(sorted(caller.agents))
            raise ToolError(
                f"this token holds several agents ({held}): name the one a saved memory "
                f"belongs to in the {AGENT_HEADER_NAME} header of the MCP connection"
            )
        return DEFAULT_AGENT


def mount(app: FastAPI, refuse: Callable[[errors.SgmeError], Response]) -> None:
    """Serve the MCP server at ``/mcp`` on ``app`` (made by :func:`pipeline.api.app.create_app`,
    its service in ``app.state``), its session manager run by the app's lifespan (a new one
    each time the app starts)."""
    service: Service = app.state.service
    server = tools.build(InProcess(service), service.settings.mcp)
    http_bound = service.settings.http.max_request_bytes

    def transport() -> None:
        # The SDK's own Host/Origin check is off: the API's Host allowlist and its SameOrigin
        # check cover /mcp.
        server.streamable_http_app(
            streamable_http_path=PATH,
            stateless_http=True,
            json_response=True,
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
            # the API's own bound (http_max_request_bytes, answered as a problem document)
            # holds: the SDK's 4 MiB refused, as plain text, a note a message may hold (8 MiB)
            max_request_body_size=http_bound,
        )

    async def handle(scope: Scope, receive: Receive, send: Send) -> None:
        await StreamableHTTPASGIApp(server.session_manager)(scope, receive, send)

    app.router.routes.append(Route(PATH, endpoint=Guard(handle, refuse), methods=None))
    previous = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(started: Any) -> AsyncIterator[Any]:
        transport()
        async with server.session_manager.run(), previous(started) as state:
            yield state

    app.router.lifespan_context = lifespan
