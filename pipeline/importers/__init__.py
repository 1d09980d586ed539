"""Importers: the transcripts people already have, turned into appends with deterministic keys.

One source per module — :mod:`.hermes` (a Hermes Agent ``state.db``), :mod:`.codex` (Codex CLI
rollouts), :mod:`.claude_code` (Claude Code transcripts), :mod:`.sharegpt` and :mod:`.openai`
(chat datasets) — each reading its source into :class:`.source.Session` records in the
tool-call convention (:mod:`.convention`); :func:`.runner.run` sends them through an injected
``ingest``.
"""

from __future__ import annotations

import importlib

from pipeline import errors
from pipeline.importers import source

#: ``sgme import`` source name → module
SOURCES = {
    "hermes": "pipeline.importers.hermes",
    "codex": "pipeline.importers.codex",
    "claude-code": "pipeline.importers.claude_code",
    "sharegpt": "pipeline.importers.sharegpt",
    "openai": "pipeline.importers.openai",
}


def reader(name: str) -> source.Reader:
    """The importer module for a source name (``hermes``, ``codex``, ``claude-code``, …)."""
    module = SOURCES.get(name)
    if module is None:
        raise errors.InvalidInput(f"unknown import source {name!r}; one of {', '.join(SOURCES)}")
    found: source.Reader = importlib.import_module(module)
    return found
