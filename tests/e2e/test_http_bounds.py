"""The HTTP server's bounds, against a real ``sgme serve`` over raw sockets (issue:
hardening): a body over the limit is refused from its Content-Length (an ``Expect:
100-continue`` client gets the 413 at once), a body that dribbles in gets 408, a request head
that never completes is closed, and past the connection cap the oldest idle connection makes
room — while ``/v1/health`` keeps answering, with thousands of idle connections open."""

from __future__ import annotations

import contextlib
import json
import random
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import harness
import httpx
import pytest

HEAD_TIMEOUT = "2"


@contextlib.contextmanager
def server(procs: harness.Procs, tmp_path: Path, **settings: str) -> Iterator[int]:
    port, _ = serve(procs, tmp_path, **settings)
    yield port


def serve(procs: harness.Procs, tmp_path: Path, **settings: str) -> tuple[int, harness.Proc]:
    """A ``sgme serve`` of its own data directory with ``settings``, answering: its port and
    its process (whose log a test reads)."""
    port = harness.free_port()
    argv = ["serve", "--data-dir", str(tmp_path / f"data-{port}"), "--port", str(port)]
    proc = procs.start(
        f"serve-{port}", [*argv, "--log-level", "warning"], harness.clean_env(**settings)
    )
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
        harness.wait_healthy(client, proc, timeout=60)
    return port, proc


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """Status, headers and body of the next response on ``sock``."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise AssertionError(f"connection closed after {data!r}")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(rest) < length:
        rest += sock.recv(65536)
    return int(lines[0].split()[1]), headers, rest[:length]


def closed_by_server(sock: socket.socket, timeout: float) -> bool:
    """Whether the server closes ``sock`` within ``timeout`` seconds."""
    sock.settimeout(timeout)
    try:
        while sock.recv(65536):
            pass
        return True
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def health_status(port: int) -> int:
    r = httpx.get(f"http://127.0.0.1:{port}/v1/health", timeout=10)
    return r.status_code


def test_a_body_over_the_limit_gets_413_before_it_is_sent(
    procs: harness.Procs, tmp_path: Path
) -> None:
    with server(procs, tmp_path, http_max_request_bytes="100000") as port, connect(port) as sock:
        sock.sendall(
            b"POST /v1/append HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: 99000000\r\n"
            b"Expect: 100-continue\r\n\r\n"
        )
        status, headers, body = response(sock)  # no body sent: the answer comes at once
        assert status == 413
        assert headers["content-type"].startswith("application/problem+json")
        problem = json.loads(body)
        assert problem["type"] == "urn:sgme:problem:too-large"
        assert "100000 bytes" in problem["detail"]


def test_a_body_that_dribbles_in_gets_408(procs: harness.Procs, tmp_path: Path) -> None:
    with server(procs, tmp_path, http_body_timeout="1") as port, connect(port) as sock:
        sock.sendall(
            b"POST /v1/append HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b'Content-Type: application/json\r\nContent-Length: 200\r\n\r\n{"agent_id"'
        )
        status, _, body = response(sock)
        assert status == 408
        assert json.loads(body)["type"] == "urn:sgme:problem:request-timeout"
        assert health_status(port) == 200


def test_heads_that_never_complete_are_closed(procs: harness.Procs, tmp_path: Path) -> None:
    with server(procs, tmp_path, http_header_timeout=HEAD_TIMEOUT) as port:
        silent = connect(port)
        partial = connect(port)
        partial.sendall(b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # no blank line
        try:
            assert closed_by_server(silent, timeout=15)
            assert closed_by_server(partial, timeout=15)
        finally:
            silent.close()
            partial.close()
        # A keep-alive connection that completes its heads is served, request after request.
        with connect(port) as sock:
            for _ in range(3):
                sock.sendall(b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                assert response(sock)[0] == 200


def test_past_the_cap_the_oldest_idle_connection_makes_room(
    procs: harness.Procs, tmp_path: Path
) -> None:
    with server(procs, tmp_path, http_max_connections="40") as port:
        idle = [connect(port) for _ in range(100)]
        try:
            assert health_status(port) == 200
            # the server keeps at most 40: the oldest 60 (or more) were closed
            still_open = [s for s in idle if not closed_by_server(s, timeout=0.2)]
            assert len(still_open) <= 40
            assert not closed_by_server(idle[-1], timeout=0.2)  # the newest stay
        finally:
            for sock in idle:
                sock.close()


@pytest.mark.timeout(180)
def test_health_answers_with_3000_idle_connections_open(
    procs: harness.Procs, tmp_path: Path
) -> None:
    # one client address may hold them all here: the cap under test is the server's own
    with server(procs, tmp_path, http_max_connections_per_client="4096") as port:
        idle = []
        try:
            for _ in range(3000):
                idle.append(connect(port))
            started = time.monotonic()
            assert health_status(port) == 200
            assert time.monotonic() - started < 5  # promptly, not after a timeout
            assert not closed_by_server(idle[0], timeout=0.1)  # nobody was evicted: under cap
        finally:
            for sock in idle:
                sock.close()
        assert health_status(port) == 200


def _files(port: int) -> list[dict[str, object]]:
    r = httpx.get(f"http://127.0.0.1:{port}/v1/files", timeout=10)
    assert r.status_code == 200, r.text
    files: list[dict[str, object]] = r.json()["files"]
    return files


def test_a_web_page_cannot_write_across_sites(procs: harness.Procs, tmp_path: Path) -> None:
    """What a browser sends for a page on another site, byte for byte: a "simple" request —
    no preflight — to a loopback server that has no tokens."""
    body = json.dumps(
        {"agent_id": "hermes", "session_key": "s", "messages": [{"role": "user", "content": "x"}]}
    ).encode()
    upload = b"agent_id=hermes&filename=a.txt&content=remember+this"
    shapes = [
        (b"/v1/append", b"text/plain;charset=UTF-8", b"http://evil.example", b"cross-site", body),
        (b"/v1/append", b"application/json", b"http://evil.example", b"cross-site", body),
        (b"/v1/uploads", b"application/x-www-form-urlencoded", b"null", b"cross-site", upload),
    ]
    with server(procs, tmp_path) as port:
        for path, content_type, origin, site, data in shapes:
            with connect(port) as sock:
                sock.sendall(
                    b"POST "
                    + path
                    + b" HTTP/1.1\r\nHost: 127.0.0.1:"
                    + str(port).encode()
                    + b"\r\nContent-Type: "
                    + content_type
                    + b"\r\nOrigin: "
                    + origin
                    + b"\r\nSec-Fetch-Site: "
                    + site
                    + b"\r\nSec-Fetch-Mode: no-cors"
                    + b"\r\nContent-Length: "
                    + str(len(data)).encode()
                    + b"\r\n\r\n"
                    + data
                )
                status, _, answer = response(sock)
            assert status == 403, answer
            assert json.loads(answer)["type"] == "urn:sgme:problem:cross-site-request"
        # the same body as a program sends it is stored: only the browser's shape is refused
        ok = httpx.post(
            f"http://127.0.0.1:{port}/v1/append",
            content=body,
            timeout=10,
            headers={"Content-Type": "application/json"},
        )
        assert ok.status_code == 202, ok.text
        text = httpx.post(
            f"http://127.0.0.1:{port}/v1/append",
            content=body,
            timeout=10,
            headers={"Content-Type": "text/plain"},
        )
        assert text.status_code == 415, text.text
        assert len(_files(port)) == 1


@pytest.mark.timeout(120)
def test_slow_bodies_cannot_lock_others_out(procs: harness.Procs, tmp_path: Path) -> None:
    """150 connections each send an append's head and one byte of its body, with a good
    token, past a cap of 100 connections: health checks and another agent's appends keep
    being answered at once, and the slow bodies are closed, by eviction or their 408."""
    data_dir = tmp_path / "data"
    env = harness.clean_env(http_max_connections="100", http_body_timeout="10", require_auth="true")
    procs.run(["migrate", "--data-dir", str(data_dir)], env)
    made = procs.run(
        [
            "token",
            "create",
            "--data-dir",
            str(data_dir),
            "--agent-id",
            "*",
            "--scope",
            "append",
            "--scope",
            "read",
            "--name",
            "t",
            "--json",
        ],
        env,
    )
    token = json.loads(made)["token"]
    auth = {"Authorization": f"Bearer {token}"}
    port = harness.free_port()
    proc = procs.start(
        f"serve-{port}",
        ["serve", "--data-dir", str(data_dir), "--port", str(port), "--log-level", "warning"],
        env,
    )
    base = f"http://127.0.0.1:{port}"
    with httpx.Client(base_url=base, timeout=10) as client:
        harness.wait_healthy(client, proc, timeout=60)
    head = (
        f"POST /v1/append HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
        "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"
    ).encode()
    slow = []
    try:
        for _ in range(150):
            sock = connect(port)
            sock.sendall(head)
            slow.append(sock)
        for n in range(5):
            started = time.monotonic()
            with httpx.Client(base_url=base, timeout=10) as client:
                assert client.get("/v1/health").status_code == 200
                body = {
                    "agent_id": "other",
                    "session_key": f"s{n}",
                    "messages": [{"role": "user", "content": f"still served {n}"}],
                }
                assert client.post("/v1/append", json=body, headers=auth).status_code == 202
            assert time.monotonic() - started < 3, "answered only after a wait"
        # the slow ones do not stay: closed to make room, or answered 408 within the timeout
        still = [s for s in slow if not closed_by_server(s, timeout=0.1)]
        assert len(still) <= 100
        deadline = time.monotonic() + 30
        for sock in still:
            assert closed_by_server(sock, timeout=max(0.1, deadline - time.monotonic()))
    finally:
        for sock in slow:
            sock.close()


def test_one_client_address_cannot_take_every_connection(
    procs: harness.Procs, tmp_path: Path
) -> None:
    with server(procs, tmp_path, http_max_connections_per_client="20") as port:
        idle = [connect(port) for _ in range(40)]
        try:
            assert health_status(port) == 200
            still_open = [s for s in idle if not closed_by_server(s, timeout=0.2)]
            assert len(still_open) <= 20
            assert not closed_by_server(idle[-1], timeout=0.2)  # the newest stay
        finally:
            for sock in idle:
                sock.close()


# ---------------------------------------------------------------------------------------------
# streamed answers: raw downloads and GET /mcp


def _store(port: int, *, megabytes: int) -> tuple[str, bytes]:
    """A flushed session of about ``megabytes`` MB (seeded text): its file_id and raw bytes."""
    rng = random.Random(megabytes)
    words = [f"w{n}" for n in range(1000)]
    chunk = " ".join(rng.choice(words) for _ in range(300_000))  # ~1.5 MB
    size = max(1, megabytes * 1_000_000 // len(chunk))
    body = {
        "agent_id": "a",
        "session_key": "big",
        "messages": [{"role": "user", "content": chunk} for _ in range(size)],
    }
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
        r = client.post("/v1/append", params={"wait": "flushed"}, json=body)
        assert r.status_code == 200, r.text
        file_id = str(r.json()["file_id"])
        raw = client.get(f"/v1/files/{file_id}/raw")
        assert raw.status_code == 200
    return file_id, raw.content


def _slow_reader(port: int) -> socket.socket:
    """A connection whose receive buffer is small, so the server's writes wait for its reads."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32 * 1024)
    sock.settimeout(10)
    sock.connect(("127.0.0.1", port))
    return sock


