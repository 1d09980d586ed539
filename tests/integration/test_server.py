"""The HTTP protocol :mod:`pipeline.api.server` serves with, on both of uvicorn's parsers
(httptools, what ``sgme serve`` and ``sgme api`` run; h11, the pure-Python one): a request head
past ``http_max_header_bytes`` or ``http_max_headers`` is answered 431 (a target past the bound
414) as a problem document and the connection closed — whether the head comes at once or a
piece at a time — and heads within the bounds are served as before."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Iterator
from typing import Any

import helpers
import pytest
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from pipeline.api import server
from pipeline.settings import Http

BOUNDS = Http(max_header_bytes=8192, max_headers=20)


async def hello(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The smallest ASGI app: 200 ``ok`` (and the lifespan's startup and shutdown)."""
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


@contextlib.contextmanager
def serving(base: type[Any]) -> Iterator[int]:
    """uvicorn with the guarded protocol over ``base``, in a thread; its port."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(
        hello,
        http=server.guarded_protocol(BOUNDS, base=base),
        log_level="error",
        h11_max_incomplete_event_size=BOUNDS.max_header_bytes,
        lifespan="on",
    )
    running = uvicorn.Server(config)
    thread = threading.Thread(target=running.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        helpers.wait_for(lambda: running.started, timeout=10, what="uvicorn to start")
        yield int(sock.getsockname()[1])
    finally:
        running.should_exit = True
        thread.join(10)
        sock.close()


def answer(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed after {data!r}"
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    while len(rest) < int(headers.get("content-length", "0")):
        rest += sock.recv(65536)
    return int(lines[0].split()[1]), headers, rest


def refused(sock: socket.socket) -> tuple[int, str]:
    status, headers, body = answer(sock)
    assert headers["content-type"] == "application/problem+json"
    assert headers["connection"] == "close"
    problem = json.loads(body)
    assert problem["status"] == status
    # and the connection is closed (reset, when the client was still sending)
    with contextlib.suppress(ConnectionResetError):
        assert sock.recv(1) == b""
    return status, str(problem["type"])


START = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n"


@pytest.mark.parametrize("base", [HttpToolsProtocol, H11Protocol], ids=["httptools", "h11"])
def test_heads_past_their_bounds_are_refused_on_both_parsers(base: type[Any]) -> None:
    with serving(base) as port:

        def connect() -> socket.socket:
            return socket.create_connection(("127.0.0.1", port), timeout=10)

        with connect() as sock:  # one field of 100 KB, at once
            sock.sendall(START + b"X-Big: " + b"a" * 100_000 + b"\r\n\r\n")
            assert refused(sock) == (431, "urn:sgme:problem:headers-too-large")
        with connect() as sock:  # a complete head just past the bound, at once
            sock.sendall(START + b"X-Big: " + b"a" * 8200 + b"\r\n\r\n")
            assert refused(sock) == (431, "urn:sgme:problem:headers-too-large")
        with connect() as sock:  # more fields than allowed
            sock.sendall(START + b"".join(b"X-%d: 1\r\n" % n for n in range(25)) + b"\r\n")
            assert refused(sock) == (431, "urn:sgme:problem:headers-too-large")
        with connect() as sock:  # a field that keeps coming, a kilobyte at a time
            sock.sendall(START + b"X-Long: ")
            with contextlib.suppress(OSError):
                for _ in range(64):
                    sock.sendall(b"b" * 1024)
            assert refused(sock) == (431, "urn:sgme:problem:headers-too-large")
        with connect() as sock:  # a target past the bound
            sock.sendall(b"GET /?" + b"q" * 9000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert refused(sock) == (414, "urn:sgme:problem:uri-too-long")
        with connect() as sock:  # within the bounds: served, request after request
            for _ in range(3):
                sock.sendall(START + b"".join(b"X-%d: 1\r\n" % n for n in range(18)) + b"\r\n")
                assert answer(sock)[0] == 200
                sock.sendall(START + b"X-Big: " + b"a" * 7000 + b"\r\n\r\n")
                assert answer(sock)[0] == 200
