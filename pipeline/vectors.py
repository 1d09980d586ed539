"""Message vectors (docs/search.md, semantic search): made off the append path, exactly once per
message and model, and scored for a query within the caller's scope.

**Exactly once, like refinement** (docs/design.md §4). Each file has a watermark in
``embed_marks``: the last seq the current model embedded. A round takes the files whose
watermark is behind ``flushed_seq`` (or was made by another model: a model change starts the
file over, and the old vectors are ignored until replaced, never compared with the new),
*claims* each one — one conditional UPDATE bumps the epoch and leases the file, so two
workers never embed one stretch at once — reads the claimed messages from the file, embeds
them with no lock and no transaction held, and *commits* the vectors with the watermark's
advance in one transaction, fenced on the epoch and the old watermark: a claim that lost its
lease (a slow endpoint, a killed worker) or was replaced (a redaction, an erasure) commits
nothing. A failed embedder frees the claim; the messages wait for the next round. Appends and
flushes never wait for any of it.

**Context.** A message's vector is the average of its text's and its
:data:`pipeline.tables.VECTOR_CONTEXT` predecessors' in the file (each embedding claim reads
those predecessors again), made unit length: an answer ("We named her Biscuit") carries the
meaning of the question it follows. The query's vector is its own.

**Storage.** A vector is stored as int8 (the unit vector times 127: ``dim`` bytes, a quarter
of float32, cosine kept to about 1e-3), and the vectors of one commit — messages
``lo < seq <= hi`` of a file — as one block, one row: a scan then reads hundreds of vectors a
row (reading one row per vector cost 2–4 µs a row in SQLite alone, 0.2–0.4 s at 100,000
messages). Blocks are keyed by file and seq like source_refs, so a reindex keeps them. A
query is scored over the files within its scope: those whose vectors the process keeps in
memory (:mod:`pipeline.vector_cache`, checked against each file's watermark row in the same
snapshot) from there — only a shortlist of them when they are many (:class:`Shortlist`) —
the others by reading their blocks, :data:`SCAN_BLOCKS` at a time;
the best are kept as it goes, so memory stays bounded whatever the store's size, on SQLite
and PostgreSQL alike (docs/search.md has the measurements). A redaction drops the blocks that
hold the message's vector and those averaged with it, and moves the watermark back to the
first one's start; an erasure drops the file's vectors and watermark (both in
:mod:`pipeline.purge`, which loads no numpy: a process that redacts or erases without an
embedder never imports it).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import time
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import sqlalchemy as sa

from pipeline import (
    catalog,
    database,
    embeddings,
    errors,
    ranking,
    reader,
    tables,
    vector_cache,
)
from pipeline.tables import Status

log = logging.getLogger(__name__)

#: blocks read and scored at a time by :func:`nearest` (each at most embed_claim_messages
#: vectors of about 384 bytes)
SCAN_BLOCKS = 64
#: files whose vectors one statement of :func:`nearest` reads
FILES_AT_ONCE = 500
#: seconds after which an embedding round claims no more files (the next round goes on): a
#: round stays well inside a task's time limit, and one process's rounds take turns
ROUND_SECONDS = 60.0
#: files one embedding round claims at most
ROUND_FILES = 64

_V = tables.message_vectors.c
_E = tables.embed_marks.c
_F = tables.raw_files.c


@dataclasses.dataclass(frozen=True)
class Claim:
    """Messages ``lo < seq <= hi`` of a file leased to one embedding job, fenced by
    ``epoch``, for ``model``."""

    file_id: str
    lo: int
    hi: int
    epoch: int
    model: str


def encode(vectors: np.ndarray[Any, Any]) -> bytes:
    """Unit vectors (one a row) as a block stores them: int8, times 127, row after row."""
    return np.clip(np.rint(vectors * 127.0), -127, 127).astype(np.int8).tobytes()


def decode(data: bytes, dim: int) -> np.ndarray[Any, Any]:
    """A block's vectors back as float32 rows (each of length about 1)."""
    return np.frombuffer(data, dtype=np.int8).reshape(-1, dim).astype(np.float32) / 127.0


# the watermark: due files, claim, commit, release


