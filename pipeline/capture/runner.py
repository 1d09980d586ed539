"""One capture run: what the transcripts gained since the last run, sent in order, within a
time budget, never failing.

1. What the spool holds (earlier runs' turns the server could not take) is delivered first,
   oldest first.
2. Each transcript is read by its importer (the same reader, conversion and keys as ``sgme
   import``), unless it is unchanged since a run that took everything it could.
3. Each turn whose key is not yet in the session's state (:mod:`.state`) is sent — straight to
   the server while nothing waits in the spool, else (and once the server fails, or the time
   is nearly up) to the spool behind what waits, so a session's turns land in order. A key
   joins the state only once its turn is delivered or spooled.

Any error is caught, logged and ends the run: a hook exits 0 whatever happens.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import filelock

from pipeline import errors
from pipeline.capture import spool as spooling
from pipeline.capture import state as states
from pipeline.capture.config import Agent
from pipeline.importers import runner, source

logger = logging.getLogger("sgme.capture")

#: seconds one request may take at most (less when the budget is nearly spent)
REQUEST_SECONDS = 5.0
#: seconds kept back from the budget for spooling what could not be sent in time
RESERVE_SECONDS = 0.3


@dataclasses.dataclass(frozen=True)
class Target:
    """A transcript to capture, how to read it, and its signature for the unchanged check."""

    path: Path
    read: Callable[[Path], Iterator[source.Record]]
    policy: str  #: what the hook said about the transcript's last turn (part of the signature)


@dataclasses.dataclass
class Summary:
    """What a run did (for logs and tests)."""

    sent: int = 0  #: turns the server stored (or had already) in this run
    spooled: int = 0  #: turns put in the spool
    delivered: bool = False  #: the spool was empty at the end
    unchanged: int = 0  #: transcripts skipped as unchanged
    problems: list[str] = dataclasses.field(default_factory=list)


def outcome(send: Callable[[], object]) -> tuple[spooling.Outcome, str]:
    """What became of one append, by the error the client raised (``spool.Outcome``)."""
    try:
        send()
    except errors.Conflict:
        return spooling.Outcome.SENT, "already stored"  # the key holds this turn already
    except (errors.Unauthorized, errors.TransientError) as exc:
        return spooling.Outcome.LATER, exc.detail
    except errors.PermanentError as exc:
        return spooling.Outcome.REFUSED, f"{exc.status} {exc.detail}"
    except errors.SgmeError as exc:  # a 5xx: the server failed, it may not later
        return spooling.Outcome.LATER, exc.detail
    return spooling.Outcome.SENT, ""


class Run:
    """A capture run for one agent, against one server, until ``deadline``."""

    def __init__(self, config: Agent, *, deadline: float) -> None:
        self.config = config
        self.deadline = deadline
        self.spool = spooling.Spool(config.spool_dir, max_bytes=config.spool_max_bytes)
        self.state = states.State(config.spool_dir)
        self.summary = Summary()
        self._client: Any = None  # made when there is something to send (see _connect)
        self._timeout = REQUEST_SECONDS
        self._clear = False  # nothing waits in the spool: turns may go straight

    def left(self) -> float:
        """Seconds left of the budget."""
        return self.deadline - time.monotonic()

    def _connect(self) -> Any:
        """The HTTP client, made on first use: importing it (its answer models) costs a
        good part of a SessionEnd hook's budget, and most such runs have nothing to send.
        Made again with a shorter timeout once less than one request's is left of the budget,
        so no request outlasts it."""
        from pipeline import client

        left = max(0.1, self.left() - RESERVE_SECONDS)  # after the import, which takes time
        if self._client is not None and self._timeout > left:
            self._client.close()
            self._client = None
        if self._client is None:
            self._timeout = min(REQUEST_SECONDS, left)
            self._client = client.Client(
                self.config.url,
                token=self.config.token,
                timeout=self._timeout,
                retry=client.NO_RETRY,
            )
        return self._client

    def send(self, body: dict[str, Any]) -> tuple[spooling.Outcome, str]:
        """One attempt to append one body (a spool ``Send``)."""
        return outcome(lambda: self._connect().append(**body))

    def close(self) -> None:
        if self._client is not None:
            self._client.close()

    def deliver(self) -> None:
        """Send what earlier runs spooled."""
        self._clear = self.spool.deliver(self.send, deadline=self.deadline - RESERVE_SECONDS)
        self.summary.delivered = self._clear

    def capture(self, target: Target) -> None:
        """Take what ``target`` gained since the last run."""
        try:
            stat = target.path.stat()
        except OSError as exc:
            self.summary.problems.append(f"{target.path}: {exc}")
            return
        signature = f"{stat.st_size}:{stat.st_mtime_ns}:{target.policy}"
        if self.state.unchanged(target.path, signature):
            self.summary.unchanged += 1
            return
        complete = True
        for record in target.read(target.path):
            if isinstance(record, source.Problem):
                self.summary.problems.append(str(record))
            elif isinstance(record, source.Session):
                complete = self._session(record) and complete
        if complete:
            self.state.remember(target.path, signature)

    def _session(self, session: source.Session) -> bool:
        """Send or spool the session's new turns; whether all of them were taken care of."""
        appends = runner.bodies(session, agent_id=self.config.agent_id)
        if not appends:
            return True
        try:
            with self.state.session(
                self.config.agent_id, session.session_key, timeout=max(0.0, self.left())
            ) as known:
                for _, body in appends:
                    key = body["idempotency_key"]
                    if key in known:
                        continue
                    if not self._take(body):
                        return False
                    known.add(key)
        except filelock.Timeout:
            self.summary.problems.append(f"session {session.session_key!r}: busy, left for later")
            return False
        return True

    def _take(self, body: dict[str, Any]) -> bool:
        """Deliver ``body`` or spool it; False when neither could be done."""
        if self._clear and self.left() > RESERVE_SECONDS:
            found, detail = self.send(body)
            if found is spooling.Outcome.SENT:
                self.summary.sent += 1
                return True
            if found is spooling.Outcome.REFUSED:
                logger.warning("sgme capture: turn %s refused: %s", body["idempotency_key"], detail)
                # kept for a person to look at, like a refused spooled turn
                try:
                    self.spool.set_aside(self.spool.put(body), detail)
                except (OSError, spooling.Full) as exc:
                    self.summary.problems.append(f"cannot keep a refused turn: {exc}")
                return True
            self._clear = False  # the server cannot take it now: this and the rest wait
        try:
            self.spool.put(body)
        except (OSError, spooling.Full) as exc:
            # left out of the state: the next run reads the transcript and tries again
            self.summary.problems.append(f"cannot spool turn {body['idempotency_key']}: {exc}")
            return False
        self.summary.spooled += 1
        return True


def capture(config: Agent, targets: list[Target], *, seconds: float) -> Summary:
    """Run one capture of ``targets`` within ``seconds``; never raises."""
    deadline = time.monotonic() + seconds
    run: Run | None = None
    try:
        run = Run(config, deadline=deadline)
        run.deliver()
        for target in targets:
            run.capture(target)
        return run.summary
    except Exception as exc:  # a hook must never fail its agent: say it and go
        logger.warning("sgme capture: %s: %s", type(exc).__name__, exc)
        summary = run.summary if run is not None else Summary()
        summary.problems.append(f"{type(exc).__name__}: {exc}")
        return summary
    finally:
        if run is not None:
            run.close()
