"""Serving the API with bounds on what a client can hold: uvicorn (on uvloop, parsing with
httptools: both C, where the pure-Python h11 and asyncio loop took about half of the server's
time under load, bench/bench_http.py) with a request-head timeout and bounds on a head's size
and fields, a cap on open connections and on those of one client address (an idle or slow one
makes room for a new one), a cap on the answers one address has streaming, an idle keep-alive
timeout, and request bodies refused past a size, or when they arrive too slowly, before they
are parsed.

Each bound is an ``http_*`` setting; docs/operations.md says what a client gets at each.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import math
import re
import resource
from collections.abc import MutableMapping
from http import HTTPStatus
from typing import Any, NoReturn

import h11
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
    100-continue`` gets the answer at once), or as soon as a chunked body's bytes pass it —
    and a body that arrives too slowly with 408: it has ``timeout`` seconds, plus one second
    for every ``min_rate`` bytes that came, so a client that dribbles a body in cannot hold a
    connection (and the request's thread) for long.

    Only the request's body is timed: once it is all there, ``receive()`` is the wait for the
    client to disconnect, which a streamed answer (a raw download, ``GET /mcp``) keeps up for
    as long as it sends, and which must not end it.

    The refusal is answered here, the moment the bound is passed, with ``Connection: close``
    (the rest of the body is not parsed): whatever the route does with the error its
    ``receive()`` raised — a route whose body FastAPI parses would turn it into a 400 — its own
    answer goes nowhere. What the client still sends of the body is read and dropped for at
    most ``linger`` seconds before the connection closes (:meth:`_answer`), so that a client
    still sending reads its refusal rather than a reset."""

    def __init__(
        self, app: Any, *, max_bytes: int, timeout: float, min_rate: int, linger: float
    ) -> None:
        self.app = app
        self.linger = linger
        self.max_bytes = max_bytes
        self.timeout = timeout
        self.min_rate = max(1, min_rate)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._answer(errors.RequestTooLarge(self._detail()), scope, receive, send)
            return
        loop = asyncio.get_running_loop()
        started = loop.time()
        received = 0
        body_done = False
        answered = False  #: a refusal of ours was sent: the app's own answer goes nowhere
        response_started = False

        async def refuse(exc: errors.SgmeError) -> NoReturn:
            nonlocal answered
            if not response_started:
                answered = True
                await self._answer(exc, scope, receive, send, close=True)
            raise exc

        async def limited() -> dict[str, Any]:
            nonlocal received, body_done
            if body_done:  # the wait for a disconnect: no body to bound
                found: dict[str, Any] = await receive()
                return found
            deadline = started + self.timeout + received / self.min_rate
            try:
                # a timeout on this task, not wait_for's task of its own around receive()
                async with asyncio.timeout_at(deadline):
                    message: dict[str, Any] = await receive()
            except TimeoutError:
                await refuse(
                    errors.RequestTimeout(
                        f"the request body came too slowly: {received} bytes in "
                        f"{loop.time() - started:.0f} s (a body has http_body_timeout "
                        f"{self.timeout:g} s, then must average http_min_body_rate "
                        f"{self.min_rate} bytes/s)"
                    )
                )
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    await refuse(errors.RequestTooLarge(self._detail()))
                body_done = not message.get("more_body", False)
            else:
                body_done = True  # gone: there is no more body to wait for
            return message

        async def answering(message: dict[str, Any]) -> None:
            nonlocal response_started
            if answered:
                return
            response_started = True
            await send(message)

        try:
            await self.app(scope, limited, answering)
        except Exception:
            if not answered:
                raise
            # what the route made of our refusal (the error itself, or one of its own
            # around it): the client has its answer
            log.debug("a request refused for its body ended with", exc_info=True)

    async def _answer(
        self,
        exc: errors.SgmeError,
        scope: Scope,
        receive: Receive,
        send: Send,
        *,
        close: bool = False,
    ) -> None:
        """``exc`` as a problem document; ``close``: and the connection closed after it,
        once the client has stopped sending its body or ``linger`` seconds passed (the answer
        whole meanwhile, its end held back: the server closes the connection at the end of
        an answer, and a socket closed with unread bytes answers with a reset, which can
        discard the answer before the client reads it)."""
        headers = {"Connection": "close"} if close else None
        name = type(exc).__name__
        response = deps.problem(exc.status, exc.type, name, exc.detail, headers=headers)
        if not close or self.linger <= 0:
            await response(scope, receive, send)
            return

        async def held(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.body" and not message.get("more_body"):
                message = {**message, "more_body": True}
            await send(message)

        await response(scope, receive, held)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.linger):
                while True:  # the rest of the body, dropped
                    message = await receive()
                    if message["type"] != "http.request" or not message.get("more_body"):
                        break
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    def _detail(self) -> str:
        return f"the request body is larger than {self.max_bytes} bytes (http_max_request_bytes)"