def due_files(conn: sa.Connection, model: str, *, now: dt.datetime, limit: int) -> list[str]:
    """Files with flushed messages that ``model`` has not embedded, not leased."""
    behind = sa.or_(_E.file_id.is_(None), _E.model != model, _E.embedded_seq < _F.flushed_seq)
    free = sa.or_(_E.lease_until.is_(None), _E.lease_until < now)
    query = (
        sa.select(_F.file_id)
        .select_from(tables.raw_files.outerjoin(tables.embed_marks, _E.file_id == _F.file_id))
        .where(_F.flushed_seq > 0, _F.status != Status.ERROR, behind, free)
        .order_by(_F.file_id)
        .limit(limit)
    )
    return list(conn.execute(query).scalars())


def claim(
    db: database.Database, file_id: str, model: str, *, most: int, lease_seconds: float
) -> Claim | None:
    """Lease the next at most ``most`` un-embedded messages of a file, or None when it is
    leased to another job or has nothing to embed."""
    now = db.now()

    def work(conn: sa.Connection) -> Claim | None:
        flushed = conn.execute(
            sa.select(_F.flushed_seq).where(_F.file_id == file_id, _F.status != Status.ERROR)
        ).scalar()
        if not flushed:
            return None
        conn.execute(
            database.insert(conn, tables.embed_marks)
            .values(file_id=file_id, model=model, embedded_seq=0, epoch=0)
            .on_conflict_do_nothing(index_elements=["file_id"])
        )
        lo = sa.case((_E.model == model, _E.embedded_seq), else_=0)
        stmt = (
            sa.update(tables.embed_marks)
            .where(
                _E.file_id == file_id,
                sa.or_(_E.lease_until.is_(None), _E.lease_until < now),
                lo < flushed,
            )
            .values(
                embedded_seq=lo,
                model=model,
                epoch=_E.epoch + 1,
                lease_until=now + dt.timedelta(seconds=lease_seconds),
            )
            .returning(_E.embedded_seq, _E.epoch)
        )
        row = conn.execute(stmt).first()
        if row is None:
            return None
        return Claim(
            file_id, row.embedded_seq, min(flushed, row.embedded_seq + most), row.epoch, model
        )

    return db.commit(work, key=file_id)


def commit(db: database.Database, c: Claim, vectors: np.ndarray[Any, Any]) -> bool:
    """Store the claim's vectors (one a message, in seq order) as one block and advance the
    watermark to ``hi`` — only if the claim still holds; False (nothing stored) otherwise.
    Blocks the claim overlaps (an older model's, or those a redaction moved the watermark
    back over) go."""
    if len(vectors) != c.hi - c.lo or not len(vectors):
        raise errors.InternalError(f"{len(vectors)} vectors for {c.hi - c.lo} messages")
    block = {
        "file_id": c.file_id,
        "lo": c.lo,
        "hi": c.hi,
        "model": c.model,
        "dim": int(vectors.shape[1]),
        "vectors": encode(vectors),
    }
    now = db.now()

    def work(conn: sa.Connection) -> bool:
        advance = (
            sa.update(tables.embed_marks)
            .where(
                _E.file_id == c.file_id,
                _E.epoch == c.epoch,
                _E.embedded_seq == c.lo,
                _E.model == c.model,
            )
            .values(embedded_seq=c.hi, lease_until=None, embedded_at=now)
        )
        if not conn.execute(advance).rowcount:
            return False
        conn.execute(
            sa.delete(tables.message_vectors).where(
                _V.file_id == c.file_id, _V.lo < c.hi, _V.hi > c.lo
            )
        )
        conn.execute(sa.insert(tables.message_vectors), [block])
        return True

    return db.commit(work, key=c.file_id)


def release(db: database.Database, c: Claim) -> None:
    """Free a claim whose embedding failed, so the next round may take the file at once."""
    stmt = (
        sa.update(tables.embed_marks)
        .where(_E.file_id == c.file_id, _E.epoch == c.epoch)
        .values(lease_until=None)
    )
    db.commit(lambda conn: conn.execute(stmt), key=c.file_id)


def lag(conn: sa.Connection, model: str, *, agents: Collection[str] | None = None) -> int:
    """Flushed messages that ``model`` has not embedded yet (files in ``error`` left out), of
    ``agents`` only when given."""
    done = sa.case((_E.model == model, _E.embedded_seq), else_=0)
    query = (
        sa.select(sa.func.coalesce(sa.func.sum(_F.flushed_seq - sa.func.coalesce(done, 0)), 0))
        .select_from(tables.raw_files.outerjoin(tables.embed_marks, _E.file_id == _F.file_id))
        .where(_F.status != Status.ERROR)
    )
    if agents is not None:
        query = query.where(_F.agent_id.in_(list(agents)))
    return int(conn.execute(query).scalar() or 0)


