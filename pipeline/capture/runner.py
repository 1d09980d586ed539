"""One capture run: what the transcripts gained since the last run, sent in order, within a
time budget, never failing.

1. Each transcript is read from where the last run left it (:mod:`.state`), record by record,
   by the importer of the same name — the same conversion and the same keys as ``sgme
   import`` — for at most half of what is left of the budget (what is read must still be sent
   or spooled). A transcript this version has not read before is read from its start, with the
   keys earlier versions gave its turns (``legacy_key``). A hook that names the answer the
   transcript should end with (Claude Code's Stop runs before the last records are written)
   waits a little for it. This comes first: what an agent wrote is on the spool's disk before
   the run spends its time on the server, so a run that a slow server or a long backlog keeps
   busy to its end still takes what its hook came for (no later hook may come for this
   transcript: a session ends).
2. Each unit's append is sent straight while nothing waits in the spool; once one cannot go
   (the server down, slow, refusing the token) or the time is nearly up — and from the start
   when the spool holds something — it and everything after it are kept for the spool,
   behind what waits, so a session's units land in order.
3. What was kept goes to the spool as one file (one fsync), redacted. Then each transcript's
   state moves to its last record taken care of — delivered, or in the written spool file.
   When the spool cannot be written, what was kept for it is sent straight while the server
   takes it, and the rest is read again by the next run.
4. What the spool holds is delivered, oldest first, with what is left of the budget.

Any error is caught, logged and ends the run: a hook exits 0 whatever happens.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
import logging
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import filelock

from pipeline import errors
from pipeline.capture import spool as spooling
from pipeline.capture import state as states
from pipeline.capture.config import Agent
from pipeline.importers import claude_code, codex, runner, source

logger = logging.getLogger("sgme.capture")

#: seconds one request may take at most (less when the budget is nearly spent)
REQUEST_SECONDS = 5.0
#: seconds kept back from the budget for spooling what could not be sent in time
RESERVE_SECONDS = 0.3
#: bytes a second what is kept is assumed spooled at (redacted, encoded, written: about 20 MB/s
#: measured on a loaded machine), to keep back time for a large spool file
SPOOL_RATE = 10e6
#: the share of what is left of the budget a transcript may be read for; half of it when the
#: keys of earlier versions are to be worked out too (about as long again: docs/benchmarks.md)
READ_SHARE = 0.5
#: seconds kept back from the budget at the very end (closing the client, the log, a process
#: that held a large transcript letting go of it)
LAST = 0.25
#: seconds a run waits for the answer its hook named to be in the transcript
LAG_SECONDS = 2.0
LAG_POLL = 0.05
#: the importer that reads each agent's transcripts
FORMATS: dict[str, Any] = {"claude-code": claude_code, "codex": codex}
VERSION = 2  #: of a transcript's saved state


@dataclasses.dataclass(frozen=True)
class Target:
    """A transcript to capture: its path, whose it is (``claude-code``, ``codex``), and the
    answer its hook said it ends with (None: the hook said nothing)."""

    path: Path
    kind: str
    expect: str | None = None


@dataclasses.dataclass
class Summary:
    """What a run did (for the log, ``sgme capture status`` and tests)."""

    sent: int = 0  #: appends the server took (stored, already stored, or erased)
    spooled: int = 0  #: appends put in the spool
    erased: int = 0  #: messages not stored again because they were erased
    delivered: bool = False  #: the spool was empty at the end
    unchanged: int = 0  #: transcripts with nothing new (not read)
    lagging: list[str] = dataclasses.field(default_factory=list)  #: answers not in time
    #: why what is left could not be delivered (the first reason met), or None
    failure: str | None = None
    problems: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class _Item:
    """A line of a transcript read in this run, and its appends."""

    end: int  #: the byte offset after it
    number: int
    line: source.Line | None  #: None: the line could not be read
    units: list[source.Unit] = dataclasses.field(default_factory=list)
    bodies: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    taken: int = 0  #: bodies sent (or set aside)
    kept: int = 0  #: bodies after those, kept for the spool


@dataclasses.dataclass
class _Pass:
    """One transcript's reading in this run."""

    target: Target
    saved: states.Saved
    start: dict[str, Any]  #: the state it starts from
    items: list[_Item]
    reader: Any  #: the importer's Reader after the last item


