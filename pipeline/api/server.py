"""Serving the API with bounds on what a client can hold: uvicorn with a request-head timeout,
a cap on open connections (the oldest idle one makes room for a new one), an idle keep-alive
timeout, and request bodies refused past a size or a time before they are parsed.

Each bound is an ``http_*`` setting; docs/operations.md says what a client gets at each.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import resource
from typing import Any

import uvicorn
from fastapi import FastAPI
from uvicorn.protocols.http.h11_impl import H11Protocol

from pipeline import errors
from pipeline.api import deps
from pipeline.settings import Http, Settings

log = logging.getLogger(__name__)
#: file descriptors kept for everything but client connections (database, files, logs)
FD_RESERVE = 256

Scope = dict[str, Any]
Receive = Any
Send = Any


class BodyLimit:
    """ASGI middleware: a body larger than ``max_bytes`` is refused with 413 — from
    ``Content-Length`` before any of it is read (so a client that sent ``Expect:
    100-continue`` gets the answer at once), or as a chunked body's bytes arrive — and a body
    that has not arrived within ``timeout`` seconds with 408."""

    def __init__(self, app: Any, *, max_bytes: int, timeout: float) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout = timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            response = deps.problem(
                413, errors.RequestTooLarge.type, "RequestTooLarge", self._detail()
            )
            await response(scope, receive, send)
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        received = 0

        async def limited() -> dict[str, Any]:
            nonlocal received
            try:
                message: dict[str, Any] = await asyncio.wait_for(
                    receive(), max(0.0, deadline - loop.time())
                )
            except TimeoutError:
                raise errors.RequestTimeout(
                    f"the request body did not arrive within {self.timeout:g} s"
                ) from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise errors.RequestTooLarge(self._detail())
            return message

        await self.app(scope, limited, send)

    def _detail(self) -> str:
        return f"the request body is larger than {self.max_bytes} bytes (http_max_request_bytes)"


def guarded_protocol(http: Http) -> type[H11Protocol]:
    """uvicorn's h11 protocol with a request-head timeout and a connection cap.

    uvicorn closes idle keep-alive connections, but a connection that never completes a
    request head (a slow or silent client) stays open for ever, and nothing caps how many:
    enough of them exhaust the file descriptors, and then nothing is served at all. Here a
    head must arrive within ``header_timeout``, and past ``max_connections`` the oldest
    connection that is waiting for a head is closed to make room for the new one.
    """
    # connections waiting for a request head, oldest first (one table per server)
    idle: collections.OrderedDict[GuardedH11, None] = collections.OrderedDict()

    class GuardedH11(H11Protocol):
        _head_timer: asyncio.TimerHandle | None = None
        _seen_cycle: Any = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._waiting()
            if len(self.connections) > http.max_connections:
                oldest = next(iter(idle))  # this one at least is waiting
                oldest._drop("too many connections")

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            self._track()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._track(done=True)

        def connection_lost(self, exc: Exception | None) -> None:
            self._busy()
            super().connection_lost(exc)

        def _track(self, *, done: bool = False) -> None:
            if self.cycle is not None and self.cycle is not self._seen_cycle:
                self._seen_cycle = self.cycle  # a request head arrived: a request is running
                self._busy()
            elif done:
                self._waiting()

        def _waiting(self) -> None:
            idle.pop(self, None)
            idle[self] = None
            if self._head_timer is None:
                self._head_timer = self.loop.call_later(
                    http.header_timeout, self._drop, "no request head in time"
                )

        def _busy(self) -> None:
            idle.pop(self, None)
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _drop(self, why: str) -> None:
            self._busy()
            if not self.transport.is_closing():
                log.debug("closing connection from %s: %s", self.client, why)
                self.transport.close()

    return GuardedH11


def connection_budget(http: Http) -> int:
    """``max_connections``, lowered to what the file descriptor limit allows (the soft limit
    is raised to the hard one first)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard and hard != resource.RLIM_INFINITY:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        soft = hard
    if soft == resource.RLIM_INFINITY:
        return http.max_connections
    allowed = max(16, soft - FD_RESERVE)
    if http.max_connections > allowed:
        log.warning(
            "http_max_connections %d lowered to %d: the file descriptor limit is %d",
            http.max_connections,
            allowed,
            soft,
        )
        return allowed
    return http.max_connections


def config(app: FastAPI, settings: Settings, *, log_level: str = "info") -> uvicorn.Config:
    """The uvicorn configuration that serves ``app`` within the ``http_*`` bounds."""
    import dataclasses

    http = dataclasses.replace(settings.http, max_connections=connection_budget(settings.http))
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=log_level,
        http=guarded_protocol(http),
        timeout_keep_alive=int(max(1, http.keepalive_timeout)),
        backlog=min(2048, http.max_connections),
        h11_max_incomplete_event_size=64 * 1024,
        proxy_headers=False,  # nothing reads the client address; a proxy's headers are not ours
    )


def run(app: FastAPI, settings: Settings, *, log_level: str = "info") -> None:
    """Serve ``app`` in the foreground until SIGINT or SIGTERM."""
    uvicorn.Server(config(app, settings, log_level=log_level)).run()


def run_processes(settings: Settings, *, processes: int, log_level: str = "info") -> None:
    """Serve the API from ``processes`` processes sharing one listening socket, under
    uvicorn's supervisor (which restarts a process that dies), until SIGINT or SIGTERM. Each
    process builds everything from ``settings``, which must also be what
    :meth:`Settings.load` reads from the environment (``sgme api`` puts them there)."""
    from uvicorn.supervisors import Multiprocess

    http = settings.http
    supervised = uvicorn.Config(
        "pipeline.api.child:app",
        factory=True,
        host=settings.host,
        port=settings.port,
        log_level=log_level,
        http="pipeline.api.child:Protocol",
        timeout_keep_alive=int(max(1, http.keepalive_timeout)),
        backlog=min(2048, http.max_connections),
        h11_max_incomplete_event_size=64 * 1024,
        proxy_headers=False,
        workers=processes,
    )
    Multiprocess(supervised, sockets=[supervised.bind_socket()]).run()