def _errors_logged(proc: harness.Proc) -> list[str]:
    return [line for line in proc.tail(400).splitlines() if "ERROR" in line or "Traceback" in line]


@pytest.mark.timeout(120)
def test_a_raw_download_that_outlasts_the_body_timeout_is_not_cut(
    procs: harness.Procs, tmp_path: Path
) -> None:
    """The body bound times a request's body, not the wait for a disconnect that a streamed
    answer keeps up while it sends: a download read slowly for several times
    ``http_body_timeout`` arrives whole."""
    port, proc = serve(procs, tmp_path, http_body_timeout="1")
    file_id, expected = _store(port, megabytes=6)
    with _slow_reader(port) as sock:
        sock.sendall(f"GET /v1/files/{file_id}/raw HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        started = time.monotonic()
        data = b""
        while b"\r\n\r\n" not in data:
            data += sock.recv(65536)
        head, _, got = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200")
        while len(got) < len(expected):
            chunk = sock.recv(32 * 1024)
            if not chunk:
                break
            got += chunk
            time.sleep(0.02)  # a slow reader, on purpose: ~1.5 MB/s
        took = time.monotonic() - started
    assert took > 2, f"the download was not slow enough to test anything ({took:.1f} s)"
    assert len(got) == len(expected), f"cut at {len(got)} of {len(expected)} bytes"
    assert got == expected
    assert _errors_logged(proc) == []


def _open_mcp_stream(port: int) -> socket.socket:
    """A ``GET /mcp`` event stream, its answer's head read."""
    sock = connect(port)
    sock.sendall(
        b"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n"
        b"MCP-Protocol-Version: 2025-06-18\r\n\r\n"
    )
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed before an answer: {data!r}"
        data += chunk
    assert data.startswith(b"HTTP/1.1 200"), data
    assert b"text/event-stream" in data
    return sock


def test_an_mcp_event_stream_outlives_the_body_timeout(
    procs: harness.Procs, tmp_path: Path
) -> None:
    port, proc = serve(procs, tmp_path, http_body_timeout="1")
    with _open_mcp_stream(port) as stream:
        assert not closed_by_server(stream, timeout=3)
    assert _errors_logged(proc) == []


def test_streams_do_not_lock_their_client_out(procs: harness.Procs, tmp_path: Path) -> None:
    """Answers being streamed (event streams, downloads) do not count against
    ``http_max_connections_per_client``: with more of them open than the cap, the same
    address's health checks and appends are answered at once."""
    with server(procs, tmp_path, http_max_connections_per_client="20") as port:
        streams = [_open_mcp_stream(port) for _ in range(30)]
        try:
            for n in range(3):
                started = time.monotonic()
                assert health_status(port) == 200
                body = {
                    "agent_id": "a",
                    "session_key": "s",
                    "messages": [{"role": "user", "content": f"still served {n}"}],
                }
                r = httpx.post(f"http://127.0.0.1:{port}/v1/append", json=body, timeout=10)
                assert r.status_code == 202, r.text
                assert time.monotonic() - started < 3
            assert not any(closed_by_server(s, timeout=0.05) for s in streams)
        finally:
            for sock in streams:
                sock.close()


def test_past_its_stream_cap_a_client_loses_its_oldest_streams(
    procs: harness.Procs, tmp_path: Path
) -> None:
    settings = {"http_max_connections_per_client": "20", "http_max_streams_per_client": "25"}
    with server(procs, tmp_path, **settings) as port:
        streams = [_open_mcp_stream(port) for _ in range(35)]
        try:
            assert health_status(port) == 200
            closed = [n for n, s in enumerate(streams) if closed_by_server(s, timeout=0.2)]
            assert len(closed) >= 10, closed
            assert min(closed) == 0  # the oldest went first
            assert not closed_by_server(streams[-1], timeout=0.1)  # the newest stays
        finally:
            for sock in streams:
                sock.close()


# ---------------------------------------------------------------------------------------------
# request heads and chunked bodies


def _refused(sock: socket.socket) -> tuple[int, dict[str, object]]:
    status, headers, body = response(sock)
    assert headers["content-type"].startswith("application/problem+json"), headers
    assert headers.get("connection") == "close"
    problem: dict[str, object] = json.loads(body)
    return status, problem


def test_request_heads_past_their_bounds_are_refused(procs: harness.Procs, tmp_path: Path) -> None:
    settings = {"http_max_header_bytes": "16384", "http_max_headers": "50"}
    with server(procs, tmp_path, **settings) as port:
        start = b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        # one header of 1 MB, sent at once, through a small send buffer: most of it is still
        # being sent when the server refuses the head; the client reads the refusal, not a
        # reset (http_refusal_linger)
        with connect(port) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
            sock.sendall(start + b"X-Big: " + b"a" * 1_000_000 + b"\r\n\r\n")
            status, problem = _refused(sock)
            assert sock.recv(1) == b""  # then the server's end of the connection
        assert (status, problem["type"]) == (431, "urn:sgme:problem:headers-too-large")
        assert "16384" in str(problem["detail"])
        # many small headers
        with connect(port) as sock:
            sock.sendall(start + b"".join(b"X-%d: 1\r\n" % n for n in range(60)) + b"\r\n")
            status, problem = _refused(sock)
        assert (status, problem["type"]) == (431, "urn:sgme:problem:headers-too-large")
        assert "50" in str(problem["detail"])
        # a header that never ends, a kilobyte at a time: refused once past the bound (the
        # head never completes, so the 431 can come from the bound alone)
        with connect(port) as sock:
            sock.sendall(start + b"X-Long: ")
            with contextlib.suppress(OSError):
                for _ in range(200):
                    sock.sendall(b"b" * 1024)
            status, problem = _refused(sock)
        assert (status, problem["type"]) == (431, "urn:sgme:problem:headers-too-large")
        # a target past the bound
        with connect(port) as sock:
            sock.sendall(
                b"GET /v1/health?" + b"q" * 20_000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
            )
            status, problem = _refused(sock)
        assert (status, problem["type"]) == (414, "urn:sgme:problem:uri-too-long")
        # ordinary requests, and heads just under the bounds, are served as before
        with connect(port) as sock:
            sock.sendall(start + b"X-Big: " + b"a" * 15_000 + b"\r\n\r\n")
            assert response(sock)[0] == 200
            sock.sendall(start + b"".join(b"X-%d: 1\r\n" % n for n in range(45)) + b"\r\n")
            assert response(sock)[0] == 200


def _send_chunked(sock: socket.socket, head: bytes, total: int) -> int:
    """Send ``head`` and a chunked body of up to ``total`` bytes, stopping once an answer has
    come; how many body bytes went."""
    sock.sendall(head)
    sent = 0
    sock.setblocking(False)
    try:
        while sent < total:
            with contextlib.suppress(BlockingIOError):
                if sock.recv(1, socket.MSG_PEEK):
                    break
            part = b"x" * 65536
            try:
                sock.sendall(b"%x\r\n" % len(part) + part + b"\r\n")
            except (BlockingIOError, BrokenPipeError, ConnectionResetError):
                break
            sent += len(part)
    finally:
        sock.setblocking(True)
        sock.settimeout(10)
    return sent


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1/append"),
        ("POST", "/v1/uploads"),
        ("PUT", "/v1/agents/a/policy"),
        ("POST", "/v1/refs/0d3d3e7f-2620-4d14-8725-c195f73040e8:1/redact"),
        ("POST", "/mcp"),
    ],
)
def test_a_chunked_body_gets_413_once_past_the_limit(
    procs: harness.Procs, tmp_path: Path, method: str, path: str
) -> None:
    """Without a Content-Length, the body is counted as it arrives: the answer is 413 as soon
    as it passes ``http_max_request_bytes``, whatever the route does with its body."""
    with server(procs, tmp_path, http_max_request_bytes="100000") as port, connect(port) as sock:
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            "Transfer-Encoding: chunked\r\n\r\n"
        ).encode()
        sent = _send_chunked(sock, head, 60_000_000)
        status, problem = _refused(sock)
        assert (status, problem["type"]) == (413, "urn:sgme:problem:too-large")
        assert "100000 bytes" in str(problem["detail"])
        assert sent < 10_000_000, f"{sent} bytes went before the answer"


