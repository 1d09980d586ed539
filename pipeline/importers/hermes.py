"""Hermes Agent's ``state.db`` (``$HERMES_HOME/state.db``, SQLite), opened read-only.

Sessions in the order they started; each session's messages by id (their insertion order),
with their own timestamps. Message rows are OpenAI-style: ``content`` (structured content is
stored as ``"\\x00json:"`` + JSON and decoded here), an assistant's ``tool_calls`` (JSON),
a tool row's ``tool_name`` / ``tool_call_id`` — converted exactly as the Hermes provider converts
Hermes' live transcript (:func:`chat.convert`). Rows of role ``session_meta`` are
bookkeeping, not transcript. A row whose content or tool calls do not parse, or nest past
:data:`source.MAX_DEPTH`, is reported and left out; the rest of the session goes on.

Rows no longer live in the session:

- **pre-compaction history** (``active = 0, compacted = 1``: what an in-place compaction
  replaced with its summary) is the real conversation, so it is imported as a session of its
  own, ``{session id}#compacted``, with ``compacted_from`` in its metadata. Its rows only
  ever grow at the end, so re-imports append only what a later compaction added;
- **rewound turns** (``active = 0, compacted = 0``: what the user took back with /undo or a
  rewind) are kept where they were said, numbered as they were while live, as the provider
  stored them; the live turn that goes on from before them gets a rewind marker
  (:func:`convention.rewound`) naming them — the marker the provider writes when Hermes tells
  it of the rewind (:class:`chat.Branch`). A rewound question never answered is left out and
  counted as skipped (the provider never had it). ``state.db`` does not record where each
  rewind went back to: a run of rewound rows is taken for one branch, so a turn written after
  a rewind and itself taken back later, with no live turn between, is numbered as if no
  rewind came between (docs/clients.md).

A live turn appended by an earlier import stays in L0 when it is later rewound or compacted
(L0 is append-only); a turn that comes back different is a new key and is appended.

Older schemas work: columns are looked up with ``PRAGMA table_info``, and a database without
``active`` (before rewinds existed) has every row live. The last turn of a session that has
not ended is imported once it is finished (it ends with assistant text). Session key: the
Hermes session id; metadata: source (cli, telegram, …), model, title, cwd, git branch, parent
session. Keys: :func:`convention.hermes_key` — ``hermes:{session id}:{turn number}:{hash}``, the
turn numbered by its user message and hashed without times — the provider's key for the same
turn, so importing what the provider stored (or the reverse) writes nothing twice.
"""

from __future__ import annotations

import itertools
import sqlite3
import urllib.parse
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from pipeline import errors
from pipeline.importers import chat, convention, source

SOURCE = convention.HERMES
JSON_PREFIX = "\x00json:"
COMPACTED_SUFFIX = "#compacted"
_SESSION_FIELDS = (
    "id",
    "source",
    "model",
    "title",
    "cwd",
    "git_branch",
    "parent_session_id",
    "started_at",
    "ended_at",
)
_MESSAGE_FIELDS = (
    "id",
    "role",
    "content",
    "tool_call_id",
    "tool_calls",
    "tool_name",
    "timestamp",
    "active",
    "compacted",
)


def files(path: Path) -> list[Path]:
    """The database: ``path`` itself, or ``path/state.db`` for a Hermes home."""
    source.existing(path)
    if path.is_dir():
        return [source.existing(path / "state.db")]
    return [path]


def connect(path: Path) -> sqlite3.Connection:
    """A read-only connection (``?mode=ro``): an import never writes to Hermes' database."""
    uri = "file:" + urllib.parse.quote(str(path.resolve())) + "?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True, timeout=5.0)
    except sqlite3.Error as exc:
        raise errors.StorageUnavailable(f"cannot open {str(path)!r} read-only: {exc}") from exc
    conn.row_factory = sqlite3.Row
    return conn


def columns(conn: sqlite3.Connection, table: str) -> set[str]:
    """The columns a table has in this database (older schemas lack some)."""
    return {str(row[1]) for row in conn.execute(f"PRAGMA table_info({table})")}


