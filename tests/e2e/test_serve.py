"""``sgme serve`` as a real process: the embedded worker flushes what the API acknowledged,
a SIGKILL loses nothing acknowledged (the sweep at start flushes it, exactly once), and the
server refuses to bind anything but loopback. The processes come from ``harness.py``."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import harness
import httpx

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
        with store.lock(data_dir, file_id, timeout=10):
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


def test_serve_refuses_to_bind_a_non_loopback_address(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    argv = ["serve", "--data-dir", str(data_dir), "--host", "0.0.0.0"]
    result = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", *argv, "--port", str(harness.free_port())],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        env=harness.clean_env(),
        cwd=tmp_path,
        timeout=60,
    )
    assert result.returncode == 2, result
    err = result.stderr.decode("utf-8")
    assert "0.0.0.0" in err and "loopback" in err, err
    assert err.startswith("sgme serve: ") and err.count("\n") == 1, err
    assert not data_dir.exists()
