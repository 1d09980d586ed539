"""The Hermes provider's recall without a server: which words of a user's message it searches
for, and how it ranks the hits of those searches (``integrations/hermes/sgme/recall.py``, which
runs in Hermes' environment on httpx and the standard library; ``tests/hermes/test_recall.py``
runs it inside the real hermes-agent against a real server)."""

from __future__ import annotations

import datetime as dt
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from pipeline import terms

PLUGIN = Path(__file__).resolve().parents[2] / "integrations" / "hermes" / "sgme"


def load_recall() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sgme_plugin_recall", PLUGIN / "recall.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


recall = load_recall()


def test_keywords_leave_out_stop_words_and_put_the_longest_first() -> None:
    assert recall.keywords("What kind of tea do I like?") == ["kind", "like", "tea"]
    assert recall.keywords("Do you remember what I told you?") == []
    assert recall.keywords("PostgreSQL, postgresql and Ｐｏｓｔｇｒｅｓ") == [
        "postgresql",
        "postgres",
    ]  # case-folded, NFKC, each once
    many = recall.keywords("alpha bravo charlie delta echo foxtrot golf hotel")
    assert len(many) == recall.MAX_KEYWORDS


def test_a_cjk_run_becomes_its_pairs_as_the_server_indexes_them() -> None:
    assert recall.keywords("我喜欢什么茶") == ["我喜", "喜欢", "欢什", "么茶"]  # 什么: a stop word
    assert recall.keywords("茶") == ["茶"]
    # every pair is a term the server's index holds for the same text
    assert set(recall.keywords("数据库迁移")) <= set(terms.terms("数据库迁移"))


def hit(ref: str) -> dict[str, Any]:
    return {"source_ref": ref, "snippet": ref}


def test_rank_puts_hits_with_every_word_first_then_the_most_specific() -> None:
    together = [hit("f:9")]
    alone = [
        [hit("f:1"), hit("f:2"), hit("f:3"), hit("f:9")],  # a common word: each weighs 1/4
        [hit("f:3")],  # a rare one: 1
        [hit("f:2"), hit("f:9")],  # 1/2
    ]
    ranked = recall.rank(together, alone)
    assert [(h["source_ref"], h["partial"]) for h in ranked] == [
        ("f:9", False),
        ("f:3", True),  # 1/4 + 1
        ("f:2", True),  # 1/4 + 1/2
        ("f:1", True),  # 1/4
    ]
    assert recall.rank([], []) == []


def test_timestamps_parse_as_l0_writes_them() -> None:
    assert recall.parse_ts("2026-08-03T11:18:06.5Z") == dt.datetime(
        2026, 8, 3, 11, 18, 6, 500000, tzinfo=dt.UTC
    )
    assert recall.parse_ts("yesterday") is None and recall.parse_ts(None) is None
