"""Running scripts in the Hermes Agent test environment (``make hermes-env``).

Tests that need the real hermes-agent skip off CI when ``.venv-hermes`` is missing and fail
on CI, like the tests that need PostgreSQL or Redis.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from conftest import unavailable

from pipeline.cli import hermes

ROOT = Path(__file__).resolve().parents[2]
# The end-to-end helpers (tests/e2e/harness.py) start the sgme children these tests talk to.
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
import harness  # noqa: E402

__all__ = ["Driver", "harness", "hermes_env", "make_home", "python", "serve"]
PYTHON = ROOT / ".venv-hermes" / "bin" / "python"
HERE = Path(__file__).resolve().parent
PLUGIN = ROOT / "integrations" / "hermes" / "sgme"


def python() -> Path:
    """The Hermes environment's interpreter (skips or fails the test when it is missing)."""
    if not PYTHON.exists():
        unavailable(f"{PYTHON} is missing: run `make hermes-env`")
    return PYTHON


def serve(procs: Any, data_dir: Path, name: str = "serve") -> tuple[Any, list[str], str]:
    """``sgme serve`` of ``data_dir`` on a free port, started by ``procs``: the process, its
    arguments (to start it again) and its URL."""
    port = harness.free_port()
    args = ["serve", "--data-dir", str(data_dir), "--port", str(port), "--log-level", "warning"]
    return procs.start(name, args, harness.clean_env()), args, f"http://127.0.0.1:{port}"


def hermes_env(home: Path, **extra: str) -> dict[str, str]:
    """An environment for a Hermes script: its home, nothing of ours but what is given."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SGME_", "HERMES_"))}
    env.update(HERMES_HOME=str(home), PYTHONUNBUFFERED="1", **extra)
    return env


def make_home(home: Path) -> Path:
    """A Hermes home with the provider installed by ``sgme hermes install``'s own function,
    and enabled in config.yaml."""
    hermes.install(home)
    (home / "config.yaml").write_text("memory:\n  provider: sgme\n", encoding="utf-8")
    return home


class Driver:
    """``tests/hermes/driver.py`` in a child process: one JSON command, one JSON answer."""

    def __init__(self, home: Path, env: dict[str, str], log: Path) -> None:
        self._log = log.open("ab")
        self.popen = subprocess.Popen(
            [str(python()), str(HERE / "driver.py")],
            env=env,
            cwd=home,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )
        self.log = log
        self._answers: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            if line.startswith("@@ "):
                self._answers.put(line[3:])
        self._answers.put(None)

    def __call__(self, op: str, *, timeout: float = 90.0, **args: Any) -> dict[str, Any]:
        assert self.popen.stdin is not None
        self.popen.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.popen.stdin.flush()
        try:
            line = self._answers.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(
                f"driver: no answer to {op} in {timeout} s:\n{self.tail()}"
            ) from None
        if line is None:
            raise AssertionError(f"driver exited during {op}:\n{self.tail()}")
        answer: dict[str, Any] = json.loads(line)
        assert answer.pop("ok"), f"driver {op}: {answer.get('error')}\n{self.tail()}"
        return answer

    def tail(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")[-4000:]

    def close(self) -> None:
        if self.popen.stdin is not None and not self.popen.stdin.closed:
            self.popen.stdin.close()
        try:
            self.popen.wait(30)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(10)
        self._reader.join(10)
        if self.popen.stdout is not None:
            self.popen.stdout.close()
        self._log.close()