def test_a_chunked_body_sent_whole_past_the_limit_reads_its_413(
    procs: harness.Procs, tmp_path: Path
) -> None:
    """A client that sends its whole chunked body without looking for an early answer (through
    a small send buffer: most of it still going when the server refuses) reads the 413, then
    the server's end, not a reset: the rest of the body is read and dropped
    (``http_refusal_linger``)."""
    body = b"".join(b"10000\r\n" + b"a" * 0x10000 + b"\r\n" for _ in range(30)) + b"0\r\n\r\n"
    with server(procs, tmp_path, http_max_request_bytes="100000") as port:
        for _ in range(3):
            with connect(port) as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
                sock.sendall(
                    b"POST /v1/append HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                    b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n" + body
                )
                status, problem = _refused(sock)
                assert (status, problem["type"]) == (413, "urn:sgme:problem:too-large")
                assert sock.recv(1) == b""


def test_a_slow_body_gets_408_on_every_route(procs: harness.Procs, tmp_path: Path) -> None:
    with server(procs, tmp_path, http_body_timeout="1") as port:
        for method, path in (("PUT", "/v1/agents/a/policy"), ("POST", "/v1/uploads")):
            with connect(port) as sock:
                sock.sendall(
                    f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                    "Content-Type: application/json\r\nContent-Length: 200\r\n\r\n{".encode()
                )
                status, problem = _refused(sock)
            assert (status, problem["type"]) == (408, "urn:sgme:problem:request-timeout"), path


@pytest.mark.timeout(120)
def test_a_slow_download_does_not_hold_a_stopping_server(
    procs: harness.Procs, tmp_path: Path
) -> None:
    """Nothing bounds how long a download to a slow reader lasts, so a stopping server waits
    for it only ``http_shutdown_timeout`` seconds before it ends it."""
    port, proc = serve(procs, tmp_path, http_shutdown_timeout="2")
    file_id, expected = _store(port, megabytes=6)
    with _slow_reader(port) as sock:
        sock.sendall(f"GET /v1/files/{file_id}/raw HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")  # it has begun: ~75 s at this pace
        proc.popen.send_signal(signal.SIGTERM)
        started = time.monotonic()
        got = 0
        with contextlib.suppress(OSError):
            while proc.alive() and time.monotonic() - started < 60:
                got += len(sock.recv(8192))
                time.sleep(0.1)
        proc.popen.wait(30)
        stopped = time.monotonic() - started
    assert got < len(expected)  # the download was still going
    assert stopped < 20, f"the server took {stopped:.0f} s to stop"
    assert proc.popen.returncode == 0, proc.tail()
