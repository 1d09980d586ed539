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
#: the cost PostgreSQL's planner gives a page read out of order in a ranked search's
#: statements (its default is 4, for disks that seek; 1.1 is the usual value for an index that
#: is in memory or on SSD)
PG_RANDOM_PAGE_COST = 1.1
#: a ranked search's planner settings, for its transaction (:func:`rank` says why)
_PG_SEARCH_SETTINGS = (
    f"SELECT set_config('random_page_cost', '{PG_RANDOM_PAGE_COST}', true), "
    "set_config('max_parallel_workers_per_gather', '0', true)"
)
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
    scored: int = Search.common_scored,
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
    outranked a long answer.)

    Every match of a phrase in fewer than ``common`` messages is scored, however old. A
    phrase in more is *common*: left out when the query has rarer ones, unless those find
    fewer than ``enough`` (default ``limit``) messages; then, and for a query of common
    phrases only, the common phrases are scored in their newest ``scored`` matches (a word in
    most messages would cost a score for each), their BM25 added to what the rarer ones
    scored (BM25 is a sum over phrases, so a message in both has its score over every
    phrase). A common phrase in half the messages or more ranks nothing (FTS5's idf gives it
    its floor): it is left out, and only when nothing else finds a message are its newest
    matches returned, unranked (score 0). A phrase no message holds is not searched for.
    QueryTooCostly when the database works on it past ``timeout`` seconds (PostgreSQL: any
    one of its statements)."""
    if filters.agents is not None and not filters.agents:
        return []
    postgres = database.is_postgres(conn)
    try:
        if postgres and timeout is not None:
            conn.exec_driver_sql(f"SET LOCAL statement_timeout = {max(1, int(timeout * 1000))}")
        if postgres:
            # the search's statements reach rows through indexes (GIN, the keys of a scope's
            # files) that a store searched keeps in memory: planned so, not as if each index
            # visit were a seek on disk (PostgreSQL's default 4 chose scanning every message
            # for an agent's scope; docs/benchmarks.md, bench_search)
            # and run in this process alone: a search's statements take milliseconds, and
            # starting parallel workers for one (the planner's choice for a few thousand
            # matches) cost more than they saved, and took the cores of the searches beside it
            conn.exec_driver_sql(_PG_SEARCH_SETTINGS)
        # PostgreSQL: whether any message's terms are in segments (catalog.PARTS); most
        # stores have none, and then no statement asks for them
        long_ones = postgres and catalog.custom_plans(conn)
        with _interrupted_after(conn, None if postgres else timeout):
            counts = _counts(conn, query, common, long_ones, context)

            def ranked(
                kept: list[int], newest: int | None = None, also: Collection[int] = ()
            ) -> list[tuple[int, float]]:
                q, df = _only(query, kept), [counts[i].documents for i in kept]
                if postgres:
                    return _rank_postgres(
                        conn, q, df, filters, limit, long_ones, context, newest, also
                    )
                return _rank_sqlite(conn, q, filters, limit, context, newest, also)

            # a phrase no message holds finds nothing in any scope
            rare = [i for i, c in enumerate(counts) if 0 < c.matches < common]
            found = ranked(rare) if rare else []
            many = [i for i, c in enumerate(counts) if c.matches >= common]
            weighed = [i for i in many if counts[i].share < 0.5]
            if weighed and len(found) < (enough or limit):
                sums = dict(found)
                for i, s in ranked(weighed, newest=scored, also=sums):
                    sums[i] = sums.get(i, 0.0) + s
                found = sorted(sums.items(), key=lambda s: (-s[1], s[0]))[:limit]
            elif many and not found:
                # every phrase is in half the messages or more: BM25 gives each its floor
                # idf, nothing to rank by (and FTS5's bm25() would count all their
                # matches first): their newest matches, unranked
                found = _newest(conn, _only(query, many), filters, limit, context, postgres)
    except sa.exc.OperationalError as exc:
        code = getattr(exc.orig, "sqlstate", None)
        if code != "57014" and "interrupted" not in str(exc.orig):
            raise
        raise errors.QueryTooCostly(
            f"the search took longer than {timeout:g} s (search_timeout) and was stopped: "
            "leave out its most common words or narrow it with a filter"
        ) from None
    score = dict(found)
    hits = [Scored(i, f, s, score[i]) for i, f, s in _keys(conn, list(score))]
    hits.sort(key=lambda h: (-h.score, h.file_id, h.seq))
    return hits


def _newest(
    conn: sa.Connection,
    query: terms.Query,
    f: catalog.Filters,
    limit: int,
    context: float,
    postgres: bool,
) -> list[tuple[int, float]]:
    """The newest ``limit`` messages within ``f`` that match ``query``, each scored 0 (on
    PostgreSQL, of the messages whose terms are on their row: not a long message's
    segments)."""
    if not postgres:
        match = terms.fts5_match(query, tags=catalog.tag_groups(f), columns=_columns(context))
        sql, params = _sqlite_matched("t.rowid", match, f)
        stmt = sa.text(f"{sql} ORDER BY t.rowid DESC LIMIT :limit").bindparams(*_times(params))
        return [(int(i), 0.0) for (i,) in conn.execute(stmt, params | {"limit": limit})]
    t = _PG_TERMS
    where = [_pg_matched(query, context), *_pg_filters(f)]
    stmt = _pg_joined(sa.select(t.c.id).select_from(t), where).order_by(t.c.id.desc())
    stmt = stmt.limit(limit)
    return [(int(i), 0.0) for (i,) in conn.execute(stmt)]


class Count(NamedTuple):
    """How many messages hold a phrase of a query (:func:`_counts`)."""

    matches: int  #: counted up to the common bound (a count that reaches it is common)
    share: float  #: of every message, estimated past the bound (the idf's ``n / N``)
    documents: int  #: the phrase's messages, estimated past the bound (its idf's ``n``)


class Scored(NamedTuple):
    """A ranked message, without what a hit shows of it (:func:`hits_by_id` has that)."""

    id: int
    file_id: str
    seq: int
    score: float


_KEYS = sa.select(tables.messages.c.id, tables.messages.c.file_id, tables.messages.c.seq).where(
    tables.messages.c.id.in_(sa.bindparam("ids", expanding=True))
)


#: PostgreSQL's: the ids as one array (a list of 200 bound parameters cost ~2 ms to send)
_PG_KEYS = sa.text("SELECT id, file_id, seq FROM messages WHERE id = ANY(:ids)")


def _keys(conn: sa.Connection, ids: list[int]) -> list[tuple[int, str, int]]:
    if database.is_postgres(conn):
        return [(int(i), f, int(s)) for i, f, s in conn.execute(_PG_KEYS, {"ids": ids})]
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
    conn: sa.Connection,
    query: terms.Query,
    f: catalog.Filters,
    limit: int,
    context: float,
    newest: int | None = None,
    also: Collection[int] = (),
) -> list[tuple[int, float]]:
    """The best ``limit`` matches of ``query`` by BM25; with ``newest``, of its newest
    ``newest`` matches only, and the scores of those of ``also`` among them too."""
    match = terms.fts5_match(query, tags=catalog.tag_groups(f), columns=_columns(context))
    # the terms column's score, the tags column weighing 0 (a filter, not a relevance signal);
    # plus ``context`` times the context column's score alone (:func:`rank` says why not one
    # bm25() with the context column weighted)
    bm25 = "bm25(message_terms, 1.0, 0.0, 0.0)"
    if context > 0:
        bm25 = f"({bm25} + {float(context)!r} * bm25(message_terms, 0.0, 0.0, 1.0))"
    matched, params = _sqlite_matched(f"t.rowid AS id, {bm25} AS r", match, f)
    params["limit"] = limit
    if newest is None:
        sql = f"{matched} ORDER BY r, id LIMIT :limit"
    else:
        # the newest matches, scored once (one FTS5 cursor: bm25() counts each phrase's
        # messages for its idf once a cursor), the best of them and those of ``also``
        params["newest"] = newest
        wanted = ", ".join(str(int(i)) for i in also) or "NULL"
        sql = (
            f"WITH w AS MATERIALIZED ({matched} ORDER BY t.rowid DESC LIMIT :newest) "
            "SELECT id, r FROM (SELECT id, r FROM w ORDER BY r, id LIMIT :limit) "
            f"UNION SELECT id, r FROM w WHERE id IN ({wanted})"
        )
    stmt = sa.text(sql).bindparams(*_times(params))
    return [(int(i), -float(r)) for i, r in conn.execute(stmt, params)]


def _sqlite_matched(columns: str, match: str, f: catalog.Filters) -> tuple[str, dict[str, Any]]:
    """``SELECT columns`` of the index rows (``t``) that match ``match`` within ``f``'s times
    (the rest of ``f`` is in ``match``: tags), and its parameters."""
    params: dict[str, Any] = {"match": match}
    clauses = []
    if f.since is not None:
        clauses.append("m.ts >= :since")
        params["since"] = f.since
    if f.until is not None:
        clauses.append("m.ts <= :until")
        params["until"] = f.until
    sql = (
        f"SELECT {columns} FROM message_terms t "
        + ("JOIN messages m ON m.id = t.rowid " if clauses else "")
        + "WHERE message_terms MATCH :match"
        + "".join(f" AND {c}" for c in clauses)
    )
    return sql, params


def _times(params: dict[str, Any]) -> list[sa.BindParameter[Any]]:
    """The time parameters among ``params``, typed, so a time compares with the catalog's as
    SQLAlchemy stores it."""
    return [sa.bindparam(n, type_=sa.DateTime) for n in ("since", "until") if n in params]


def _counts(
    conn: sa.Connection, query: terms.Query, common: int, long_ones: bool, context: float
) -> list[Count]:
    """How many messages hold each phrase of ``query``, counted up to ``common`` (a phrase in
    that many is common), with its share of every message estimated past that."""
    if database.is_postgres(conn):
        rows = _pg_rows(conn)
        return [_pg_count(conn, p, common, long_ones, context, rows) for p in query.phrases]
    newest = conn.exec_driver_sql(
        "SELECT rowid FROM message_terms ORDER BY rowid DESC LIMIT 1"
    ).scalar()
    return [_sqlite_count(conn, p, common, context, newest or 0) for p in query.phrases]


def _sqlite_count(
    conn: sa.Connection, phrase: tuple[str, ...], common: int, context: float, newest: int
) -> Count:
    """Messages that hold ``phrase`` (in their context terms too when ``context``), counted
    through the index, newest first, up to ``common`` (so a common word costs no more than
    that); past it, its share of the messages is the bound over the ids its newest matches
    span (ids are given in order: the span is the messages since the oldest of them)."""
    q = terms.phrase_fts5(phrase, columns=_columns(context))
    sql = (
        "SELECT count(*), min(rowid) FROM (SELECT rowid FROM message_terms "
        "WHERE message_terms MATCH :q ORDER BY rowid DESC LIMIT :cap) AS s"
    )
    matches, oldest = conn.execute(sa.text(sql), {"q": q, "cap": common}).one()
    if matches < common or not newest:
        return Count(matches, matches / max(newest, 1), matches)
    share = min(1.0, matches / (newest - oldest + 1))
    return Count(matches, share, max(matches, round(share * newest)))


def _only(query: terms.Query, kept: list[int]) -> terms.Query:
    """``query`` with the phrases at ``kept`` alone (all of them when ``kept`` is empty)."""
    if not kept or len(kept) == len(query.phrases):
        return query
    return dataclasses.replace(query, phrases=tuple(query.phrases[i] for i in kept))


def _pg_count(
    conn: sa.Connection,
    phrase: tuple[str, ...],
    common: int,
    long_ones: bool,
    context: float,
    rows: int,
) -> Count:
    """Messages that hold ``phrase`` (in their context terms too when ``context``): in an
    index of up to :data:`PG_COUNTED` messages every match counted; above, counted up to
    ``common`` through the GIN index after PostgreSQL's own estimate: a phrase its statistics
    put in ``common`` or more is common, and that estimate is its number (counting a common
    word's thousands of matches visits as many heap rows; an estimate costs a plan). With
    ``long_ones``, the long messages whose segments hold it count too."""
    where, q = "tsv @@ CAST(:q AS tsquery)", terms.phrase_tsquery(phrase)
    if context > 0:
        where = f"({where} OR ctx @@ CAST(:q AS tsquery))"
    if rows <= PG_COUNTED:  # small: every match counted (its share exact)
        common = rows + 1
    else:
        plan = conn.execute(
            sa.text(f"EXPLAIN (FORMAT JSON) SELECT 1 FROM message_terms WHERE {where}"),
            {"q": q},
        ).scalar_one()
        plan = json.loads(plan) if isinstance(plan, str) else plan
        estimate = int(plan[0]["Plan"]["Plan Rows"])
        if estimate >= common:
            documents = min(estimate, rows)
            return Count(common, documents / rows, documents)
    if not long_ones:
        sql = f"SELECT count(*) FROM (SELECT 1 FROM message_terms WHERE {where} LIMIT :cap) s"
        matches = int(conn.execute(sa.text(sql), {"q": q, "cap": common}).scalar_one())
    else:
        # a long message matched by its context terms and by its segments counts once
        sql = (
            f"SELECT count(*) FROM ((SELECT id FROM message_terms WHERE {where} LIMIT :cap) "
            "UNION (SELECT DISTINCT id FROM message_term_parts "
            "WHERE tsv @@ CAST(:q AS tsquery) LIMIT :cap)) AS s"
        )
        found = int(conn.execute(sa.text(sql), {"q": q, "cap": common}).scalar_one())
        matches = min(common, found)
    return Count(matches, matches / max(rows, 1), matches)


#: messages up to which PostgreSQL counts every phrase's matches (no estimate; below it, the
#: number of messages is exact too: :func:`_pg_rows`)
PG_COUNTED = 10_000


def _rank_postgres(
    conn: sa.Connection,
    query: terms.Query,
    df: list[int],
    f: catalog.Filters,
    limit: int,
    long_ones: bool,
    context: float,
    newest: int | None = None,
    also: Collection[int] = (),
) -> list[tuple[int, float]]:
    """The best ``limit`` matches of ``query`` by BM25 computed from the tsvectors (``df``:
    each phrase's messages); with ``newest``, of its newest ``newest`` matches only, and the
    scores of those of ``also`` too."""
    rows = _pg_rows(conn)
    idf = [_idf(rows, n) for n in df]
    t, tsq = _PG_TERMS, _tsq
    where = [_pg_matched(query, context), *_pg_filters(f)]

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

    n = max(PG_FIRST_PASS, limit)
    if newest is None:
        first = first_of(t.c.tsv, t.c.ctx)
        stmt: Any = _pg_joined(sa.select(t.c.id, first.label("r")).select_from(t), where)
        stmt = stmt.order_by(first.desc(), t.c.id).limit(n)
    else:  # the newest matches only, each ranked once
        window = _pg_joined(sa.select(t.c.id, t.c.tsv, t.c.ctx).select_from(t), where)
        w = window.order_by(t.c.id.desc()).limit(newest).subquery()
        first = first_of(w.c.tsv, w.c.ctx)
        stmt = sa.select(w.c.id, first.label("r")).order_by(first.desc(), w.c.id).limit(n)
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
    listed = set(ids)
    ids += [i for i in also if i not in listed]
    if not ids:
        return []
    # second pass: FTS5's BM25 exactly, from the candidates' lengths and the positions of the
    # query's terms (unnested in the database: parsing whole tsvectors costs more); a long
    # message's from its segments, each position past the terms before its segment; a
    # message's length counts its context terms too, as FTS5 counts every column's
    lexemes = sorted({t for p in query.phrases for t in p})
    if long_ones:
        lengths, positions_of, context_of = _pg_terms_with_parts(conn, ids, lexemes, context)
    else:
        lengths, positions_of, context_of = _pg_terms(conn, ids, lexemes)
    avgdl = _pg_average_length(conn, rows)
    scored = []
    for i, positions in positions_of.items():
        length = lengths[i] + _TAGS_PER_MESSAGE
        score = 0.0
        norm = K1 * (1 - B + B * length / avgdl)
        for p, weight in zip(query.phrases, idf, strict=True):
            # each column's BM25 apart, the context's weighed ``context``, as on SQLite
            own = _saturated(terms.phrase_count(positions, p), norm)
            near = (
                _saturated(terms.phrase_count(context_of.get(i, {}), p), norm) if context else 0.0
            )
            score += weight * (own + context * near)
        scored.append((int(i), score))
    scored.sort(key=lambda s: (-s[1], s[0]))
    return scored[:limit] + [s for s in scored[limit:] if s[0] in also and s[1] > 0]


#: PostgreSQL's search index, as the ranking reads it
_PG_TERMS = sa.table(
    "message_terms", sa.column("id"), sa.column("tsv"), sa.column("ctx"), sa.column("speaker")
)


def _tsq(text: str) -> Any:
    """A ``tsquery`` literal."""
    return sa.cast(sa.literal(text, sa.Text), postgresql.TSQUERY)


def _pg_matched(query: terms.Query, context: float) -> Any:
    """The condition that an index row matches ``query`` (its context terms too when
    ``context``)."""
    t, found = _PG_TERMS, terms.tsquery(query)
    matched: Any = t.c.tsv.op("@@")(_tsq(found))
    return sa.or_(matched, t.c.ctx.op("@@")(_tsq(found))) if context > 0 else matched


def _pg_filters(f: catalog.Filters) -> list[Any]:
    """``f``'s conditions on an index row (the speaker) and on its message and file."""
    return [*catalog.spoken_by(_PG_TERMS, f), *catalog.scope(f)]


def _pg_joined(stmt: Any, where: list[Any]) -> Any:
    """``stmt`` over the index rows within ``where``: joined to their messages and files when
    it asks for more than the rows' own match."""
    if len(where) == 1:
        return stmt.where(*where)
    m, files = tables.messages.c, tables.raw_files.c
    return (
        stmt.join(tables.messages, m.id == _PG_TERMS.c.id)
        .join(tables.raw_files, files.file_id == m.file_id)
        .where(*where)
    )


#: a candidate's terms and its context's: positions by lexeme, and lengths in terms
Terms = tuple[dict[int, int], dict[int, dict[str, list[int]]], dict[int, dict[str, list[int]]]]


def _pg_terms(conn: sa.Connection, ids: list[int], lexemes: list[str]) -> Terms:
    """Of the messages ``ids``: each one's length in terms with its context's, and the
    positions of ``lexemes`` in its terms and in its context terms — one statement, each
    row's tsvectors read once."""
    lengths: dict[int, int] = {}
    own: dict[int, dict[str, list[int]]] = {}
    near: dict[int, dict[str, list[int]]] = {}
    for i, length, context_length, at, around in conn.execute(
        _PG_TERMS_OF, {"ids": ids, "lexemes": lexemes}
    ):
        lengths[i] = (length or 0) + (context_length or 0)
        # a tsvector's positions of a lexeme are in order already
        own[i] = {k: list(v) for k, v in (at or {}).items()}
        near[i] = {k: list(v) for k, v in (around or {}).items()}
    return lengths, own, near


def _pg_terms_with_parts(
    conn: sa.Connection, ids: list[int], lexemes: list[str], context: float
) -> Terms:
    """:func:`_pg_terms` where some messages' terms are in segments (catalog.PARTS): a long
    message's length from its last segment, its positions each past the terms before its
    segment."""
    own_lengths: dict[int, int] = {}
    context_lengths: dict[int, int] = {}
    # a long message has two rows: its own (empty terms, its context's) and its last segment's
    for i, length, context_length in conn.execute(_PG_LENGTHS_ALL, {"ids": ids}):
        own_lengths[i] = max(length or 0, own_lengths.get(i, 0))
        context_lengths[i] = max(context_length or 0, context_lengths.get(i, 0))
    lengths = {i: n + context_lengths[i] for i, n in own_lengths.items()}
    seen: dict[int, dict[str, set[int]]] = {i: {} for i in lengths}
    any_lexeme = " | ".join(terms.phrase_tsquery((x,)) for x in lexemes)
    params = {"ids": ids, "lexemes": lexemes, "any": any_lexeme}
    for i, lexeme, base, at_ in conn.execute(_PG_POSITIONS_ALL, params):
        seen[i].setdefault(lexeme, set()).update(base + a for a in at_)
    own = {i: {k: sorted(v) for k, v in ps.items()} for i, ps in seen.items()}
    near: dict[int, dict[str, list[int]]] = {i: {} for i in lengths}
    if context > 0:
        for i, lexeme, at_ in conn.execute(_PG_CONTEXT, {"ids": ids, "lexemes": lexemes}):
            near[i][lexeme] = list(at_)
    return lengths, own, near


#: the last position of a tsvector ``tsv`` (a lexeme's positions are sorted: its last is its
#: greatest, so no position is unnested)
_LAST = "(SELECT max(v.positions[array_upper(v.positions, 1)]) FROM unnest(tsv) AS v)"
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
#: a tsvector ``tsv`` unnested once: its last position and the positions of ``:lexemes`` in it
_UNNESTED = (
    "(SELECT max(u.positions[array_upper(u.positions, 1)]) AS last, "
    "json_object_agg(u.lexeme, u.positions) FILTER (WHERE u.lexeme = ANY(:lexemes)) AS at "
    "FROM unnest(tsv) AS u)"
)
#: :func:`_pg_terms`'s statement: lengths, and the lexemes' positions in both tsvectors, each
#: tsvector unnested once (unnesting each twice, for its length and for the positions, cost
#: a third more: ~9 ms of 300 candidates at 1,000,000 messages, docs/benchmarks.md)
_PG_TERMS_OF = sa.text(
    "SELECT t.id, o.last, c.last, o.at, c.at FROM message_terms t "
    f"CROSS JOIN LATERAL {_UNNESTED.replace('tsv', 't.tsv')} AS o "
    f"CROSS JOIN LATERAL {_UNNESTED.replace('tsv', 't.ctx')} AS c "
    "WHERE t.id = ANY(:ids)"
)
_PG_LENGTHS_ALL = sa.text(  # and of the long messages (their context is on their row)
    f"{_LENGTHS} UNION ALL SELECT s.id, {_LONG_LENGTH.format(id='s.id')}, 0 "
    "FROM (SELECT DISTINCT id FROM message_term_parts WHERE id = ANY(:ids)) AS s"
)
_POSITIONS = (
    "SELECT t.id, u.lexeme, 0, u.positions FROM message_terms t, unnest(t.tsv) AS u "
    "WHERE t.id = ANY(:ids) AND u.lexeme = ANY(:lexemes)"
)
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
    if estimate is not None and estimate > PG_COUNTED:
        return int(estimate)
    return int(conn.execute(sa.text("SELECT count(*) FROM message_terms")).scalar_one())


#: seconds an estimate of PostgreSQL's average message length is used (while the number of
#: messages stays within a tenth of what it was)
PG_LENGTH_SECONDS = 900.0
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


#: :func:`at`'s statement on PostgreSQL, before its conditions
_PG_AT = (
    "SELECT m.id, m.file_id, m.seq FROM unnest(CAST(:files AS varchar[]), CAST(:seqs AS "
    "integer[])) AS k(file_id, seq) JOIN messages m ON m.file_id = k.file_id AND m.seq = k.seq "
    "WHERE 1 = 1"
)


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
    if wanted and database.is_postgres(conn):
        # the keys as two arrays, unnested: one statement of two parameters (the VALUES list's
        # 400 cost ~3 ms a search to send and plan)
        stmt = sa.text(_PG_AT + where).bindparams(*_times(params))
        keyed = {"files": [f for f, _ in wanted], "seqs": [q for _, q in wanted]}
        found = [(int(i), f, int(s)) for i, f, s in conn.execute(stmt, keyed | params)]
    else:
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
