"""The message catalog (docs/design.md §6): one row per flushed message — where its block is in the
file, the facts of its heading — and the search terms of its text, both written in the commit
of the flush that wrote the message (never ahead of ``flushed_seq``, never behind), rebuilt by
``reindex``, checked by ``fsck``. No file access here.

The terms live in ``message_terms``, one row per message under the same id: on SQLite an FTS5
table without content (the text stays in the files; the index holds terms and, in a second
column, tags for the agent, the file, the session and the role, so filters intersect there);
on PostgreSQL a ``tsvector`` with a GIN index (filters are ordinary SQL). The terms are
:mod:`pipeline.terms`'s on both, so a query finds the same messages on either. The ranked search
over them is :mod:`pipeline.ranking`'s.

A ``tsvector`` keeps positions up to 16,383 and 256 of one term: a PostgreSQL message past
those bounds (:func:`terms.segments`) has an empty ``message_terms`` row and its terms in
``message_term_parts``, one row per overlapping segment with the number of terms before it
(``base``), so a phrase anywhere in it is whole in one row. A query matches such a message
when each of its phrases matches one of its segments (:func:`parts_matching`).

**Context terms.** Each message is indexed a second time with the terms of the
:data:`CONTEXT_TURNS` messages before it in its file (its session), the last
:data:`CONTEXT_TERMS` distinct words of each: the answer "Yes, twice last month!" holds none
of its subject, the turn before it does. They go in a column of their own (SQLite: the FTS5
table's third column; PostgreSQL: a second ``tsvector``, ``ctx``), which the ranked search
weighs lower and ``match=all`` does not look at. A message's context is made wherever its
terms are (:func:`ready` is given the texts of the messages before the first one), and a
redaction makes its neighbours' again (:mod:`pipeline.rewrite`)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import itertools
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from pipeline import database, document, tables, terms

_M = tables.messages.c
_INSERT_ROWS = sa.insert(tables.messages).returning(_M.id, sort_by_parameter_order=True)
# SQLite runs the inserts, their ids given, on the driver in one executemany
# (database.Prepared); PostgreSQL sends a flush's rows in one statement with RETURNING.
_INSERT_ROW = database.Prepared(
    sa.insert(tables.messages).values(id=sa.bindparam("id"), **database.binds(tables.messages))
)
_MAX_ID = database.Prepared(sa.select(sa.func.max(_M.id).label("id")))
_PG_INSERT = sa.text(
    "INSERT INTO message_terms (id, tsv, ctx, speaker) "
    "VALUES (:id, CAST(:tsv AS tsvector), CAST(:ctx AS tsvector), :speaker)"
)
_PG_INSERT_PART = sa.text(
    "INSERT INTO message_term_parts (id, part, base, tsv) "
    "VALUES (:id, :part, :base, CAST(:tsv AS tsvector))"
)
#: PostgreSQL's segments of long messages (:func:`terms.segments`)
PARTS = sa.table(
    "message_term_parts", sa.column("id"), sa.column("part"), sa.column("base"), sa.column("tsv")
)
#: messages before a message whose terms are its context (docs/search.md has the measurement
#: that chose it; a change takes ``sgme reindex`` to reach the messages indexed before)
CONTEXT_TURNS = 2
#: distinct terms (but stop words) of each of them at most, its last ones (where a turn's
#: question usually is): FTS5 indexes every term it is given, and a flush's cost grows with
#: them (docs/search.md has the measurement that chose it)
CONTEXT_TERMS = 8


def contexts(own: Sequence[list[str]], before: Sequence[list[str]] = ()) -> list[list[str]]:
    """The context terms of consecutive messages whose terms are ``own``: for each, the last
    :data:`CONTEXT_TERMS` distinct terms but stop words (a ranked query leaves those out) of
    each of the :data:`CONTEXT_TURNS` messages before it, in their order, oldest turn first
    (``before`` holds the terms of those before the first, oldest first). Each once: the
    context says what was talked about, and a short context keeps the index small and a
    flush fast (FTS5 indexes every term it is given)."""
    stops = terms.stop_terms()
    return _contexts(own, [_last_words(found, stops) for found in before])[0]


def _contexts(
    own: Sequence[list[str]], earlier: Sequence[Sequence[str]]
) -> tuple[list[list[str]], Recent]:
    """:func:`contexts` from the last words (:func:`_last_words`) of the messages before the
    first, and the :class:`Recent` of the file after the last of ``own``."""
    stops = terms.stop_terms()
    turns = CONTEXT_TURNS
    # the last words of the messages, after those of the turns before the first and empty
    # ones standing in for turns a file's start does not have
    run: list[Sequence[str]] = [()] * turns
    run += earlier[max(0, len(earlier) - turns) :]
    run += [_last_words(found, stops) for found in own]
    end, count = len(run), len(own)
    # the turns before each message, as a tuple, and its context made of them by iterators
    # in C: no Python step of its own a message (a flush of 100 turns makes 100)
    windows: Iterable[tuple[Sequence[str], ...]] = (
        zip(*(run[end - count - turns + k : end - turns + k] for k in range(turns)), strict=True)
        if turns
        else itertools.repeat((), count)
    )
    chain = itertools.chain.from_iterable
    made = list(map(list, map(dict.fromkeys, map(chain, windows))))
    recent = Recent(tuple(map(tuple, run[max(turns, end - turns) :])))
    return made, recent


def _last_words(found: Sequence[str], stops: frozenset[str]) -> list[str]:
    """The last :data:`CONTEXT_TERMS` distinct terms of ``found`` but stop words, in order.
    Given its own result, the same: a flush may keep it for the next (:class:`Recent`). The
    write path runs this for every message: it walks back from the end, the stop words passed
    over by a filter in C, and stops at the last term it needs, so most of a long message is
    never looked at (docs/benchmarks.md, "Recovery", has the measurement)."""
    if CONTEXT_TERMS <= 0:
        return []
    last: dict[str, None] = {}
    for term in itertools.filterfalse(stops.__contains__, reversed(found)):
        last[term] = None
        if len(last) == CONTEXT_TERMS:
            break
    return list(reversed(last))


@dataclasses.dataclass(frozen=True)
class Recent:
    """What the context terms of a file's next messages are made of: the last words
    (:func:`_last_words`) of its last :data:`CONTEXT_TURNS` messages, oldest first. A flush
    keeps it for the file's next (:mod:`pipeline.flush`), which then neither reads those
    messages back nor makes their terms again; the same context terms either way."""

    words: tuple[tuple[str, ...], ...] = ()


#: the messages before the first of those a catalog entry is made for: their texts, oldest
#: first, or the :class:`Recent` a flush kept of them
Before = Sequence[str] | Recent


def term_lists(
    owner: Owner, messages: Sequence[document.Message], before: Before = ()
) -> tuple[list[str | None], list[list[str]], list[list[str]]]:
    """The speaker (:func:`said`), the terms and the context terms (:func:`contexts`) of
    consecutive messages of ``owner``'s file (``before``: the messages before the first). A
    speaker's name a turn starts with is neither."""
    who, own, context, _ = _term_lists(owner, messages, before)
    return who, own, context


