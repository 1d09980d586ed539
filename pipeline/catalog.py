"""The message catalog (docs/design.md §6): one row per flushed message — where its block is in the
file, the facts of its heading — and the search terms of its text, both written in the commit
of the flush that wrote the message (never ahead of ``flushed_seq``, never behind), rebuilt by
``reindex``, checked by ``fsck``. No file access here.

The terms live in ``message_terms``, one row per message under the same id: on SQLite an FTS5
table without content (the text stays in the files; the index holds terms and, in a second
column, tags for the agent, the file, the session and the role, so filters intersect there);
on PostgreSQL a ``tsvector`` with a GIN index (filters are ordinary SQL). The terms are
:mod:`pipeline.terms`'s on both, so a query finds the same messages on either.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import math
import time
from collections.abc import Collection, Iterator, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from pipeline import database, document, errors, tables, terms

_M = tables.messages.c
_INSERT_ROWS = sa.insert(tables.messages).returning(_M.id, sort_by_parameter_order=True)
# SQLite runs the inserts on the driver in one executemany (database.Prepared) and looks the
# new ids up by seq; PostgreSQL sends a flush's rows in one statement with RETURNING.
_INSERT_ROW = database.Prepared(sa.insert(tables.messages).values(database.binds(tables.messages)))
_IDS = database.Prepared(
    sa.select(_M.seq, _M.id).where(
        _M.file_id == sa.bindparam("file_id"),
        _M.seq >= sa.bindparam("lo"),
        _M.seq <= sa.bindparam("hi"),
    )
)
_FTS_INSERT = database.Prepared(
    sa.text("INSERT INTO message_terms (rowid, terms, tags) VALUES (:id, :terms, :tags)")
)
_PG_INSERT = sa.text("INSERT INTO message_terms (id, tsv) VALUES (:id, CAST(:tsv AS tsvector))")


@dataclasses.dataclass(frozen=True)
class Owner:
    """What the catalog keeps of a message's file: its id, and for filtering its agent and
    session."""

    file_id: str
    agent_id: str
    session_key: str

    @classmethod
    def of(cls, row: tables.FileRow) -> Owner:
        """The owner facts of a file row."""
        return cls(row.file_id, row.agent_id, row.session_key)


def _tags(owner: Owner, role: str) -> str:
    return " ".join(
        (
            terms.tag("a", owner.agent_id),
            terms.tag("f", owner.file_id),
            terms.tag("s", owner.session_key),
            terms.tag("r", role),
        )
    )


def add(conn: sa.Connection, owner: Owner, found: Sequence[document.Located]) -> None:
    """Catalog flushed messages of a file and index their text (in the flush's commit)."""
    if not found:
        return
    ids = add_rows(conn, owner, found)
    words = [terms.terms(located.message.content) for located in found]
    if database.is_postgres(conn):
        tsvs = [{"id": i, "tsv": terms.tsvector(w)} for i, w in zip(ids, words, strict=True)]
        conn.execute(_PG_INSERT, tsvs)
        return
    _FTS_INSERT.many(
        conn,
        [
            {"id": i, "terms": " ".join(w), "tags": _tags(owner, located.message.role)}
            for i, w, located in zip(ids, words, found, strict=True)
        ],
    )


def add_rows(conn: sa.Connection, owner: Owner, found: Sequence[document.Located]) -> list[int]:
    """The catalog rows of ``found`` alone, without their search terms; their ids, in order."""
    values = [
        {
            "file_id": owner.file_id,
            "seq": located.message.seq,
            "byte_offset": located.offset,
            "byte_length": located.length,
            "ts": document.parse_ts(located.message.ts).replace(tzinfo=None),
            "role": located.message.role,
            "tool_name": located.message.tool_name,
        }
        for located in found
    ]
    if database.is_postgres(conn):
        return list(conn.execute(_INSERT_ROWS, values).scalars())
    _INSERT_ROW.many(conn, values)
    seqs = [located.message.seq for located in found]
    bounds = {"file_id": owner.file_id, "lo": min(seqs), "hi": max(seqs)}
    new_ids = {r["seq"]: r["id"] for r in _IDS.rows(conn, bounds)}
    return [new_ids[seq] for seq in seqs]


_ROWS = (
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
    found = conn.execute(_ROWS, {"file_id": file_id, "after": after, "upto": upto})
    return [tables.MessageRow.from_row(row) for row in found]


def clear(conn: sa.Connection) -> None:
    """Drop every row and every term (``reindex`` rebuilds them from the files)."""
    if database.is_postgres(conn):
        conn.execute(sa.text("TRUNCATE message_terms, messages"))
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


@dataclasses.dataclass(frozen=True)
class Hit:
    """A message that matched, with what a result shows of its file."""

    message: tables.MessageRow
    agent_id: str
    session_key: str
    score: float


_HIT_COLUMNS = (
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


def _find_sqlite(
    conn: sa.Connection, query: terms.Query, f: Filters, limit: int, window: int
) -> list[Hit]:
    tags: list[list[str]] = []
    if f.agents is not None:
        tags.append([terms.tag("a", a) for a in sorted(f.agents)])
    for kind, value in (("a", f.agent_id), ("s", f.session_key), ("f", f.file_id), ("r", f.role)):
        if value is not None:
            tags.append([terms.tag(kind, value)])
    match = terms.fts5_match(query, tags=tags)
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
            sa.select(*_HIT_COLUMNS, (-best.c.rank).label("score"))
            .select_from(best)
            .join(tables.messages, tables.messages.c.id == best.c.id)
            .join(tables.raw_files, tables.raw_files.c.file_id == tables.messages.c.file_id)
            .order_by(best.c.rank, tables.messages.c.file_id, tables.messages.c.seq)
        )
    else:
        within = (
            sa.select(*_HIT_COLUMNS, (-rank).label("score"))
            .select_from(fts)
            .join(tables.messages, tables.messages.c.id == fts.c.rowid)
            .join(tables.raw_files, tables.raw_files.c.file_id == tables.messages.c.file_id)
            .where(sa.text("message_terms MATCH :match"), *_window(f))
            .order_by(fts.c.rowid.desc())
            .limit(window)
            .subquery()
        )
        stmt = (
            sa.select(within)
            .order_by(within.c.score.desc(), within.c.file_id, within.c.seq)
            .limit(limit)
        )
    return [_hit(row) for row in conn.execute(stmt, {"match": match})]


def _window(f: Filters) -> list[Any]:
    found = []
    if f.since is not None:
        found.append(tables.messages.c.ts >= f.since)
    if f.until is not None:
        found.append(tables.messages.c.ts <= f.until)
    return found


def _find_postgres(
    conn: sa.Connection, query: terms.Query, f: Filters, limit: int, window: int
) -> list[Hit]:
    t = sa.table("message_terms", sa.column("id"), sa.column("tsv"))
    q = sa.cast(sa.bindparam("tsquery", type_=sa.Text), postgresql.TSQUERY)
    m, files = tables.messages.c, tables.raw_files.c
    where = [t.c.tsv.op("@@")(q), *_window(f)]
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
        sa.select(*_HIT_COLUMNS, score.label("score"))
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
    conn.exec_driver_sql("SET LOCAL plan_cache_mode = force_custom_plan")
    return [_hit(row) for row in conn.execute(stmt, {"tsquery": terms.tsquery(query)})]


def _hit(row: sa.Row[Any]) -> Hit:
    values = row._mapping
    message = tables.MessageRow(**{c.name: values[c.name] for c in tables.messages.columns})
    return Hit(message, values["agent_id"], values["session_key"], float(values["score"]))


# ---------------------------------------------------------------------------------------------
# ranked search (match=any; docs/search.md)

#: BM25's parameters, FTS5's own (its bm25() has them built in; PostgreSQL's score uses them)
K1 = 1.2
B = 0.75
#: messages a term may match and still be "rare" on PostgreSQL: a term in more is common, and
#: only adds to the score of messages found by the query's rarer terms (counting and scoring
#: every message of a word half the store holds would grow with the store)
COMMON_MATCHES = 20_000
#: messages ranked by PostgreSQL's first pass (idf-weighted ts_rank of each phrase), whose exact
#: BM25 is then computed from their tsvectors
PG_FIRST_PASS = 1_000
#: rows PostgreSQL's average message length is estimated from (exact below it)
PG_LENGTH_SAMPLE = 2_000
#: tags every message has in SQLite's second column: FTS5 counts them in a message's length
_TAGS_PER_MESSAGE = 4


def _tag_groups(f: Filters) -> list[list[str]]:
    tags: list[list[str]] = []
    if f.agents is not None:
        tags.append([terms.tag("a", a) for a in sorted(f.agents)])
    for kind, value in (("a", f.agent_id), ("s", f.session_key), ("f", f.file_id), ("r", f.role)):
        if value is not None:
            tags.append([terms.tag(kind, value)])
    return tags


def rank(
    conn: sa.Connection,
    query: terms.Query,
    filters: Filters,
    *,
    limit: int,
    common: int = COMMON_MATCHES,
    timeout: float | None = None,
) -> list[Hit]:
    """The ``limit`` messages within ``filters`` that match any phrase of ``query`` with the
    highest BM25 score (FTS5's formula on both databases), best first; equal scores in
    source_ref order. Every match is scored, however old (PostgreSQL: every match of a phrase
    in fewer than ``common`` messages; see :data:`COMMON_MATCHES`). QueryTooCostly when the
    database works on it past ``timeout`` seconds (PostgreSQL: any one of its statements)."""
    if filters.agents is not None and not filters.agents:
        return []
    try:
        if database.is_postgres(conn):
            if timeout is not None:
                conn.exec_driver_sql(f"SET LOCAL statement_timeout = {max(1, int(timeout * 1000))}")
            scored = _rank_postgres(conn, query, filters, limit, common)
        else:
            with _interrupted_after(conn, timeout):
                scored = _rank_sqlite(conn, query, filters, limit)
    except sa.exc.OperationalError as exc:
        code = getattr(exc.orig, "sqlstate", None)
        if code != "57014" and "interrupted" not in str(exc.orig):
            raise
        raise errors.QueryTooCostly(
            f"the search took longer than {timeout:g} s (search_timeout) and was stopped: "
            "leave out its most common words or narrow it with a filter"
        ) from None
    return hits_by_id(conn, scored)


@contextlib.contextmanager
def _interrupted_after(conn: sa.Connection, timeout: float | None) -> Iterator[None]:
    """SQLite stops the statement it runs once ``timeout`` seconds passed ("interrupted")."""
    if timeout is None:
        yield
        return
    raw: Any = conn.connection.driver_connection
    deadline = time.monotonic() + timeout
    raw.set_progress_handler(lambda: int(time.monotonic() > deadline), 10_000)
    try:
        yield
    finally:
        raw.set_progress_handler(None, 0)


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
            sa.select(*_HIT_COLUMNS, sa.literal(0.0).label("score"))
            .select_from(tables.messages)
            .join(tables.raw_files, files.file_id == m.file_id)
            .where(m.id.in_(ids[lo : lo + 500]))
        )
        for row in conn.execute(stmt):
            hit = _hit(row)
            found.append(dataclasses.replace(hit, score=score[hit.message.id]))
    found.sort(key=lambda h: (-h.score, h.message.file_id, h.message.seq))
    return found


def _rank_sqlite(
    conn: sa.Connection, query: terms.Query, f: Filters, limit: int
) -> list[tuple[int, float]]:
    match = terms.fts5_match(query, tags=_tag_groups(f))
    # weights: the terms column 1, the tags column 0 (a filter, not a relevance signal)
    if f.since is None and f.until is None:
        sql = (
            "SELECT rowid, bm25(message_terms, 1.0, 0.0) AS r FROM message_terms "
            "WHERE message_terms MATCH :match ORDER BY r, rowid LIMIT :limit"
        )
        params: dict[str, Any] = {"match": match, "limit": limit}
    else:
        clauses = []
        params = {"match": match, "limit": limit}
        if f.since is not None:
            clauses.append("m.ts >= :since")
            params["since"] = f.since
        if f.until is not None:
            clauses.append("m.ts <= :until")
            params["until"] = f.until
        sql = (
            "SELECT t.rowid, bm25(message_terms, 1.0, 0.0) AS r FROM message_terms t "
            "JOIN messages m ON m.id = t.rowid WHERE message_terms MATCH :match AND "
            + " AND ".join(clauses)
            + " ORDER BY r, t.rowid LIMIT :limit"
        )
    return [(int(i), -float(r)) for i, r in conn.execute(sa.text(sql), params)]


def _rank_postgres(
    conn: sa.Connection, query: terms.Query, f: Filters, limit: int, common: int
) -> list[tuple[int, float]]:
    conn.exec_driver_sql("SET LOCAL plan_cache_mode = force_custom_plan")
    rows = _pg_rows(conn)
    df = [_pg_matches(conn, p, common) for p in query.phrases]
    idf = [_idf(rows, n) for n in df]
    rare = [i for i, n in enumerate(df) if n < common]
    if not rare:  # only common words: the newest matches of all of them are ranked
        rare = list(range(len(query.phrases)))
    t = sa.table("message_terms", sa.column("id"), sa.column("tsv"))
    m, files = tables.messages.c, tables.raw_files.c

    def tsq(text: str) -> Any:
        return sa.cast(sa.literal(text, sa.Text), postgresql.TSQUERY)

    found = " | ".join(terms.phrase_tsquery(query.phrases[i]) for i in rare)
    where = [t.c.tsv.op("@@")(tsq(found)), *_window(f)]
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
    # first pass, in the database: each phrase's ts_rank (a saturating term frequency over
    # the log of the length) weighted by its idf, for every match of the rare phrases
    first: Any = sum(
        (
            sa.func.ts_rank(t.c.tsv, tsq(terms.phrase_tsquery(p)), 1) * idf[i]
            for i, p in enumerate(query.phrases)
        ),
        sa.literal(0.0),
    )
    stmt: Any = sa.select(t.c.id).select_from(t)
    if len(where) > 1:
        stmt = stmt.join(tables.messages, m.id == t.c.id).join(
            tables.raw_files, files.file_id == m.file_id
        )
    stmt = stmt.where(*where).order_by(first.desc(), t.c.id).limit(max(PG_FIRST_PASS, limit))
    ids = list(conn.execute(stmt).scalars())
    if not ids:
        return []
    # second pass: FTS5's BM25 exactly, from the candidates' terms and positions
    vectors = conn.execute(
        sa.text("SELECT id, tsv::text FROM message_terms WHERE id = ANY(:ids)"), {"ids": ids}
    )
    avgdl = _pg_average_length(conn, rows)
    scored = []
    for i, text in vectors:
        positions = terms.parse_tsvector(text)
        length = max((max(ps) for ps in positions.values()), default=0) + _TAGS_PER_MESSAGE
        score = 0.0
        for p, weight in zip(query.phrases, idf, strict=True):
            tf = terms.phrase_count(positions, p)
            if tf:
                score += weight * tf * (K1 + 1) / (tf + K1 * (1 - B + B * length / avgdl))
        scored.append((int(i), score))
    scored.sort(key=lambda s: (-s[1], s[0]))
    return scored[:limit]


def _idf(rows: int, matches: int) -> float:
    """FTS5's idf (never zero or less, so a word in most messages still counts a little)."""
    value = math.log((rows - matches + 0.5) / (matches + 0.5))
    return value if value > 0 else 1e-6


def _pg_rows(conn: sa.Connection) -> int:
    """Messages in the index: PostgreSQL's estimate when large (counting is slow), else exact."""
    estimate = conn.execute(
        sa.text("SELECT reltuples::bigint FROM pg_class WHERE oid = 'message_terms'::regclass")
    ).scalar_one()
    if estimate is not None and estimate >= 10_000:
        return int(estimate)
    return int(conn.execute(sa.text("SELECT count(*) FROM message_terms")).scalar_one())


def _pg_matches(conn: sa.Connection, phrase: tuple[str, ...], common: int) -> int:
    """Messages that hold ``phrase``, counted up to ``common``."""
    sql = (
        "SELECT count(*) FROM (SELECT 1 FROM message_terms "
        "WHERE tsv @@ CAST(:q AS tsquery) LIMIT :cap) AS s"
    )
    params = {"q": terms.phrase_tsquery(phrase), "cap": common}
    return int(conn.execute(sa.text(sql), params).scalar_one())


#: seconds an estimate of PostgreSQL's average message length is used (while the number of
#: messages stays within a tenth of what it was)
PG_LENGTH_SECONDS = 60.0
_lengths: dict[str, tuple[float, int, float]] = {}  # database URL -> (when, rows, length)


def _pg_average_length(conn: sa.Connection, rows: int) -> float:
    """A message's average length in terms (with its tags, as FTS5 counts it): exact for a
    small index (measured again when its number of messages changes), else from a sample of
    :data:`PG_LENGTH_SAMPLE` rows kept :data:`PG_LENGTH_SECONDS` (it moves slowly, and
    sampling costs more than a search)."""
    key = conn.engine.url.render_as_string(hide_password=True)
    now = time.monotonic()
    known = _lengths.get(key)
    if known is not None and (
        known[1] == rows  # a small index is measured again whenever it changes
        or (
            rows > PG_LENGTH_SAMPLE
            and now - known[0] < PG_LENGTH_SECONDS
            and abs(rows - known[1]) <= known[1] / 10
        )
    ):
        return known[2]
    length = _pg_measure_length(conn, rows)
    _lengths[key] = (now, rows, length)
    return length


def _pg_measure_length(conn: sa.Connection, rows: int) -> float:
    sample = "" if rows <= PG_LENGTH_SAMPLE else f" TABLESAMPLE SYSTEM ({_sample_percent(rows)})"
    sql = (
        "SELECT avg(coalesce((SELECT max(p) FROM unnest(tsv) AS u, unnest(u.positions) AS p), 0))"
        f" FROM message_terms{sample}"
    )
    value = conn.execute(sa.text(sql)).scalar_one()
    return float(value or 0) + _TAGS_PER_MESSAGE


def _sample_percent(rows: int) -> float:
    return min(100.0, max(0.01, 100.0 * PG_LENGTH_SAMPLE / rows))


def at(conn: sa.Connection, keys: Collection[tuple[str, int]], filters: Filters) -> list[Hit]:
    """The hits (score 0) of the messages at ``(file_id, seq)`` in ``keys`` that are within
    ``filters``: a ranked hit's neighbours, which share its file (so its agent and session)."""
    m, files = tables.messages.c, tables.raw_files.c
    where: list[Any] = [*_window(filters)]
    if filters.role is not None:
        where.append(m.role == filters.role)
    found: list[Hit] = []
    wanted = sorted(keys)
    for lo in range(0, len(wanted), 200):
        stmt = (
            sa.select(*_HIT_COLUMNS, sa.literal(0.0).label("score"))
            .select_from(tables.messages)
            .join(tables.raw_files, files.file_id == m.file_id)
            .where(sa.tuple_(m.file_id, m.seq).in_(wanted[lo : lo + 200]), *where)
        )
        found.extend(_hit(row) for row in conn.execute(stmt))
    return found
