"""Full-text search over every raw message (docs/design.md §6): a query's hits from the catalog's
search index, each with a snippet cut from the file through the message's offsets.

The text never leaves the files: the index holds terms (:mod:`pipeline.terms`) of all of a
message's text, and a hit's snippet is read from the message's block (all of it: a word may be
anywhere in it).

Under ``match="any"`` (the default) the hits are ranked (docs/search.md): the
``search_candidates`` best messages by BM25 (:func:`ranking.rank`), then each one's score raised
by its neighbours' in the same file (:func:`converse`), which lifts the answer that follows
the turn that shares the question's words.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

from pipeline import (
    catalog,
    database,
    dates,
    document,
    errors,
    index,
    paging,
    ranking,
    reader,
    refs,
    tables,
    terms,
)
from pipeline.settings import Search

DEFAULT_LIMIT = paging.SEARCH_DEFAULT_LIMIT
MAX_LIMIT = paging.SEARCH_MAX_LIMIT
#: how the neighbours count (docs/search.md has each option's recall): "none", "candidates"
#: (a ranked message's score gains its ranked neighbours'), "next" (also the turn after each
#: ranked message becomes a candidate, so an answer that shares no word is found)
Neighbours = Literal["none", "candidates", "next"]
NEIGHBOURS: Neighbours = "next"
PREVIOUS_WEIGHT = 0.5  #: share of the turn before's score a message gains
NEXT_WEIGHT = 0.2  #: share of the turn after's score a message gains
MAX_CONTEXT = 3  #: turns on each side a hit may be returned with (``context``)
#: reciprocal rank fusion's constant (:func:`fused`): the usual 60, so the first few ranks of
#: each ranking weigh about alike
RRF_K = 60


@dataclasses.dataclass(frozen=True)
class Ranking:
    """What a ranked search may do: the ``search_*`` settings (docs/search.md), their
    defaults those of :class:`pipeline.settings.Search`, but no time bound (a library call's
    search is not a request's)."""

    timeout: float | None = None  #: seconds in the database at most (None: no bound)
    candidates: int = Search.candidates  #: BM25 hits the neighbours' scores may reorder
    #: messages a phrase may be in and still find candidates (a more common one counts only
    #: when the rarer ones find fewer messages than asked for)
    common_matches: int = Search.common_matches
    #: the newest matches of a query's common words that are scored, when they are
    common_scored: int = Search.common_scored
    #: weight of a word found in the turns before a message (its context terms) against 1
    #: in the message itself
    context_weight: float = Search.context_weight
    #: characters of each turn a hit is returned with (``context``), at most
    context_chars: int = Search.context_chars
    #: ranked, the question's first words each searched alone too (this many at most), and
    #: every ranking fused with the whole question's (:func:`fused`); 0: not (docs/search.md
    #: has what it measured)
    subqueries: int = 0

    @classmethod
    def of(cls, settings: Search) -> Ranking:
        """What the ``search_*`` settings allow a search (``search_embedder`` is
        :mod:`pipeline.hybrid`'s)."""
        return cls(
            timeout=settings.timeout,
            candidates=settings.candidates,
            common_matches=settings.common_matches,
            common_scored=settings.common_scored,
            context_weight=settings.context_weight,
            context_chars=settings.context_chars,
        )


@dataclasses.dataclass(frozen=True)
class Turn:
    """A turn around a hit, as ``context`` returns it: its text cut to ``context_chars``."""

    source_ref: str
    seq: int
    ts: str
    role: str
    text: str


@dataclasses.dataclass(frozen=True)
class Result:
    """One hit, as ``GET /v1/search`` and ``sgme search`` show it."""

    source_ref: str
    file_id: str
    seq: int
    ts: str
    role: str
    agent_id: str
    session_key: str
    snippet: str
    score: float
    #: the turns just before and after it in its session (``context``), oldest first; a turn
    #: that is a hit, or around a better one, is not repeated
    before: tuple[Turn, ...] = ()
    after: tuple[Turn, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The hit as the API shows it."""
        return dataclasses.asdict(self)


def search(
    db: database.Database,
    data_dir: Path,
    q: str,
    filters: catalog.Filters = catalog.Filters(),  # noqa: B008 - a frozen value
    *,
    limit: int = DEFAULT_LIMIT,
    match: terms.Match = "any",
    neighbours: Neighbours = NEIGHBOURS,
    how: Ranking = Ranking(),
    context: int = 0,
    window: dates.Window | None = None,
    fuse: Callable[[Any, list[ranking.Scored]], list[ranking.Scored]] | None = None,
) -> list[Result]:
    """The best ``limit`` messages for query ``q`` within ``filters``, best first: ranked by
    relevance (``match="any"``, as ``how`` says), or those holding every word and phrase
    (``"all"``); each with the ``context`` turns before and after it in its session (any
    role, each cut to ``how.context_chars``). Ranked, a ``window`` the question names
    (:func:`dates.window`) is searched too, without the words that named it, and the two
    rankings fused (:func:`fused`): scores are then the fusion's. ``fuse``: what re-ranks
    the ranked candidates last, in the same snapshot (the semantic leg,
    :mod:`pipeline.hybrid`)."""
    if not 1 <= limit <= MAX_LIMIT:
        raise errors.InvalidInput(f"limit must be 1..{MAX_LIMIT}, got {limit}")
    if not 0 <= context <= MAX_CONTEXT:
        raise errors.InvalidInput(f"context must be 0..{MAX_CONTEXT}, got {context}")
    query = terms.parse_query(q, match=match)
    with db.reading() as conn:
        if match == "all":
            hits = catalog.find(conn, query, filters, limit=limit)
        else:
            best = _ranked(conn, query, filters, limit, neighbours, how)
            if how.subqueries and len(query.phrases) > 1:
                alone = [
                    _ranked(conn, dataclasses.replace(query, phrases=(p,)), filters, limit,
                            neighbours, how)
                    for p in query.phrases[: how.subqueries]
                ]  # fmt: skip
                best = fused([best, *alone])
            if window is not None:
                best = fused([best, _dated(conn, query, window, filters, limit, neighbours, how)])
            if fuse is not None:
                best = fuse(conn, best)
            hits = ranking.hits_by_id(conn, [(h.id, h.score) for h in best[:limit]])
        files = {
            row.file_id: row
            for row in (index.get_file(conn, f) for f in {h.message.file_id for h in hits})
            if row is not None
        }
        around = {
            (h.message.file_id, h.message.seq): catalog.rows(
                conn,
                h.message.file_id,
                after=max(0, h.message.seq - context - 1),
                upto=h.message.seq + context,
            )
            for h in hits
            if context
        }
    found = [
        Result(
            source_ref=refs.format(h.message.file_id, h.message.seq),
            file_id=h.message.file_id,
            seq=h.message.seq,
            ts=document.format_ts(h.message.ts),
            role=h.message.role,
            agent_id=h.agent_id,
            session_key=h.session_key,
            snippet=_snippet(db, data_dir, files[h.message.file_id], h.message, query),
            score=round(h.score, 6),
        )
        for h in hits
        if h.message.file_id in files
    ]
    if not context:
        return found
    return _with_turns(db, data_dir, found, files, around, how.context_chars)


def _with_turns(
    db: database.Database,
    data_dir: Path,
    found: list[Result],
    files: dict[str, tables.FileRow],
    around: dict[tuple[str, int], list[tables.MessageRow]],
    chars: int,
) -> list[Result]:
    """``found`` with the turns ``around`` each hit: best hit first, each turn shown once (a
    hit, or a turn already shown around a better hit, ends a side)."""
    shown = {(r.file_id, r.seq) for r in found}
    made = []
    for r in found:
        rows = {m.seq: m for m in around.get((r.file_id, r.seq), [])}
        sides: list[list[Turn]] = [[], []]
        for side, step in ((0, -1), (1, 1)):
            seq = r.seq + step
            while seq in rows and (r.file_id, seq) not in shown:
                shown.add((r.file_id, seq))
                sides[side].append(_turn(db, data_dir, files[r.file_id], rows[seq], chars))
                seq += step
        made.append(dataclasses.replace(r, before=tuple(reversed(sides[0])), after=tuple(sides[1])))
    return made


def _turn(
    db: database.Database, data_dir: Path, file: tables.FileRow, m: tables.MessageRow, chars: int
) -> Turn:
    """A turn around a hit; its text cut to ``chars`` (empty when it cannot be read: fsck will
    name the file)."""
    try:
        text = reader.message_text(db, data_dir, file, m, cap=chars * 4 + 1024)
    except errors.SgmeError:
        text = ""
    if len(text) > chars:
        text = text[: chars - 1] + "…"
    return Turn(refs.format(m.file_id, m.seq), m.seq, document.format_ts(m.ts), m.role, text)


def _ranked(
    conn: Any,
    query: terms.Query,
    filters: catalog.Filters,
    limit: int,
    neighbours: Neighbours,
    how: Ranking,
) -> list[ranking.Scored]:
    """The ranked search's messages for ``query``, best first: BM25's candidates re-ranked
    with their neighbours (:func:`converse`)."""
    ranked = ranking.rank(
        conn,
        query,
        filters,
        limit=max(limit, how.candidates),
        common=how.common_matches,
        scored=how.common_scored,
        enough=limit,
        timeout=how.timeout,
        context=how.context_weight,
    )
    return converse(conn, ranked, filters, neighbours)


def _dated(
    conn: Any,
    query: terms.Query,
    window: dates.Window,
    filters: catalog.Filters,
    limit: int,
    neighbours: Neighbours,
    how: Ranking,
) -> list[ranking.Scored]:
    """:func:`_ranked` within ``window`` (and ``filters``' own times), for the question
    without the words that named it (all of it when nothing else is left to search for)."""
    since = max(window.since, filters.since) if filters.since else window.since
    until = min(window.until, filters.until) if filters.until else window.until
    if since > until:
        return []
    try:
        rest = terms.parse_query(window.rest, match="any")
    except errors.InvalidInput:
        rest = query
    narrowed = dataclasses.replace(filters, since=since, until=until)
    return _ranked(conn, rest, narrowed, limit, neighbours, how)


def fused(rankings: Sequence[Sequence[ranking.Scored]]) -> list[ranking.Scored]:
    """Rankings fused by their ranks (reciprocal rank fusion): a message's score is the sum
    over the rankings that hold it of ``1 / (RRF_K + rank)``, so one ranked high in either
    comes high, and one ranked high in both highest. Best first, ties in source_ref order."""
    score: dict[tuple[str, int], float] = {}
    first: dict[tuple[str, int], ranking.Scored] = {}
    for found in rankings:
        for rank, h in enumerate(found, 1):
            key = (h.file_id, h.seq)
            score[key] = score.get(key, 0.0) + 1.0 / (RRF_K + rank)
            first.setdefault(key, h)
    made = [first[key]._replace(score=value) for key, value in score.items()]
    made.sort(key=lambda h: (-h.score, h.file_id, h.seq))
    return made


def converse(
    conn: Any, ranked: list[ranking.Scored], filters: catalog.Filters, neighbours: Neighbours
) -> list[ranking.Scored]:
    """``ranked`` re-ranked with each message's neighbours in its file: its score plus
    :data:`PREVIOUS_WEIGHT` of the turn before's and :data:`NEXT_WEIGHT` of the turn after's
    (both their BM25 scores); under ``"next"`` the turn after each ranked message joins them
    (score 0 of its own). Best first, ties in source_ref order."""
    if neighbours == "none" or not ranked:
        return ranked
    by_key = {(h.file_id, h.seq): h for h in ranked}
    if neighbours == "next":
        after = {(f, s + 1) for f, s in by_key} - set(by_key)
        for i, f, s in ranking.at(conn, after, filters):
            by_key[(f, s)] = ranking.Scored(i, f, s, 0.0)
    own = {key: h.score for key, h in by_key.items()}
    boosted = [
        h._replace(
            score=own[(f, s)]
            + PREVIOUS_WEIGHT * own.get((f, s - 1), 0.0)
            + NEXT_WEIGHT * own.get((f, s + 1), 0.0),
        )
        for (f, s), h in by_key.items()
    ]
    boosted.sort(key=lambda h: (-h.score, h.file_id, h.seq))
    return boosted


def _snippet(
    db: database.Database,
    data_dir: Path,
    file: tables.FileRow,
    message: tables.MessageRow,
    query: terms.Query,
) -> str:
    """The snippet of one hit; a file that cannot be read gives an empty one (the hit stays:
    the index is right about what was said, and fsck will name the file)."""
    try:
        text = reader.message_text(db, data_dir, file, message, cap=message.byte_length)
    except errors.SgmeError:
        return ""
    return terms.snippet(text, query)


def hits_of(results: Sequence[Result], window: dates.Window | None = None) -> dict[str, Any]:
    """The API's answer: the hits, and the window a date in the question named (or None)."""
    return {"hits": [r.to_json() for r in results], "window": window_json(window)}


def window_json(window: dates.Window | None) -> dict[str, str] | None:
    """A window as the API shows it: its ends (RFC 3339, UTC) and the words that named it."""
    if window is None:
        return None
    return {
        "since": document.format_ts(window.since),
        "until": document.format_ts(window.until),
        "matched": window.matched,
    }