def count(conn: sa.Connection, model: str) -> int:
    """Vectors stored for ``model``."""
    stored = sa.select(sa.func.sum(_V.hi - _V.lo)).where(_V.model == model)
    return int(conn.execute(stored).scalar() or 0)


def any_of(conn: sa.Connection, model: str) -> bool:
    """Whether any vector of ``model`` is stored (one index probe)."""
    return conn.execute(sa.select(_V.lo).where(_V.model == model).limit(1)).first() is not None


# a round: claim, read, embed, commit


def texts(messages: Sequence[Any], *, max_chars: int) -> list[str]:
    """What is embedded of each message: the start of its text."""
    return [m.content[:max_chars] for m in messages]


def read_texts(
    db: database.Database, data_dir: Path, file_id: str, lo: int, hi: int, *, max_chars: int
) -> list[str]:
    """The text embedded of messages ``lo < seq <= hi``: at most ``max_chars`` characters
    each, read from at most 4 bytes a character of its block (one read a message), so a
    claim of messages of 8 MiB each costs what its embedded text does. An archive, read as a
    stream, is read in one range; a file not fully cataloged (a store migrated without its
    data, before a reindex) is read whole."""
    row = reader.get_file(db, file_id)
    with db.reading() as conn:
        cataloged = catalog.rows(conn, file_id, after=lo, upto=hi)
    if len(cataloged) == hi - lo and row.status != Status.ARCHIVED:
        cap = max_chars * 4 + 1024  # and the heading
        return [reader.message_text(db, data_dir, row, m, cap=cap)[:max_chars] for m in cataloged]
    found = reader.between(db, data_dir, row, lo, hi)
    if len(found) != hi - lo:
        raise errors.FileDamaged(f"file {file_id} has {len(found)} of the messages {lo}<seq<={hi}")
    return texts(found, max_chars=max_chars)


def in_context(own: np.ndarray[Any, Any], skip: int) -> np.ndarray[Any, Any]:
    """Each message's vector averaged with its :data:`pipeline.tables.VECTOR_CONTEXT`
    predecessors' (as many as it has), made unit length again; the first ``skip`` rows
    (predecessors read only for this) left out."""
    mixed = own.copy()
    for back in range(1, tables.VECTOR_CONTEXT + 1):
        mixed[back:] += own[:-back]
    mixed /= np.linalg.norm(mixed, axis=1, keepdims=True)
    return mixed[skip:]


def embed_file(
    db: database.Database,
    data_dir: Path,
    embedder: embeddings.Embedder,
    c: Claim,
    *,
    max_chars: int,
) -> bool:
    """Embed a claim's messages and commit them; False when the claim no longer held. An
    embedder's failure frees the claim and is raised (:class:`errors.EmbedderUnavailable`)."""
    first = max(0, c.lo - tables.VECTOR_CONTEXT)
    try:
        found = read_texts(db, data_dir, c.file_id, first, c.hi, max_chars=max_chars)
        vectors = in_context(embedder.passages(found), c.lo - first)
    except errors.SgmeError:
        release(db, c)
        raise
    return commit(db, c, vectors)


def run_round(
    db: database.Database,
    data_dir: Path,
    embedder: embeddings.Embedder,
    *,
    claim_messages: int,
    lease_seconds: float,
    max_chars: int,
    files: int = ROUND_FILES,
    seconds: float = ROUND_SECONDS,
) -> int:
    """One embedding round: each due file's next claim embedded and committed, no new claim
    after ``seconds``; the messages embedded. An embedder that fails ends the round (raised);
    a damaged file is skipped."""
    with db.reading() as conn:
        due = due_files(conn, embedder.model, now=db.now(), limit=files)
    done = 0
    ends = time.monotonic() + seconds
    for file_id in due:
        if time.monotonic() > ends:
            break
        c = claim(db, file_id, embedder.model, most=claim_messages, lease_seconds=lease_seconds)
        if c is None:
            continue
        try:
            if embed_file(db, data_dir, embedder, c, max_chars=max_chars):
                done += c.hi - c.lo
        except (errors.FileDamaged, errors.NotFound) as exc:
            log.warning("file %s not embedded: %s", file_id, exc)
    return done


