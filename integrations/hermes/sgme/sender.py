"""The provider's write path: turns go to the spool (``spool.py``, the same module live capture
uses, copied here by ``sgme hermes install``) and a background thread delivers it, in order.

When the spool cannot take a turn — its directory cannot be written, or it is at its bound
(``SGME_SPOOL_MAX_BYTES``) — the turn is held in memory (up to :data:`HELD_BYTES`) and sent
after what the spool holds; it is never counted as sent before it is. Past that bound too, the
turn is left out with a warning: it is still in Hermes' own ``state.db``, and ``sgme import
hermes`` stores it under the same key once SGME is back.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # beside this module once installed (see __init__)
    from pipeline.capture import spool as spooling
else:
    from . import spool as spooling

try:
    import httpx
except ImportError:  # pragma: no cover - Hermes ships httpx; is_available() says so if not
    httpx = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)

#: seconds: connecting, and the whole answer; a slow server costs a spooled turn, not the agent
CONNECT_TIMEOUT = 2.0
REQUEST_TIMEOUT = 5.0
#: seconds on_session_end / shutdown spend delivering at most
DRAIN_TIMEOUT = 5.0
#: answers after which a body is set aside for a person, not retried: invalid, forbidden
#: (another agent's, e.g. after SGME_AGENT_ID changed), too large, not JSON
REFUSED = (400, 403, 413, 415, 422)
#: bytes of turns held in memory when the spool cannot take them
HELD_BYTES = 64 * 1024 * 1024


def _erased(answer: Any) -> bool:
    """Whether an append's answer says its turn was erased (its key is an erasure's
    tombstone: nothing was written, on purpose)."""
    try:
        found = answer.json()
    except ValueError:
        return False
    return isinstance(found, dict) and bool(found.get("erased"))


class Sender:
    """Spools turns and delivers them in order from a background thread, or on demand with a
    deadline."""

    def __init__(self, config: dict[str, Any], spool: spooling.Spool) -> None:
        self.config = config
        self.spool = spool
        self._held: deque[tuple[dict[str, Any], int]] = deque()
        self._held_bytes = 0
        self._deliver_lock = threading.Lock()
        self._put_lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sgme-sender", daemon=True)
        headers = {"Content-Type": "application/json"}
        if config["token"]:
            headers["Authorization"] = "Bearer " + config["token"]
        self._client = httpx.Client(
            base_url=config["url"],
            headers=headers,
            timeout=httpx.Timeout(REQUEST_TIMEOUT, connect=CONNECT_TIMEOUT),
        )
        self._warned: set[str] = set()

    def _warn_once(self, kind: str, message: str, *args: Any) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            logger.warning(message, *args)

    def start(self) -> None:
        self._thread.start()

    def kick(self) -> None:
        """Ask the background thread to deliver (returns at once)."""
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait()
            self._wake.clear()
            if not self._stop.is_set():
                self.deliver()

    def put(self, bodies: list[dict[str, Any]]) -> bool:
        """Keep a turn's bodies until they are delivered: spooled (one file, redacted), else
        held in memory; False when neither could take them (the turn is then left out, and
        said so)."""
        with self._put_lock:
            if not self._held:  # once one is held, the rest waits behind it (order)
                try:
                    self.spool.put(bodies)
                    return True
                except (OSError, spooling.Full) as exc:
                    self._warn_once(
                        "spool", "sgme: cannot spool turns (%s); holding them in memory", exc
                    )
            for index, body in enumerate(bodies):
                size = len(json.dumps(body, ensure_ascii=False))
                if self._held_bytes + size > HELD_BYTES:
                    logger.warning(
                        "sgme: turn %s not kept: the spool and the memory bound are full. It "
                        "is in Hermes' state.db: `sgme import hermes` stores it (same key) "
                        "once SGME is back",
                        body.get("idempotency_key"),
                    )
                    return index > 0
                self._held.append((body, size))
                self._held_bytes += size
        return True

    def deliver(self, deadline: float | None = None) -> bool:
        """Send the spool, then what is held, in order, until one cannot go now; True when
        nothing waits."""
        with self._deliver_lock:
            if not self.spool.deliver(self.send, deadline=deadline):
                return False
            while self._held:
                if deadline is not None and time.monotonic() > deadline:
                    return False
                body, size = self._held[0]
                outcome, detail = self.send(body)
                if outcome is spooling.Outcome.LATER:
                    return False
                if outcome is spooling.Outcome.REFUSED:
                    logger.warning("sgme: turn %s refused: %s", body.get("idempotency_key"), detail)
                with self._put_lock:
                    self._held.popleft()
                    self._held_bytes -= size
            return True

    def send(self, body: dict[str, Any]) -> tuple[spooling.Outcome, str]:
        """One attempt to append one body."""
        try:
            answer = self._client.post("/v1/append", json=body)
        except httpx.HTTPError as exc:
            self._warn_once(
                "down",
                "sgme: %s unreachable (%s); turns wait in %s",
                self.config["url"],
                exc,
                self.spool.directory,
            )
            return spooling.Outcome.LATER, str(exc)
        status = answer.status_code
        if status < 300 or status == 409:
            self._warned.difference_update(("down", "status"))
            # 409: the key is taken by this same turn sent earlier (its times or metadata
            # differ, or the importer stored it): it is in SGME already.
            if status < 300 and _erased(answer):
                logger.warning(
                    "sgme: turn %s was erased from SGME: not stored again",
                    body.get("idempotency_key"),
                )
                return spooling.Outcome.SENT, "erased"
            return spooling.Outcome.SENT, ""
        detail = f"{status} {answer.text[:500]}"
        if status in REFUSED:
            logger.warning(
                "sgme: %s refused turn %s (%s): set aside in %s",
                self.config["url"],
                body.get("idempotency_key"),
                detail,
                self.spool.rejected,
            )
            return spooling.Outcome.REFUSED, detail
        self._warn_once(
            "status",
            "sgme: %s answered %s; turns wait in %s",
            self.config["url"],
            status,
            self.spool.directory,
        )
        return spooling.Outcome.LATER, detail

    def close(self, timeout: float = DRAIN_TIMEOUT) -> None:
        """One last bounded delivery, then stop the thread."""
        with contextlib.suppress(Exception):
            self.deliver(deadline=time.monotonic() + timeout)
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=1.0)
        self._client.close()