def _term_lists(
    owner: Owner, messages: Sequence[document.Message], before: Before
) -> tuple[list[str | None], list[list[str]], list[list[str]], Recent]:
    """:func:`term_lists`, and the :class:`Recent` of the file after the last message."""
    if owner.speakers or owner.user is not None:
        spoken = [said(owner, m.role, m.content) for m in messages]
        who: list[str | None] = [name for name, _ in spoken]
        own = [terms.terms(text) for _, text in spoken]
    else:  # nobody named (most files): each message's text is its own, said by no name
        who = [None] * len(messages)
        own = [terms.terms(m.content) for m in messages]
    if isinstance(before, Recent):
        earlier: Sequence[Sequence[str]] = before.words
    else:
        stops = terms.stop_terms()
        last = before[max(0, len(before) - CONTEXT_TURNS) :]
        earlier = [_last_words(terms.terms(said(owner, "", t)[1]), stops) for t in last]
    context, recent = _contexts(own, earlier)
    return who, own, context, recent


#: speakers' names a file's metadata may declare (``speakers``), and characters of each
MAX_SPEAKERS = 64
MAX_SPEAKER_CHARS = 64


@dataclasses.dataclass(frozen=True)
class Owner:
    """What the catalog keeps of a message's file: its id, for filtering its agent and
    session, and who speaks in it (docs/search.md, "Speakers"): ``speakers``, the names a
    dialogue's turns start with ("Caroline: …", metadata ``speakers``), and ``user``, the
    name of who speaks as ``user`` (metadata ``speaker``)."""

    file_id: str
    agent_id: str
    session_key: str
    speakers: tuple[str, ...] = ()
    user: str | None = None

    @classmethod
    def of(cls, row: tables.FileRow) -> Owner:
        """The owner facts of a file row."""
        return cls.made(row.file_id, row.agent_id, row.session_key, row.metadata)

    @classmethod
    def made(
        cls, file_id: str, agent_id: str, session_key: str, metadata: Mapping[str, Any]
    ) -> Owner:
        """The owner facts of a file, its speakers from its ``metadata`` (a value that is not
        a name, or a list of them, is passed over: the metadata was free to hold anything)."""
        names = metadata.get("speakers")
        speakers = (
            tuple(dict.fromkeys(n for n in names[:MAX_SPEAKERS] if _name(n)))
            if isinstance(names, list)
            else ()
        )
        user = metadata.get("speaker")
        return cls(file_id, agent_id, session_key, speakers, user if _name(user) else None)


