"""``sgme serve`` as a real process: the embedded worker flushes what the API acknowledged,
a SIGKILL loses nothing acknowledged (the sweep at start flushes it, exactly once), and the
server refuses to bind anything but loopback."""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from pipeline import document, store

T = TypeVar("T")
START_TIMEOUT = 60.0  #: seconds for a server to answer /v1/health
FLUSH_TIMEOUT = 30.0  #: seconds for the embedded worker to flush what was acknowledged


def clean_env() -> dict[str, str]:
    """This process's environment without SGME_* settings, which would leak into the server."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGME_")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclasses.dataclass
class Server:
    proc: subprocess.Popen[bytes]
    url: str
    log: Path

    def output(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")[-4000:]

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=10.0)


def poll(what: str, condition: Callable[[], T | None], *, timeout: float, server: Server) -> T:
    """``condition()``'s first truthy value; fails after ``timeout`` or if the server died."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if server.proc.poll() is not None:
            pytest.fail(
                f"server exited ({server.proc.returncode}) before {what}:\n{server.output()}"
            )
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}:\n{server.output()}")
        time.sleep(0.02)  # the polling interval, not a synchronisation


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[Callable[..., Server]]:
    """``start_server(data_dir, *args)``: a running ``sgme serve``; every one is stopped at the
    end of the test, whatever happened."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(data_dir: Path, *args: str) -> Server:
        port = free_port()
        log = tmp_path / f"serve-{len(procs)}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "pipeline.cli",
                    "serve",
                    "--data-dir",
                    str(data_dir),
                    "--port",
                    str(port),
                    "--log-level",
                    "warning",
                    *args,
                ],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=clean_env(),
                cwd=tmp_path,
            )
        procs.append(proc)
        server = Server(proc, f"http://127.0.0.1:{port}", log)

        def healthy() -> bool:
            try:
                r = httpx.get(f"{server.url}/v1/health", timeout=2.0)
            except httpx.TransportError:
                return False
            return r.status_code == 200 and r.json()["status"] == "ok"

        poll("/v1/health", healthy, timeout=START_TIMEOUT, server=server)
        return server

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=15)


def file_row(client: httpx.Client, file_id: str) -> dict[str, Any]:
    r = client.get(f"/v1/files/{file_id}")
    assert r.status_code == 200, r.text
    return dict(r.json())


def flushed_up_to(client: httpx.Client, file_id: str, seq: int) -> Callable[[], bool]:
    return lambda: file_row(client, file_id)["flushed_seq"] >= seq


def check_file(client: httpx.Client, data_dir: Path, file_id: str, contents: list[str]) -> None:
    """The file holds exactly ``contents``, in order, once each, and matches the index."""
    row = file_row(client, file_id)
    assert row["flushed_seq"] == row["next_seq"] - 1 == len(contents)
    assert row["pending_messages"] == 0
    data = (data_dir / row["path"]).read_bytes()
    assert client.get(f"/v1/files/{file_id}/raw").content == data
    assert row["flushed_bytes"] == len(data)
    head, blocks = document.chain(data)
    assert (head.hex(), blocks) == (row["chain_head"], len(contents))
    doc = document.parse(data.decode("utf-8"), file_id=file_id)
    assert [m.content for m in doc.messages] == contents
    assert [m.seq for m in doc.messages] == list(range(1, len(contents) + 1))
    for content in contents:
        assert data.count(f"\n\n{content}\n\n".encode()) == 1, content
    served = client.get(f"/v1/files/{file_id}/messages", params={"limit": 1000}).json()
    assert [m["content"] for m in served["messages"]] == contents


def append(client: httpx.Client, session_key: str, *contents: str) -> dict[str, Any]:
    r = client.post(
        "/v1/append",
        json={
            "agent_id": "e2e",
            "session_key": session_key,
            "messages": [{"role": "user", "content": c} for c in contents],
        },
    )
    assert r.status_code == 202, r.text
    return dict(r.json())


def test_serve_flushes_acknowledged_appends_in_the_background(
    start_server: Callable[..., Server], tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    server = start_server(data_dir)
    with server.client() as client:
        first = append(client, "s1", "hello 1", "hello 2", "hello 3")
        file_id = first["file_id"]
        assert first["source_refs"] == [f"{file_id}:{s}" for s in (1, 2, 3)]
        assert first["status"] == "pending"
        poll(
            "the first flush",
            flushed_up_to(client, file_id, 3),
            timeout=FLUSH_TIMEOUT,
            server=server,
        )
        check_file(client, data_dir, file_id, ["hello 1", "hello 2", "hello 3"])
        assert (data_dir / "raw" / "sessions" / f"{file_id}.md").is_file()

        more = [append(client, "s1", f"more {i}") for i in range(1, 6)]
        assert [a["first_seq"] for a in more] == [4, 5, 6, 7, 8]
        other = append(client, "s2", "elsewhere")["file_id"]
        poll(
            "the next flushes",
            flushed_up_to(client, file_id, 8),
            timeout=FLUSH_TIMEOUT,
            server=server,
        )
        poll(
            "the other file", flushed_up_to(client, other, 1), timeout=FLUSH_TIMEOUT, server=server
        )
        check_file(
            client,
            data_dir,
            file_id,
            ["hello 1", "hello 2", "hello 3", *[f"more {i}" for i in range(1, 6)]],
        )
        check_file(client, data_dir, other, ["elsewhere"])
        health = client.get("/v1/health").json()
        assert health["journal_backlog"] == {"rows": 0, "messages": 0}


def test_sigkill_loses_nothing_acknowledged_and_restart_flushes_it_once(
    start_server: Callable[..., Server], tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    # No periodic sweep during the test: only the sweep at start can find the orphaned rows.
    config = tmp_path / "sgme.yaml"
    config.write_text("sweep_interval: 3600\n", encoding="utf-8")
    server = start_server(data_dir, "--config", str(config))
    with server.client() as client:
        file_id = append(client, "crash", "before 1")["file_id"]
        poll(
            "the first flush",
            flushed_up_to(client, file_id, 1),
            timeout=FLUSH_TIMEOUT,
            server=server,
        )
        expected = ["before 1"]

        # Holding the file's lock keeps the server's flush waiting, so these appends are
        # acknowledged (in the journal) but not in the file when the server is killed.
        with store.lock(data_dir, file_id, timeout=10):
            for i in range(1, 6):
                ack = append(client, "crash", f"acked {i}a", f"acked {i}b")
                assert ack["file_id"] == file_id
                assert (ack["first_seq"], ack["last_seq"]) == (2 * i, 2 * i + 1)
                expected += [f"acked {i}a", f"acked {i}b"]
            row = file_row(client, file_id)
            assert (row["flushed_seq"], row["pending_messages"]) == (1, 10)
            backlog = client.get("/v1/health").json()["journal_backlog"]
            assert backlog == {"rows": 5, "messages": 10}
            server.proc.send_signal(signal.SIGKILL)
            assert server.proc.wait(timeout=15) == -signal.SIGKILL

    on_disk = (data_dir / "raw" / "sessions" / f"{file_id}.md").read_bytes()
    assert [m.content for m in document.parse(on_disk.decode("utf-8")).messages] == ["before 1"]

    restarted = start_server(data_dir, "--config", str(config))
    with restarted.client() as client:
        poll(
            "the sweep at start to flush the orphaned journal rows",
            flushed_up_to(client, file_id, 11),
            timeout=FLUSH_TIMEOUT,
            server=restarted,
        )
        check_file(client, data_dir, file_id, expected)
        assert client.get("/v1/health").json()["journal_backlog"] == {"rows": 0, "messages": 0}

        # The file carries on after the recovered messages, still once each.
        r = client.post(
            "/v1/append?wait=flushed",
            json={
                "agent_id": "e2e",
                "session_key": "crash",
                "messages": [{"role": "user", "content": "after restart"}],
            },
        )
        assert r.status_code == 200, r.text
        assert r.json()["source_refs"] == [f"{file_id}:12"]
        check_file(client, data_dir, file_id, [*expected, "after restart"])


def test_serve_refuses_to_bind_a_non_loopback_address(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline.cli",
            "serve",
            "--data-dir",
            str(data_dir),
            "--host",
            "0.0.0.0",
            "--port",
            str(free_port()),
        ],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        env=clean_env(),
        cwd=tmp_path,
        timeout=60,
    )
    assert result.returncode == 2, result
    err = result.stderr.decode("utf-8")
    assert "0.0.0.0" in err and "loopback" in err, err
    assert err.startswith("sgme serve: ") and err.count("\n") == 1, err
    assert not data_dir.exists()
