"""``sgme serve`` as a real process: the embedded worker flushes what the API acknowledged,
a SIGKILL loses nothing acknowledged (the sweep at start flushes it, exactly once), the server
binds a network address only with auth on, and tokens made or revoked by the CLI reach it
without a restart. The processes come from ``harness.py``."""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import harness
import httpx
import pytest

from pipeline import document, store

FLUSH_TIMEOUT = 30.0  #: seconds for the embedded worker to flush what was acknowledged


@contextlib.contextmanager
def serve(
    procs: harness.Procs, data_dir: Path, *args: str
) -> Iterator[tuple[harness.Proc, httpx.Client]]:
    """A running ``sgme serve`` on a free port, and a client for it."""
    port = harness.free_port()
    argv = ["serve", "--data-dir", str(data_dir), "--port", str(port), "--log-level", "warning"]
    proc = procs.start(f"serve-{port}", [*argv, *args], harness.clean_env())
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10.0) as client:
        harness.wait_healthy(client, proc, timeout=60)
        yield proc, client


def file_row(client: httpx.Client, file_id: str) -> dict[str, Any]:
    r = client.get(f"/v1/files/{file_id}")
    assert r.status_code == 200, r.text
    return dict(r.json())


def wait_flushed(client: httpx.Client, proc: harness.Proc, file_id: str, seq: int) -> None:
    def flushed() -> bool:
        return bool(file_row(client, file_id)["flushed_seq"] >= seq)

    harness.wait_until(
        flushed, timeout=FLUSH_TIMEOUT, what=f"{file_id} flushed to {seq}", check=proc.check_alive
    )


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
    procs: harness.Procs, tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    with serve(procs, data_dir) as (proc, client):
        first = append(client, "s1", "hello 1", "hello 2", "hello 3")
        file_id = first["file_id"]
        assert first["source_refs"] == [f"{file_id}:{s}" for s in (1, 2, 3)]
        assert first["status"] == "pending"
        wait_flushed(client, proc, file_id, 3)
        check_file(client, data_dir, file_id, ["hello 1", "hello 2", "hello 3"])
        assert (data_dir / "raw" / "sessions" / f"{file_id}.md").is_file()

        more = [append(client, "s1", f"more {i}") for i in range(1, 6)]
        assert [a["first_seq"] for a in more] == [4, 5, 6, 7, 8]
        other = append(client, "s2", "elsewhere")["file_id"]
        wait_flushed(client, proc, file_id, 8)
        wait_flushed(client, proc, other, 1)
        check_file(
            client,
            data_dir,
            file_id,
            ["hello 1", "hello 2", "hello 3", *[f"more {i}" for i in range(1, 6)]],
        )
        check_file(client, data_dir, other, ["elsewhere"])
        health = client.get("/v1/health").json()
        assert health["journal_backlog"] == {"rows": 0, "messages": 0, "bytes": 0}