class _HeadRefused(Exception):
    """Raised inside a parser callback to stop reading a request head past its bounds."""


def guarded_protocol(http: Http, *, base: type[Any] = HttpToolsProtocol) -> type[Any]:
    """uvicorn's HTTP protocol (``base``: httptools', or h11's) with a request-head timeout,
    bounds on a request head, a connection cap and a cap per client address.

    uvicorn closes idle keep-alive connections, but a connection that never completes a
    request head (a slow or silent client) stays open for ever, and nothing caps how many:
    enough of them exhaust the file descriptors, and then nothing is served at all. Here a
    head must arrive within ``header_timeout``, and hold at most ``max_header_bytes`` and
    ``max_headers`` fields (431; a target longer than ``max_header_bytes``: 414) — httptools
    itself bounds neither, h11 only the bytes of a head still incomplete.

    Past ``max_connections`` — or past ``max_connections_per_client`` for one address — an
    existing connection makes room for the new one: the oldest that is waiting for a request
    head, or else the one whose request body is arriving slowest (per byte since its head
    came). A connection whose request is being answered is never closed for room; when every
    one is, the new connection is. So a client holding many slow bodies loses them to the next
    connection — a health check included — instead of locking everyone out.

    An answer being streamed (its head sent, its body still going: a raw download, the event
    stream of ``GET /mcp``) may last as long as its client reads, so streams are bounded on
    their own: they do not count against ``max_connections_per_client``, one address may hold
    ``max_streams_per_client`` of them (past it, its oldest is closed), and past
    ``max_connections`` the oldest stream makes room when no connection is idle or slow.
    """
    # one table per server: every connection, and how many each client address holds
    open_now: collections.OrderedDict[Any, None] = collections.OrderedDict()
    per_client: collections.Counter[str] = collections.Counter()
    #: past this many connections of one address, its streams are counted (a scan)
    look_at = min(http.max_connections_per_client, http.max_streams_per_client)

    class Guarded(base):  # type: ignore[misc]
        _head_timer: asyncio.TimerHandle | None = None
        _seen_cycle: Any = None
        _waiting_head = True
        _body_since: float | None = None  #: when the body of the current request began
        _body_bytes = 0
        _address = ""
        # the request head being parsed (httptools' callbacks; h11 is checked per head)
        _in_head = False
        _head_bytes = 0  #: counted by the callbacks: target and fields
        _head_fields = 0
        _target_bytes = 0
        _head_received = 0  #: bytes received while the head was still coming
        _head_refusal: errors.SgmeError | None = None
        #: set once refused and the refusal sent: until it closes the connection, what the
        #: client still sends is dropped (:meth:`_linger`)
        _linger_timer: asyncio.TimerHandle | None = None

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            conn = getattr(self, "conn", None)
            if isinstance(conn, h11.Connection):
                conn.next_event = self._checked_events(conn.next_event)  # type: ignore[method-assign]

        def connection_made(self, transport: asyncio.Transport) -> None:
            super().connection_made(transport)
            peer = transport.get_extra_info("peername")
            self._address = str(peer[0]) if peer else ""
            open_now[self] = None
            per_client[self._address] += 1
            self._waiting()
            if per_client[self._address] > look_at:
                self._bound_client()
            if len(open_now) > http.max_connections:
                self._make_room("too many connections", same_client=False)

        def data_received(self, data: bytes) -> None:
            if self._linger_timer is not None:
                return
            if self._body_since is not None:
                self._body_bytes += len(data)
            super().data_received(data)
            if self._in_head and not self.transport.is_closing():
                # a head still coming (a field arriving in pieces is buffered by the parser
                # until it is whole, so its callback alone would see it too late)
                self._head_received += len(data)
                if self._head_received > http.max_header_bytes:
                    self._refuse_head(self._head_too_large())
                    return
            self._track()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._track(done=True)

        def connection_lost(self, exc: Exception | None) -> None:
            self._busy()
            if self._linger_timer is not None:
                self._linger_timer.cancel()
            if self in open_now:
                del open_now[self]
                per_client[self._address] -= 1
                if per_client[self._address] <= 0:
                    del per_client[self._address]
            super().connection_lost(exc)

        # -- the request head (httptools calls these as it parses) ----------------------------

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._in_head = True
            self._head_bytes = self._head_fields = self._target_bytes = 0
            self._head_received = 0

        def on_url(self, url: bytes) -> None:
            self._target_bytes += len(url)
            self._head_bytes += len(url)
            if self._target_bytes > http.max_header_bytes:
                self._head_refusal = self._target_too_long()
                raise _HeadRefused
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._head_fields += 1
            self._head_bytes += len(name) + len(value) + 4
            if self._head_fields > http.max_headers or self._head_bytes > http.max_header_bytes:
                self._head_refusal = self._check_head(self._head_fields, self._head_bytes)
                raise _HeadRefused
            super().on_header(name, value)

        def on_headers_complete(self) -> None:
            self._in_head = False
            super().on_headers_complete()

        def _checked_events(self, next_event: Any) -> Any:
            """h11's ``next_event``, refusing a head past the bounds (h11 has refused an
            incomplete one past ``max_header_bytes`` itself, with the hint 431)."""

            def checked() -> Any:
                try:
                    event = next_event()
                except h11.RemoteProtocolError as exc:
                    if exc.error_status_hint == 431:
                        self._head_refusal = self._head_too_large()
                    raise
                if isinstance(event, h11.Request):
                    size = len(event.target) + sum(len(n) + len(v) + 4 for n, v in event.headers)
                    refusal = (
                        self._target_too_long()
                        if len(event.target) > http.max_header_bytes
                        else self._check_head(len(event.headers), size)
                    )
                    if refusal is not None:
                        self._head_refusal = refusal
                        raise h11.RemoteProtocolError(refusal.detail, refusal.status)
                return event

            return checked

        def _check_head(self, fields: int, size: int) -> errors.SgmeError | None:
            if fields > http.max_headers:
                return errors.HeadersTooLarge(
                    f"a request head has at most {http.max_headers} header fields "
                    "(http_max_headers)"
                )
            if size > http.max_header_bytes:
                return self._head_too_large()
            return None

        def _head_too_large(self) -> errors.SgmeError:
            return errors.HeadersTooLarge(
                f"a request head is at most {http.max_header_bytes} bytes (http_max_header_bytes)"
            )

        def _target_too_long(self) -> errors.SgmeError:
            return errors.UriTooLong(
                f"a request target is at most {http.max_header_bytes} bytes (http_max_header_bytes)"
            )

        def send_400_response(self, msg: str) -> None:
            if self._head_refusal is None:
                super().send_400_response(msg)
            else:
                self._refuse_head(self._head_refusal)

        def _refuse_head(self, refusal: errors.SgmeError) -> None:
            """Answer a head past its bounds with a problem document, and close."""
            self._in_head = False
            self._busy()
            body = json.dumps(
                {
                    "type": errors.problem_type(refusal.type),
                    "title": type(refusal).__name__,
                    "status": refusal.status,
                    "detail": refusal.detail,
                }
            ).encode()
            head = (
                f"HTTP/1.1 {refusal.status} {HTTPStatus(refusal.status).phrase}\r\n"
                f"content-type: {deps.PROBLEM}\r\ncontent-length: {len(body)}\r\n"
                "connection: close\r\n\r\n"
            )
            if not self.transport.is_closing():
                self.transport.write(head.encode("latin-1") + body)
                self._linger()

        def _linger(self) -> None:
            """Close a refused connection without a reset: the refusal sent, the server's side
            is shut (the client reads the refusal, then the end), and what the client still
            sends is read and dropped until it closes its side or ``refusal_linger`` seconds
            pass. Closed at once instead, a socket with unread bytes answers a client still
            sending with a reset, which can discard the refusal before the client reads it
            (a 1 MB head refused at 16 KiB, say)."""
            if http.refusal_linger <= 0 or not self.transport.can_write_eof():
                self.transport.close()
                return
            self.transport.write_eof()
            self._linger_timer = self.loop.call_later(http.refusal_linger, self.transport.close)

        # -- room for new connections --------------------------------------------------------

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

        def _streaming(self) -> bool:
            """Whether an answer is being sent on this connection (its head went, its body
            is not done)."""
            cycle = self.cycle
            return bool(
                cycle is not None and cycle.response_started and not cycle.response_complete
            )

        def _slowness(self, now: float) -> float:
            """Seconds per byte of the body arriving now (a body that sent nothing yet counts
            as slowest)."""
            assert self._body_since is not None
            return (now - self._body_since) / max(1, self._body_bytes)

        def _bound_client(self) -> None:
            """This address holds many connections: close its oldest streams past
            ``max_streams_per_client``, and make room if what it holds besides its streams is
            past ``max_connections_per_client``."""
            mine = [c for c in open_now if c._address == self._address and c is not self]
            streams = [c for c in mine if c._streaming()]
            extra = len(streams) - http.max_streams_per_client
            for stream in streams[: max(0, extra)]:
                stream._drop(
                    f"more than {http.max_streams_per_client} streams from {self._address}"
                )
            if len(mine) + 1 - len(streams) > http.max_connections_per_client:
                why = (
                    f"more than {http.max_connections_per_client} connections from {self._address}"
                )
                self._make_room(why, same_client=True)

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
            streams = [] if same_client else [c for c in candidates if c._streaming()]
            if idle:
                idle[0]._drop(why)  # the oldest: open_now keeps them in order of arrival
            elif slow:
                max(slow, key=lambda c: c._slowness(now))._drop(why)
            elif streams:
                streams[0]._drop(why)
            else:
                self._drop(why)

        def _drop(self, why: str) -> None:
            self._busy()
            if not self.transport.is_closing():
                log.debug("closing connection from %s: %s", self.client, why)
                if self._streaming():
                    self.transport.abort()  # what is buffered for a stream is dropped with it
                else:
                    self.transport.close()

    return Guarded


