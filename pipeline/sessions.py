"""The sessions listing a person and an agent browse: newest first, each with a title, its time
span and message count, filtered by agent, source and time, paged as "N of M".

A session here is a file that holds at least one flushed message (an upload is one too; an
acknowledged session whose first flush has not happened yet is not listed until it has).
"Newest" is the time of its latest message (``ended_at``), ties broken by file_id, so the order
is total and a page boundary never repeats or skips a row. The time filter keeps the sessions
whose span meets it: ``since`` the latest message is at or after it, ``until`` the first at or
before it.

A session's title is the one its source gave (``metadata.title``: a Claude Code summary, a
Hermes title; an upload's file name), or else the first words of its first user message (the
first message when no user spoke), read from the file through the catalog: a page costs one
catalog query and one short read per session, however large the store or the sessions.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from collections.abc import Collection
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from pipeline import convention, database, errors, paging, reader, tables

DEFAULT_LIMIT = paging.SESSIONS_DEFAULT_LIMIT
MAX_LIMIT = paging.SESSIONS_MAX_LIMIT
MAX_OFFSET = paging.SESSIONS_MAX_OFFSET
TITLE_WORDS = 12  #: words of the first message a title is made of, at most
TITLE_CHARS = 90  #: characters of a title, at most
_TITLE_READ = 2048  #: bytes of the first message read to make a title
MAX_CWD_CHARS = 4096  #: characters of a ``cwd`` filter (Linux's PATH_MAX)
_SPACE = re.compile(r"\s+")

_R = tables.raw_files.c
_M = tables.messages.c


@dataclasses.dataclass(frozen=True)
class Filters:
    """What a listing shows: the caller's ``agents`` (None: every agent), narrowed by the
    other fields when given."""

    agents: Collection[str] | None = None
    agent_id: str | None = None
    source_type: str | None = None
    status: str | None = None
    since: dt.datetime | None = None  #: naive UTC
    until: dt.datetime | None = None  #: naive UTC
    session_key: str | None = None
    #: sessions recorded in this directory or below it (their metadata's ``cwd``)
    cwd: str | None = None
    #: files with no message in them yet (acknowledged, not flushed) too, newest of all
    unflushed: bool = False


@dataclasses.dataclass(frozen=True)
class Session:
    """One session as a listing shows it: its file's index row and its title."""

    file: tables.FileRow
    title: str

    @property
    def file_id(self) -> str:
        return self.file.file_id

    @property
    def agent_id(self) -> str:
        return self.file.agent_id

    @property
    def source_type(self) -> str:
        return self.file.source_type

    @property
    def session_key(self) -> str:
        return self.file.session_key

    @property
    def started_at(self) -> dt.datetime:
        return self.file.started_at

    @property
    def ended_at(self) -> dt.datetime | None:
        return self.file.ended_at

    @property
    def message_count(self) -> int:
        """Messages in the file (flushed)."""
        return self.file.flushed_seq

    @property
    def status(self) -> str:
        return self.file.status

    @property
    def origin(self) -> str | None:
        """What wrote it, when its metadata says (an importer, the Hermes provider, …)."""
        metadata = self.file.metadata
        for key in ("importer", "client", "source"):
            value = metadata.get(key)
            if isinstance(value, str) and value:
                return value
        return None

    @property
    def cwd(self) -> str | None:
        """The working directory the agent ran in, when its source recorded one."""
        return convention.cwd(self.file.metadata)

    def to_json(self) -> dict[str, Any]:
        """As ``GET /v1/sessions`` shows it."""
        return {
            "file_id": self.file_id,
            "agent_id": self.agent_id,
            "source_type": self.source_type,
            "session_key": self.session_key,
            "title": self.title,
            "started_at": tables.iso(self.started_at),
            "ended_at": self.ended_at and tables.iso(self.ended_at),
            "message_count": self.message_count,
            "status": self.status,
            "origin": self.origin,
            "cwd": self.cwd,
        }