def test_sigkill_loses_nothing_acknowledged_and_restart_flushes_it_once(
    procs: harness.Procs, tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    # No periodic sweep during the test: only the sweep at start can find the orphaned rows.
    config = tmp_path / "sgme.yaml"
    config.write_text("sweep_interval: 3600\n", encoding="utf-8")
    with serve(procs, data_dir, "--config", str(config)) as (proc, client):
        file_id = append(client, "crash", "before 1")["file_id"]
        wait_flushed(client, proc, file_id, 1)
        expected = ["before 1"]

        # Holding the file's lock keeps the server's flush waiting, so these appends are
        # acknowledged (in the journal) but not in the file when the server is killed.
        with store.LockFiles(data_dir).lock(file_id, timeout=10):
            for i in range(1, 6):
                ack = append(client, "crash", f"acked {i}a", f"acked {i}b")
                assert ack["file_id"] == file_id
                assert (ack["first_seq"], ack["last_seq"]) == (2 * i, 2 * i + 1)
                expected += [f"acked {i}a", f"acked {i}b"]
            row = file_row(client, file_id)
            assert (row["flushed_seq"], row["pending_messages"]) == (1, 10)
            backlog = client.get("/v1/health").json()["journal_backlog"]
            assert (backlog["rows"], backlog["messages"]) == (5, 10)
            proc.kill()
            assert proc.popen.returncode == -signal.SIGKILL

    on_disk = (data_dir / "raw" / "sessions" / f"{file_id}.md").read_bytes()
    assert [m.content for m in document.parse(on_disk.decode("utf-8")).messages] == ["before 1"]

    with serve(procs, data_dir, "--config", str(config)) as (restarted, client):
        # the sweep at start flushes the orphaned journal rows
        wait_flushed(client, restarted, file_id, 11)
        check_file(client, data_dir, file_id, expected)
        assert client.get("/v1/health").json()["journal_backlog"] == {
            "rows": 0,
            "messages": 0,
            "bytes": 0,
        }

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


def run_sgme(cwd: Path, *args: str, **settings: str) -> subprocess.CompletedProcess[str]:
    """A one-shot ``sgme`` child (its exit code is the caller's to check)."""
    return subprocess.run(
        [sys.executable, "-m", "pipeline.cli", *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=harness.clean_env(**settings),
        cwd=cwd,
        timeout=60,
        check=False,
    )


def test_serve_refuses_a_network_address_until_a_token_exists(
    procs: harness.Procs, tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    port = harness.free_port()
    argv = ["serve", "--data-dir", str(data_dir), "--host", "0.0.0.0", "--port", str(port)]
    refused = run_sgme(tmp_path, *argv)
    assert refused.returncode == 2, refused
    err = refused.stderr
    assert "0.0.0.0" in err and "loopback" in err and "sgme token create" in err, err
    assert err.startswith("sgme serve: ") and err.count("\n") == 1, err
    with socket.socket() as s:  # nothing listens on the port
        assert s.connect_ex(("127.0.0.1", port)) != 0
    assert not data_dir.exists()  # and nothing was created

    assert run_sgme(tmp_path, "migrate", "--data-dir", str(data_dir)).returncode == 0
    made = run_sgme(
        tmp_path,
        "token",
        "create",
        "--data-dir",
        str(data_dir),
        "--agent-id",
        "*",
        "--scope",
        "admin",
        "--json",
    )
    assert made.returncode == 0, made
    secret = json.loads(made.stdout)["token"]

    proc = procs.start(f"serve-{port}", [*argv, "--log-level", "debug"], harness.clean_env())
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10.0) as client:
        harness.wait_healthy(client, proc, timeout=60)
        assert client.get("/v1/files").status_code == 401
        assert (
            client.get("/v1/files", headers={"Authorization": "Bearer sgme_x"}).status_code == 401
        )
        auth = {"Authorization": f"Bearer {secret}"}
        assert client.get("/v1/files", headers=auth).status_code == 200
        r = client.post(
            "/v1/append?wait=flushed",
            headers=auth,
            json={
                "agent_id": "e2e",
                "session_key": "s",
                "messages": [{"role": "user", "content": "x"}],
            },
        )
        assert r.status_code == 200, r.text
        # a page that rebinds its DNS name to this server sends its own Host: refused
        rebound = client.get("/v1/files", headers={**auth, "Host": "attacker.example"})
        assert rebound.status_code == 400
        assert rebound.json()["type"] == "urn:sgme:problem:host-not-allowed"
    proc.stop()
    log = proc.log_path.read_text(encoding="utf-8")
    assert "GET /v1/files" in log  # the access log is there, and it has no secret in it
    assert secret not in log and secret.removeprefix("sgme_")[:16] not in log


def test_require_auth_lets_serve_bind_a_network_address(
    procs: harness.Procs, tmp_path: Path
) -> None:
    port = harness.free_port()
    argv = ["serve", "--data-dir", str(tmp_path / "data"), "--host", "0.0.0.0", "--port", str(port)]
    proc = procs.start(f"serve-{port}", argv, harness.clean_env(require_auth="true"))
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10.0) as client:
        harness.wait_healthy(client, proc, timeout=60)
        r = client.get("/v1/files")
        assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")


def test_tokens_made_and_revoked_by_the_cli_reach_a_running_server(
    procs: harness.Procs, tmp_path: Path
) -> None:
    """Without a restart, within token_cache_seconds (5 s by default)."""
    data_dir = tmp_path / "data"
    with serve(procs, data_dir) as (proc, client):
        assert client.get("/v1/files").status_code == 200  # no token yet: open (loopback)
        made = run_sgme(
            tmp_path,
            "token",
            "create",
            "--data-dir",
            str(data_dir),
            "--agent-id",
            "e2e",
            "--scope",
            "read",
        )
        assert made.returncode == 0, made
        secret = made.stdout.splitlines()[-1]
        token_id = made.stdout.split("token_id:")[1].split()[0]
        auth = {"Authorization": f"Bearer {secret}"}
        started = time.monotonic()
        harness.wait_until(
            lambda: client.get("/v1/files").status_code == 401,
            timeout=15,
            what="the server to require the new token",
            check=proc.check_alive,
        )
        assert time.monotonic() - started < 5 + 2
        assert client.get("/v1/files", headers=auth).status_code == 200
        revoked = run_sgme(tmp_path, "token", "revoke", token_id, "--data-dir", str(data_dir))
        assert revoked.returncode == 0, revoked
        started = time.monotonic()
        harness.wait_until(
            lambda: client.get("/v1/files", headers=auth).status_code == 401,
            timeout=15,
            what="the server to refuse the revoked token",
            check=proc.check_alive,
        )
        assert time.monotonic() - started < 5 + 2


def test_a_pathological_session_page_neither_runs_long_nor_stalls_appends(
    procs: harness.Procs, tmp_path: Path
) -> None:
    """One append of ten messages of ``"![" * 100000`` (2 MB of what Markdown works hardest
    on): its web page is answered within the page's render budget, the part past it shown as
    plain text, and another agent's appends are answered while it renders — none waits for
    the whole page."""
    with serve(procs, tmp_path / "data") as (_, client):
        body = {
            "agent_id": "a",
            "session_key": "marks",
            "messages": [{"role": "user", "content": "![" * 100_000} for _ in range(10)],
        }
        r = client.post("/v1/append", params={"wait": "flushed"}, json=body, timeout=60)
        assert r.status_code == 200, r.text
        file_id = r.json()["file_id"]
        page: dict[str, Any] = {}

        def fetch() -> None:
            started = time.monotonic()
            with httpx.Client(base_url=str(client.base_url), timeout=120) as other:
                page["response"] = other.get(f"/ui/files/{file_id}")
            page["seconds"] = time.monotonic() - started

        fetching = threading.Thread(target=fetch)
        fetching.start()
        waits = []
        n = 0
        while fetching.is_alive() or n < 3:
            started = time.monotonic()
            append = {
                "agent_id": "b",
                "session_key": "meanwhile",
                "messages": [{"role": "user", "content": f"while the page renders {n}"}],
            }
            assert client.post("/v1/append", json=append).status_code == 202
            waits.append(time.monotonic() - started)
            n += 1
        fetching.join()
    response = page["response"]
    assert response.status_code == 200
    assert "shown as plain text" in response.text
    assert response.text.count('<pre class="rest">') == 10
    assert page["seconds"] < 30, f"the page took {page['seconds']:.1f} s"
    assert max(waits) < page["seconds"], (waits, page["seconds"])


@pytest.mark.parametrize("command", [["serve"], ["api", "--workers", "2"]], ids=["serve", "api"])
def test_the_access_log_keeps_no_query_values(
    procs: harness.Procs, tmp_path: Path, command: list[str]
) -> None:
    """What a search asks for is what someone said: the access log names the path and the
    query's parameters, never their values — on /v1/search, /ui/search, and the login that a
    search page sends a visitor to (its ``next``)."""
    data = ["--data-dir", str(tmp_path / "data")]
    procs.run(["migrate", *data], harness.clean_env())
    port = harness.free_port()
    argv = [*command, *data, "--port", str(port), "--log-level", "info"]
    proc = procs.start(f"{command[0]}-{port}", argv, harness.clean_env())
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
        harness.wait_healthy(client, proc, timeout=60)
        assert client.get("/v1/search", params={"q": "turquoise walrus", "limit": 5}).is_success
        assert client.get("/ui/search", params={"q": "vermilion heron"}).is_success
        r = client.get("/ui/login", params={"next": "/ui/search?q=saffron+otter"})
        assert r.is_success

        def logged() -> bool:
            return proc.tail(400).count('"GET /') >= 4

        harness.wait_until(logged, timeout=10, what="the access log lines")
    log = proc.tail(400)
    assert '"GET /v1/search?q=…&limit=… HTTP/1.1" 200' in log, log
    assert '"GET /ui/search?q=… HTTP/1.1" 200' in log, log
    assert '"GET /ui/login?next=… HTTP/1.1" 200' in log, log
    for secret in ("turquoise", "walrus", "vermilion", "heron", "saffron", "otter"):
        assert secret not in log
