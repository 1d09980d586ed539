"""Full-text search over every raw message (docs/design.md §6): a query's hits from the catalog's
search index, each with a snippet cut from the file through the message's offsets.

The text never leaves the files: the index holds terms (:mod:`pipeline.terms`), and a hit's
snippet is read from the message's block (its first :data:`SNIPPET_READ` bytes, where
every indexed term lies).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipeline import catalog, database, document, errors, index, reader, refs, tables, terms

DEFAULT_LIMIT = 20
MAX_LIMIT = 100
#: bytes of a message's block read for its snippet: the indexed characters (at most 4 bytes
#: each) and its heading
SNIPPET_READ = terms.MAX_INDEXED_CHARS * 4 + 1024


@dataclasses.dataclass(frozen=True)
class Result:
    """One hit, as ``GET /v1/search`` and ``sgme search`` show it."""

    source_ref: str
    file_id: str
    seq: int
    ts: str
    role: str
    agent_id: str
    session_key: str
    snippet: str
    score: float

    def to_json(self) -> dict[str, Any]:
        """The hit as the API shows it."""
        return dataclasses.asdict(self)


def search(
    db: database.Database,
    data_dir: Path,
    q: str,
    filters: catalog.Filters = catalog.Filters(),  # noqa: B008 - a frozen value
    *,
    limit: int = DEFAULT_LIMIT,
) -> list[Result]:
    """The best ``limit`` messages for query ``q`` within ``filters``, best first."""
    if not 1 <= limit <= MAX_LIMIT:
        raise errors.InvalidInput(f"limit must be 1..{MAX_LIMIT}, got {limit}")
    query = terms.parse_query(q)
    with db.reading() as conn:
        hits = catalog.find(conn, query, filters, limit=limit)
        files = {
            row.file_id: row
            for row in (index.get_file(conn, f) for f in {h.message.file_id for h in hits})
            if row is not None
        }
    return [
        Result(
            source_ref=refs.format(h.message.file_id, h.message.seq),
            file_id=h.message.file_id,
            seq=h.message.seq,
            ts=document.format_ts(h.message.ts),
            role=h.message.role,
            agent_id=h.agent_id,
            session_key=h.session_key,
            snippet=_snippet(db, data_dir, files[h.message.file_id], h.message, query),
            score=round(h.score, 6),
        )
        for h in hits
        if h.message.file_id in files
    ]


def _snippet(
    db: database.Database,
    data_dir: Path,
    file: tables.FileRow,
    message: tables.MessageRow,
    query: terms.Query,
) -> str:
    """The snippet of one hit; a file that cannot be read gives an empty one (the hit stays:
    the index is right about what was said, and fsck will name the file)."""
    try:
        text = reader.message_text(db, data_dir, file, message, cap=SNIPPET_READ)
    except errors.SgmeError:
        return ""
    return terms.snippet(text, query)


def hits_of(results: Sequence[Result]) -> dict[str, list[dict[str, Any]]]:
    """The API's answer."""
    return {"hits": [r.to_json() for r in results]}
