"""The spool: appends a client could not deliver yet, kept on disk and sent later, in order.

One design for every client that must never lose a turn nor hold up its agent — live capture
(:mod:`pipeline.capture`) and the Hermes provider (``sgme hermes install`` copies this very
file next to it: standard library only). docs/clients.md, "The spool", says the same for
users.

- **One file per append body**, named ``{time_ns:020d}-{pid}-{counter:06d}.json`` so names
  sort in the order bodies were put; written to a hidden temporary file, fsynced, renamed into
  place and the directory fsynced: a crash leaves the whole body or nothing.
- **Private**: the directory is made ``0700`` and each file ``0600`` (they hold conversations).
- **In order**: :meth:`Spool.deliver` sends the oldest first and stops at the first body the
  server cannot take *now* (down, overloaded, a token it does not accept yet), so a session's
  turns land in the order they were put. A body it refuses *for good* (invalid, too large, or
  403: not this token's to write, e.g. after the agent id changed) is set aside in
  ``rejected/`` with a ``.reason`` file beside it, and delivery goes on. A file that cannot be
  read as one JSON object is set aside the same way: one bad file never blocks the others.
- **Bounded**: a body that would take the spool past ``max_bytes`` is not spooled —
  :meth:`Spool.put` raises :class:`Full` — and the client keeps its own copy instead (capture:
  the agent's transcript, read again at the next hook; the Hermes provider: memory, then
  Hermes' own state.db, which ``sgme import hermes`` reads under the same keys). Nothing
  already spooled is ever dropped to make room.
- **One deliverer at a time** per directory (an advisory lock, where the platform has one):
  another process that finds it taken leaves delivery to the holder. Two at once would still
  be safe — every body carries its idempotency key — only wasteful.
"""

from __future__ import annotations

import contextlib
import enum
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no advisory lock, keys keep it correct
    fcntl = None  # type: ignore[assignment]

#: the default bound of a spool directory's pending bodies: 256 MiB
DEFAULT_MAX_BYTES = 256 * 1024 * 1024
REJECTED = "rejected"
LOCK = ".deliver.lock"


class Full(Exception):
    """The spool is at its bound: the body was not spooled."""


class Outcome(enum.Enum):
    """What became of one body sent to the server."""

    SENT = "sent"  #: stored (or already stored): done with it
    LATER = "later"  #: not now (down, overloaded, unauthorized): keep it, stop here
    REFUSED = "refused"  #: never (invalid, too large, forbidden): set it aside, go on


#: ``send(body) -> (outcome, detail)``: one delivery attempt of one body
Send = Callable[[dict[str, Any]], tuple[Outcome, str]]


class Spool:
    """A directory of append bodies waiting to be delivered, oldest first."""

    def __init__(self, directory: Path, *, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.directory = directory
        self.rejected = directory / REJECTED
        self.max_bytes = max_bytes
        self._counter = 0
        self._lock = threading.Lock()

    def _make(self, directory: Path) -> None:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        with contextlib.suppress(OSError):
            os.chmod(directory, 0o700)  # made earlier, or by an older version, more open

    def put(self, body: dict[str, Any]) -> Path:
        """Store a body durably at the end of the queue; :class:`Full` at the bound,
        ``OSError`` when it cannot be written (a read-only or full disk)."""
        data = json.dumps(body, ensure_ascii=False).encode("utf-8", "surrogatepass")
        if self.size() + len(data) > self.max_bytes:
            raise Full(
                f"the spool {self.directory} is at its bound ({self.max_bytes} bytes pending)"
            )
        self._make(self.directory)
        with self._lock:
            self._counter += 1
            name = f"{time.time_ns():020d}-{os.getpid()}-{self._counter:06d}.json"
        path = self.directory / name
        write_file(self.directory / f".{name}.tmp", data, path)
        return path

    def pending(self) -> list[Path]:
        """What waits, in order."""
        try:
            return sorted(p for p in self.directory.glob("*.json") if p.is_file())
        except OSError:
            return []

    def size(self) -> int:
        """The bytes pending."""
        total = 0
        for path in self.pending():
            with contextlib.suppress(OSError):
                total += path.stat().st_size
        return total

    def set_aside(self, path: Path, reason: str) -> None:
        """Move a body to ``rejected/`` with a ``.reason`` note, for a person to look at."""
        with contextlib.suppress(OSError):
            self._make(self.rejected)
            os.replace(path, self.rejected / path.name)
            note = self.rejected / (path.stem + ".reason")
            write_file(self.rejected / f".{path.stem}.reason.tmp", reason.encode() + b"\n", note)

    def deliver(self, send: Send, *, deadline: float | None = None) -> bool:
        """Send what waits, in order, until a body cannot go now, the spool is empty or the
        ``deadline`` (``time.monotonic()``) has passed; True when nothing waits. Another
        process delivering this directory already: False at once (it sends ours too)."""
        with self._deliverer() as mine:
            if not mine:
                return not self.pending()
            for path in self.pending():
                if deadline is not None and time.monotonic() > deadline:
                    return False
                try:
                    body = json.loads(path.read_bytes())
                except FileNotFoundError:
                    continue  # another deliverer sent it
                except (OSError, ValueError, RecursionError) as exc:
                    self.set_aside(path, f"unreadable spool file: {exc}")
                    continue
                if not isinstance(body, dict):
                    self.set_aside(path, f"not an append body: a JSON {type(body).__name__}")
                    continue
                outcome, detail = send(body)
                if outcome is Outcome.LATER:
                    return False
                if outcome is Outcome.REFUSED:
                    self.set_aside(path, detail)
                else:
                    with contextlib.suppress(FileNotFoundError):
                        path.unlink()
            return not self.pending()

    @contextlib.contextmanager
    def _deliverer(self) -> Iterator[bool]:
        if fcntl is None or not self.directory.is_dir():
            yield True
            return
        try:
            fd = os.open(self.directory / LOCK, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError:
            yield True
            return
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                yield False
                return
            yield True
        finally:
            os.close(fd)


def write_file(tmp: Path, data: bytes, path: Path, *, durable: bool = True) -> None:
    """``data`` at ``path``, whole or not at all: a private temporary file renamed into place;
    ``durable``: the file and its directory fsynced too (what must survive a power cut)."""
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            if durable:
                os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if not durable:
        return
    with contextlib.suppress(OSError):
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
