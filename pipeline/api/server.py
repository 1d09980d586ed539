"""Serving the API with bounds on what a client can hold: uvicorn (on uvloop, parsing with
httptools: both C, where the pure-Python h11 and asyncio loop took about half of the server's
time under load, bench/bench_http.py) with a request-head timeout,
a cap on open connections and on those of one client address (an idle or slow one makes room
for a new one), an idle keep-alive timeout, and request bodies refused past a size, or when
they arrive too slowly, before they are parsed.

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
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from pipeline import errors, runtime
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
    that arrives too slowly with 408: it has ``timeout`` seconds, plus one second for every
    ``min_rate`` bytes that came, so a client that dribbles a body in cannot hold a
    connection (and the request's thread) for long."""

    def __init__(self, app: Any, *, max_bytes: int, timeout: float, min_rate: int) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout = timeout
        self.min_rate = max(1, min_rate)

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
        started = loop.time()
        received = 0

        async def limited() -> dict[str, Any]:
            nonlocal received
            deadline = started + self.timeout + received / self.min_rate
            try:
                # a timeout on this task, not wait_for's task of its own around receive()
                async with asyncio.timeout_at(deadline):
                    message: dict[str, Any] = await receive()
            except TimeoutError:
                raise errors.RequestTimeout(
                    f"the request body came too slowly: {received} bytes in "
                    f"{loop.time() - started:.0f} s (a body has http_body_timeout "
                    f"{self.timeout:g} s, then must average http_min_body_rate "
                    f"{self.min_rate} bytes/s)"
                ) from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise errors.RequestTooLarge(self._detail())
            return message

        await self.app(scope, limited, send)

    def _detail(self) -> str:
        return f"the request body is larger than {self.max_bytes} bytes (http_max_request_bytes)"


def guarded_protocol(http: Http, *, base: type[Any] = HttpToolsProtocol) -> type[Any]:
    """uvicorn's HTTP protocol (``base``: httptools', or h11's) with a request-head timeout, a
    connection cap and a cap per client address.

    uvicorn closes idle keep-alive connections, but a connection that never completes a
    request head (a slow or silent client) stays open for ever, and nothing caps how many:
    enough of them exhaust the file descriptors, and then nothing is served at all. Here a
    head must arrive within ``header_timeout``. Past ``max_connections`` — or past
    ``max_connections_per_client`` for one address — an existing connection makes room for
    the new one: the oldest that is waiting for a request head, or else the one whose request
    body is arriving slowest (per byte since its head came). A connection whose request is
    being answered is never closed for room; when every one is, the new connection is. So a
    client holding many slow bodies loses them to the next connection — a health check
    included — instead of locking everyone out.
    """
    # one table per server: every connection, and how many each client address holds
    open_now: collections.OrderedDict[Any, None] = collections.OrderedDict()
    per_client: collections.Counter[str] = collections.Counter()

    class Guarded(base):  # type: ignore[misc]
        _head_timer: asyncio.TimerHandle | None = None
        _seen_cycle: Any = None
        _waiting_head = True
        _body_since: float | None = None  #: when the body of the current request began
        _body_bytes = 0
        _address = ""

        def connection_made(self, transport: asyncio.Transport) -> None:
            super().connection_made(transport)
            peer = transport.get_extra_info("peername")
            self._address = str(peer[0]) if peer else ""
            open_now[self] = None
            per_client[self._address] += 1
            self._waiting()
            if per_client[self._address] > http.max_connections_per_client:
                why = (
                    f"more than {http.max_connections_per_client} connections from {self._address}"
                )
                self._make_room(why, same_client=True)
            if len(open_now) > http.max_connections:
                self._make_room("too many connections", same_client=False)

        def data_received(self, data: bytes) -> None:
            if self._body_since is not None:
                self._body_bytes += len(data)
            super().data_received(data)
            self._track()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._track(done=True)

        def connection_lost(self, exc: Exception | None) -> None:
            self._busy()
            if self in open_now:
                del open_now[self]
                per_client[self._address] -= 1
                if per_client[self._address] <= 0:
                    del per_client[self._address]
            super().connection_lost(exc)

        def _track(self, *, done: bool = False) -> None:
            cycle = self.cycle
            if cycle is not None and cycle is not self._seen_cycle:
                self._seen_cycle = cycle  # a request head arrived: a request is running
                self._busy()
                if cycle.more_body:
                    self._body_since, self._body_bytes = self.loop.time(), 0
            elif done:
                self._waiting()
            if cycle is not None and not cycle.more_body:
                self._body_since = None  # the body is all there

        def _waiting(self) -> None:
            self._waiting_head = True
            self._body_since = None
            if self._head_timer is None:
                self._head_timer = self.loop.call_later(
                    http.header_timeout, self._drop, "no request head in time"
                )

        def _busy(self) -> None:
            self._waiting_head = False
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _slowness(self, now: float) -> float:
            """Seconds per byte of the body arriving now (a body that sent nothing yet counts
            as slowest)."""
            assert self._body_since is not None
            return (now - self._body_since) / max(1, self._body_bytes)

        def _make_room(self, why: str, *, same_client: bool) -> None:
            """Close the connection that should go first, or this new one if none may."""
            now = self.loop.time()
            candidates = [
                c
                for c in open_now
                if c is not self and (not same_client or c._address == self._address)
            ]
            idle = [c for c in candidates if c._waiting_head]
            slow = [c for c in candidates if c._body_since is not None]
            if idle:
                idle[0]._drop(why)  # the oldest: open_now keeps them in order of arrival
            elif slow:
                max(slow, key=lambda c: c._slowness(now))._drop(why)
            else:
                self._drop(why)

        def _drop(self, why: str) -> None:
            self._busy()
            if not self.transport.is_closing():
                log.debug("closing connection from %s: %s", self.client, why)
                self.transport.close()

    return Guarded


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
        loop="uvloop",
        http=guarded_protocol(http),
        timeout_keep_alive=int(max(1, http.keepalive_timeout)),
        backlog=min(2048, http.max_connections),
        h11_max_incomplete_event_size=64 * 1024,
        proxy_headers=False,  # nothing reads the client address; a proxy's headers are not ours
    )


def run(app: FastAPI, settings: Settings, *, log_level: str = "info") -> None:
    """Serve ``app`` in the foreground until SIGINT or SIGTERM."""
    runtime.long_running()
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
        loop="uvloop",
        http="pipeline.api.child:Protocol",
        timeout_keep_alive=int(max(1, http.keepalive_timeout)),
        backlog=min(2048, http.max_connections),
        h11_max_incomplete_event_size=64 * 1024,
        proxy_headers=False,
        workers=processes,
    )
    Multiprocess(supervised, sockets=[supervised.bind_socket()]).run()
