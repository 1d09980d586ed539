"""The vector cache's own bookkeeping (pipeline.vector_cache): entries taken only at the
version they were read at, the byte bound, and eviction of what the current search did not
use. Searches through it, on both databases: tests/integration/test_vector_cache.py."""

from __future__ import annotations

import numpy as np

from pipeline import vector_cache


def test_the_cache_keeps_entries_by_version_within_its_bound() -> None:
    def entry(version: int, rows: int) -> vector_cache.Entry:
        matrix = np.zeros((rows, 4), dtype=np.int8)
        return vector_cache.Entry(("m", version, rows), matrix, np.arange(rows, dtype=np.int32))

    cache = vector_cache.Cache(8 * 3)  # three rows of 4 + 4 bytes
    first = cache.search()
    assert cache.put(("m", 4, "a"), entry(1, 2), first)
    assert cache.get(("m", 4, "a"), ("m", 1, 2), first) is not None
    assert cache.get(("m", 4, "a"), ("m", 2, 2), first) is None  # stale: dropped
    assert len(cache) == 0 and cache.used == 0
    assert cache.put(("m", 4, "a"), entry(2, 2), first)
    assert not cache.put(("m", 4, "b"), entry(1, 2), first)  # only by evicting this search's
    second = cache.search()
    assert cache.put(("m", 4, "b"), entry(1, 2), second)  # the older search's entry goes
    assert cache.get(("m", 4, "a"), ("m", 2, 2), second) is None
    assert not cache.put(("m", 4, "c"), entry(1, 4), cache.search())  # larger than the bound
    assert cache.used == 16 and len(cache) == 1
    cache.forget("b")
    assert len(cache) == 0 and cache.used == 0
