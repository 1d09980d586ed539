"""A sender's order: appends numbered by their sender are applied in that order.

Celery does not keep the order of tasks once more than one process consumes a queue, and a seq,
once given, is never moved (docs/design.md §2). So a sender that needs its order numbers the
appends of a session — ``sequence`` 1, 2, 3, … — and ingest applies each one only when the
session expects it (``raw_files.next_sequence``: kept in the index, never in the file).

This module decides; :mod:`pipeline.ingest` acts. :func:`decide` says what to do with a
numbered append whose idempotency key was found new:

* **the expected one** → :class:`Write`: ingest writes it, the session expects the next one,
  and the appends held for it follow at once, in order, in the same transaction
  (:func:`next_release` / :func:`released`);
* **one ahead of it** is refused over HTTP (409 ``out-of-order``, naming the expected one: the
  client decides); a queued one (``sgme.append``) → :class:`Hold`: kept in
  ``waiting_appends`` (:func:`hold`) — in the index, durable, not in the broker: a worker
  killed while tasks wait takes none of them along — until its predecessor lands;
* **one behind it** was applied already: refused over HTTP (409) and, queued,
  → :class:`Drop`: recorded (:func:`drop`) — ``sequence_late`` when its number was skipped as a
  gap, ``sequence_duplicate`` otherwise — and not written;
* **a gap that never fills** (a sender that crashed between two tasks, a task lost with a
  wiped broker): once the oldest held append of the session has waited
  ``order_wait_seconds``, :func:`next_release` lets the lowest held one go next; the gap is
  recorded once as ``sequence_gap`` (keyed by the missing numbers) and the others follow.

A session uses sequences always or never: an append without one to a session that numbers its
appends, or with one to a session that had appends without, is refused (409 conflict: the
body is valid, the session's state is what it conflicts with).

All of it runs under the session's locks inside ingest's transaction — its row's, and a
transaction lock on the session itself (:func:`lock`), as its file may not exist yet — so two
processes can never both apply one number; the update of ``next_sequence`` is fenced on what
it read besides.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
from typing import Protocol

import sqlalchemy as sa

from pipeline import (
    anomalies,
    database,
    document,
    errors,
    idempotency,
    index,
    ledger,
    tables,
    validation,
)
from pipeline.tables import Kind

MAX_WAIT_SECONDS = 30 * 86400  #: the longest ``order_wait_seconds`` allowed (30 days)


class Numbered(Protocol):
    """What :func:`check_unsequenced` reads of a session's row."""

    @property
    def session_key(self) -> str: ...

    @property
    def next_sequence(self) -> int | None: ...


@dataclasses.dataclass(frozen=True)
class Write:
    """The append is the one its session expects: write it."""


@dataclasses.dataclass(frozen=True)
class Hold:
    """A queued append ahead of its session: keep it until its predecessor lands. ``new`` is
    False when the very same append is held already (a redelivered task)."""

    expected: int
    new: bool = True


@dataclasses.dataclass(frozen=True)
class Drop:
    """A queued append that will never be written: record it as ``kind`` and let it go."""

    kind: Kind
    expected: int


Decision = Write | Hold | Drop


@dataclasses.dataclass(frozen=True)
class Release:
    """A held append that may be written now: the lowest one waiting, when it is the expected
    one, or after a gap (``gap``: it is not) that has waited long enough."""

    waiting: tables.WaitingRow
    append: validation.Append
    expected: int

    @property
    def gap(self) -> bool:
        """Whether appends before it are missing (a gap let go)."""
        return self.waiting.sequence > self.expected


def session_of(append: validation.Append) -> ledger.Session:
    """The session an append goes to."""
    return ledger.Session(append.agent_id, append.source_type, append.session_key)


def lock(conn: sa.Connection, session: ledger.Session) -> None:
    """Hold the session until the transaction ends, whether or not its file exists yet."""
    database.transaction_lock(conn, "session\x1f" + "\x1f".join(session))


def expected(row: tables.FileRow | None) -> int:
    """The sequence the session of ``row`` expects next (1 for a session with no file)."""
    if row is None or row.next_seq == 1:
        return 1
    if row.next_sequence is None:
        raise errors.Conflict(
            f"sequence: session {row.session_key!r} has appends without a sequence; a session "
            "uses sequences always or never"
        )
    return row.next_sequence