def _size(body: dict[str, Any]) -> int:
    """About what an append takes in the spool (its messages' text and some for the rest)."""
    return 200 + sum(len(m["content"]) for m in body["messages"])


def _matches(said: str | None, expect: str) -> bool:
    if said is None:
        return False
    a, b = " ".join(said.split()), " ".join(expect.split())
    return a == b or a.endswith(b) or b.endswith(a)


class Run:
    """A capture run for one agent, against one server, until ``deadline``."""

    def __init__(self, config: Agent, *, deadline: float, transport: Any = None) -> None:
        self.config = config
        self.deadline = deadline
        self.transport = transport  #: an httpx transport in place of the network (tests)
        self.spool = spooling.Spool(
            config.spool_dir,
            max_bytes=config.spool_max_bytes,
            max_rejected_bytes=config.rejected_max_bytes,
            scrub=_scrub,
        )
        self.state = states.State(config.spool_dir)
        self.summary = Summary()
        self._client: Any = None  # made when there is something to send (see _connect)
        self._timeout = REQUEST_SECONDS
        self._clear = False  # nothing waits in the spool: appends may go straight
        self._kept: list[dict[str, Any]] = []  # appends for the spool, in order
        self._kept_bytes = 0
        self._undecided_bytes = 0  # of the appends made and neither sent nor kept yet
        self._spooled_bytes: int | None = None  # what the spool held when the run kept its first
        self._stopped = False  # an append could be neither sent nor kept: take no more
        self._passes: list[_Pass] = []
        self._locks = contextlib.ExitStack()

    def left(self) -> float:
        """Seconds left of the budget."""
        return self.deadline - time.monotonic()

    def _reserve(self) -> float:
        """Seconds to keep back: enough to spool what is kept, and what may yet be."""
        return RESERVE_SECONDS + (self._kept_bytes + self._undecided_bytes) / SPOOL_RATE

    def _connect(self) -> Any:
        """The HTTP client (httpx), made on first use — most SessionEnd runs have nothing to
        send — and made again with a shorter timeout once less than one request's is left of
        the budget, so no request outlasts it. Not ``pipeline.client``: its answer models
        import the server's tables (SQLAlchemy), a third of a second of a hook's budget."""
        import httpx

        left = max(0.1, self.left() - self._reserve())
        if self._client is not None and self._timeout > left:
            self._client.close()
            self._client = None
        if self._client is None:
            self._timeout = min(REQUEST_SECONDS, left)
            headers = {"Authorization": f"Bearer {self.config.token}"} if self.config.token else {}
            self._client = httpx.Client(
                base_url=self.config.url,
                headers=headers,
                timeout=self._timeout,
                transport=self.transport,
            )
        return self._client

    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        """``POST /v1/append``: the answer, or the :mod:`pipeline.errors` error it stands for
        (:func:`exchange.error_from`, the client's own reading of a refusal)."""
        import httpx

        from pipeline import exchange

        try:
            answer = self._connect().post("/v1/append", json=body)
        except httpx.RequestError as exc:  # no answer at all
            raise errors.Unreachable(f"no answer: {type(exc).__name__}: {exc}") from exc
        if answer.status_code >= 300:
            raise exchange.error_from(answer)
        try:
            found = answer.json()
        except ValueError:
            found = None
        return found if isinstance(found, dict) else {}

    def send(self, body: dict[str, Any]) -> tuple[spooling.Outcome, str]:
        """One attempt to append one body (a spool ``Send``); why not, when it cannot go."""
        found, detail = self._outcome(body)
        if found is spooling.Outcome.LATER and self.summary.failure is None:
            self.summary.failure = detail
        elif found is spooling.Outcome.SENT:
            self.summary.sent += 1
        return found, detail

    def _outcome(self, body: dict[str, Any]) -> tuple[spooling.Outcome, str]:
        """What became of one append, by the answer or the error the client raised."""
        try:
            # a body the server refuses for its metadata goes again without it (the importer's
            # rule: metadata describes a session, the unit is what must not be lost)
            answer = runner.send(self._post, body)
        except errors.Conflict:
            return spooling.Outcome.SENT, "already stored"  # the key holds this unit already
        except errors.Unauthorized as exc:
            if self.config.token is None:
                why = self.config.token_problem or "no SGME_TOKEN and no token file"
                return spooling.Outcome.LATER, (
                    f"the server asks for a token and the hook has none ({why}): see "
                    "`sgme capture install`"
                )
            return spooling.Outcome.LATER, (
                f"the server refuses the token from {self.config.token_source} (401): {exc.detail}"
            )
        except errors.Unreachable as exc:
            return spooling.Outcome.LATER, f"the server at {self.config.url} is away: {exc.detail}"
        except errors.TransientError as exc:
            return (
                spooling.Outcome.LATER,
                f"the server cannot take it now ({exc.status}): {exc.detail}",
            )
        except errors.PermanentError as exc:
            return spooling.Outcome.REFUSED, f"{exc.status} {exc.detail}"
        except errors.SgmeError as exc:  # a 5xx: the server failed, it may not later
            return spooling.Outcome.LATER, f"the server failed ({exc.status}): {exc.detail}"
        erased = answer.get("erased", 0) if isinstance(answer, dict) else 0
        erased = erased if isinstance(erased, int) else 0
        self.summary.erased += erased
        return spooling.Outcome.SENT, "erased earlier: not stored again" if erased else ""

    def close(self) -> None:
        """Let go of the transcripts' locks and the HTTP client."""
        self._locks.close()
        if self._client is not None:
            self._client.close()

    def deliver(self) -> None:
        """Send what the spool holds, oldest first, with what is left of the budget."""
        self.summary.delivered = self.spool.deliver(self.send, deadline=self.deadline - LAST)

    def start(self) -> None:
        """Appends go straight only while nothing waits in the spool (they would land
        before what does)."""
        self._clear = not self.spool.pending()

    # -- reading ---------------------------------------------------------------------------------

    def capture(self, target: Target) -> None:
        """Read what ``target`` gained since the last run and take its appends."""
        module = FORMATS[target.kind]
        try:
            found = os.stat(target.path)
        except OSError as exc:
            self.summary.problems.append(f"{target.path}: {exc.strerror}")
            return
        if not stat.S_ISREG(found.st_mode):
            self.summary.problems.append(f"{target.path}: not a regular file: not read")
            return
        try:
            saved = self._locks.enter_context(
                self.state.transcript(target.path, timeout=max(0.0, self.left() - 1.0))
            )
        except filelock.Timeout:
            self.summary.problems.append(f"{target.path}: busy (another hook), left for later")
            return
        except OSError as exc:  # a spool directory that cannot be written: no state either
            self.summary.problems.append(f"cannot keep the capture's state ({exc}): read whole")
            saved = states.Saved(None)
        if self._clear and self.spool.pending():  # another hook spooled meanwhile: behind it
            self._clear = False
        start = self._start(target, saved.data, found)
        offset = int(start["offset"])
        if offset == found.st_size and (
            target.expect is None or _matches(start["reader"].get("last_text"), target.expect)
        ):
            self.summary.unchanged += 1
            return
        try:
            reader = module.Reader(target.path, start["reader"])
        except (TypeError, ValueError, AttributeError):  # a damaged state: read it all again
            start = self._start(target, None, found)
            offset, reader = 0, module.Reader(target.path, None)
        share = max(0.0, self.left() - self._reserve()) * READ_SHARE
        pending = start.get("legacy_until")
        if isinstance(pending, int) and offset < pending:
            share /= 2
        until = time.monotonic() + share
        items = self._read(target, reader, offset, int(start["line"]), until)
        if target.expect is not None and not _matches(reader.last_text, target.expect):
            items += self._wait(target, reader, items, start, until)
        self._passes.append(_Pass(target, saved, start, items, reader))
        self._take(module, self._passes[-1])

    def _start(self, target: Target, data: dict[str, Any] | None, found: Any) -> dict[str, Any]:
        """Where to read ``target`` from: its saved state, unless there is none (or it is
        another file now, or shorter): then its start, with an earlier version's keys."""
        if (
            isinstance(data, dict)
            and data.get("version") == VERSION
            and data.get("kind") == target.kind
            and (data.get("dev"), data.get("ino")) == (found.st_dev, found.st_ino)
            and isinstance(data.get("offset"), int)
            and 0 <= data["offset"] <= found.st_size
            and isinstance(data.get("line"), int)
            and isinstance(data.get("reader"), dict)
        ):
            return data
        return {
            "version": VERSION,
            "kind": target.kind,
            "path": str(target.path),
            "dev": found.st_dev,
            "ino": found.st_ino,
            "offset": 0,
            "line": 0,
            "legacy_until": found.st_size,
            "reader": {},
        }

    def _read(
        self, target: Target, reader: Any, offset: int, number: int, until: float
    ) -> list[_Item]:
        items: list[_Item] = []
        for line in source.lines(
            target.path, offset=offset, number=number, live=True, deadline=until
        ):
            if isinstance(line, source.Problem):
                self.summary.problems.append(str(line))
                if line.end is not None and line.line is not None:
                    items.append(_Item(line.end, line.line, None))
                continue
            item = _Item(line.end, line.number, line)
            items.append(item)
            try:
                item.units = reader.take(line.number, line.value)
            except ValueError as exc:
                self.summary.problems.append(f"{target.path}:{line.number}: {exc}")
        return items

    def _wait(
        self, target: Target, reader: Any, items: list[_Item], start: dict[str, Any], until: float
    ) -> list[_Item]:
        """More of the transcript, until it holds the answer the hook named or
        :data:`LAG_SECONDS` pass (then the rest is for the next run)."""
        more: list[_Item] = []
        stop = min(until, time.monotonic() + LAG_SECONDS)
        while time.monotonic() < stop:
            time.sleep(LAG_POLL)
            last = (more or items)[-1] if (more or items) else None
            offset = last.end if last else int(start["offset"])
            number = last.number if last else int(start["line"])
            more += self._read(target, reader, offset, number, until)
            if _matches(reader.last_text, target.expect or ""):
                return more
        self.summary.lagging.append(str(target.path))
        return more

    # -- taking ----------------------------------------------------------------------------------

    def _take(self, module: Any, read: _Pass) -> None:
        """Make the appends of what was read, then send or keep them, in order."""
        units = [unit for item in read.items for unit in item.units]
        by_position = {unit.position: item for item in read.items for unit in item.units}
        until = read.start.get("legacy_until")
        if units and isinstance(until, int) and int(read.start["offset"]) < until:
            lines = self._legacy_lines(read, until)
            units = module.legacy_units(read.target.path, lines, units)
        session = read.reader.session(units, metadata=int(read.start["offset"]) == 0)
        for unit, body in runner.bodies(session, agent_id=self.config.agent_id):
            item = by_position.get(unit.position)
            if item is not None:
                item.bodies.append(body)
                self._undecided_bytes += _size(body)
        for item in read.items:
            for body in item.bodies:
                if self._stopped:
                    return
                self._undecided_bytes -= _size(body)
                self._take_one(item, body)

    def _legacy_lines(self, read: _Pass, until: int) -> list[source.Line]:
        """The transcript's records up to ``until`` (where earlier versions' turns end)."""
        if int(read.start["offset"]) == 0:
            return [item.line for item in read.items if item.line is not None and item.end <= until]
        found = source.lines(read.target.path, live=True, deadline=self.deadline)
        return [line for line in found if isinstance(line, source.Line) and line.end <= until]

    def _take_one(self, item: _Item, body: dict[str, Any]) -> None:
        if self._clear and not self._kept and self.left() > self._reserve():
            outcome, detail = self.send(body)
            if outcome is not spooling.Outcome.LATER:
                if outcome is spooling.Outcome.REFUSED:
                    logger.warning("unit %s refused: %s", body["idempotency_key"], detail)
                    self.spool.set_aside(body, detail)  # kept for a person to look at
                item.taken += 1
                return
            self._clear = False  # the server cannot take it now: this and the rest wait
        elif self.left() <= self._reserve() and self.summary.failure is None:
            self.summary.failure = "the run's time was up: the rest waits in the spool"
        size = len(json.dumps(body, ensure_ascii=False).encode("utf-8", "surrogatepass"))
        if self._spooled_bytes is None:
            self._spooled_bytes = self.spool.size()
        if self._spooled_bytes + self._kept_bytes + size > self.spool.max_bytes:
            self.summary.failure = f"the spool {self.spool.directory} is at its bound"
            self._stopped = True
            return
        self._kept.append(body)
        self._kept_bytes += size
        item.kept += 1

    # -- the end ---------------------------------------------------------------------------------

    def finish(self) -> None:
        """Spool what was kept (one file), then move each transcript's state on."""
        written = False
        if self._kept:
            try:
                self.spool.put(self._kept)
                written = True
                self.summary.spooled += len(self._kept)
                self._kept_bytes = 0  # written: no time to keep back for it any more
            except (OSError, spooling.Full) as exc:
                self.summary.failure = f"cannot spool ({exc}): sending straight"
                self._straight()
        for read in self._passes:
            self._save(read, written)

    def _straight(self) -> None:
        """What was kept for a spool that cannot be written, sent while the server takes it."""
        for read in self._passes:
            for item in read.items:
                while item.kept and self.left() > RESERVE_SECONDS:
                    outcome, _ = self.send(item.bodies[item.taken])
                    if outcome is spooling.Outcome.LATER:
                        return
                    item.taken += 1
                    item.kept -= 1
                if item.kept:
                    return

    def _save(self, read: _Pass, written: bool) -> None:
        """Move the transcript's state to its last record taken care of."""
        done = 0
        for item in read.items:
            if item.taken + (item.kept if written else 0) < len(item.bodies):
                break
            done += 1
        if not done:
            return
        data = dict(read.start)
        last = read.items[done - 1]
        data["offset"], data["line"] = last.end, last.number
        if done == len(read.items):
            data["reader"] = read.reader.state()
        else:  # what the reader knew after the last record taken care of: read them again
            reader = FORMATS[read.target.kind].Reader(read.target.path, read.start["reader"])
            for item in read.items[:done]:
                if item.line is not None:
                    with contextlib.suppress(ValueError):
                        reader.take(item.line.number, item.line.value)
            data["reader"] = reader.state()
        until = data.get("legacy_until")
        if isinstance(until, int) and data["offset"] >= until:
            data["legacy_until"] = None
        data["session_key"] = data["reader"].get("session_key")
        data["read_at"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        try:
            read.saved.save(data)
        except OSError as exc:
            self.summary.problems.append(f"cannot save the state of {read.target.path}: {exc}")


_redact: Callable[[str], Any] | None = None


def _scrub(body: dict[str, Any]) -> dict[str, Any]:
    """A body with its secrets redacted (``pipeline.redactor``, imported when a body is first
    spooled: a run that sends everything never pays for its rules)."""
    global _redact
    if _redact is None:
        from pipeline import redactor

        _redact = redactor.redact
    return spooling.scrubber(_redact)(body)


def capture(
    config: Agent, targets: list[Target], *, seconds: float, transport: Any = None
) -> Summary:
    """Run one capture of ``targets`` within ``seconds``; never raises. ``transport``: an
    httpx transport in place of the network (tests)."""
    deadline = time.monotonic() + seconds
    run: Run | None = None
    try:
        run = Run(config, deadline=deadline, transport=transport)
        run.start()
        for target in targets:
            if run.left() <= run._reserve():
                run.summary.failure = run.summary.failure or "the run's time was up"
                break
            run.capture(target)
        run.finish()
        run.deliver()
        return run.summary
    except Exception as exc:  # a hook must never fail its agent: say it and go
        logger.warning("sgme capture: %s: %s", type(exc).__name__, exc, exc_info=True)
        summary = run.summary if run is not None else Summary()
        summary.problems.append(f"{type(exc).__name__}: {exc}")
        return summary
    finally:
        if run is not None:
            run.close()
