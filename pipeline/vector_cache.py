"""The vectors of files kept in this process's memory, decoded, so a hybrid search scores
in-memory matrices instead of reading every block out of the index (docs/search.md, semantic
search; :func:`vectors.nearest` uses it).

**Why.** Reading the blocks was most of a scan: at 100,000 messages on SQLite 48 ms of
reads and decoding for 17 ms of products (bench/bench_embed.py ``--scan``); on PostgreSQL
more. The vectors of a file change only when an embedding commits, a redaction drops them
or an erasure deletes them, so they can be kept between searches — if every search can
tell, cheaply, that what is kept is still what the index holds.

**Never stale.** An entry is kept for one file and one model (and dimension) with the
*version* of the file it was read at: its ``embed_marks`` row's ``(model, epoch,
embedded_seq)``. Every change to a file's blocks changes that row in the same transaction
(:mod:`pipeline.vectors` is the only writer of both tables): a commit advances
``embedded_seq`` under a fenced epoch (one commit per epoch, so the pair never repeats), a
redaction bumps the epoch, a claim of another model writes the model, an erasure deletes the
row. A search reads the versions of the files in its scope in one statement, in the same
snapshot it scores in, and takes an entry only if its version is the one read; so another
process's commit is seen at the next search, and a file whose row is gone is never scored.
A claim also bumps the epoch without touching blocks: the file is read again once, which
costs one file's blocks.

**Sign codes.** Once a model has a *center* — the mean of the first ``center_rows``
vectors the cache is given of it, fixed for the process (a mean of 256 turns ranks as well
as one of 4,063) — each entry is kept with its rows' sign codes around it, which a search
over many vectors ranks first (:class:`vectors.Shortlist`); an entry kept before the center
has none, and is scored whole. The codes are made from the entry's own matrix, so they are
exactly as current as its vectors.

**Bounded.** The entries hold at most ``embed_cache_bytes`` bytes (the vectors, int8,
their seqs and their sign codes); a file that does not fit is scored from the index as
before, and an entry is evicted (least recently used first) only for a file of another
search, never for one the current search has used: a scope larger than the bound keeps a
stable part in memory and reads the rest, instead of evicting what the next search needs.
``0`` keeps nothing.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from typing import Any

import numpy as np

#: vectors of a model whose mean is the center of its sign codes (a sample: the mean of 256
#: turns ranks the shortlist as well as the mean of 4,063, docs/search.md)
CENTER_ROWS = 256
#: what an entry is kept for: (model, dim, file_id)
Key = tuple[str, int, str]
#: a file's version (its embed_marks ``model``, ``epoch``, ``embedded_seq``)
Version = tuple[str, int, int]


def signs(rows: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """The sign codes of ``rows`` (2-d): bit ``j`` of a row's code is whether its component
    ``j`` is above 0, packed into 64-bit words (zero bits pad the last), word by word —
    ``codes[w]`` is word ``w`` of every row — so a Hamming distance is a few whole-array
    operations (:class:`vectors.Shortlist`)."""
    packed = np.packbits(rows > 0, axis=1)
    padded = np.zeros((len(rows), -(-packed.shape[1] // 8) * 8), dtype=np.uint8)
    padded[:, : packed.shape[1]] = packed
    return np.ascontiguousarray(padded.view(np.uint64).T)


@dataclasses.dataclass(frozen=True)
class Entry:
    """One file's vectors of one model: ``matrix`` (int8, one row a message, as the blocks
    store them) and the seq of each row, read at ``version``; ``codes``: the sign codes of
    the rows less their model's center (:meth:`Cache.center`), None until it has one."""

    version: Version
    matrix: np.ndarray[Any, Any]
    seqs: np.ndarray[Any, Any]
    codes: np.ndarray[Any, Any] | None = None

    @property
    def nbytes(self) -> int:
        """What the entry costs of the bound."""
        codes = 0 if self.codes is None else self.codes.nbytes
        return int(self.matrix.nbytes + self.seqs.nbytes + codes)