@dataclasses.dataclass(frozen=True)
class Page:
    """Sessions ``offset + 1 … offset + len(sessions)`` of ``total``."""

    sessions: list[Session]
    total: int
    offset: int
    limit: int

    @property
    def next_offset(self) -> int | None:
        """The offset of the next page, None on the last."""
        following = self.offset + len(self.sessions)
        return following if following < self.total else None

    def to_json(self) -> dict[str, Any]:
        """As ``GET /v1/sessions`` answers."""
        return {
            "sessions": [s.to_json() for s in self.sessions],
            "total": self.total,
            "offset": self.offset,
            "limit": self.limit,
            "next_offset": self.next_offset,
        }


def _in_directory(directory: str, *, postgres: bool) -> sa.ColumnElement[bool]:
    """Sessions whose metadata's ``cwd`` is ``directory`` or a directory below it (the
    metadata is JSON text: read with each database's own JSON function)."""
    if postgres:
        # jsonb refuses the escape of a NUL (``\\u0000``), which a metadata string may hold:
        # read as U+FFFD instead (the same six characters' length, valid JSON whether they
        # were an escape or text), so such a row fails nobody's listing
        text = sa.func.replace(_R.metadata_json, "\\u0000", "\\ufffd")
        cwd: Any = sa.cast(text, postgresql.JSONB)["cwd"].astext
    else:
        cwd = sa.func.json_extract(_R.metadata_json, "$.cwd")
    base = directory.rstrip("/") or "/"
    below = base.rstrip("/") + "/"
    # "_" and "%" in a path are letters, not LIKE's wildcards
    pattern = below.replace("!", "!!").replace("%", "!%").replace("_", "!_") + "%"
    return sa.or_(cwd == base, cwd.like(pattern, escape="!"))


def _where(filters: Filters, *, postgres: bool = False) -> list[sa.ColumnElement[bool]]:
    where: list[sa.ColumnElement[bool]] = [] if filters.unflushed else [_R.flushed_seq > 0]
    if filters.agents is not None:
        where.append(_R.agent_id.in_(sorted(filters.agents)))
    if filters.agent_id is not None:
        where.append(_R.agent_id == filters.agent_id)
    if filters.source_type is not None:
        where.append(_R.source_type == filters.source_type)
    if filters.status is not None:
        where.append(_R.status == filters.status)
    if filters.session_key is not None:
        where.append(_R.session_key == filters.session_key)
    if filters.since is not None:
        where.append(_R.ended_at >= filters.since)
    if filters.until is not None:
        where.append(_R.started_at <= filters.until)
    if filters.cwd is not None:
        where.append(_in_directory(filters.cwd, postgres=postgres))
    return where


def list_sessions(
    db: database.Database,
    data_dir: Path,
    filters: Filters = Filters(),
    *,
    offset: int = 0,
    limit: int = DEFAULT_LIMIT,
) -> Page:
    """One page of sessions, newest first, with the count of all that match."""
    if not 1 <= limit <= MAX_LIMIT:
        raise errors.InvalidInput(f"limit must be 1..{MAX_LIMIT}, got {limit}")
    if not 0 <= offset <= MAX_OFFSET:
        raise errors.InvalidInput(f"offset must be 0..{MAX_OFFSET}, got {offset}")
    if filters.agents is not None and not filters.agents:
        return Page([], 0, offset, limit)
    where = _where(filters, postgres=database.is_postgres(db.engine))
    # a file not flushed yet has no ended_at: it is the newest of all
    newest = _R.ended_at.desc().nulls_first() if filters.unflushed else _R.ended_at.desc()
    query = (
        sa.select(tables.raw_files)
        .where(*where)
        .order_by(newest, _R.file_id.desc())
        .offset(offset)
        .limit(limit)
    )
    count = sa.select(sa.func.count()).select_from(tables.raw_files).where(*where)
    with db.reading() as conn:
        rows = [tables.FileRow.from_row(r) for r in conn.execute(query)]
        total = int(conn.execute(count).scalar_one())
        firsts = _first_messages(conn, [r.file_id for r in rows if not _given_title(r)])
    sessions = [_session(db, data_dir, row, firsts.get(row.file_id)) for row in rows]
    return Page(sessions, total, offset, limit)


