"""A PostgreSQL server and a Redis server of a test's own, on loopback ports of their own, for
the fault tests that stop and restart them (the machine's shared servers are never touched).

Skipped off CI when the server binaries are missing; a failure on CI.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from conftest import unavailable
from harness import free_port


def _pg_bindir() -> Path | None:
    found = shutil.which("pg_config")
    if found:
        done = subprocess.run([found, "--bindir"], capture_output=True, text=True, check=False)
        if done.returncode == 0 and (Path(done.stdout.strip()) / "initdb").exists():
            return Path(done.stdout.strip())
    return None


class PrivatePostgres:
    """A throwaway cluster: ``initdb`` in a temporary directory, trust auth, one port."""

    def __init__(self, root: Path, bindir: Path) -> None:
        self.root = root
        self.data = root / "data"
        self.bindir = bindir
        self.port = free_port()
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *argv: str) -> None:
        command = [str(self.bindir / argv[0]), *argv[1:]]
        if os.geteuid() == 0:  # initdb and postgres refuse to run as root
            command = ["runuser", "-u", "postgres", "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, f"{argv[0]} failed: {done.stdout}{done.stderr}"

    def init(self) -> None:
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")

    def start(self) -> None:
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1"
        # -l: the server's output goes to a file, not to our pipes (which it would hold open)
        log = str(self.root / "server.log")
        self._run(
            "pg_ctl", "-D", str(self.data), "-o", options, "-l", log, "-w", "-t", "30", "start"
        )

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")


@contextlib.contextmanager
def private_postgres() -> Iterator[PrivatePostgres]:
    """A running private PostgreSQL; stopped and removed afterwards."""
    bindir = _pg_bindir()
    if bindir is None:
        unavailable("PostgreSQL server binaries (initdb, pg_ctl) are not installed")
    assert bindir is not None
    root = Path(tempfile.mkdtemp(prefix="sgme-pg-"))
    if os.geteuid() == 0:
        user = pwd.getpwnam("postgres")
        os.chown(root, user.pw_uid, user.pw_gid)
    server = PrivatePostgres(root, bindir)
    try:
        server.init()
        server.start()
        yield server
    finally:
        with contextlib.suppress(AssertionError, subprocess.SubprocessError):
            server.stop()
        shutil.rmtree(root, ignore_errors=True)


class PrivateRedis:
    """A redis-server that keeps nothing on disk, on a port of its own."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        argv = [
            "redis-server",
            "--bind",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.root),
        ]
        log = (self.root / "redis.log").open("ab")
        self.proc = subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        log.close()
        import redis

        client = redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=1)
        deadline = time.monotonic() + 30
        while True:
            try:
                client.ping()
                break
            except redis.RedisError:
                assert self.proc.poll() is None, "redis-server exited"
                assert time.monotonic() < deadline, "redis-server did not answer"
                time.sleep(0.05)
        client.close()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(15)
        self.proc = None


@contextlib.contextmanager
def private_redis() -> Iterator[PrivateRedis]:
    """A running private Redis; stopped afterwards."""
    if shutil.which("redis-server") is None:
        unavailable("redis-server is not installed")
    root = Path(tempfile.mkdtemp(prefix="sgme-redis-"))
    server = PrivateRedis(root)
    try:
        server.start()
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