def decode(content: Any) -> Any:
    """A stored content value: structured content (``"\\x00json:"`` + JSON) decoded.

    Raises ``ValueError`` when the JSON after the prefix does not parse or nests too deep."""
    if isinstance(content, str) and content.startswith(JSON_PREFIX):
        return source.parse_json(content[len(JSON_PREFIX) :])
    return content


def _select(conn: sqlite3.Connection, table: str, wanted: tuple[str, ...], tail: str) -> str:
    have = columns(conn, table)
    listed = ", ".join(c if c in have else f"NULL AS {c}" for c in wanted)
    return f"SELECT {listed} FROM {table} {tail}"


def _rows(
    conn: sqlite3.Connection, path: Path, session_id: str, query: str
) -> tuple[list[dict[str, Any]], list[source.Problem]]:
    """A session's message rows as OpenAI-style dicts, and the rows it could not read."""
    messages: list[dict[str, Any]] = []
    problems: list[source.Problem] = []
    for row in conn.execute(query, (session_id,)):
        where = f"session {session_id!r} message id {row['id']}"
        if row["role"] == "session_meta":
            continue
        try:
            content = decode(row["content"])
        except ValueError as exc:
            problems.append(source.Problem(str(path), None, f"{where}: bad JSON content: {exc}"))
            continue
        calls: Any = row["tool_calls"]
        if isinstance(calls, str) and calls:
            try:
                calls = source.parse_json(calls)
            except ValueError as exc:
                problems.append(
                    source.Problem(str(path), None, f"{where}: bad tool_calls JSON: {exc}")
                )
                continue
        messages.append(
            {
                "role": row["role"],
                "content": content,
                "tool_calls": calls or None,
                "tool_call_id": row["tool_call_id"],
                "tool_name": row["tool_name"],
                "timestamp": row["timestamp"],
                "active": 1 if row["active"] is None else row["active"],
                "compacted": row["compacted"] or 0,
            }
        )
    return messages, problems


def _turns(messages: list[convention.Message], *, finished: bool) -> tuple[list[source.Unit], int]:
    """Turns numbered by their user message, and the messages of an unfinished last turn
    (left for a later run)."""
    turns = chat.turns(messages)
    skipped = 0
    if turns and not finished:
        last = turns[-1][1][-1]
        if last["role"] != "assistant" or convention.kind("assistant", last["content"]) != "text":
            skipped = len(turns.pop()[1])
    return [
        source.Unit(position=str(number), messages=tuple(turn)) for number, turn in turns
    ], skipped


def _finished(turn: list[convention.Message]) -> bool:
    last = turn[-1]
    return last["role"] == "assistant" and convention.kind("assistant", last["content"]) == "text"


def _state(row: Mapping[str, Any]) -> str:
    if row["active"]:
        return "live"
    return "compacted" if row["compacted"] else "rewound"