def check_unsequenced(conn: sa.Connection, row: Numbered | None, session: ledger.Session) -> None:
    """Refuse an append without a sequence to a session that numbers its appends: its row
    says so, or, with no file yet, numbered appends wait for its first (then the caller
    holds the session's :func:`lock`)."""
    if row is not None and row.next_sequence is not None:
        raise errors.Conflict(
            f"sequence is required: session {row.session_key!r} numbers its appends (it "
            f"expects sequence {row.next_sequence} next); a session uses sequences always or never"
        )
    if row is None and ledger.first_waiting(conn, session) is not None:
        raise errors.Conflict(
            f"sequence is required: appends with a sequence wait for session "
            f"{session.session_key!r}; a session uses sequences always or never"
        )


def decide(
    conn: sa.Connection, row: tables.FileRow | None, append: validation.Append, *, queued: bool
) -> Decision:
    """What to do with a numbered append to its session (``row``, locked; None: no file
    yet), after its idempotency key was found new. Not ``queued`` (HTTP, where the client
    decides), anything but the expected number is :class:`errors.OutOfOrder`."""
    assert append.sequence is not None
    number, want = append.sequence, expected(row)
    if number == want:
        return Write()
    if not queued:
        raise _out_of_order(number, want)
    if number < want:
        assert row is not None  # a session past sequence 1 has its file
        late = _was_skipped(conn, row.file_id, number)
        return Drop(Kind.SEQUENCE_LATE if late else Kind.SEQUENCE_DUPLICATE, want)
    found = ledger.waiting(conn, session_of(append), number)
    if found is None:
        return Hold(want)
    if found.idempotency_key != append.idempotency_key:
        return Drop(Kind.SEQUENCE_DUPLICATE, want)
    if found.request_hash != append.digest:
        raise idempotency.conflict(append.idempotency_key or "")
    return Hold(want, new=False)


def hold(conn: sa.Connection, append: validation.Append, *, now: dt.datetime) -> None:
    """Keep a queued append until its predecessor lands (durable with the transaction)."""
    assert append.sequence is not None
    text = _dump(append)
    ledger.hold(
        conn,
        session_of(append),
        sequence=append.sequence,
        idempotency_key=append.idempotency_key or "",
        request_hash=append.digest,
        append_json=text,
        size=len(text.encode("utf-8")),
        received_at=now,
    )


def drop(
    conn: sa.Connection,
    file_id: str | None,
    append: validation.Append,
    decision: Drop,
    *,
    now: dt.datetime,
) -> None:
    """Record a queued append that will never be written, once per session, number and kind:
    it names the append's key, message count and times, never its content."""
    number = append.sequence
    assert number is not None
    count = len(append.messages)
    what = (
        f"the append with idempotency_key {append.idempotency_key!r} ({count} "
        f"message{'s' if count != 1 else ''}, {append.messages[0].ts} to "
        f"{append.messages[-1].ts})"
    )
    if decision.kind == Kind.SEQUENCE_LATE:
        detail = (
            f"sequence {number} came after it was skipped as a gap (the session expects "
            f"{decision.expected} next): {what} was recorded here, not appended out of place"
        )
    else:
        detail = f"sequence {number} was already taken: {what} was dropped"
    key = str(number)
    if file_id is None:  # no file to name it by: the session is named in the detail instead
        session = session_of(append)
        detail = f"agent_id={session.agent_id!r} session_key={session.session_key!r}: {detail}"
        key = _session_key(session, number)
    anomalies.record(conn, file_id, decision.kind, detail, key=key, now=now)


def next_release(
    conn: sa.Connection, session: ledger.Session, *, wait_seconds: float, now: dt.datetime
) -> Release | None:
    """The held append of ``session`` to write next, if one may go now: the lowest held one
    when it is the expected one or, once the oldest held one has waited ``wait_seconds``,
    after a gap. Held appends that can never be written (their number applied meanwhile, a
    session that turned out to take no sequences, a key used since) are recorded and let go
    on the way. The caller holds the session's :func:`lock`, writes the release and calls
    :func:`released`."""
    row = index.find_file(conn, *session)
    while (first := ledger.first_waiting(conn, session)) is not None:
        try:
            want = expected(row)
        except errors.Conflict as exc:  # the session had appends without a sequence
            _reject(conn, first, exc.detail, now=now)
            continue
        if first.sequence < want:  # its number was applied meanwhile (over HTTP, say)
            digest = idempotency.recorded_digest(conn, session.agent_id, first.idempotency_key)
            if digest != first.request_hash:  # not this very append
                file_id = row.file_id if row else None
                drop(conn, file_id, _load(first), Drop(Kind.SEQUENCE_DUPLICATE, want), now=now)
            ledger.release(conn, session, first.sequence)
            continue
        if first.sequence > want and not _overdue(conn, session, wait_seconds, now):
            return None
        if idempotency.recorded_digest(conn, session.agent_id, first.idempotency_key):
            why = f"idempotency_key {first.idempotency_key!r} was already used"
            _reject(conn, first, why, now=now)
            continue
        return Release(first, _load(first), want)
    return None


