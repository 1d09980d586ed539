"""The spool: appends a client could not deliver yet, kept on disk and sent later, in order.

One design for every client that must never lose a turn nor hold up its agent — live capture
(:mod:`pipeline.capture`) and the Hermes provider (``sgme hermes install`` copies this very
file next to it: standard library only). docs/clients.md, "The spool", says the same for
users.

- **One file per put**, holding the bodies of one run (JSON Lines: a body a line), named
  ``{time_ns:020d}-{pid}-{counter:06d}.jsonl`` so names sort in the order they were put;
  written to a hidden temporary file, fsynced, renamed into place and the directory fsynced:
  a crash leaves the whole file or nothing, and a run that spools a thousand bodies pays one
  fsync. (Files of earlier versions, one body each as ``.json``, are read the same way.)
- **Redacted**: the client gives a ``scrub`` that replaces the secrets in a body's text before
  it is written (:func:`scrubber` over :func:`pipeline.redactor.redact`), so no credential
  waits in clear on the client's disk.
- **Private**: the directory is made ``0700`` and each file ``0600`` (they hold conversations).
- **In order**: :meth:`Spool.deliver` sends the oldest first and stops at the first body the
  server cannot take *now* (down, overloaded, a token it does not accept yet), so a session's
  turns land in the order they were put; how far a file was delivered is noted beside it
  (``.{name}.done``, not fsynced: lost, it only sends lines again, which replay). A body it
  refuses *for good* (invalid, too large, or 403: not this token's to write,
  e.g. after the agent id changed) is set aside in ``rejected/`` with a ``.reason`` file beside
  it, and delivery goes on. A line that is not one JSON object is set aside the same way: one
  bad body never blocks the others.
- **Bounded**: bodies that would take the spool past ``max_bytes`` are not spooled —
  :meth:`Spool.put` raises :class:`Full` — and the client keeps its own copy instead (capture:
  the agent's transcript, read again at the next hook; the Hermes provider: memory, then
  Hermes' own state.db, which ``sgme import hermes`` reads under the same keys). Nothing
  already spooled is ever dropped to make room. ``rejected/`` keeps at most
  ``max_rejected_bytes``: past it, the oldest set-aside bodies go (they were refused for good;
  the log names each).
- **One deliverer at a time** per directory (an advisory lock, where the platform has one):
  another process that finds it taken leaves delivery to the holder. Two at once would still
  be safe — every body carries its idempotency key — only wasteful.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import json
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no advisory lock, keys keep it correct
    fcntl = None  # type: ignore[assignment]

#: the default bound of a spool directory's pending bodies: 256 MiB
DEFAULT_MAX_BYTES = 256 * 1024 * 1024
#: the default bound of what ``rejected/`` keeps: 16 MiB
DEFAULT_REJECTED_BYTES = 16 * 1024 * 1024
REJECTED = "rejected"
LOCK = ".deliver.lock"
SUFFIXES = (".jsonl", ".json")  #: a spool file's (``.json``: one body, an earlier version's)

Body = dict[str, Any]
#: what a client gives to redact a text: ``redact(text)`` → an object with ``.text``
Redact = Callable[[str], Any]


class Full(Exception):
    """The spool is at its bound: the bodies were not spooled."""


class Outcome(enum.Enum):
    """What became of one body sent to the server."""

    SENT = "sent"  #: stored (or already stored): done with it
    LATER = "later"  #: not now (down, overloaded, unauthorized): keep it, stop here
    REFUSED = "refused"  #: never (invalid, too large, forbidden): set it aside, go on


#: ``send(body) -> (outcome, detail)``: one delivery attempt of one body
Send = Callable[[Body], tuple[Outcome, str]]


def scrubber(redact: Redact) -> Callable[[Body], Body]:
    """A body's scrub: ``redact`` over each message's content and every string of its
    metadata (what the server's own redaction covers)."""

    def value(item: Any) -> Any:
        if isinstance(item, str):
            return redact(item).text
        if isinstance(item, dict):
            return {k: value(v) for k, v in item.items()}
        if isinstance(item, list):
            return [value(v) for v in item]
        return item

    def scrub(body: Body) -> Body:
        out = dict(body)
        messages = body.get("messages")
        if isinstance(messages, list):
            out["messages"] = [
                {**m, "content": redact(m["content"]).text}
                if isinstance(m, dict) and isinstance(m.get("content"), str)
                else m
                for m in messages
            ]
        if isinstance(body.get("metadata"), dict):
            out["metadata"] = value(body["metadata"])
        return out

    return scrub


@dataclasses.dataclass
class Pending:
    """What waits in a spool (:meth:`Spool.waiting`)."""

    files: int = 0
    bodies: int = 0
    bytes: int = 0
    oldest: float | None = None  #: when the oldest waiting file was put (Unix time)
    by_agent: dict[str, int] = dataclasses.field(default_factory=dict)  #: bodies per agent_id
    rejected: int = 0  #: bodies set aside in rejected/


class Spool:
    """A directory of append bodies waiting to be delivered, oldest first."""

    def __init__(
        self,
        directory: Path,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        max_rejected_bytes: int = DEFAULT_REJECTED_BYTES,
        scrub: Callable[[Body], Body] | None = None,
    ) -> None:
        self.directory = directory
        self.rejected = directory / REJECTED
        self.max_bytes = max_bytes
        self.max_rejected_bytes = max_rejected_bytes
        self.scrub = scrub
        self.dropped: list[str] = []  #: set-aside bodies dropped past the bound (names)
        self._counter = 0
        self._lock = threading.Lock()

    def _make(self, directory: Path) -> None:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        with contextlib.suppress(OSError):
            os.chmod(directory, 0o700)  # made earlier, or by an older version, more open

    def _name(self) -> str:
        with self._lock:
            self._counter += 1
            return f"{time.time_ns():020d}-{os.getpid()}-{self._counter:06d}"

    def _encode(self, bodies: list[Body]) -> bytes:
        scrub = self.scrub or (lambda body: body)
        lines = [json.dumps(scrub(body), ensure_ascii=False) + "\n" for body in bodies]
        return "".join(lines).encode("utf-8", "surrogatepass")

    def put(self, bodies: list[Body]) -> Path:
        """Store bodies durably at the end of the queue, as one file (one fsync); :class:`Full`
        at the bound, ``OSError`` when it cannot be written (a read-only or full disk)."""
        data = self._encode(bodies)
        if self.size() + len(data) > self.max_bytes:
            raise Full(
                f"the spool {self.directory} is at its bound ({self.max_bytes} bytes pending)"
            )
        self._make(self.directory)
        name = self._name() + ".jsonl"
        path = self.directory / name
        write_file(self.directory / f".{name}.tmp", data, path)
        return path

    def pending(self) -> list[Path]:
        """What waits, in order."""
        try:
            found = [p for p in self.directory.iterdir() if p.name.endswith(SUFFIXES)]
            return sorted((p for p in found if p.is_file()), key=lambda p: p.name)
        except OSError:
            return []

    def size(self) -> int:
        """The bytes pending."""
        total = 0
        for path in self.pending():
            with contextlib.suppress(OSError):
                total += path.stat().st_size
        return total

    def set_aside(self, body: Body | bytes, reason: str) -> None:
        """Keep a body in ``rejected/`` with a ``.reason`` note, for a person to look at; the
        oldest go past ``max_rejected_bytes`` (their names in :attr:`dropped`)."""
        with contextlib.suppress(OSError):
            self._make(self.rejected)
            name = self._name()
            data = body if isinstance(body, bytes) else self._encode([body])
            write_file(self.rejected / f".{name}.tmp", data, self.rejected / f"{name}.json")
            note = self.rejected / f"{name}.reason"
            write_file(self.rejected / f".{name}.reason.tmp", reason.encode() + b"\n", note)
            self._bound_rejected()

    def _bound_rejected(self) -> None:
        sizes: dict[Path, int] = {}
        for path in sorted(self.rejected.glob("*.json")):
            with contextlib.suppress(OSError):
                sizes[path] = path.stat().st_size
        total = sum(sizes.values())
        for path, size in sizes.items():
            if total <= self.max_rejected_bytes:
                break
            with contextlib.suppress(OSError):
                path.unlink()
                path.with_suffix(".reason").unlink(missing_ok=True)
                self.dropped.append(path.name)
            total -= size

    def deliver(self, send: Send, *, deadline: float | None = None) -> bool:
        """Send what waits, in order, until a body cannot go now, the spool is empty or the
        ``deadline`` (``time.monotonic()``) has passed; True when nothing waits. Another
        process delivering this directory already: False at once (it sends ours too)."""
        with self._deliverer() as mine:
            if not mine:
                return not self.pending()
            for path in self.pending():
                if not self._deliver_file(path, send, deadline):
                    return False
            return not self.pending()

    def _deliver_file(self, path: Path, send: Send, deadline: float | None) -> bool:
        """Deliver one file from where an earlier delivery stopped; False when a body could
        not go now (how far it got is noted beside the file)."""
        try:
            lines = path.read_bytes().splitlines(keepends=True)
        except FileNotFoundError:
            return True  # another deliverer sent it
        except OSError as exc:
            return self._give_up(path, f"unreadable spool file: {exc}")
        for index in range(_done(path), len(lines)):
            line = lines[index]
            if deadline is not None and time.monotonic() > deadline:
                return self._keep(path, index)
            if not line.strip():
                continue
            try:
                body = json.loads(line)
            except (ValueError, RecursionError) as exc:
                self.set_aside(line, f"unreadable spool line: {exc}")
                continue
            if not isinstance(body, dict):
                self.set_aside(line, f"not an append body: a JSON {type(body).__name__}")
                continue
            outcome, detail = send(body)
            if outcome is Outcome.LATER:
                return self._keep(path, index)
            if outcome is Outcome.REFUSED:
                self.set_aside(body, detail)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        _progress(path).unlink(missing_ok=True)
        return True

    def _keep(self, path: Path, done: int) -> bool:
        """Note that the first ``done`` lines of a file are delivered: the file keeps its name
        (its place in the queue) and its bytes. Not fsynced: a note lost only sends those
        lines again, which their keys make replay. Always False (what is left waits)."""
        with contextlib.suppress(OSError):
            note = _progress(path)
            write_file(note.with_name(note.name + ".tmp"), str(done).encode(), note, durable=False)
        return False

    def _give_up(self, path: Path, reason: str) -> bool:
        with contextlib.suppress(OSError):
            self._make(self.rejected)
            os.replace(path, self.rejected / path.name)
            note = self.rejected / (path.name + ".reason")
            write_file(self.rejected / f".{path.name}.reason.tmp", reason.encode() + b"\n", note)
        return True

    def waiting(self) -> Pending:
        """What waits, counted (for ``sgme capture status``)."""
        found = Pending()
        for path in self.pending():
            try:
                data = path.read_bytes()
                found.oldest = found.oldest or path.stat().st_mtime
            except OSError:
                continue
            found.files += 1
            found.bytes += len(data)
            for line in data.splitlines()[_done(path) :]:
                with contextlib.suppress(ValueError, RecursionError):
                    body = json.loads(line)
                    agent = body.get("agent_id") if isinstance(body, Mapping) else None
                    found.bodies += 1
                    found.by_agent[str(agent)] = found.by_agent.get(str(agent), 0) + 1
        with contextlib.suppress(OSError):
            found.rejected = sum(1 for p in self.rejected.glob("*.json") if p.is_file())
        return found

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


def _progress(path: Path) -> Path:
    """Where how far a spool file was delivered is noted (a hidden file beside it)."""
    return path.with_name(f".{path.name}.done")


def _done(path: Path) -> int:
    """How many lines of a spool file an earlier delivery took (0 when none noted)."""
    try:
        return max(0, int(_progress(path).read_text()))
    except (OSError, ValueError):
        return 0


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
