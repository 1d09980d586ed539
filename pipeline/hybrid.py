"""Hybrid search (docs/search.md, semantic search): the lexical ranking fused with the nearest
vectors, and the embedding rounds, through the :class:`Hybrid` a
:class:`~pipeline.service.Service` holds (``service.hybrid``).

**Fusion** is reciprocal rank fusion (:func:`fuse`): each message scores
``1 / (RRF_K + rank)`` in the lexical ranking (BM25 with its neighbours, as
:func:`search.converse` leaves it) plus ``SEMANTIC_WEIGHT / (RRF_K + rank)`` in the vector
ranking, ranks from 1, a ranking the message is not in adding nothing. Ranks, not scores: BM25
and cosine are on scales that move with the query, and the measurement in docs/search.md
chose it over a weighted sum of normalised scores. The vector ranking is taken over the same
filters and the caller's agents as the lexical one (:func:`vectors.closest`; over many
vectors, from a shortlist: :class:`vectors.Shortlist`), so a vector never surfaces a message
the caller may not read; only the fused hits a search keeps are looked up in the catalog
(:func:`identified`), where a speaker condition is checked too.

**Never in the way.** A query's embedding that fails (the endpoint down or slow past
``embed_timeout``) or a store with no vectors of the current model answers with the lexical
ranking, and the answer says so (:class:`HowRanked`'s ``fallback``); vectors that lag behind
the flush (``embedding_lag``) still rank the messages they cover.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import sys
import threading
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from pipeline import catalog, database, dates, errors, ranking, search, terms, vocabulary
from pipeline.settings import Settings

if TYPE_CHECKING:  # imported where they run: they load numpy (and httpx), which a store
    # without an embedder never needs (docs/design.md, "What a process loads")
    from pipeline import embeddings, vector_cache, vectors

log = logging.getLogger(__name__)
#: what fuses the nearest vectors into the lexical ranking (:func:`search.search`'s ``fuse``)
Near = Callable[[sa.Connection, list[ranking.Scored]], list[ranking.Scored]]

Mode = vocabulary.SearchMode
#: the rank offset of reciprocal rank fusion, and the vector ranking's weight against the
#: lexical one's 1: chosen on bench/bench_embed.py (docs/benchmarks.md), where they beat the
#: usual k=60 with equal weights on every class of question
RRF_K = 20
SEMANTIC_WEIGHT = 2.0


@dataclasses.dataclass(frozen=True)
class HowRanked:
    """How one search was ranked: the ``ranking`` member of ``GET /v1/search``'s answer."""

    mode: Mode  #: what ranked the hits
    model: str | None = None  #: the embedder's model, when one is configured
    embedding_lag: int | None = None  #: flushed messages without a vector of ``model`` yet
    fallback: str | None = None  #: why a hybrid search ranked lexically

    def to_json(self) -> dict[str, Any]:
        """As the API shows it."""
        return dataclasses.asdict(self)


def fuse(
    lexical: Sequence[vectors.Near | ranking.Scored],
    near: Sequence[vectors.Near | ranking.Scored],
    *,
    k: int = RRF_K,
    weight: float = SEMANTIC_WEIGHT,
) -> list[vectors.Near]:
    """Reciprocal rank fusion of two rankings: each message with its fused score, best
    first, ties in source_ref order."""
    scores: dict[tuple[str, int], float] = {}
    for share, ranked in ((1.0, lexical), (weight, near)):
        for rank, h in enumerate(ranked, start=1):
            key = (h.file_id, h.seq)
            scores[key] = scores.get(key, 0.0) + share / (k + rank)
    from pipeline import vectors

    fused = [vectors.Near(f, seq, s) for (f, seq), s in scores.items()]
    fused.sort(key=lambda h: (-h.score, h.file_id, h.seq))
    return fused


def identified(
    conn: sa.Connection,
    fused: list[vectors.Near],
    lexical: list[ranking.Scored],
    limit: int,
    speaker: str | None = None,
) -> list[ranking.Scored]:
    """The first ``limit`` of ``fused`` with their catalog ids: the lexical ranking's, and
    the others' looked up (:func:`vectors.identify`: 200 keys cost about 1 ms, ten 0.2); a
    message not cataloged, or not ``speaker``'s when one is given, is left out and the next
    one taken."""
    from pipeline import vectors

    ids = {(h.file_id, h.seq): h.id for h in lexical}
    found: list[ranking.Scored] = []
    start = 0
    while len(found) < limit and start < len(fused):
        part = fused[start : start + limit - len(found)]
        start += len(part)
        unknown = [h for h in part if (h.file_id, h.seq) not in ids]
        looked = vectors.identify(conn, unknown, speaker)
        ids |= {(h.file_id, h.seq): h.id for h in looked}
        found += [ranking.Scored(ids[h[:2]], *h) for h in part if h[:2] in ids]
    return found


def yield_cores(nice: int) -> None:
    """Make the calling thread at least ``nice`` nice (``embed_nice``), so that where an
    embedding round shares cores with appends, the appends' threads get them first. On
    Linux a thread has a niceness of its own (``setpriority`` on its native id); it is never
    lowered (raising a thread's priority takes a privilege). Elsewhere, or refused: as it is."""
    if nice <= 0 or not hasattr(os, "setpriority") or sys.platform != "linux":
        return
    me = threading.get_native_id()
    try:
        if os.getpriority(os.PRIO_PROCESS, me) < nice:
            os.setpriority(os.PRIO_PROCESS, me, nice)
    except OSError as exc:
        log.debug("embedding round left at its priority: %s", exc)