def released(
    conn: sa.Connection, release: Release, file_id: str, *, wait_seconds: float, now: dt.datetime
) -> None:
    """A released append was written to ``file_id``: forget it, and record the gap it was let
    go after, if any."""
    w = release.waiting
    ledger.release(conn, ledger.Session(w.agent_id, w.source_type, w.session_key), w.sequence)
    if not release.gap:
        return
    lo, hi = release.expected, w.sequence - 1
    missing = f"sequence {lo}" if lo == hi else f"sequences {lo}-{hi}"
    after = f"after sequence {lo - 1}" if lo > 1 else "first"
    detail = (
        f"{missing} never arrived within order_wait_seconds ({wait_seconds:g} s) of the first "
        f"append waiting for it; sequence {w.sequence} was applied {after}"
    )
    anomalies.record(conn, file_id, Kind.SEQUENCE_GAP, detail, key=_span(lo, hi), now=now)


def waiting_sessions(db: database.Database, *, age: float) -> list[ledger.Session]:
    """Sessions where an append has waited ``age`` seconds or more (the sweeper's list); with
    ``age`` 0, every session with a held append."""
    older_than = db.now() - dt.timedelta(seconds=age) if age > 0 else None
    with db.reading() as conn:
        return ledger.waiting_sessions(conn, older_than)


def _overdue(
    conn: sa.Connection, session: ledger.Session, wait_seconds: float, now: dt.datetime
) -> bool:
    oldest = ledger.oldest_waiting(conn, session)
    return oldest is not None and oldest <= now - dt.timedelta(seconds=wait_seconds)


def _out_of_order(number: int, want: int) -> errors.OutOfOrder:
    if number > want:
        detail = (
            f"sequence {number} is ahead: this session expects sequence {want} next "
            "(send the ones before it first)"
        )
    else:
        detail = (
            f"sequence {number} of this session was already applied (by an append with "
            f"another idempotency_key); it expects sequence {want} next"
        )
    return errors.OutOfOrder(detail, expected=want)


def _span(lo: int, hi: int) -> str:
    """The anomaly key of a gap: the missing numbers, ``11`` or ``11-13``."""
    return str(lo) if lo == hi else f"{lo}-{hi}"


def _was_skipped(conn: sa.Connection, file_id: str, number: int) -> bool:
    """Whether ``number`` lies in a gap of the file (its ``sequence_gap`` anomalies), compared
    with each gap's bounds: a gap can span two billion numbers."""
    for gap in anomalies.listed(conn, file_id=file_id, kinds=[Kind.SEQUENCE_GAP]):
        lo, _, hi = gap.key.partition("-")
        if int(lo) <= number <= int(hi or lo):
            return True
    return False


def _session_key(session: ledger.Session, number: int) -> str:
    """The anomaly key of a session that has no file yet: a digest of the session and the
    number (an anomaly without a file and without a key is an event, recorded each time)."""
    digest = hashlib.sha256("\x1f".join(session).encode("utf-8", "surrogatepass")).hexdigest()
    return f"{digest[:32]}#{number}"


def _reject(conn: sa.Connection, waiting: tables.WaitingRow, why: str, *, now: dt.datetime) -> None:
    """Drop a held append that can never be written, as an invalid task is (an event)."""
    session = ledger.Session(waiting.agent_id, waiting.source_type, waiting.session_key)
    who = f"agent_id={session.agent_id!r} session_key={session.session_key!r}"
    detail = f"{who}: sequence {waiting.sequence} dropped: {why}"
    anomalies.record(conn, None, Kind.APPEND_TASK_REJECTED, detail, now=now)
    ledger.release(conn, session, waiting.sequence)


def _dump(append: validation.Append) -> str:
    """A validated append as held (timestamps already resolved: a message without ``ts`` keeps
    the time it was received, not the time it is written)."""
    data = dataclasses.asdict(append)
    data["messages"] = [[m.role, m.content, m.ts, m.tool_name] for m in append.messages]
    return json.dumps(data, ensure_ascii=False)


def _load(waiting: tables.WaitingRow) -> validation.Append:
    data = json.loads(waiting.append_json)
    messages = tuple(document.Message(*message) for message in data.pop("messages"))
    return validation.Append(**data, messages=messages)