# scoring a query


def _scope(filters: catalog.Filters) -> list[sa.ColumnElement[bool]]:
    """The conditions on a file a search within ``filters`` may return messages of (none:
    every file)."""
    conditions = [] if filters.file_id is None else [_F.file_id == filters.file_id]
    if filters.agents is not None:
        conditions.append(_F.agent_id.in_(list(filters.agents)))
    if filters.agent_id is not None:
        conditions.append(_F.agent_id == filters.agent_id)
    if filters.session_key is not None:
        conditions.append(_F.session_key == filters.session_key)
    return conditions


def versions(conn: sa.Connection, filters: catalog.Filters) -> dict[str, vector_cache.Version]:
    """The files a search within ``filters`` may return messages of that have a watermark
    (only those have vectors: a block is committed under its file's ``embed_marks`` row and
    deleted with it), each with its version (:mod:`pipeline.vector_cache`), in one
    statement: what checks a cache at every search."""
    return _versions(conn, _scope(filters))


def _versions(
    conn: sa.Connection, scope: list[sa.ColumnElement[bool]]
) -> dict[str, vector_cache.Version]:
    """:func:`versions` of the files within ``scope``."""
    query = sa.select(_E.file_id, _E.model, _E.epoch, _E.embedded_seq)
    if scope:
        query = query.select_from(
            tables.embed_marks.join(tables.raw_files, _F.file_id == _E.file_id)
        ).where(*scope)
    return {f: (m, int(e), int(s)) for f, m, e, s in conn.execute(query)}


def _allowed(
    conn: sa.Connection, filters: catalog.Filters, files: list[str] | None
) -> dict[str, np.ndarray[Any, Any]] | None:
    """The seqs of the messages within ``filters``' own conditions (role, time) in ``files``,
    by file; None when it has none (every message of the files is in)."""
    if filters.role is None and filters.since is None and filters.until is None:
        return None
    m = tables.messages.c
    base = sa.select(m.file_id, m.seq)
    if filters.role is not None:
        base = base.where(m.role == filters.role)
    if filters.since is not None:
        base = base.where(m.ts >= filters.since)
    if filters.until is not None:
        base = base.where(m.ts <= filters.until)
    statements = [base]
    if files is not None:
        statements = [
            base.where(m.file_id.in_(files[i : i + FILES_AT_ONCE]))
            for i in range(0, len(files), FILES_AT_ONCE)
        ]
    found: dict[str, list[int]] = {}
    for stmt in statements:
        for f, q in conn.execute(stmt):
            found.setdefault(f, []).append(q)
    return {f: np.array(seqs, dtype=np.int32) for f, seqs in found.items()}


class Near(NamedTuple):
    """A message's closeness to a query (cosine), without its catalog id
    (:func:`identify`)."""

    file_id: str
    seq: int
    score: float


@dataclasses.dataclass(frozen=True)
class Shortlist:
    """How a search over many vectors scores fewer (``embed_exact_below``, ``embed_rerank``;
    docs/search.md): each vector kept in memory has a sign code — bit ``j``: whether its
    component ``j`` is above its model's center's (:meth:`vector_cache.Cache.center`: e5's
    vectors share one large direction, and with a shortlist of 4 % of 4,063 turns their raw
    signs kept 0.25 of the exact top 10, the centered ones 0.90) — and a scope of more than
    ``exact_below`` of them is ranked first by the Hamming distance of their codes to the
    query's (six 64-bit words a vector of 384 dimensions: 1.4 ms for 100,000 vectors, where
    their product takes 17), and only the ``rerank`` nearest so (at least: ties at the cut
    are all in) are scored exactly. Approximate: a message whose code is far from the
    query's is not scored. At or below ``exact_below``, every vector is."""

    exact_below: int
    rerank: int


