"""Over HTTP too, every acknowledgement follows the durable sync of its commit, seen from the
system calls (``strace``): ``sgme serve`` answers ``POST /v1/append`` from batches committed on
one thread (pipeline.api.batching), so the 202 is written by the event loop's thread while the
commit ran on another; the trace shows the order in which the kernel saw them.

Each request carries a unique marker. In the trace of the server (every thread): the request is
read from a socket (its marker in the bytes read); its append's journal row reaches the WAL in
a ``pwrite64`` (the marker in the page written); the WAL is synced (``fdatasync``); and only then
is the ``202`` written to that request's socket. Skipped where strace is missing or not
allowed, except on CI, where that fails (``.ci/run`` installs strace).
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
from conftest import unavailable

ROOT = Path(__file__).resolve().parents[2]
CALL = re.compile(r"^(\d+) +(\w+)\((\d+)<([^>]*)>(.*)$")
#: a call another thread's interrupted: its start, and where it resumes (with what it read)
UNFINISHED = " <unfinished ...>"
RESUMED = re.compile(r"^(\d+) +<\.\.\. (\w+) resumed>(.*)$")
MARK = re.compile(r"MARK-(\d+)-END")
CLIENTS = 4
EACH = 8
#: starts of the traced server when strace cannot attach (once seen in a full run, gone on a
#: rerun): on CI a second refusal fails the test, it is not skipped
PTRACE_ATTEMPTS = 2


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        found.extend(int(x) for x in text)
    return found


class _NoPtrace(Exception):
    """strace could not attach to the server."""


def _serve_traced(tmp_path: Path) -> Path:
    """Run ``sgme serve`` under ``strace -f``, append CLIENTS x EACH marked messages over HTTP
    (a connection per client, concurrently), stop it; the trace's path."""
    if shutil.which("strace") is None:
        unavailable("strace is not installed (.ci/run installs it)")
    refused = ""
    for attempt in range(PTRACE_ATTEMPTS):
        run_dir = tmp_path / f"run-{attempt}"
        run_dir.mkdir()
        try:
            return _serve_traced_once(run_dir)
        except _NoPtrace as exc:
            refused = str(exc)
    unavailable(f"strace cannot trace here: {refused}")


def _serve_traced_once(tmp_path: Path) -> Path:
    port = _free_port()
    out = tmp_path / "trace"
    errors = (tmp_path / "stderr").open("wb")
    calls = "read,recvfrom,write,writev,sendto,sendmsg,pwrite64,fdatasync,fsync"
    argv = ["strace", "-f", "-y", "-qq", "-s", "65536", "-e", f"trace={calls}", "-o", str(out)]
    serve = [sys.executable, "-m", "pipeline.cli", "serve", "--data-dir", str(tmp_path / "data")]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SGME_SWEEP_INTERVAL": "3600"}
    proc = subprocess.Popen(
        [*argv, *serve, "--port", str(port), "--log-level", "warning"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=errors,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                err = (tmp_path / "stderr").read_text()
                if "ptrace" in err:
                    raise _NoPtrace(err.strip())
                raise AssertionError(f"sgme serve ended: {err}")
            try:
                if httpx.get(f"{url}/v1/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "sgme serve did not start under strace"
            time.sleep(0.2)

        failures: list[str] = []

        def client(c: int) -> None:
            with httpx.Client(base_url=url, timeout=30) as http:
                for i in range(EACH):
                    n = c * EACH + i
                    r = http.post(
                        "/v1/append",
                        json={
                            "agent_id": "strace",
                            "session_key": f"s{c % 2}",
                            "messages": [{"role": "user", "content": f"MARK-{n}-END"}],
                        },
                    )
                    if r.status_code != 202:
                        failures.append(r.text)

        threads = [threading.Thread(target=client, args=(c,)) for c in range(CLIENTS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not failures, failures
    finally:
        for child in _children(proc.pid):
            os.kill(child, signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        errors.close()
    return out


@dataclasses.dataclass(frozen=True)
class _Call:
    began: int  #: the trace line it started on
    ended: int  #: the trace line it returned on (the same, unless another thread cut in)
    call: str
    fd: str
    path: str
    rest: str  #: its other arguments and result, with what it read or wrote


def _calls(trace: Path) -> list[_Call]:
    """Each traced call, in the order they returned; a call that another thread interrupted is
    joined with where it resumed."""
    found = []
    started: dict[str, tuple[int, str, str, str, str]] = {}
    for number, line in enumerate(trace.read_text(errors="replace").splitlines()):
        resumed = RESUMED.match(line)
        if resumed:
            tid, call, rest = resumed.groups()
            begun = started.pop(tid, None)
            if begun is not None and begun[1] == call:
                found.append(_Call(begun[0], number, call, begun[2], begun[3], begun[4] + rest))
            continue
        match = CALL.match(line)
        if match is None:
            continue
        tid, call, fd, path, rest = match.groups()
        if rest.endswith(UNFINISHED):
            started[tid] = (number, call, fd, path, rest.removesuffix(UNFINISHED))
        else:
            found.append(_Call(number, number, call, fd, path, rest))
    return found


def test_each_202_follows_the_wal_sync_after_its_appends_commit(tmp_path: Path) -> None:
    trace = _serve_traced(tmp_path)
    in_wal: dict[int, int] = {}  #: marker -> line where the first WAL write holding it returned
    reading: dict[str, int] = {}  #: socket -> marker of the request read from it last
    syncs: list[tuple[int, int]] = []  #: WAL syncs: the lines they began and returned on
    answered: dict[int, int] = {}  #: marker -> line where the write of its 202 began
    for c in _calls(trace):
        if c.path.endswith("-wal"):
            if c.call == "pwrite64":
                for mark in MARK.finditer(c.rest):
                    in_wal.setdefault(int(mark.group(1)), c.ended)
            elif c.call in ("fsync", "fdatasync"):
                syncs.append((c.began, c.ended))
        elif c.path.startswith(("socket:", "TCP")):
            key = f"{c.fd}<{c.path}>"
            if c.call in ("read", "recvfrom"):
                request = MARK.search(c.rest)
                if request:
                    reading[key] = int(request.group(1))
            elif "HTTP/1.1 202" in c.rest and key in reading:
                answered[reading.pop(key)] = c.began

    assert sorted(answered) == list(range(CLIENTS * EACH)), "every 202 seen, once"
    for marker, response in answered.items():
        written = in_wal.get(marker)
        assert written is not None and written < response, f"MARK-{marker}: not in the WAL first"
        # a sync that began after the write returned, and returned before the 202 was written
        assert any(written < began and ended < response for began, ended in syncs), (
            f"MARK-{marker}: answered (trace line {response}) without a WAL sync after its "
            f"write (line {written})"
        )
