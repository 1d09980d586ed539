"""The HTTP server's bounds, against a real ``sgme serve`` over raw sockets (issue:
hardening): a body over the limit is refused from its Content-Length (an ``Expect:
100-continue`` client gets the 413 at once), a body that dribbles in gets 408, a request head
that never completes is closed, and past the connection cap the oldest idle connection makes
room — while ``/v1/health`` keeps answering, with thousands of idle connections open."""

from __future__ import annotations

import contextlib
import json
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
    port = harness.free_port()
    argv = ["serve", "--data-dir", str(tmp_path / "data"), "--port", str(port)]
    proc = procs.start(
        f"serve-{port}", [*argv, "--log-level", "warning"], harness.clean_env(**settings)
    )
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
        harness.wait_healthy(client, proc, timeout=60)
    yield port


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
