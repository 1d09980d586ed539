"""The library's facade: the append protocol for programs that embed it (docs/design.md §3),
ingest into the journal, then flush to the file.

:func:`ingest` commits an append to the journal — the acknowledgement — and :func:`flush`
writes a file's journal rows to it, once. These two names and signatures are the library's
entry points and stay as they are, here and under their first name in :mod:`pipeline.journal`;
the protocol itself lives in :mod:`pipeline.ingest`, :mod:`pipeline.flush`,
:mod:`pipeline.ordering` and :mod:`pipeline.idempotency`. A program
that appends from many threads should build a :class:`pipeline.runtime.Runtime` instead and
call its :class:`pipeline.service.Service`: the runtime keeps its file locks and flushes
kicked files in rounds. Calls here given one :class:`database.Database`, or one engine (whose
handle is kept with it), share its commits (group commit); each flush opens the file locks
afresh.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from pipeline import database, locks, validation
from pipeline import flush as flushing
from pipeline import ingest as ingesting
from pipeline.flush import FlushResult
from pipeline.ingest import AppendResult
from pipeline.settings import DEFAULT_LOCK_TIMEOUT, Backlog, Limits

__all__ = ["AppendResult", "FlushResult", "flush", "ingest", "ingest_upload"]


#: where an engine keeps the handle the calls given it share (on the engine itself: a cache
#: keyed by engine would keep every engine alive through its handle)
_HANDLE = "_sgme_database"


def _handle(target: sa.Engine | database.Database) -> database.Database:
    """``target``, or the one handle of an engine: calls given an engine share its group
    committer and its held connections, as calls given one handle do (a handle per call
    opened a connection per call: several times the cost of the append)."""
    if isinstance(target, database.Database):
        return target
    found = target.__dict__.get(_HANDLE)
    if found is None:  # two threads may both make one; one is kept (setdefault is atomic)
        found = target.__dict__.setdefault(_HANDLE, database.Database(target))
    assert isinstance(found, database.Database)
    return found


def ingest(
    engine: sa.Engine | database.Database,
    body: Mapping[str, Any] | bytes | validation.Append,
    *,
    limits: Limits | None = None,
    backlog: Backlog | None = None,
) -> AppendResult:
    """Validate an append (a JSON body, its parsed mapping, or an :class:`validation.Append`)
    and commit it to the journal; the answer names its ``file_id`` and ``source_refs``.
    Nothing is written when anything in the body is wrong. The caller flushes the file (or
    lets a sweep do it) when ``result.kick`` is true."""
    parsed = body if isinstance(body, validation.Append) else validation.parse_append(body, limits)
    return ingesting.append(_handle(engine), parsed, limits=backlog)


def ingest_upload(
    engine: sa.Engine | database.Database,
    body: Mapping[str, Any] | bytes | validation.Upload,
    *,
    limits: Limits | None = None,
) -> AppendResult:
    """Validate an uploaded text document and commit it as a new file of one message."""
    parsed = body if isinstance(body, validation.Upload) else validation.parse_upload(body, limits)
    return ingesting.upload(_handle(engine), parsed)


def flush(
    engine: sa.Engine | database.Database,
    data_dir: Path,
    file_id: str,
    *,
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
    file_lock: bool = True,
    **options: Any,
) -> FlushResult:
    """Write every journal row of ``file_id`` past ``flushed_seq`` to its file, once
    (:func:`pipeline.flush.flush`, whose keyword options are passed on)."""
    db = _handle(engine)
    file_locks = locks.FileLocks(db, data_dir, timeout=lock_timeout, flock=file_lock)
    try:
        return flushing.flush(db, file_locks, data_dir, file_id, **options)
    finally:
        file_locks.close()
