"""A sender's order (issue 13): appends numbered by their sender are applied in that order.

Celery does not keep the order of tasks once more than one process consumes a queue, and a seq,
once given, is never moved (DESIGN §2.9). So a sender that needs its order numbers the appends
of a session — ``sequence`` 1, 2, 3, … — and ingest applies each one only when the session
expects it (``raw_files.next_sequence``: kept in the index, never in the file):

* **The expected one** is written (by the writer ingest hands in), the session expects the next
  one, and the appends held for it follow at once, in order, in the same transaction.
* **One ahead of it** is refused over HTTP (409 ``out-of-order``, naming the expected one: the
  client decides). A queued one (``sgme.append``) is held in ``waiting_appends`` — in the
  index, durable, not in the broker: a worker killed while tasks wait takes none of them along
  — and written when its predecessor lands.
* **One behind it** was applied already. A retry with the same idempotency key was answered
  from its key before this module is asked (a redelivered task replays); any other append is
  refused over HTTP (409) and, queued, recorded and dropped: ``sequence_late`` when its number
  was skipped as a gap, ``sequence_duplicate`` otherwise.
* **A gap that never fills** (a sender that crashed between two tasks, a task lost with a wiped
  broker): once the oldest held append of the session has waited ``order_wait_seconds``, the
  lowest held one is written next, the gap is recorded once as ``sequence_gap`` (keyed by the
  missing numbers), and the others follow in order. Each queued arrival and each beat sweep
  (:func:`settle`) looks for that.

A session uses sequences always or never: an append without one to a session that numbers its
appends, or with one to a session that had appends without, is refused (422).

All of it runs under the session's locks inside ingest's transaction — its row's, and a
transaction lock on the session itself, as its file may not exist yet — so two processes can
never both apply one number; the update of ``next_sequence`` is fenced on what it read besides.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Callable
from typing import Protocol, TypeVar

import sqlalchemy as sa

from pipeline import commits, database, document, errors, index, ledger, tables, validation

DEFAULT_WAIT_SECONDS = 60.0  #: ``order_wait_seconds``: how long a gap may hold appends back
MAX_WAIT_SECONDS = 30 * 86400  #: the longest ``order_wait_seconds`` allowed (30 days)


class Written(Protocol):
    """What a writer answers: at least which file it wrote to."""

    @property
    def file_id(self) -> str: ...


W = TypeVar("W", bound=Written)
#: writes an append after the session's last one (making its file when the row is None) and
#: sets the sequence the session expects next to the append's ``sequence + 1``
Writer = Callable[[sa.Connection, tables.FileRow | None, validation.Append], W]


@dataclasses.dataclass(frozen=True)
class Held:
    """A queued append not written now: waiting for its predecessor, or ``dropped`` (recorded
    as an anomaly: there is nobody to answer)."""

    sequence: int
    expected: int  #: what the session expected when it came
    dropped: bool = False
    #: a file that appends held before were written to meanwhile (a gap was let go): flush it
    kick: str | None = None


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
        raise errors.InvalidInput(
            f"sequence: session {row.session_key!r} has appends without a sequence; a session "
            "uses sequences always or never"
        )
    return row.next_sequence


def check_unsequenced(
    conn: sa.Connection, row: tables.FileRow | None, session: ledger.Session
) -> None:
    """Refuse an append without a sequence to a session that numbers its appends: its row
    says so, or, with no file yet, numbered appends wait for its first (then the caller
    holds the session's :func:`lock`)."""
    if row is not None and row.next_sequence is not None:
        raise errors.InvalidInput(
            f"sequence is required: session {row.session_key!r} numbers its appends (it "
            f"expects sequence {row.next_sequence} next); a session uses sequences always or never"
        )
    if row is None and ledger.first_waiting(conn, session) is not None:
        raise errors.InvalidInput(
            f"sequence is required: appends with a sequence wait for session "
            f"{session.session_key!r}; a session uses sequences always or never"
        )


def apply(
    conn: sa.Connection,
    row: tables.FileRow | None,
    append: validation.Append,
    *,
    write: Writer[W],
    hold: bool,
    wait_seconds: float = DEFAULT_WAIT_SECONDS,
) -> W | Held:
    """Apply a numbered append to its session (``row``, locked; None: no file yet), after its
    idempotency key was found new: write it if it is the expected one, then whatever waited
    for it. Otherwise raise :class:`errors.OutOfOrder` — or, with ``hold`` (the queued path),
    hold it for later or record and drop it."""
    assert append.sequence is not None
    number, want = append.sequence, expected(row)
    session = session_of(append)
    if number == want:
        written = write(conn, row, append)
        settle(conn, session, write=write, wait_seconds=wait_seconds)
        return written
    if not hold:
        raise _out_of_order(number, want)
    if number < want:
        assert row is not None  # a session past sequence 1 has its file
        late = number in _skipped(conn, row.file_id)
        _drop(conn, row.file_id, append, "sequence_late" if late else "sequence_duplicate", want)
        return Held(number, want, dropped=True)
    found = ledger.waiting(conn, session, number)
    if found is None:
        text = _dump(append)
        ledger.hold(
            conn,
            session,
            sequence=number,
            idempotency_key=append.idempotency_key or "",
            request_hash=append.digest,
            append_json=text,
            size=len(text.encode("utf-8")),
            received_at=tables.utcnow(),
        )
    elif found.idempotency_key != append.idempotency_key:
        file_id = row.file_id if row is not None else None
        _drop(conn, file_id, append, "sequence_duplicate", want)
        return Held(number, want, dropped=True)
    elif found.request_hash != append.digest:
        raise errors.Conflict(
            f"idempotency_key {append.idempotency_key!r} was already used with a different body"
        )
    return Held(number, want, kick=settle(conn, session, write=write, wait_seconds=wait_seconds))


def settle(
    conn: sa.Connection,
    session: ledger.Session,
    *,
    write: Writer[W],
    wait_seconds: float = DEFAULT_WAIT_SECONDS,
) -> str | None:
    """Write what waits for ``session`` and may go now: the held appends that follow the
    expected one without a hole and, once the oldest of them has waited ``wait_seconds``, the
    lowest one after a gap (recorded). The file written to, or None. The caller holds the
    session's :func:`lock`."""
    row = index.find_file(conn, *session)
    wrote: str | None = None
    while (first := ledger.first_waiting(conn, session)) is not None:
        try:
            want = expected(row)
        except errors.InvalidInput as exc:  # the session had appends without a sequence
            _reject(conn, first, exc.detail)
            continue
        if first.sequence < want:  # its number was applied meanwhile (over HTTP, say)
            recorded = ledger.get_key(conn, session.agent_id, first.idempotency_key)
            if recorded is None or recorded[0] != first.request_hash:  # not this very append
                _drop(conn, row.file_id if row else None, _load(first), "sequence_duplicate", want)
            ledger.release(conn, session, first.sequence)
            continue
        if first.sequence > want and not _overdue(conn, session, wait_seconds):
            break
        if ledger.get_key(conn, session.agent_id, first.idempotency_key) is not None:
            _reject(conn, first, f"idempotency_key {first.idempotency_key!r} was already used")
            continue
        try:
            written = write(conn, row, _load(first))
        except errors.Overloaded:  # it waits on; the next arrival or sweep comes back to it
            break
        ledger.release(conn, session, first.sequence)
        if first.sequence > want:
            _record_gap(conn, written.file_id, want, first.sequence, wait_seconds)
        wrote = written.file_id
        row = index.find_file(conn, *session)
    return wrote


def settle_waiting(
    engine: sa.Engine, *, age: float, write: Writer[W], wait_seconds: float = DEFAULT_WAIT_SECONDS
) -> list[str]:
    """:func:`settle` every session where an append has waited more than ``age`` seconds (the
    sweeper's part: a gap that never fills is let go even when no task of its session comes
    any more, and what a full backlog held back goes on); the files written to."""
    with database.reading(engine) as conn:
        sessions = ledger.waiting_sessions(conn, tables.utcnow() - dt.timedelta(seconds=age))
    written = []
    for session in sessions:

        def work(conn: sa.Connection, session: ledger.Session = session) -> str | None:
            lock(conn, session)
            return settle(conn, session, write=write, wait_seconds=wait_seconds)

        file_id = commits.group(engine).run(work)
        if file_id is not None:
            written.append(file_id)
    return written


def _overdue(conn: sa.Connection, session: ledger.Session, wait_seconds: float) -> bool:
    oldest = ledger.oldest_waiting(conn, session)
    return oldest is not None and oldest <= tables.utcnow() - dt.timedelta(seconds=wait_seconds)


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


def _record_gap(conn: sa.Connection, file_id: str, want: int, applied: int, wait: float) -> None:
    lo, hi = want, applied - 1
    missing = f"sequence {lo}" if lo == hi else f"sequences {lo}-{hi}"
    after = f"after sequence {lo - 1}" if lo > 1 else "first"
    detail = (
        f"{missing} never arrived within order_wait_seconds ({wait:g} s) of the first append "
        f"waiting for it; sequence {applied} was applied {after}"
    )
    index.record_anomaly(conn, file_id, "sequence_gap", detail, key=_span(lo, hi))


def _skipped(conn: sa.Connection, file_id: str) -> set[int]:
    """The sequences of a file skipped as gaps (from its ``sequence_gap`` anomalies)."""
    found: set[int] = set()
    for gap in index.list_anomalies(conn, file_id=file_id, kinds=["sequence_gap"]):
        lo, _, hi = gap.key.partition("-")
        found.update(range(int(lo), int(hi or lo) + 1))
    return found


def _drop(
    conn: sa.Connection, file_id: str | None, append: validation.Append, kind: str, want: int
) -> None:
    """Record a queued append that will never be written (once per number and kind)."""
    number = append.sequence
    count = len(append.messages)
    what = (
        f"the append with idempotency_key {append.idempotency_key!r} ({count} "
        f"message{'s' if count != 1 else ''}, {append.messages[0].ts} to "
        f"{append.messages[-1].ts})"
    )
    if kind == "sequence_late":
        detail = (
            f"sequence {number} came after it was skipped as a gap (the session expects "
            f"{want} next): {what} was recorded here, not appended out of place"
        )
    else:
        detail = f"sequence {number} was already taken: {what} was dropped"
    index.record_anomaly(conn, file_id, kind, detail, key=str(number))


def _reject(conn: sa.Connection, waiting: tables.WaitingRow, why: str) -> None:
    """Drop a held append that can never be written, as an invalid task is (an event)."""
    session = ledger.Session(waiting.agent_id, waiting.source_type, waiting.session_key)
    who = f"agent_id={session.agent_id!r} session_key={session.session_key!r}"
    detail = f"{who}: sequence {waiting.sequence} dropped: {why}"
    index.record_anomaly(conn, None, "append_task_rejected", detail)
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