class QueryValuesHidden(logging.Filter):
    """The access log's lines with the values of the query left out (``/v1/search?q=…``): a
    search is what someone said, and so is the ``next`` of a login a search page sent its
    visitor to. The parameters' names stay, for whoever reads the log (a name that is not a
    plain word shows as ``…`` too)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str):
            path, mark, query = args[2].partition("?")
            if mark:
                names = (part.partition("=")[0] for part in query.split("&") if part)
                shown = "&".join(f"{n if _PLAIN_NAME.fullmatch(n) else '…'}=…" for n in names)
                record.args = (*args[:2], f"{path}?{shown}", *args[3:])
        return True


_PLAIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,31}")
ACCESS_LOG = "uvicorn.access"


def hide_query_values() -> None:
    """Keep query values out of uvicorn's access log in this process (uvicorn configures its
    loggers as it starts; a filter added afterwards stays)."""
    logging.getLogger(ACCESS_LOG).addFilter(_HIDDEN)


_HIDDEN = QueryValuesHidden()


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
    configured = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=log_level,
        loop="uvloop",
        http=guarded_protocol(http),
        timeout_keep_alive=int(max(1, http.keepalive_timeout)),
        timeout_graceful_shutdown=math.ceil(http.shutdown_timeout),
        backlog=min(2048, http.max_connections),
        h11_max_incomplete_event_size=http.max_header_bytes,
        proxy_headers=False,  # nothing reads the client address; a proxy's headers are not ours
    )
    hide_query_values()  # after uvicorn's Config, which sets its loggers up
    return configured


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
        timeout_graceful_shutdown=math.ceil(http.shutdown_timeout),
        backlog=min(2048, http.max_connections),
        h11_max_incomplete_event_size=http.max_header_bytes,
        proxy_headers=False,
        workers=processes,
    )
    Multiprocess(supervised, sockets=[supervised.bind_socket()]).run()
