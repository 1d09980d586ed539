"""What live capture remembers between hook runs, under ``{spool dir}/state/``.

- **per transcript** (``t-{hash of its path}.json``): how far it was read — the byte offset
  after the last record taken care of (delivered or durably spooled), its line number, the
  file's identity (device and inode: a transcript replaced by another is read again from its
  start) — what its reader knew there (``Reader.state()`` of the importer), and up to where
  an earlier version's keys may apply (``legacy_until``: the size the file had when this
  version first read it). So a run reads only what the transcript gained. Read and written
  under a lock: two hooks firing at once take turns.
- **per agent** (``a-{agent}.json``): the last delivery and the last error of its runs, for
  ``sgme capture status``.

Files are written whole (temporary file, rename) and private (0600 in a 0700 directory), not
fsynced: a state is written only after what it records is delivered or durably spooled, and a
lost or damaged one only costs a read from an earlier point (the server's idempotency keys
still make every unit land once). Each fsync may cost a busy disk a second, and a hook has
about one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import filelock

from pipeline.capture import spool as spooling

DIRECTORY = "state"
_AGENT = re.compile(r"[^A-Za-z0-9_.-]")


def _name(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def _read(path: Path) -> dict[str, Any] | None:
    try:
        found = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return None
    return found if isinstance(found, dict) else None


def _write(path: Path, data: dict[str, Any]) -> None:
    encoded = json.dumps(data, ensure_ascii=False).encode("utf-8", "surrogatepass")
    spooling.write_file(path.with_name(f".{path.name}.tmp"), encoded, path, durable=False)


class Saved:
    """A transcript's state, held under its lock: ``data`` as saved (None: never read, or
    unreadable), :meth:`save` to replace it. Without a ``path`` (the state directory cannot
    be written) nothing is kept: every run reads the transcript from its start, and the keys
    make what was delivered replay."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.data = None if path is None else _read(path)

    def save(self, data: dict[str, Any]) -> None:
        """Replace the state (when it changed)."""
        if self.path is not None and data != self.data:
            _write(self.path, data)
            self.data = data


class State:
    """The capture state kept beside a spool."""

    def __init__(self, spool_dir: Path) -> None:
        self.directory = spool_dir / DIRECTORY

    def _make(self) -> None:
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)

    @contextlib.contextmanager
    def transcript(self, transcript: Path, *, timeout: float) -> Iterator[Saved]:
        """The state of ``transcript``, locked for at most ``timeout`` seconds of waiting
        (``filelock.Timeout`` past it) until the block ends; ``OSError`` when the state
        directory cannot be made."""
        self._make()
        path = self.directory / f"t-{_name(str(transcript))}.json"
        lock = filelock.FileLock(str(path) + ".lock", timeout=max(timeout, 0.0), mode=0o600)
        with lock:
            yield Saved(path)

    def transcripts(self) -> list[dict[str, Any]]:
        """Every transcript's state (for ``sgme capture status``)."""
        found = []
        with contextlib.suppress(OSError):
            for path in sorted(self.directory.glob("t-*.json")):
                data = _read(path)
                if data is not None:
                    found.append(data)
        return found

    # -- per agent ------------------------------------------------------------------------------

    def _agent_path(self, agent: str) -> Path:
        return self.directory / f"a-{_AGENT.sub('_', agent)}.json"

    def status(self, agent: str) -> dict[str, Any]:
        """An agent's last delivery and last error: ``{"last_delivery": {"at", "bodies"},
        "last_error": {"at", "detail"}}`` (each absent until there is one)."""
        return _read(self._agent_path(agent)) or {}

    def note(self, agent: str, *, at: str, delivered: int, error: str | None) -> None:
        """Record what a run of ``agent`` delivered (bodies the server took) and why it could
        not deliver the rest (None: nothing was left)."""
        if not delivered and error is None:
            return
        self._make()
        found = self.status(agent)
        if delivered:
            found["last_delivery"] = {"at": at, "bodies": delivered}
        if error is not None:
            found["last_error"] = {"at": at, "detail": error}
        _write(self._agent_path(agent), found)
