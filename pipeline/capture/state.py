"""What live capture remembers between hook runs, under ``{spool dir}/state/``.

- per L0 session (agent id and session key): the idempotency keys of the turns already
  delivered or spooled, so a run sends only what the transcript gained — and a resumed
  session, whose new transcript copies the old turns under their old keys, sends none of them
  again. Read and written under a lock (two hooks firing at once take turns);
- per transcript file: the signature (size, modification time, what the hook said about the
  last turn) of the last read that took everything it could, so a hook that finds the file
  unchanged returns without reading it.

Files are written whole (temporary file, rename) and private (0600 in a 0700 directory), not
fsynced: a state is written only after what it records is delivered or durably spooled, and a
lost or damaged one only costs requests (the server's idempotency keys still make every turn
land once). Each fsync may cost a busy disk a second, and a hook has about one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import filelock

from pipeline.capture import spool as spooling

DIRECTORY = "state"


def _name(*parts: str) -> str:
    joined = "\0".join(parts).encode("utf-8", "surrogatepass")
    return hashlib.sha256(joined).hexdigest()[:32]


class State:
    """The capture state kept beside a spool."""

    def __init__(self, spool_dir: Path) -> None:
        self.directory = spool_dir / DIRECTORY

    def _make(self) -> None:
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)

    # -- transcript signatures -------------------------------------------------------------

    def _signature_path(self, transcript: Path) -> Path:
        return self.directory / f"{_name(str(transcript))}.sig"

    def unchanged(self, transcript: Path, signature: str) -> bool:
        """Whether the last full read of ``transcript`` had this ``signature``."""
        try:
            return self._signature_path(transcript).read_text(encoding="utf-8") == signature
        except (OSError, ValueError):
            return False

    def remember(self, transcript: Path, signature: str) -> None:
        """Note that everything ``transcript`` held under ``signature`` is taken care of."""
        self._make()
        path = self._signature_path(transcript)
        spooling.write_file(
            path.with_suffix(".tmp"), signature.encode("utf-8"), path, durable=False
        )

    # -- delivered keys ----------------------------------------------------------------------

    @contextlib.contextmanager
    def session(self, agent_id: str, session_key: str, *, timeout: float) -> Iterator[Keys]:
        """The keys of a session, locked for at most ``timeout`` seconds of waiting
        (``filelock.Timeout`` past it); saved when the block ends without an error."""
        self._make()
        path = self.directory / f"{_name(agent_id, session_key)}.json"
        lock = filelock.FileLock(str(path) + ".lock", timeout=max(timeout, 0.0), mode=0o600)
        with lock:
            keys = Keys(path, agent_id, session_key)
            yield keys
            keys.save()


class Keys:
    """The idempotency keys a session's turns were delivered or spooled under."""

    def __init__(self, path: Path, agent_id: str, session_key: str) -> None:
        self.path = path
        self.agent_id = agent_id
        self.session_key = session_key
        self._keys: dict[str, None] = {}
        self._changed = False
        with contextlib.suppress(OSError, ValueError):
            stored = json.loads(path.read_bytes())
            if isinstance(stored, dict) and isinstance(stored.get("keys"), list):
                self._keys = {k: None for k in stored["keys"] if isinstance(k, str)}

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def add(self, key: str) -> None:
        """Note a key as delivered or spooled."""
        if key not in self._keys:
            self._keys[key] = None
            self._changed = True

    def save(self) -> None:
        """Write the keys back when they changed."""
        if not self._changed:
            return
        data = json.dumps(
            {"agent_id": self.agent_id, "session_key": self.session_key, "keys": list(self._keys)},
            ensure_ascii=False,
        ).encode("utf-8", "surrogatepass")
        spooling.write_file(self.path.with_suffix(".tmp"), data, self.path, durable=False)
        self._changed = False
