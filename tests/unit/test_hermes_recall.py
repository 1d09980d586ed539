"""The Hermes provider's recall without a server: one ranked search of the user's message
(``integrations/hermes/sgme/recall.py``, which
runs in Hermes' environment on httpx and the standard library; ``tests/hermes/test_recall.py``
runs it inside the real hermes-agent against a real server)."""

from __future__ import annotations

import datetime as dt
import importlib.util
import sys
import time
from pathlib import Path
from types import ModuleType

import httpx

PLUGIN = Path(__file__).resolve().parents[2] / "integrations" / "hermes" / "sgme"


def load_recall() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sgme_plugin_recall", PLUGIN / "recall.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


recall = load_recall()


def test_recall_is_one_ranked_search_of_the_message_as_it_is() -> None:
    asked: list[httpx.Request] = []
    hits = [
        {"source_ref": f"f:{i}", "session_key": "s", "ts": "2026-08-03T11:18:06Z"} for i in range(9)
    ]

    def answer(request: httpx.Request) -> httpx.Response:
        asked.append(request)
        return httpx.Response(200, json={"hits": hits})

    reader = recall.Reader({"agent_id": "hermes", "token": "t", "url": "http://sgme"})
    reader._client = httpx.Client(base_url="http://sgme", transport=httpx.MockTransport(answer))
    question = 'What kind of "green tea" do I like? 我喜欢什么茶'
    found = reader.recall(
        question, limit=3, deadline=time.monotonic() + 5, keep=lambda h: h["source_ref"] != "f:0"
    )
    assert [h["source_ref"] for h in found] == ["f:1", "f:2", "f:3"]
    [request] = asked  # one request, not one per keyword
    assert dict(request.url.params) == {
        "q": question,
        "agent_id": "hermes",
        "limit": str(3 * recall.OVERFETCH),
        "match": "any",
    }
    assert reader.recall("   ", limit=3, deadline=time.monotonic() + 5) == []
    assert len(asked) == 1


def test_timestamps_parse_as_l0_writes_them() -> None:
    assert recall.parse_ts("2026-08-03T11:18:06.5Z") == dt.datetime(
        2026, 8, 3, 11, 18, 6, 500000, tzinfo=dt.UTC
    )
    assert recall.parse_ts("yesterday") is None and recall.parse_ts(None) is None