class _Best:
    """The best ``limit`` scores of a search so far, with the file (an index into ``files``)
    and seq of each: scored pieces are gathered as arrays and cut back to the best ``limit``
    every :data:`GATHERED_ROWS` rows, so memory stays bounded and the selection is one numpy
    call, not one a file."""

    def __init__(
        self,
        query: np.ndarray[Any, Any],
        limit: int,
        allowed: dict[str, np.ndarray[Any, Any]] | None,
    ) -> None:
        # Integer dot products: exact for int8 vectors, and no BLAS call, whose threads on a
        # busy 2-core host made one product of 16,384 vectors take 20x longer (113 ms against
        # 5). The query keeps 15 bits a component (7 bits rounded the ranking: recall@10 fell
        # by 1-2 points); a dot product stays below 127 * 32767 (both are unit vectors).
        self.point = np.asarray(query, dtype=np.float32)
        self.q = np.rint(self.point * 32767.0).astype(np.int16)
        self.limit = limit
        self.allowed = allowed  #: the seqs a file may score (role, time), None: all
        self.files: list[str] = []
        self._index: dict[str, int] = {}
        self._parts: list[tuple[np.ndarray[Any, Any], ...]] = []
        self._rows = 0

    def score(
        self,
        matrix: np.ndarray[Any, Any],
        files: Sequence[str],
        counts: Sequence[int],
        seqs: np.ndarray[Any, Any],
    ) -> None:
        """Score ``matrix`` (int8 rows): its rows are ``counts[i]`` messages of ``files[i]``
        in turn, at ``seqs``."""
        which = np.repeat([self._file(f) for f in files], counts).astype(np.int32)
        if self.allowed is not None:
            ends = np.cumsum(counts)
            keep = np.concatenate(
                [
                    np.isin(seqs[end - n : end], self.allowed.get(f, _NONE))
                    for f, n, end in zip(files, counts, ends, strict=True)
                ]
            )
            scores, which, seqs = self._scores(matrix)[keep], which[keep], seqs[keep]
        else:
            scores = self._scores(matrix)
        self._add(scores, which, seqs)

    def shortlist(
        self,
        entries: Sequence[tuple[str, vector_cache.Entry]],
        most: int,
        center: np.ndarray[Any, Any],
    ) -> None:
        """Score of the rows of ``entries`` (file, entry with codes around ``center``) only
        the ``most`` whose sign codes differ from the query's in the fewest bits (ties at the
        cut all in), exactly."""
        code = vector_cache.signs(self.point[None, :] * 127.0 - center)[:, 0]  # int8 units
        codes = np.concatenate([e.codes for _, e in entries if e.codes is not None], axis=1)
        seqs = np.concatenate([e.seqs for _, e in entries])
        distances = np.bitwise_count(codes[0] ^ code[0]).astype(np.uint16)
        for w in range(1, len(codes)):
            distances += np.bitwise_count(codes[w] ^ code[w])
        bits = 64 * len(codes)
        sizes = np.array([len(e.seqs) for _, e in entries])
        ends = np.cumsum(sizes)
        if self.allowed is not None:
            allowed = self.allowed
            keep = np.concatenate([np.isin(e.seqs, allowed.get(f, _NONE)) for f, e in entries])
            distances[~keep] = bits + 1  # beyond any cut
        # the smallest distance that ``most`` rows are within: a histogram, not a sort
        within = np.cumsum(np.bincount(distances, minlength=bits + 2))
        cut = min(int(np.searchsorted(within, most)), bits)
        picked = np.flatnonzero(distances <= cut)
        if not len(picked):
            return
        owner = np.searchsorted(ends, picked, side="right")  # each picked row's entry
        local = picked - (ends - sizes)[owner]
        bounds = np.searchsorted(owner, np.arange(len(entries) + 1))  # each entry's picks
        matrix = np.concatenate(
            [e.matrix[local[bounds[i] : bounds[i + 1]]] for i, (_, e) in enumerate(entries)]
        )
        which = np.array([self._file(f) for f, _ in entries], dtype=np.int32)[owner]
        self._add(self._scores(matrix), which, seqs[picked])

    def _scores(self, matrix: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """The cosine of each int8 row of ``matrix`` with the query."""
        dots: np.ndarray[Any, Any] = np.einsum("ij,j->i", matrix, self.q, dtype=np.int32)
        return dots.astype(np.float32) / (127.0 * 32767.0)

    def _add(
        self, scores: np.ndarray[Any, Any], which: np.ndarray[Any, Any], seqs: np.ndarray[Any, Any]
    ) -> None:
        self._parts.append((scores, which, seqs))
        self._rows += len(scores)
        if self._rows > GATHERED_ROWS:
            self._parts = [self._cut()]
            self._rows = len(self._parts[0][0])

    def best(self) -> list[tuple[float, str, int]]:
        """``(score, file_id, seq)`` of the best ``limit``."""
        scores, which, seqs = self._cut()
        return [
            (float(s), self.files[int(w)], int(q))
            for s, w, q in zip(scores, which, seqs, strict=True)
        ]

    def _file(self, file_id: str) -> int:
        if file_id not in self._index:
            self._index[file_id] = len(self.files)
            self.files.append(file_id)
        return self._index[file_id]

    def _cut(self) -> tuple[np.ndarray[Any, Any], ...]:
        if not self._parts:
            return _NONE.astype(np.float32), _NONE, _NONE
        scores, which, seqs = (np.concatenate(c) for c in zip(*self._parts, strict=True))
        if len(scores) > self.limit:
            # ties at the cut in source_ref order, so the best do not depend on the order in
            # which the rows were scored (kept, read, shortlisted)
            last = -np.partition(-scores, self.limit - 1)[self.limit - 1]
            above, tied = np.flatnonzero(scores > last), np.flatnonzero(scores == last)
            rank = np.argsort(np.argsort(np.array(self.files)))  # each file's, by file_id
            tied = tied[np.lexsort((seqs[tied], rank[which[tied]]))]
            top = np.concatenate([above, tied[: self.limit - len(above)]])
            scores, which, seqs = scores[top], which[top], seqs[top]
        return scores, which, seqs


_NONE = np.zeros(0, dtype=np.int32)
#: scored rows :class:`_Best` gathers before it keeps only the best (12 bytes a row)
GATHERED_ROWS = 1 << 18


def _seqs(blocks: Sequence[tuple[int, int]]) -> np.ndarray[Any, Any]:
    """The seqs of blocks ``(lo, hi)`` in turn (``lo < seq <= hi`` each)."""
    if not blocks:
        return _NONE
    return np.concatenate([np.arange(lo + 1, hi + 1, dtype=np.int32) for lo, hi in blocks])


def nearest(
    conn: sa.Connection,
    model: str,
    query: np.ndarray[Any, Any],
    filters: catalog.Filters,
    *,
    limit: int,
    cache: vector_cache.Cache | None = None,
    shortlist: Shortlist | None = None,
) -> list[ranking.Scored]:
    """:func:`closest`, each hit with its catalog id (:func:`identify`: another speaker's
    turn left out)."""
    found = closest(conn, model, query, filters, limit=limit, cache=cache, shortlist=shortlist)
    return identify(conn, found, filters.speaker)


def identify(
    conn: sa.Connection, near: Sequence[Near], speaker: str | None = None
) -> list[ranking.Scored]:
    """``near`` in its order with the catalog's ids (what a hit is read by); a message not
    cataloged is left out, and so is one not ``speaker``'s when one is given (who said a
    turn is in the search index, not in the catalog :func:`closest` filters by)."""
    keys = [(h.file_id, h.seq) for h in near]
    said = catalog.Filters(speaker=speaker)
    ids = {(f, seq): i for i, f, seq in ranking.at(conn, keys, said)}
    return [
        ranking.Scored(ids[k], *k, h.score) for k, h in zip(keys, near, strict=True) if k in ids
    ]


def closest(
    conn: sa.Connection,
    model: str,
    query: np.ndarray[Any, Any],
    filters: catalog.Filters,
    *,
    limit: int,
    cache: vector_cache.Cache | None = None,
    shortlist: Shortlist | None = None,
) -> list[Near]:
    """The ``limit`` messages within ``filters`` whose ``model`` vectors are closest to
    ``query`` (cosine), best first, ties in source_ref order (without their catalog ids:
    a hybrid search looks up only those of the hits its fusion keeps).

    The files in scope are found first with their versions (the caller's agents, the
    session, the file); a file whose vectors ``cache`` holds at its version is scored from
    memory, the others' blocks are read through ``(model, file_id)``, :data:`FILES_AT_ONCE`
    files a statement and :data:`SCAN_BLOCKS` blocks at a time, scored, and offered to
    ``cache``; a message outside the filters' own conditions (role, time) scores nothing.
    With ``shortlist``, when the vectors kept in memory for the scope are more than its
    ``exact_below``, only its ``rerank`` of them nearest by sign codes are scored (approximate:
    :class:`Shortlist`); those read from the index are all scored (their read costs more
    than their product)."""
    dim = len(query)
    scope = _scope(filters)
    versions = _versions(conn, scope)
    files = sorted(versions)
    best = _Best(query, limit, _allowed(conn, filters, files if scope else None))
    search = 0 if cache is None else cache.search()
    if cache is not None and not scope:
        cache.keep_only(model, dim, set(files))
    missing, kept = [], []
    for file_id in files:
        key = (model, dim, file_id)
        entry = None if cache is None else cache.get(key, versions[file_id], search)
        if entry is None:
            missing.append(file_id)
        elif len(entry.seqs):
            kept.append((file_id, entry))
    coded = [(f, e) for f, e in kept if e.codes is not None]
    center = None if cache is None else cache.center(model, dim)
    if (
        shortlist is not None
        and center is not None
        and sum(len(e.seqs) for _, e in coded) > shortlist.exact_below
    ):
        best.shortlist(coded, shortlist.rerank, center)
        kept = [(f, e) for f, e in kept if e.codes is None]
    for file_id, entry in kept:
        best.score(entry.matrix, [file_id], [len(entry.seqs)], entry.seqs)
    if missing:
        every = not scope and len(missing) == len(files)
        _scan(conn, model, dim, missing, versions, best, cache, search, every=every)
    top = sorted(best.best(), key=lambda t: (-t[0], t[1], t[2]))
    return [Near(f, seq, score) for score, f, seq in top]


def _scan(
    conn: sa.Connection,
    model: str,
    dim: int,
    files: list[str],
    versions: dict[str, vector_cache.Version],
    best: _Best,
    cache: vector_cache.Cache | None,
    search: int,
    *,
    every: bool,
) -> None:
    """Score the blocks of ``files`` read from the index (``every``: all of them, one
    statement), :data:`SCAN_BLOCKS` at a time, in file and seq order; each file's vectors are
    gathered as they come, while they still fit ``cache``, and offered to it whole (at the
    version read before them: a block committed since makes the entry stale at the next
    search, never a stale entry current)."""
    base = (
        sa.select(_V.file_id, _V.lo, _V.hi, _V.vectors)
        .where(_V.model == model, _V.dim == dim)
        .order_by(_V.file_id, _V.lo)
    )
    if every:
        statements = [base]
    else:
        statements = [
            base.where(_V.file_id.in_(files[i : i + FILES_AT_ONCE]))
            for i in range(0, len(files), FILES_AT_ONCE)
        ]
    # the file whose blocks are being gathered for the cache (blocks come in file order), its
    # blocks and their bytes; None: not kept (no cache, or too large for it)
    current: str | None = None
    rows: list[Any] | None = None
    size = 0

    def offer(file_id: str, rows: list[Any]) -> None:
        if cache is None:
            return
        matrix = np.frombuffer(b"".join(r[3] for r in rows), dtype=np.int8).reshape(-1, dim)
        entry = vector_cache.Entry(versions[file_id], matrix, _seqs([(r[1], r[2]) for r in rows]))
        cache.put((model, dim, file_id), entry, search)

    unseen = set(files)
    for stmt in statements:
        result = conn.execution_options(yield_per=SCAN_BLOCKS).execute(stmt)
        for part in result.partitions():
            matrix = np.frombuffer(b"".join(r[3] for r in part), dtype=np.int8).reshape(-1, dim)
            counts = [r[2] - r[1] for r in part]
            if sum(counts) != len(matrix):
                raise errors.InternalError(f"blocks of {sum(counts)} messages hold {len(matrix)}")
            best.score(matrix, [r[0] for r in part], counts, _seqs([(r[1], r[2]) for r in part]))
            if cache is None:
                continue
            for r in part:
                if r[0] != current:
                    if current is not None and rows is not None:
                        offer(current, rows)
                    current, size = r[0], 0
                    rows = [] if r[0] in unseen else None
                    unseen.discard(r[0])
                if rows is not None:
                    rows.append(r)
                    size += len(r[3])
                    if size > cache.limit:
                        rows = None  # too large to keep: scored from the index at every search
    if current is not None and rows is not None:
        offer(current, rows)
    for file_id in unseen:  # no vector of this model: kept empty, not read again
        offer(file_id, [])
