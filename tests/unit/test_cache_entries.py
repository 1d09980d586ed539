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


def test_entries_get_sign_codes_around_their_models_center_once_it_has_one() -> None:
    cache = vector_cache.Cache(1 << 20, center_rows=3)
    first = np.array([[10, -10, 0], [20, 10, -5]], dtype=np.int8)
    seqs = np.arange(1, 3, dtype=np.int32)
    search = cache.search()
    assert cache.put(("m", 3, "a"), vector_cache.Entry(("m", 1, 2), first, seqs), search)
    kept = cache.get(("m", 3, "a"), ("m", 1, 2), search)
    assert kept is not None and kept.codes is None  # 2 vectors: no center yet
    assert cache.center("m", 3) is None and cache.used == 2 * (3 + 4)
    second = np.array([[0, 30, 5]], dtype=np.int8)
    entry = vector_cache.Entry(("m", 1, 1), second, np.ones(1, dtype=np.int32))
    assert cache.put(("m", 3, "b"), entry, search)
    center = cache.center("m", 3)
    assert center is not None and np.allclose(center, [10, 10, 0])  # the 3 vectors' mean
    kept = cache.get(("m", 3, "b"), ("m", 1, 1), search)
    assert kept is not None and kept.codes is not None
    # bit j of a row: its component j above the center's; zero bits pad to a 64-bit word
    word = np.array([0b0110_0000, 0, 0, 0, 0, 0, 0, 0], dtype=np.uint8).view(np.uint64)
    assert kept.codes.shape == (1, 1) and kept.codes[0, 0] == word[0]  # (0, 30, 5) > (10, 10, 0)
    assert cache.used == 2 * (3 + 4) + 3 + 4 + 8
    assert cache.center("other", 3) is None  # a center is a model's own