def _name(value: object) -> bool:
    return isinstance(value, str) and 0 < len(value.strip()) <= MAX_SPEAKER_CHARS


def said(owner: Owner, role: str, text: str) -> tuple[str | None, str]:
    """Who said a message (a name, or None) and its text without the name it starts with:
    a dialogue's turn "Caroline: …" when Caroline is among ``owner.speakers`` (the name is a
    tag then, not a word of the turn), else ``owner.user`` for a ``user`` message."""
    for name in owner.speakers:
        if text.startswith(name) and text[len(name) : len(name) + 1] == ":":
            return name, text[len(name) + 1 :]
    return (owner.user if role == "user" else None), text


def speaker_key(name: str) -> str:
    """The form a speaker's name is kept and compared in (case-folded, trimmed)."""
    return " ".join(name.casefold().split())


def _tags(owner: Owner, role: str, speaker: str | None = None) -> str:
    found = [
        terms.tag("a", owner.agent_id),
        terms.tag("f", owner.file_id),
        terms.tag("s", owner.session_key),
        terms.tag("r", role),
    ]
    if speaker is not None:
        found.append(terms.tag("p", speaker_key(speaker)))
    return " ".join(found)


class Entry(NamedTuple):
    """One message's catalog row and search terms on PostgreSQL, made without the database
    (:class:`Ready`)."""

    seq: int
    byte_offset: int
    byte_length: int
    ts: dt.datetime
    role: str
    tool_name: str | None
    tsv: str  #: the ``tsvector`` text of its search terms (empty when in ``parts``)
    ctx: str  #: the ``tsvector`` text of its context terms
    speaker: str | None  #: who said it (:func:`speaker_key`)
    #: ``(terms before it, tsvector text)`` of each segment of a long message, else none
    parts: tuple[tuple[int, str], ...] = ()


def pg_terms(found: list[str]) -> tuple[str, tuple[tuple[int, str], ...]]:
    """A message's ``message_terms`` tsvector text and its ``message_term_parts`` from its
    terms ``found``: all of them in the one when PostgreSQL can hold them, else in segments
    (:func:`terms.segments`)."""
    made = terms.segments(found)
    if len(made) == 1:
        return terms.tsvector(made[0][1]), ()
    return "", tuple((base, terms.tsvector(part)) for base, part in made)


def entries(
    owner: Owner, found: Sequence[document.Located], before: Before = ()
) -> tuple[list[Entry], Recent]:
    """The :class:`Entry` of each message of ``found`` (PostgreSQL; ``before``: the messages
    before the first), and the :class:`Recent` of the file after them."""
    made = []
    who, own, context, recent = _term_lists(owner, [f.message for f in found], before)
    for located, speaker, found_terms, context_terms in zip(found, who, own, context, strict=True):
        row = _row(owner, located)
        tsv, parts = pg_terms(found_terms)
        made.append(
            Entry(
                row["seq"],
                row["byte_offset"],
                row["byte_length"],
                row["ts"],
                row["role"],
                row["tool_name"],
                tsv,
                terms.tsvector(context_terms),
                None if speaker is None else speaker_key(speaker),
                parts,
            )
        )
    return made, recent


def _add_entries(conn: sa.Connection, files: Sequence[tuple[Owner, Sequence[Entry]]]) -> None:
    """PostgreSQL: many files' :func:`entries` at once, the rows in one statement (their ids
    returned), the terms in another."""
    rows = [
        {
            "file_id": owner.file_id,
            "seq": e.seq,
            "byte_offset": e.byte_offset,
            "byte_length": e.byte_length,
            "ts": e.ts,
            "role": e.role,
            "tool_name": e.tool_name,
        }
        for owner, found in files
        for e in found
    ]
    if not rows:
        return
    ids = list(conn.execute(_INSERT_ROWS, rows).scalars())
    all_entries = [e for _, found in files for e in found]
    conn.execute(
        _PG_INSERT,
        [
            {"id": i, "tsv": e.tsv, "ctx": e.ctx, "speaker": e.speaker}
            for i, e in zip(ids, all_entries, strict=True)
        ],
    )
    parts = [
        {"id": i, "part": n, "base": base, "tsv": tsv}
        for i, e in zip(ids, all_entries, strict=True)
        for n, (base, tsv) in enumerate(e.parts)
    ]
    if parts:
        conn.execute(_PG_INSERT_PART, parts)