def _branch(
    session_id: str, rows: list[dict[str, Any]]
) -> tuple[list[tuple[source.Unit, bool]], int]:
    """The session's turns, live and rewound, in the order Hermes wrote them, each with whether
    it is the running end (its last turn when live, and the marker before that turn), and the
    number of messages left out (``rows``: all of the session's, in order; the compacted ones
    only count, see :func:`_sessions`).

    A run of rewound rows is a turn or more taken back; its turns are numbered as they were
    while live (after the turns live before them, compacted since or not), and a finished one
    is kept. The live turn after the run gets a rewind marker naming them
    (:class:`chat.Branch`), as the provider writes one when Hermes tells it of the rewind; a
    store that holds that turn already (an earlier version stored it without a marker) gets no
    marker (:func:`chat.first_key`). A compaction starts the numbering, and what a rewind can
    take back, again from the live rows it inserted."""
    units: list[tuple[source.Unit, bool]] = []
    branch = chat.Branch()
    live_users = 0
    skipped = 0
    previous = ""
    stored: set[str] = set()
    for state, group in itertools.groupby(rows, key=_state):
        messages, left_out = chat.convert(list(group))
        if state == "compacted":  # imported apart; its turns were live before the rewinds after
            live_users += sum(1 for m in messages if m["role"] == "user")
            previous = state
            continue
        if state == "live" and previous == "compacted":  # the set a compaction inserted
            live_users = 0
            branch = chat.Branch()
        skipped += left_out
        numbered = [(n + live_users if n else 0, turn) for n, turn in chat.turns(messages)]
        for index, (number, turn) in enumerate(numbered):
            if state == "rewound" and not _finished(turn):
                skipped += len(turn)  # never answered: the provider never had it
                continue
            position = chat.rewind_position(number, turn)
            if state == "live" and index == 0 and previous == "rewound" and number:
                places = branch.rewound(number)
                if places:
                    branch.rewind(number)
                    marker = convention.rewound(places, turn[0].get("ts"))
                    legacy = chat.first_key(session_id, number, turn)
                    units.append((source.Unit(position, (marker,), legacy_key=legacy), True))
            units.append((source.Unit(str(number), tuple(turn)), state == "live"))
            if position not in stored:  # a turn said again word for word is stored once
                stored.add(position)
                branch.add(number, turn)
        if state == "live":
            live_users += sum(1 for n, _ in numbered if n)
        previous = state
    # the running turn is the last one when it is live, with the marker just before it
    end = len(units) - 1 if units and units[-1][1] else len(units)
    if end < len(units) and end > 0 and units[end - 1][0].position.endswith(":rewound"):
        end -= 1
    return [(unit, index >= end) for index, (unit, _) in enumerate(units)], skipped


def read(path: Path) -> Iterator[source.Record]:
    """Every session of one ``state.db``."""
    conn = connect(path)
    try:
        yield from _read(conn, path)
    except sqlite3.Error as exc:
        yield source.Problem(str(path), None, f"cannot read the database: {exc}")
    finally:
        conn.close()


def _read(conn: sqlite3.Connection, path: Path) -> Iterator[source.Session | source.Problem]:
    have = columns(conn, "sessions")
    if not have or not columns(conn, "messages"):
        yield source.Problem(str(path), None, "not a Hermes state.db (no sessions/messages table)")
        return
    order = "started_at, id" if "started_at" in have else "rowid"
    sessions = conn.execute(
        _select(conn, "sessions", _SESSION_FIELDS, f"ORDER BY {order}")
    ).fetchall()
    query = _select(conn, "messages", _MESSAGE_FIELDS, "WHERE session_id = ? ORDER BY id")
    for session in sessions:
        rows, problems = _rows(conn, path, str(session["id"]), query)
        yield from problems
        yield from _sessions(session, rows, path)


def _sessions(
    session: Mapping[str, Any], rows: list[dict[str, Any]], path: Path
) -> Iterator[source.Session]:
    """The live session, and its pre-compaction history when it has one."""
    session_id = str(session["id"])
    meta = {
        "importer": SOURCE,
        "source": session["source"],
        "model": session["model"],
        "title": session["title"],
        "cwd": session["cwd"],
        "git_branch": session["git_branch"],
        "parent_session": session["parent_session_id"],
    }
    compacted = [r for r in rows if not r["active"] and r["compacted"]]
    turns, skipped = _branch(session_id, rows)
    running = session["ended_at"] is None and turns and turns[-1][1]
    if running and not _finished(list(turns[-1][0].messages)):
        # the running turn (and the rewind marker before it) is imported once finished
        skipped += len(turns.pop()[0].messages)
        if turns and turns[-1][1]:
            turns.pop()
    yield source.Session(
        source=SOURCE,
        session_key=session_id,
        metadata=convention.metadata(meta),
        units=tuple(unit for unit, _ in turns),
        origin=str(path),
        skipped=skipped,
        times=False,
    )
    if compacted:
        history, left_out = chat.convert(compacted)
        earlier, _ = _turns(history, finished=True)
        yield source.Session(
            source=SOURCE,
            session_key=session_id + COMPACTED_SUFFIX,
            metadata=convention.metadata({**meta, "compacted_from": session_id}),
            units=tuple(earlier),
            origin=str(path),
            skipped=left_out,
            times=False,
        )