class Cache:
    """Entries of decoded vectors, at most ``limit`` bytes of them; safe to share between
    threads (the entries themselves are never written after they are made)."""

    def __init__(self, limit: int, *, center_rows: int = CENTER_ROWS) -> None:
        self.limit = limit
        self.center_rows = center_rows  #: vectors of a model whose mean is its center
        self.used = 0  #: bytes the entries hold
        self.hits = 0  #: files scored from an entry
        self.misses = 0  #: files read from the index (absent, stale, or too large to keep)
        self._entries: collections.OrderedDict[Key, tuple[Entry, int]] = (
            collections.OrderedDict()
        )  # least recently used first; with the search that last used each
        self._lock = threading.Lock()
        self._searches = 0
        #: per (model, dim): the mean of the first ``center_rows`` vectors put, int8 units
        self._centers: dict[tuple[str, int], np.ndarray[Any, Any]] = {}
        self._sums: dict[tuple[str, int], tuple[np.ndarray[Any, Any], int]] = {}

    def search(self) -> int:
        """A number for one search, that :meth:`get` and :meth:`put` are given: the entries
        it used are not evicted for it."""
        with self._lock:
            self._searches += 1
            return self._searches

    def get(self, key: Key, version: Version, search: int) -> Entry | None:
        """The entry for ``key`` if it was read at ``version``; a stale one is dropped."""
        with self._lock:
            kept = self._entries.get(key)
            if kept is None or kept[0].version != version:
                if kept is not None:
                    self._drop(key)
                self.misses += 1
                return None
            self._entries[key] = (kept[0], search)
            self._entries.move_to_end(key)
            self.hits += 1
            return kept[0]

    def put(self, key: Key, entry: Entry, search: int) -> bool:
        """Keep ``entry`` if it fits, evicting the least recently used entries that search
        ``search`` has not used; False when it was not kept. It is kept with its sign codes
        once its model has a center."""
        center = self._centered(key, entry.matrix) if self.limit else None
        if center is not None:
            entry = dataclasses.replace(entry, codes=signs(entry.matrix - center))
        size = entry.nbytes
        with self._lock:
            if key in self._entries:
                self._drop(key)
            if not self.limit or size > self.limit:
                return False
            free = self.limit - self.used
            gone = []
            if free < size:
                for k, (kept, used) in self._entries.items():  # least recently used first
                    if used != search:
                        free += kept.nbytes
                        gone.append(k)
                        if free >= size:
                            break
            if free < size:
                return False
            for k in gone:
                self._drop(k)
            self._entries[key] = (entry, search)
            self.used += size
            return True

    def center(self, model: str, dim: int) -> np.ndarray[Any, Any] | None:
        """What the sign codes of ``model``'s vectors are taken around (int8 units), None
        before it has one."""
        with self._lock:
            return self._centers.get((model, dim))

    def _centered(self, key: Key, matrix: np.ndarray[Any, Any]) -> np.ndarray[Any, Any] | None:
        """The center of ``key``'s model, made once the vectors put (``matrix`` counted) are
        ``center_rows`` or more."""
        kind = key[:2]
        with self._lock:
            if kind in self._centers:
                return self._centers[kind]
            total, rows = self._sums.get(kind, (np.zeros(key[1]), 0))
            total, rows = total + matrix.sum(axis=0, dtype=np.float64), rows + len(matrix)
            if rows < self.center_rows:
                self._sums[kind] = (total, rows)
                return None
            self._sums.pop(kind, None)
            center: np.ndarray[Any, Any] = (total / rows).astype(np.float32)
            self._centers[kind] = center
            return center

    def keep_only(self, model: str, dim: int, files: set[str]) -> None:
        """Drop the entries of ``model`` and ``dim`` for files not in ``files`` (the files
        that have vectors: an erased file's vectors leave memory)."""
        with self._lock:
            for key in [k for k in self._entries if k[:2] == (model, dim) and k[2] not in files]:
                self._drop(key)

    def forget(self, file_id: str) -> None:
        """Drop every entry of a file (erased in this process)."""
        with self._lock:
            for key in [k for k in self._entries if k[2] == file_id]:
                self._drop(key)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def _drop(self, key: Key) -> None:
        entry, _ = self._entries.pop(key)
        self.used -= entry.nbytes