# SQLite's own forms of a message's values, made before the transaction that writes them (a
# flush's commit, reindex's writer): the driver takes them as they are, no conversion per row
_INSERT_BOUND = (
    "INSERT INTO messages (id, file_id, seq, byte_offset, byte_length, ts, role, tool_name) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
_FTS_BOUND = "INSERT INTO message_terms (rowid, terms, tags, context) VALUES (?, ?, ?, ?)"


def bound_entries(
    owner: Owner, found: Sequence[document.Located], before: Before = ()
) -> tuple[list[tuple[Any, ...]], Recent]:
    """SQLite: each message of ``found`` as :func:`add_ready` writes it — its catalog row
    (``file_id, seq, byte_offset, byte_length, ts, role, tool_name``) then its terms, tags and
    context terms, the values as SQLite's driver takes them (``before``: the messages before
    the first) — and the :class:`Recent` of the file after them."""
    tags: dict[tuple[str, str | None], str] = {}  #: a file has a handful of roles, speakers
    made = []
    who, own, context, recent = _term_lists(owner, [f.message for f in found], before)
    for located, speaker, found_terms, context_terms in zip(found, who, own, context, strict=True):
        message = located.message
        role = message.role
        tagged = tags.get((role, speaker))
        if tagged is None:
            tagged = tags[(role, speaker)] = _tags(owner, role, speaker)
        made.append(
            (
                owner.file_id,
                message.seq,
                located.offset,
                located.length,
                _sqlite_ts(message.ts),
                role,
                message.tool_name,
                " ".join(found_terms),
                tagged,
                " ".join(context_terms),
            )
        )
    return made, recent


def _sqlite_ts(text: str) -> str:
    """A message's timestamp, in its file's form (:data:`document.TS`), as SQLite stores a
    DATETIME: the text SQLAlchemy's type makes of the naive UTC datetime, made from the text
    itself in a sixth of the time — a flush and a reindex convert one a message
    (tests/unit/test_catalog.py holds the two equal)."""
    date, _, rest = text[:-1].partition("T")
    whole, _, fraction = rest.partition(".")
    return f"{date} {whole}.{fraction:0<6}"


def _add_bound(conn: sa.Connection, found: Sequence[tuple[Any, ...]]) -> None:
    """SQLite: many files' :func:`bound_entries` at once, the rows in one executemany, the
    terms in another."""
    if not found:
        return
    ids = _next_ids(conn, len(found))
    database.many_bound(conn, _INSERT_BOUND, [(i, *e[:7]) for i, e in zip(ids, found, strict=True)])
    database.many_bound(
        conn, _FTS_BOUND, [(i, e[7], e[8], e[9]) for i, e in zip(ids, found, strict=True)]
    )


@dataclasses.dataclass(frozen=True)
class Ready:
    """A file's flushed messages made ready for the catalog without the database (:func:`ready`):
    their rows' values and their search terms, so that the transaction adding them
    (:func:`add_ready`) only gives them ids and inserts them. A flush makes them before its
    commit, where SQLite's write lock and the group commit are not held; ``reindex`` in its
    worker processes."""

    owner: Owner
    entries: list[Entry] = dataclasses.field(default_factory=list)  #: on PostgreSQL
    #: on SQLite: the values as the driver takes them (:func:`bound_entries`)
    bound: list[tuple[Any, ...]] = dataclasses.field(default_factory=list)
    #: what the context terms of the file's next messages are made of
    recent: Recent = Recent()


def ready(
    owner: Owner, found: Sequence[document.Located], *, postgres: bool, before: Before = ()
) -> Ready:
    """The :class:`Ready` of ``found`` for the database ``postgres`` names (``before``: the
    messages of the file before the first of ``found``, their texts oldest first — at least
    :data:`CONTEXT_TURNS` of them when there are that many — or their :class:`Recent`)."""
    if postgres:
        made, recent = entries(owner, found, before)
        return Ready(owner, entries=made, recent=recent)
    bound, recent = bound_entries(owner, found, before)
    return Ready(owner, bound=bound, recent=recent)


def add_ready(conn: sa.Connection, files: Sequence[Ready]) -> None:
    """Catalog many files' flushed messages and index their text, from their :func:`ready`:
    the rows in one statement and the terms in another, whatever the number of files."""
    if database.is_postgres(conn):
        _add_entries(conn, [(f.owner, f.entries) for f in files])
    else:
        _add_bound(conn, [e for f in files for e in f.bound])


def add(
    conn: sa.Connection,
    owner: Owner,
    found: Sequence[document.Located],
    *,
    before: Sequence[str] = (),
) -> None:
    """Catalog flushed messages of a file and index their text (in the transaction that
    advances the file past them; ``before`` as :func:`ready` takes it)."""
    add_ready(conn, [ready(owner, found, postgres=database.is_postgres(conn), before=before)])


def add_terms(
    conn: sa.Connection,
    owner: Owner,
    messages: Sequence[document.Message],
    ids: Mapping[int, int],
    *,
    before: Sequence[str] = (),
) -> None:
    """Index again the text of the cataloged messages among ``messages`` whose terms were
    deleted (:func:`pipeline.purge.forget_terms`, which takes the same arguments):
    ``messages`` consecutive in their file, ``ids`` ``{seq: catalog id}`` (a message without
    one is passed over), ``before`` as :func:`ready` takes it."""
    who, own, context = term_lists(owner, messages, before)
    made = [
        (ids[m.seq], m, p, t, c)
        for m, p, t, c in zip(messages, who, own, context, strict=True)
        if m.seq in ids
    ]
    if not made:
        return
    if database.is_postgres(conn):
        rows, parts = [], []
        for i, _, p, t, c in made:
            tsv, segments = pg_terms(t)
            rows.append(
                {
                    "id": i,
                    "tsv": tsv,
                    "ctx": terms.tsvector(c),
                    "speaker": None if p is None else speaker_key(p),
                }
            )
            parts += [
                {"id": i, "part": n, "base": base, "tsv": part}
                for n, (base, part) in enumerate(segments)
            ]
        conn.execute(_PG_INSERT, rows)
        if parts:
            conn.execute(_PG_INSERT_PART, parts)
        return
    bound = [(i, " ".join(t), _tags(owner, m.role, p), " ".join(c)) for i, m, p, t, c in made]
    database.many_bound(conn, _FTS_BOUND, bound)


def add_rows(conn: sa.Connection, owner: Owner, found: Sequence[document.Located]) -> list[int]:
    """The catalog rows of ``found`` alone, without their search terms; their ids, in order."""
    return _insert_rows(conn, [_row(owner, located) for located in found])


def _insert_rows(conn: sa.Connection, rows: list[dict[str, Any]]) -> list[int]:
    """Insert catalog rows; their ids, in order. PostgreSQL sends them in one statement with
    RETURNING; SQLite gives them their ids (:func:`_next_ids`) and runs the inserts in one
    executemany on the driver."""
    if database.is_postgres(conn):
        return list(conn.execute(_INSERT_ROWS, rows).scalars())
    ids = _next_ids(conn, len(rows))
    for i, row in zip(ids, rows, strict=True):
        row["id"] = i
    _INSERT_ROW.many(conn, rows)
    return list(ids)


def _next_ids(conn: sa.Connection, count: int) -> range:
    """SQLite: the ids it would give ``count`` new catalog rows (one past the largest), so the
    terms need no lookup of the rows' ids; the write transaction holds the lock, so no other
    row comes meanwhile."""
    last = _MAX_ID.first(conn)["id"] or 0
    return range(last + 1, last + 1 + count)


def _row(owner: Owner, located: document.Located) -> dict[str, Any]:
    """A message's catalog row."""
    return {
        "file_id": owner.file_id,
        "seq": located.message.seq,
        "byte_offset": located.offset,
        "byte_length": located.length,
        "ts": document.parse_ts(located.message.ts).replace(tzinfo=None),
        "role": located.message.role,
        "tool_name": located.message.tool_name,
    }


_ROWS = database.Prepared(  # a refinement segment's, a page of messages'
    sa.select(tables.messages)
    .where(
        _M.file_id == sa.bindparam("file_id"),
        _M.seq > sa.bindparam("after"),
        _M.seq <= sa.bindparam("upto"),
    )
    .order_by(_M.seq)
)


def rows(conn: sa.Connection, file_id: str, *, after: int, upto: int) -> list[tables.MessageRow]:
    """The catalog rows of ``file_id`` with ``after < seq <= upto``, in seq order."""
    found = _ROWS.rows(conn, {"file_id": file_id, "after": after, "upto": upto})
    return [tables.MessageRow.of(row) for row in found]


def clear(conn: sa.Connection) -> None:
    """Drop every row and every term (``reindex`` rebuilds them from the files)."""
    if database.is_postgres(conn):
        conn.execute(sa.text("TRUNCATE message_term_parts, message_terms, messages"))
    else:
        conn.execute(sa.text("INSERT INTO message_terms (message_terms) VALUES ('delete-all')"))
        conn.execute(sa.delete(tables.messages))


def unindexed(conn: sa.Connection, ids: Sequence[int]) -> list[int]:
    """The ids among ``ids`` that have no terms (``fsck``)."""
    if not ids:
        return []
    if database.is_postgres(conn):
        query = sa.text("SELECT id FROM message_terms WHERE id = ANY(:ids)")
        present = set(conn.execute(query, {"ids": list(ids)}).scalars())
    else:
        query = sa.text("SELECT rowid FROM message_terms WHERE rowid = :id")
        present = {i for i in ids if conn.execute(query, {"id": i}).first() is not None}
    return [i for i in ids if i not in present]


def segment_counts(conn: sa.Connection, ids: Sequence[int]) -> dict[int, int]:
    """PostgreSQL: of the messages among ``ids`` whose ``message_terms`` tsvector is empty,
    how many segments of their terms ``message_term_parts`` holds (a long message's are all
    there; a message without words has none) — ``fsck`` checks them against the text. Empty
    on SQLite (one row holds any message's terms)."""
    if not ids or not database.is_postgres(conn):
        return {}
    query = sa.text(
        "SELECT t.id, count(p.id) FROM message_terms t "
        "LEFT JOIN message_term_parts p ON p.id = t.id "
        "WHERE t.id = ANY(:ids) AND length(t.tsv) = 0 GROUP BY t.id"
    )
    return {int(i): int(n) for i, n in conn.execute(query, {"ids": list(ids)})}


def pg_layout(owner: Owner, message: document.Message) -> tuple[bool, int]:
    """How PostgreSQL holds a message's terms (:func:`pg_terms`): whether its ``tsvector`` is
    empty, and how many segments ``message_term_parts`` has of them."""
    found = terms.terms(said(owner, message.role, message.content)[1])
    if not found:
        return True, 0
    made = terms.segments(found)
    return (False, 0) if len(made) == 1 else (True, len(made))


# ---------------------------------------------------------------------------------------------
# search


@dataclasses.dataclass(frozen=True)
class Filters:
    """What a search is narrowed to; ``agents`` are the caller's (None: every agent)."""

    agents: Collection[str] | None = None
    agent_id: str | None = None
    session_key: str | None = None
    file_id: str | None = None
    role: str | None = None
    since: dt.datetime | None = None
    until: dt.datetime | None = None
    speaker: str | None = None  #: who said it (docs/search.md, "Speakers")


@dataclasses.dataclass(frozen=True)
class Hit:
    """A message that matched, with what a result shows of its file."""

    message: tables.MessageRow
    agent_id: str
    session_key: str
    score: float


HIT_COLUMNS = (
    *(tables.messages.c[c.name] for c in tables.messages.columns),
    tables.raw_files.c.agent_id,
    tables.raw_files.c.session_key,
)


DEFAULT_WINDOW = 10_000  #: matches ranked at most per query (the newest)


def find(
    conn: sa.Connection,
    query: terms.Query,
    filters: Filters,
    *,
    limit: int,
    window: int = DEFAULT_WINDOW,
) -> list[Hit]:
    """The best ``limit`` matches of ``query`` within ``filters``, best first; equal scores in
    source_ref order (when more tie than ``limit`` takes, which of them come is not fixed).

    Only the newest ``window`` matches are ranked: a query for a word that half the messages
    contain would otherwise score every one of them, and its time would grow with the store.
    """
    if filters.agents is not None and not filters.agents:
        return []
    if database.is_postgres(conn):
        return _find_postgres(conn, query, filters, limit, window)
    return _find_sqlite(conn, query, filters, limit, window)


def tag_groups(f: Filters) -> list[list[str]]:
    """SQLite's filters as groups of tags (one of each group must be in a message's ``tags``
    column): the caller's agents, then the agent, session, file and role asked for."""
    tags: list[list[str]] = []
    if f.agents is not None:
        tags.append([terms.tag("a", a) for a in sorted(f.agents)])
    for kind, value in (("a", f.agent_id), ("s", f.session_key), ("f", f.file_id), ("r", f.role)):
        if value is not None:
            tags.append([terms.tag(kind, value)])
    if f.speaker is not None:
        tags.append([terms.tag("p", speaker_key(f.speaker))])
    return tags


def spoken_by(terms_table: Any, f: Filters) -> list[Any]:
    """PostgreSQL: the condition of ``f``'s speaker on ``message_terms`` (none without one)."""
    if f.speaker is None:
        return []
    return [terms_table.c.speaker == speaker_key(f.speaker)]


def said_by(conn: sa.Connection, ids: Collection[int], speaker: str) -> set[int]:
    """The ids among ``ids`` of messages ``speaker`` said."""
    if not ids:
        return set()
    if database.is_postgres(conn):
        query = sa.text("SELECT id FROM message_terms WHERE id = ANY(:ids) AND speaker = :p")
        return set(conn.execute(query, {"ids": list(ids), "p": speaker_key(speaker)}).scalars())
    tag = terms.tag("p", speaker_key(speaker))
    query = sa.text("SELECT rowid FROM message_terms WHERE message_terms MATCH :m AND rowid = :id")
    return {i for i in ids if conn.execute(query, {"m": f'tags : "{tag}"', "id": i}).first()}


def _find_sqlite(
    conn: sa.Connection, query: terms.Query, f: Filters, limit: int, window: int
) -> list[Hit]:
    match = terms.fts5_match(query, tags=tag_groups(f))
    fts = sa.table("message_terms", sa.column("rowid"))
    rank: sa.ColumnElement[float] = sa.literal_column("bm25(message_terms)")
    # FTS5 walks the matches newest first and stops after the window (scoring only those);
    # a time window needs the catalog, so then the join filters first.
    if f.since is None and f.until is None:
        newest = (
            sa.select(fts.c.rowid.label("id"), rank.label("rank"))
            .where(sa.text("message_terms MATCH :match"))
            .order_by(fts.c.rowid.desc())
            .limit(window)
            .subquery()
        )
        best = sa.select(newest).order_by(newest.c.rank).limit(limit).subquery()
        stmt = (
            sa.select(*HIT_COLUMNS, (-best.c.rank).label("score"))
            .select_from(best)
            .join(tables.messages, tables.messages.c.id == best.c.id)
            .join(tables.raw_files, tables.raw_files.c.file_id == tables.messages.c.file_id)
            .order_by(best.c.rank, tables.messages.c.file_id, tables.messages.c.seq)
        )
    else:
        within = (
            sa.select(*HIT_COLUMNS, (-rank).label("score"))
            .select_from(fts)
            .join(tables.messages, tables.messages.c.id == fts.c.rowid)
            .join(tables.raw_files, tables.raw_files.c.file_id == tables.messages.c.file_id)
            .where(sa.text("message_terms MATCH :match"), *time_window(f))
            .order_by(fts.c.rowid.desc())
            .limit(window)
            .subquery()
        )
        stmt = (
            sa.select(within)
            .order_by(within.c.score.desc(), within.c.file_id, within.c.seq)
            .limit(limit)
        )
    return [hit_of(row) for row in conn.execute(stmt, {"match": match})]


def time_window(f: Filters) -> list[Any]:
    """The conditions of ``f``'s time window on the catalog."""
    found = []
    if f.since is not None:
        found.append(tables.messages.c.ts >= f.since)
    if f.until is not None:
        found.append(tables.messages.c.ts <= f.until)
    return found


def scope(f: Filters) -> list[Any]:
    """The conditions of ``f`` on the messages joined with their files (PostgreSQL's filters
    are ordinary SQL; SQLite's are tags in the search index but for the time window)."""
    m, files = tables.messages.c, tables.raw_files.c
    where = time_window(f)
    if f.agents is not None:
        where.append(files.agent_id.in_(sorted(f.agents)))
    for column, value in (
        (files.agent_id, f.agent_id),
        (files.session_key, f.session_key),
        (m.file_id, f.file_id),
        (m.role, f.role),
    ):
        if value is not None:
            where.append(column == value)
    return where


def _find_postgres(
    conn: sa.Connection, query: terms.Query, f: Filters, limit: int, window: int
) -> list[Hit]:
    t = sa.table("message_terms", sa.column("id"), sa.column("tsv"), sa.column("speaker"))
    q = sa.cast(sa.bindparam("tsquery", type_=sa.Text), postgresql.TSQUERY)
    m, files = tables.messages.c, tables.raw_files.c
    where = [t.c.tsv.op("@@")(q), *spoken_by(t, f), *scope(f)]
    # The newest matches first, by id alone (joined only when a filter needs it); the rank,
    # the rows and their files only for those: computed for every match, they cost more
    # than the search itself when a word is common.
    newest: Any = sa.select(t.c.id).select_from(t)
    if len(where) > 1:
        newest = newest.join(tables.messages, m.id == t.c.id).join(
            tables.raw_files, files.file_id == m.file_id
        )
    ids = newest.where(*where).order_by(t.c.id.desc()).limit(window).subquery()
    score = sa.func.ts_rank_cd(t.c.tsv, q)
    stmt = (
        sa.select(*HIT_COLUMNS, score.label("score"))
        .select_from(ids)
        .join(t, t.c.id == ids.c.id)
        .join(tables.messages, m.id == ids.c.id)
        .join(tables.raw_files, files.file_id == m.file_id)
        .order_by(score.desc(), m.file_id, m.seq)
        .limit(limit)
    )
    # Planned for this query's words: psycopg prepares a statement run often on a connection,
    # and PostgreSQL's generic plan for it (one for any words) scans for a rare word as for a
    # common one — ten times slower at a million messages (bench/bench_search.py).
    long_ones = custom_plans(conn)
    found = [hit_of(row) for row in conn.execute(stmt, {"tsquery": terms.tsquery(query)})]
    # and the long messages (their message_terms row is empty), ranked by their best segment:
    # a statement of its own, built only when there are any (most stores have few or none)
    if not long_ones:
        return found
    rank = parts_matching(query, f, lambda tsv: sa.func.ts_rank_cd(tsv, _tsquery(query, "any")))
    newest_long = list(conn.execute(rank.order_by(PARTS.c.id.desc()).limit(window)))
    if not newest_long:
        return found
    best = sorted(newest_long, key=lambda r: (-r.score, -r.id))[:limit]
    found += hits_by_id(conn, [(r.id, r.score) for r in best])
    found.sort(key=lambda h: (-h.score, h.message.file_id, h.message.seq))
    return found[:limit]


def hits_by_id(conn: sa.Connection, scored: Sequence[tuple[int, float]]) -> list[Hit]:
    """The hits of message ids with their scores, best first (ties in source_ref order)."""
    if not scored:
        return []
    score = dict(scored)
    m, files = tables.messages.c, tables.raw_files.c
    found: list[Hit] = []
    ids = list(score)
    for lo in range(0, len(ids), 500):  # SQLite's bound parameters are few
        stmt = (
            sa.select(*HIT_COLUMNS, sa.literal(0.0).label("score"))
            .select_from(tables.messages)
            .join(tables.raw_files, files.file_id == m.file_id)
            .where(m.id.in_(ids[lo : lo + 500]))
        )
        for row in conn.execute(stmt):
            hit = hit_of(row)
            found.append(dataclasses.replace(hit, score=score[hit.message.id]))
    found.sort(key=lambda h: (-h.score, h.message.file_id, h.message.seq))
    return found


def custom_plans(conn: sa.Connection) -> bool:
    """PostgreSQL: the rest of the transaction planned for each statement's own values
    (``SET LOCAL plan_cache_mode = force_custom_plan``); and, asked in the same round trip,
    whether any message has its terms in segments (:data:`PARTS`)."""
    return bool(conn.exec_driver_sql(_CUSTOM_PLANS).one()[1])


_CUSTOM_PLANS = (
    "SELECT set_config('plan_cache_mode', 'force_custom_plan', true), "
    "EXISTS (SELECT 1 FROM message_term_parts)"
)


def _tsquery(query: terms.Query, match: terms.Match | None = None) -> Any:
    """``query`` as a tsquery (its phrases joined as ``match``, default its own)."""
    text = terms.tsquery(dataclasses.replace(query, match=match or query.match))
    return sa.cast(sa.literal(text, sa.Text), postgresql.TSQUERY)


def parts_matching(query: terms.Query, f: Filters, score: Callable[[Any], Any]) -> Any:
    """PostgreSQL: ``SELECT id, score`` of the long messages within ``f`` (speaker too) that match
    ``query`` — each of its phrases (``match="any"``: one of them) whole in one of their
    segments — with the best ``score`` of a segment's ``tsv``."""
    p, m, files = PARTS.c, tables.messages.c, tables.raw_files.c
    stmt: Any = sa.select(p.id, sa.func.max(score(p.tsv)).label("score")).select_from(PARTS)
    where = [p.tsv.op("@@")(_tsquery(query, "any")), *scope(f)]
    if len(where) > 1:
        stmt = stmt.join(tables.messages, m.id == p.id).join(
            tables.raw_files, files.file_id == m.file_id
        )
    if f.speaker is not None:  # who said it is on the message's message_terms row
        t = sa.table("message_terms", sa.column("id"), sa.column("speaker"))
        stmt = stmt.join(t, t.c.id == p.id)
        where += spoken_by(t, f)
    stmt = stmt.where(*where).group_by(p.id)
    if query.match == "all" and len(query.phrases) > 1:
        each = [
            sa.func.bool_or(p.tsv.op("@@")(_tsquery(dataclasses.replace(query, phrases=(ph,)))))
            for ph in query.phrases
        ]
        stmt = stmt.having(sa.and_(*each))
    return stmt


def hit_of(row: sa.Row[Any]) -> Hit:
    """The hit of a row of :data:`HIT_COLUMNS` and a ``score``."""
    values = row._mapping
    message = tables.MessageRow(**{c.name: values[c.name] for c in tables.messages.columns})
    return Hit(message, values["agent_id"], values["session_key"], float(values["score"]))
