"""Ranked search (docs/search.md): the messages that best answer a question, by BM25 over the
catalog's search terms (:mod:`pipeline.terms`) — FTS5's own ``bm25()`` on SQLite, the same
formula computed from the ``tsvector``s on PostgreSQL — every match scored, however old. A
phrase most messages hold is left out of a query with rarer ones (``search_common_matches``).
No file access here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import time
from collections.abc import Collection, Iterator, Sequence
from typing import Any, NamedTuple

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from pipeline import catalog, database, errors, tables, terms
from pipeline.settings import Search

#: BM25's parameters, FTS5's own (its bm25() has them built in; PostgreSQL's score uses them)
K1 = 1.2
B = 0.75
#: messages ranked by PostgreSQL's first pass (idf-weighted ts_rank of each phrase), whose exact
#: BM25 is then computed from their tsvectors
PG_FIRST_PASS = 300
#: rows PostgreSQL's average message length is estimated from (exact below it)
PG_LENGTH_SAMPLE = 2_000
#: tags every message has in SQLite's second column: FTS5 counts them in a message's length
_TAGS_PER_MESSAGE = 4


def rank(
    conn: sa.Connection,
    query: terms.Query,
    filters: catalog.Filters,
    *,
    limit: int,
    common: int = Search.common_matches,
    enough: int | None = None,
    timeout: float | None = None,
    context: float = Search.context_weight,
) -> list[Scored]:
    """The ``limit`` messages within ``filters`` that match any phrase of ``query`` with the
    highest BM25 score (FTS5's formula on both databases), best first; equal scores in
    source_ref order. A phrase in a message's context terms (the turns before it) scores
    ``context`` (0: nothing) of what it would in the message's own terms: each column's BM25
    is computed apart and the two summed so weighted. (FTS5's column weights multiply the
    term frequency before BM25 saturates it, and a low-weighted match in a short message then
    counted more than the same word's own match in a long one: a neighbour's context
    outranked a long answer.) Every match
    is scored, however old; a phrase in ``common`` messages or more is left out when the
    query has rarer ones, unless those find fewer than ``enough`` (default ``limit``)
    messages: then every phrase counts. QueryTooCostly when the database works on it past
    ``timeout`` seconds (PostgreSQL: any one of its statements)."""
    if filters.agents is not None and not filters.agents:
        return []
    postgres = database.is_postgres(conn)
    try:
        if postgres and timeout is not None:
            conn.exec_driver_sql(f"SET LOCAL statement_timeout = {max(1, int(timeout * 1000))}")
        # PostgreSQL: whether any message's terms are in segments (catalog.PARTS); most
        # stores have none, and then no statement asks for them
        long_ones = postgres and catalog.custom_plans(conn)
        with _interrupted_after(conn, None if postgres else timeout):

            def ranked(q: terms.Query, counts: list[int]) -> list[tuple[int, float]]:
                if postgres:
                    return _rank_postgres(conn, q, counts, filters, limit, long_ones, context)
                return _rank_sqlite(conn, q, filters, limit, context)

            counts = _counts(conn, query, common, long_ones, context)
            kept = [i for i, n in enumerate(counts) if n < common] or list(range(len(counts)))
            scored = ranked(_only(query, kept), [counts[i] for i in kept] if counts else [])
            if len(scored) < (enough or limit) and len(kept) < len(counts):
                # The rarer words found too few within the filters (they may be in other
                # agents' messages): the common words count too, rather than an answer that
                # holds only them vanishing.
                scored = ranked(query, counts)
    except sa.exc.OperationalError as exc:
        code = getattr(exc.orig, "sqlstate", None)
        if code != "57014" and "interrupted" not in str(exc.orig):
            raise
        raise errors.QueryTooCostly(
            f"the search took longer than {timeout:g} s (search_timeout) and was stopped: "
            "leave out its most common words or narrow it with a filter"
        ) from None
    score = dict(scored)
    found = [Scored(i, f, s, score[i]) for i, f, s in _keys(conn, list(score))]
    found.sort(key=lambda h: (-h.score, h.file_id, h.seq))
    return found


class Scored(NamedTuple):
    """A ranked message, without what a hit shows of it (:func:`hits_by_id` has that)."""

    id: int
    file_id: str
    seq: int
    score: float


_KEYS = sa.select(tables.messages.c.id, tables.messages.c.file_id, tables.messages.c.seq).where(
    tables.messages.c.id.in_(sa.bindparam("ids", expanding=True))
)


def _keys(conn: sa.Connection, ids: list[int]) -> list[tuple[int, str, int]]:
    found: list[tuple[int, str, int]] = []
    for lo in range(0, len(ids), 500):  # SQLite's bound parameters are few
        found.extend((i, f, s) for i, f, s in conn.execute(_KEYS, {"ids": ids[lo : lo + 500]}))
    return found


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


def hits_by_id(conn: sa.Connection, scored: Sequence[tuple[int, float]]) -> list[catalog.Hit]:
    """The hits of message ids with their scores, best first (ties in source_ref order)."""
    return catalog.hits_by_id(conn, scored)


def _columns(context: float) -> str:
    """The FTS5 columns a ranked query looks in."""
    return "{terms context}" if context > 0 else "terms"


def _rank_sqlite(
    conn: sa.Connection, query: terms.Query, f: catalog.Filters, limit: int, context: float
) -> list[tuple[int, float]]:
    match = terms.fts5_match(query, tags=catalog.tag_groups(f), columns=_columns(context))
    # the terms column's score, the tags column weighing 0 (a filter, not a relevance signal);
    # plus ``context`` times the context column's score alone (:func:`rank` says why not one
    # bm25() with the context column weighted)
    bm25 = "bm25(message_terms, 1.0, 0.0, 0.0)"
    if context > 0:
        bm25 = f"({bm25} + {float(context)!r} * bm25(message_terms, 0.0, 0.0, 1.0))"
    if f.since is None and f.until is None:
        sql = (
            f"SELECT rowid, {bm25} AS r FROM message_terms "
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
            f"SELECT t.rowid, {bm25} AS r FROM message_terms t "
            "JOIN messages m ON m.id = t.rowid WHERE message_terms MATCH :match AND "
            + " AND ".join(clauses)
            + " ORDER BY r, t.rowid LIMIT :limit"
        )
    # typed, so a time compares with the catalog's as SQLAlchemy stores it
    times = [sa.bindparam(n, type_=sa.DateTime) for n in ("since", "until") if n in params]
    stmt = sa.text(sql).bindparams(*times)
    return [(int(i), -float(r)) for i, r in conn.execute(stmt, params)]


def _counts(
    conn: sa.Connection, query: terms.Query, common: int, long_ones: bool, context: float
) -> list[int]:
    """How many messages hold each phrase of ``query``, counted up to ``common`` (a phrase in
    that many is common: left out of a first ranking when the query has rarer ones). SQLite
    counts only when there is a choice (its bm25() counts for itself): none for one phrase."""
    postgres = database.is_postgres(conn)
    if len(query.phrases) < 2 and not postgres:
        return []
    return [_matches(conn, p, common, postgres, long_ones, context) for p in query.phrases]


def _only(query: terms.Query, kept: list[int]) -> terms.Query:
    """``query`` with the phrases at ``kept`` alone (all of them when ``kept`` is empty)."""
    if not kept or len(kept) == len(query.phrases):
        return query
    return dataclasses.replace(query, phrases=tuple(query.phrases[i] for i in kept))


def _matches(
    conn: sa.Connection,
    phrase: tuple[str, ...],
    common: int,
    postgres: bool,
    long_ones: bool,
    context: float,
) -> int:
    """Messages that hold ``phrase`` (in their context terms too when ``context``), counted up
    to ``common`` (through the index: the count stops there, so a common word costs no more
    than that); on PostgreSQL with ``long_ones``, the long messages whose segments hold it
    too."""
    if postgres:
        where, q = "tsv @@ CAST(:q AS tsquery)", terms.phrase_tsquery(phrase)
        if context > 0:
            where = f"({where} OR ctx @@ CAST(:q AS tsquery))"
        # PostgreSQL's own estimate first: counting a common word's thousands of matches
        # visits as many heap rows, an estimate from its statistics costs a plan
        plan = conn.execute(
            sa.text(f"EXPLAIN (FORMAT JSON) SELECT 1 FROM message_terms WHERE {where}"), {"q": q}
        ).scalar_one()
        plan = json.loads(plan) if isinstance(plan, str) else plan
        if plan[0]["Plan"]["Plan Rows"] >= common:
            return common
        if not long_ones:
            sql = f"SELECT count(*) FROM (SELECT 1 FROM message_terms WHERE {where} LIMIT :cap) s"
            return int(conn.execute(sa.text(sql), {"q": q, "cap": common}).scalar_one())
        # a long message matched by its context terms and by its segments counts once
        sql = (
            f"SELECT count(*) FROM ((SELECT id FROM message_terms WHERE {where} LIMIT :cap) "
            "UNION (SELECT DISTINCT id FROM message_term_parts "
            "WHERE tsv @@ CAST(:q AS tsquery) LIMIT :cap)) AS s"
        )
        return min(common, int(conn.execute(sa.text(sql), {"q": q, "cap": common}).scalar_one()))
    where, q = "message_terms MATCH :q", terms.phrase_fts5(phrase, columns=_columns(context))
    sql = f"SELECT count(*) FROM (SELECT 1 FROM message_terms WHERE {where} LIMIT :cap) AS s"
    return int(conn.execute(sa.text(sql), {"q": q, "cap": common}).scalar_one())


def _rank_postgres(
    conn: sa.Connection,
    query: terms.Query,
    df: list[int],
    f: catalog.Filters,
    limit: int,
    long_ones: bool,
    context: float,
) -> list[tuple[int, float]]:
    rows = _pg_rows(conn)
    idf = [_idf(rows, n) for n in df]
    t = sa.table(
        "message_terms",
        sa.column("id"),
        sa.column("tsv"),
        sa.column("ctx"),
        sa.column("speaker"),
    )
    m, files = tables.messages.c, tables.raw_files.c

    def tsq(text: str) -> Any:
        return sa.cast(sa.literal(text, sa.Text), postgresql.TSQUERY)

    found = terms.tsquery(query)
    matched: Any = t.c.tsv.op("@@")(tsq(found))
    if context > 0:
        matched = sa.or_(matched, t.c.ctx.op("@@")(tsq(found)))
    where = [matched, *catalog.spoken_by(t, f), *catalog.scope(f)]

    # first pass, in the database: each phrase's ts_rank (a saturating term frequency over
    # the log of the length) weighted by its idf, for every match; the context terms'
    # weighed ``context`` (a long message's segments have none: its context is on its row)
    def first_of(tsv: Any, ctx: Any = None) -> Any:
        def rank_of(p: tuple[str, ...]) -> Any:
            own = sa.func.ts_rank(tsv, tsq(terms.phrase_tsquery(p)), 1)
            if ctx is not None and context > 0:
                return own + context * sa.func.ts_rank(ctx, tsq(terms.phrase_tsquery(p)), 1)
            return own

        return sum((rank_of(p) * idf[i] for i, p in enumerate(query.phrases)), sa.literal(0.0))

    first = first_of(t.c.tsv, t.c.ctx)
    stmt: Any = sa.select(t.c.id, first.label("r")).select_from(t)
    if len(where) > 1:
        stmt = stmt.join(tables.messages, m.id == t.c.id).join(
            tables.raw_files, files.file_id == m.file_id
        )
    n = max(PG_FIRST_PASS, limit)
    stmt = stmt.where(*where).order_by(first.desc(), t.c.id).limit(n)
    first_pass = [(int(i), float(r)) for i, r in conn.execute(stmt)]
    # long messages, each by its best segment (their message_terms row is empty): a statement
    # of its own, built only when there are any (most stores have few or none)
    if long_ones:
        long = catalog.parts_matching(query, f, first_of)
        long = long.order_by(sa.literal_column("score").desc(), catalog.PARTS.c.id).limit(n)
        first_pass += [(int(i), float(r)) for i, r in conn.execute(long)]
    first_pass.sort(key=lambda s: (-s[1], s[0]))
    # a long message matched by its context terms too is in both: once, by its best
    ids = list(dict.fromkeys(i for i, _ in first_pass))[:n]
    if not ids:
        return []
    # second pass: FTS5's BM25 exactly, from the candidates' lengths and the positions of the
    # query's terms (unnested in the database: parsing whole tsvectors costs more); a long
    # message's from its segments, each position past the terms before its segment; a
    # message's length counts its context terms too, as FTS5 counts every column's
    lengths: dict[int, int] = {}
    context_lengths: dict[int, int] = {}
    for i, length, context_length in conn.execute(
        _PG_LENGTHS_ALL if long_ones else _PG_LENGTHS, {"ids": ids}
    ):
        lengths[i] = max(length or 0, lengths.get(i, 0))
        context_lengths[i] = max(context_length or 0, context_lengths.get(i, 0))
    seen: dict[int, dict[str, set[int]]] = {i: {} for i in lengths}
    lexemes = sorted({t for p in query.phrases for t in p})
    any_lexeme = " | ".join(terms.phrase_tsquery((x,)) for x in lexemes)
    params = {"ids": ids, "lexemes": lexemes, "any": any_lexeme}
    for i, lexeme, base, at_ in conn.execute(
        _PG_POSITIONS_ALL if long_ones else _PG_POSITIONS, params
    ):
        seen[i].setdefault(lexeme, set()).update(base + a for a in at_)
    positions_of = {i: {k: sorted(v) for k, v in ps.items()} for i, ps in seen.items()}
    context_of: dict[int, dict[str, list[int]]] = {i: {} for i in lengths}
    if context > 0:
        for i, lexeme, at_ in conn.execute(_PG_CONTEXT, {"ids": ids, "lexemes": lexemes}):
            context_of[i][lexeme] = list(at_)
    avgdl = _pg_average_length(conn, rows)
    scored = []
    for i, positions in positions_of.items():
        length = lengths[i] + context_lengths[i] + _TAGS_PER_MESSAGE
        score = 0.0
        norm = K1 * (1 - B + B * length / avgdl)
        for p, weight in zip(query.phrases, idf, strict=True):
            # each column's BM25 apart, the context's weighed ``context``, as on SQLite
            own = _saturated(terms.phrase_count(positions, p), norm)
            near = _saturated(terms.phrase_count(context_of[i], p), norm) if context else 0.0
            score += weight * (own + context * near)
        scored.append((int(i), score))
    scored.sort(key=lambda s: (-s[1], s[0]))
    return scored[:limit]


#: the last position of a tsvector ``tsv``
_LAST = "(SELECT max(p) FROM unnest(tsv) AS v, unnest(v.positions) AS p)"
#: the length in terms of a message ``id`` whose terms are in segments: its last one's end
_LONG_LENGTH = (
    f"(SELECT l.base + {_LAST.replace('tsv', 'l.tsv')} FROM message_term_parts l "
    "WHERE l.id = {id} ORDER BY l.part DESC LIMIT 1)"
)
#: a message's length in terms and its context's (the last position of each)
_LENGTHS = (
    f"SELECT t.id, {_LAST.replace('tsv', 't.tsv')}, {_LAST.replace('tsv', 't.ctx')} "
    "FROM message_terms t WHERE t.id = ANY(:ids)"
)
_PG_LENGTHS = sa.text(_LENGTHS)
_PG_LENGTHS_ALL = sa.text(  # and of the long messages (their context is on their row)
    f"{_LENGTHS} UNION ALL SELECT s.id, {_LONG_LENGTH.format(id='s.id')}, 0 "
    "FROM (SELECT DISTINCT id FROM message_term_parts WHERE id = ANY(:ids)) AS s"
)
_POSITIONS = (
    "SELECT t.id, u.lexeme, 0, u.positions FROM message_terms t, unnest(t.tsv) AS u "
    "WHERE t.id = ANY(:ids) AND u.lexeme = ANY(:lexemes)"
)
_PG_POSITIONS = sa.text(_POSITIONS)
_PG_POSITIONS_ALL = sa.text(  # and of the long messages' segments that hold any of them
    f"{_POSITIONS} UNION ALL "
    "SELECT l.id, u.lexeme, l.base, u.positions FROM message_term_parts l, unnest(l.tsv) AS u "
    "WHERE l.id = ANY(:ids) AND l.tsv @@ CAST(:any AS tsquery) AND u.lexeme = ANY(:lexemes)"
)
_PG_CONTEXT = sa.text(
    "SELECT t.id, u.lexeme, u.positions FROM message_terms t, unnest(t.ctx) AS u "
    "WHERE t.id = ANY(:ids) AND u.lexeme = ANY(:lexemes)"
)


def _saturated(tf: int, norm: float) -> float:
    """BM25's share of a term frequency ``tf`` in a message whose length makes ``norm``."""
    return tf * (K1 + 1) / (tf + norm) if tf else 0.0


def _idf(rows: int, matches: int) -> float:
    """FTS5's idf (never zero or less, so a word in most messages still counts a little)."""
    matches = min(matches, rows)  # an estimate may say more
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
    # a long message's row is empty: its length is its segments' (catalog.PARTS); a
    # message's length counts its context terms too, as FTS5 counts every column's
    long = _LONG_LENGTH.format(id="t.id")
    sql = (
        f"SELECT avg(coalesce(CASE WHEN length(t.tsv) = 0 THEN {long} "
        f"ELSE {_LAST.replace('tsv', 't.tsv')} END, 0) "
        f"+ coalesce({_LAST.replace('tsv', 't.ctx')}, 0)) FROM message_terms AS t{sample}"
    )
    value = conn.execute(sa.text(sql)).scalar_one()
    return float(value or 0) + _TAGS_PER_MESSAGE


def _sample_percent(rows: int) -> float:
    return min(100.0, max(0.01, 100.0 * PG_LENGTH_SAMPLE / rows))


_AT_COLUMNS = [sa.column(c.name, c.type) for c in tables.messages.columns] + [
    sa.column("agent_id", sa.String),
    sa.column("session_key", sa.String),
    sa.column("score", sa.Float),
]
_AT_SELECT = ", ".join(f"m.{c.name}" for c in tables.messages.columns)


@functools.lru_cache(maxsize=64)
def _at_statement(keys: int, where: str) -> sa.TextClause:
    """:func:`at`'s statement for ``keys`` keys and the conditions ``where``: made once (its
    parsing and 400 bound parameters cost more than the query, ~2 ms a search)."""
    # the keys as a table joined to the catalog's (file_id, seq) index: a row-value IN
    # made SQLite scan the catalog, and an OR of 200 expressions costs more to build
    rows = ", ".join(f"(:f{i}, :s{i})" for i in range(keys))
    sql = (
        f"WITH k(file_id, seq) AS (VALUES {rows}) SELECT m.id, m.file_id, m.seq FROM k "
        f"JOIN messages m ON m.file_id = k.file_id AND m.seq = k.seq WHERE 1 = 1{where}"
    )
    # typed, so a time compares with the catalog's as SQLAlchemy stores it
    times = [sa.bindparam(n, type_=sa.DateTime) for n in ("since", "until") if f":{n}" in where]
    return sa.text(sql).bindparams(*times)


def at(
    conn: sa.Connection, keys: Collection[tuple[str, int]], filters: catalog.Filters
) -> list[tuple[int, str, int]]:
    """``(id, file_id, seq)`` of the messages at ``(file_id, seq)`` in ``keys`` that are within
    ``filters``: a ranked hit's neighbours, which share its file (so its agent and session)."""
    where, params = "", dict[str, Any]()
    if filters.role is not None:
        where, params["role"] = where + " AND m.role = :role", filters.role
    if filters.since is not None:
        where, params["since"] = where + " AND m.ts >= :since", filters.since
    if filters.until is not None:
        where, params["until"] = where + " AND m.ts <= :until", filters.until
    found: list[tuple[int, str, int]] = []
    wanted = sorted(keys)
    for lo in range(0, len(wanted), 200):
        batch = wanted[lo : lo + 200]
        values: dict[str, Any] = {f"f{i}": f for i, (f, _) in enumerate(batch)}
        values |= {f"s{i}": q for i, (_, q) in enumerate(batch)}
        stmt = _at_statement(len(batch), where)
        found.extend((i, f, s) for i, f, s in conn.execute(stmt, values | params))
    if filters.speaker is not None:  # a tag in the search index, not in the catalog
        said = catalog.said_by(conn, [i for i, _, _ in found], filters.speaker)
        found = [key for key in found if key[0] in said]
    return found