class Hybrid:
    """The embedding and hybrid search use cases over one runtime's settings and index
    handle."""

    def __init__(self, settings: Settings, db: database.Database) -> None:
        self.settings = settings
        self.db = db
        self._embedder: embeddings.Embedder | None = None
        self._made = False  #: whether :attr:`embedder` was made (it may be None)
        self._round_lock = threading.Lock()  #: one round at a time in this process

    @functools.cached_property
    def cache(self) -> vector_cache.Cache:
        """The vectors this process's searches keep in memory (``embed_cache_bytes``), made
        by the first hybrid search."""
        from pipeline import vector_cache

        return vector_cache.Cache(self.settings.embed.cache_bytes)

    @property
    def embedder(self) -> embeddings.Embedder | None:
        """The configured embedder (``search_embedder``), made at first use; with ``none``,
        nothing of the embedders is loaded."""
        if not self._made:
            self._embedder = None
            if self.settings.search.embedder != "none":
                from pipeline import embeddings

                self._embedder = embeddings.configured(self.settings)
            self._made = True
        return self._embedder

    @embedder.setter
    def embedder(self, embedder: embeddings.Embedder | None) -> None:
        """Use ``embedder`` instead of the configured one (tests, benchmarks)."""
        self._embedder, self._made = embedder, True

    def close(self) -> None:
        """Let go of what the embedder holds (the ``openai`` embedder's connection pool);
        one made later is made afresh."""
        embedder, self._embedder, self._made = self._embedder, None, False
        close = getattr(embedder, "close", None)
        if close is not None:
            close()

    def embed_round(self) -> int:
        """One embedding round (:func:`vectors.run_round`); 0 at once when no embedder is
        configured or a round is running in this process already. The messages embedded."""
        embedder = self.embedder
        if embedder is None:
            return 0
        if not self._round_lock.acquire(blocking=False):
            return 0
        from pipeline import vectors

        try:
            e = self.settings.embed
            yield_cores(e.nice)
            # a claim outlives its slowest embedding (every request at its timeout), so a slow
            # endpoint delays vectors without losing the work to another claim
            requests = -(-e.claim_messages // e.batch)
            lease = max(e.lease_seconds, requests * e.timeout * 1.5)
            return vectors.run_round(
                self.db,
                self.settings.data_dir,
                embedder,
                claim_messages=e.claim_messages,
                lease_seconds=lease,
                max_chars=e.max_chars,
            )
        finally:
            self._round_lock.release()

    def embedding_lag(self, *, agents: Collection[str] | None = None) -> int | None:
        """Flushed messages (of ``agents``, when given) the configured embedder has not
        embedded yet; None when no embedder is set."""
        embedder = self.embedder
        if embedder is None:
            return None
        from pipeline import vectors

        with self.db.reading() as conn:
            return vectors.lag(conn, embedder.model, agents=agents)

    def ranked(
        self,
        q: str,
        filters: catalog.Filters,
        *,
        limit: int,
        match: terms.Match = "any",
        mode: Mode | None = None,
        context: int = 0,
        window: dates.Window | None = None,
    ) -> tuple[list[search.Result], HowRanked]:
        """A search (docs/search.md; ``context`` and ``window`` as :func:`search.search`
        takes them), with how it was ranked. ``mode`` None: hybrid when an embedder is
        configured; a hybrid search without one ranks lexically and says why (a client cannot
        know the server's settings, and a search never fails for want of vectors)."""
        embedder = self.embedder
        how = search.Ranking.of(self.settings.search)
        near: Near | None = None
        if mode == "lexical" or embedder is None or match == "all":
            model = None if embedder is None else embedder.model
            unmet = mode == "hybrid" and embedder is None
            why = "no embedder is configured (setting search_embedder)" if unmet else None
            ranked = HowRanked("lexical", model=model, fallback=why)
        else:
            near, ranked = self._nearness(embedder, q, filters, how.candidates, limit)
        found = search.search(
            self.db,
            self.settings.data_dir,
            q,
            filters,
            limit=limit,
            match=match,
            how=how,
            context=context,
            window=window,
            fuse=near,
        )
        return found, ranked

    def _nearness(
        self,
        embedder: embeddings.Embedder,
        q: str,
        filters: catalog.Filters,
        candidates: int,
        limit: int,
    ) -> tuple[Near | None, HowRanked]:
        """What fuses the nearest vectors into a lexical ranking (its first ``limit``: what
        the search keeps), with how the search will have been ranked; none, and why, when
        there is nothing to fuse."""
        from pipeline import vectors

        with self.db.reading() as conn:
            behind = vectors.lag(conn, embedder.model, agents=filters.agents)
            stored = vectors.any_of(conn, embedder.model)
        if not stored:
            why = "no message has a vector of this model yet"
            return None, HowRanked("lexical", embedder.model, behind, why)
        try:
            point = embedder.query(q)
        except errors.EmbedderUnavailable as exc:
            log.warning("search ranked lexically: %s", exc)
            why = f"the embedder is unavailable: {exc.detail}"
            return None, HowRanked("lexical", embedder.model, behind, why)

        e = self.settings.embed
        shortlist = vectors.Shortlist(e.exact_below, e.rerank)

        def near(conn: sa.Connection, ranked: list[ranking.Scored]) -> list[ranking.Scored]:
            found = vectors.closest(
                conn,
                embedder.model,
                point,
                filters,
                limit=candidates,
                cache=self.cache,
                shortlist=shortlist,
            )
            return identified(conn, fuse(ranked, found), ranked, limit, filters.speaker)

        return near, HowRanked("hybrid", embedder.model, behind)