def describe(db: database.Database, data_dir: Path, row: tables.FileRow) -> Session:
    """One file as a listing would show it (its title made the same way)."""
    if _given_title(row):
        return _session(db, data_dir, row, None)
    with db.reading() as conn:
        first = _first_messages(conn, [row.file_id]).get(row.file_id)
    return _session(db, data_dir, row, first)


def _session(
    db: database.Database, data_dir: Path, row: tables.FileRow, first: tables.MessageRow | None
) -> Session:
    return Session(row, _given_title(row) or _first_words(db, data_dir, row, first))


def _given_title(row: tables.FileRow) -> str:
    """The title the session's source gave it, one line; "" when none."""
    metadata = row.metadata
    for key in ("title", "filename"):
        value = metadata.get(key)
        if isinstance(value, str) and value.strip():
            return shorten(value, words=64)
    return ""


def _first_messages(conn: sa.Connection, file_ids: list[str]) -> dict[str, tables.MessageRow]:
    """The catalog row of each file's first user message (or, without one, its first)."""
    if not file_ids:
        return {}
    user = (
        sa.select(_M.file_id, sa.func.min(_M.seq).label("seq"))
        .where(_M.file_id.in_(file_ids), _M.role == "user")
        .group_by(_M.file_id)
    )
    wanted = {file_id: 1 for file_id in file_ids}
    wanted.update({file_id: int(seq) for file_id, seq in conn.execute(user)})
    pairs = [sa.and_(_M.file_id == f, _M.seq == s) for f, s in wanted.items()]
    found = conn.execute(sa.select(tables.messages).where(sa.or_(*pairs)))
    return {row.file_id: tables.MessageRow.from_row(row) for row in found}


def _first_words(
    db: database.Database, data_dir: Path, row: tables.FileRow, first: tables.MessageRow | None
) -> str:
    """A title from the first words of a message; "" when the file cannot be read (the
    listing still shows the session: ``fsck`` names the file)."""
    if first is None:
        return ""
    try:
        text = reader.message_text(db, data_dir, row, first, cap=_TITLE_READ)
    except errors.SgmeError:
        return ""
    return shorten(_said(first.role, text))


def _said(role: str, text: str) -> str:
    """What a message says, read by the clients' convention (docs/format.md): a call's name
    and arguments (so a session that opens with a call is titled by it), a result's output,
    the text of thinking or a summary without its marker line, a text without its escaping."""
    kind = convention.kind(role, text)
    call = convention.parse_call(text) if kind == "call" else None
    if call is not None:
        return f"{call.name} {call.arguments}"
    if kind == "result":
        return convention.result_output(convention.parse_result(text)[1])
    if kind in ("thinking", "summary"):
        return convention.marked_text(text)
    return convention.unescape_text(text, role)


def shorten(text: str, *, words: int = TITLE_WORDS, chars: int = TITLE_CHARS) -> str:
    """``text`` on one line: its first ``words`` words and at most ``chars`` characters,
    with "…" when something was left out."""
    parts = _SPACE.split(text.strip())
    short = " ".join(parts[:words])
    cut = len(parts) > words
    if len(short) > chars:
        short = short[: chars - 1].rstrip()
        cut = True
    return short + "…" if cut and short else short


def span(session: Session) -> str:
    """The session's time span for a person: ``2026-08-03 11:18 – 11:42`` (UTC)."""
    start = session.started_at
    end = session.ended_at or start
    first = f"{start:%Y-%m-%d %H:%M}"
    if end.date() != start.date():
        return f"{first} – {end:%Y-%m-%d %H:%M}"
    if f"{end:%H:%M}" == f"{start:%H:%M}":
        return first
    return f"{first} – {end:%H:%M}"
