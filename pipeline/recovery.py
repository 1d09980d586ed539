"""Reading a store's files for ``reindex`` (docs/design.md §8): each file's index row and its
messages' catalog rows and search terms, made from its bytes alone — no database — so that
worker processes can make them while one writer commits the files before them.

The pool is fed in chunks and held at most ``2 × workers`` chunks ahead of the writer, plus
the files the caller asks for (``ahead_files``: reindex asks for a batch, so that the workers
keep reading while it commits one and waits for the disk), so a slow database bounds the
memory, not the store's size. Files come back in the order they were given (the catalog's ids
follow the files' order, as before). The workers are started with ``spawn`` (a fork would copy
the caller's threads and connections), so a program that calls :func:`read_all` with workers
must guard its main module (``if __name__ == "__main__"``), as ``sgme`` and the benchmarks do;
each worker exits when the process that started it is gone.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import datetime as dt
import json
import multiprocessing
import os
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from pipeline import archive, catalog, document, errors, store

CHUNK = 64  #: files a worker reads per task (fewer hand-offs than one at a time)
PARENT_CHECK_SECONDS = 1.0  #: how often a worker looks whether the command is still there


@dataclasses.dataclass(frozen=True)
class Read:
    """One file as ``reindex`` found it: its index row's file-derived values and its
    messages' catalog entries; or, when it cannot be read, why (``unreadable``)."""

    file_id: str
    archived: bool
    values: dict[str, Any] = dataclasses.field(default_factory=dict)
    cataloged: catalog.Ready | None = None  #: its messages' catalog rows and search terms
    unreadable: str | None = None  #: why the file could not be read
    misplaced: str | None = None  #: a file in the directory of another source type


def file_id_of(path: Path) -> str:
    """The file id a raw file's name carries."""
    return path.name.split(".", 1)[0]


def read(data_dir: Path, source_type: str, path: Path, *, postgres: bool) -> Read:
    """Read one raw file (``source_type`` "archive" for an archive) for the index."""
    file_id = file_id_of(path)
    archived = source_type == "archive"
    try:
        data = archive.read_path(path) if archived else store.read(path)
        yaml_text, _ = document.split_frontmatter(data[: data.find(b"\n---", 3) + 5].decode())
        header = document.parse_header(yaml_text)
        if header.file_id != file_id:
            raise errors.FormatError(f"file_id {header.file_id!r} is not the file's own")
        started_at = checked_ts(header.started_at, "started_at").replace(tzinfo=None)
        upload_ts = document.format_ts(started_at) if header.source_type == "upload" else None
        found = document.locate(data, upload_ts=upload_ts)
        # a session's blocks are where locate found them; an upload's are the chain's own
        starts = None if upload_ts else [f.offset for f in found]
        head, count = document.chain(data, starts=starts)
        ended_at = max(checked_ts(f.message.ts, f"message {f.message.seq}") for f in found)
    except (UnicodeDecodeError, errors.SgmeError) as exc:
        detail = exc.detail if isinstance(exc, errors.SgmeError) else f"not UTF-8: {exc}"
        return Read(file_id, archived, unreadable=detail)
    misplaced = None
    if not archived and header.source_type != source_type:
        misplaced = f"a {header.source_type} file in raw/{path.parent.name}"
    values = {
        "path": path.relative_to(data_dir).as_posix(),
        "source_type": header.source_type,
        "agent_id": header.agent_id,
        "session_key": header.session_key,
        "metadata_json": json.dumps(dict(header.metadata), ensure_ascii=False),
        "started_at": started_at,
        "ended_at": ended_at.replace(tzinfo=None),
        "flushed_seq": count,
        "flushed_bytes": len(data),
        "chain_head": head.hex(),
    }
    owner = catalog.Owner.made(
        header.file_id, header.agent_id, header.session_key, dict(header.metadata)
    )
    cataloged = catalog.ready(owner, found, postgres=postgres)
    return Read(file_id, archived, values, cataloged, misplaced=misplaced)


def checked_ts(text: str, what: str) -> dt.datetime:
    """:func:`document.parse_ts` of a timestamp read from a file (``what`` names it). The
    format's pattern takes a heading whose date does not exist (a hand edit: month 13): a
    :class:`errors.FormatError`, which makes the file unreadable to whoever reads it."""
    try:
        return document.parse_ts(text)
    except ValueError as exc:
        raise errors.FormatError(f"{what}: {text} is not a time ({exc})") from None


def _read_chunk(data_dir: Path, files: Sequence[tuple[str, Path]], postgres: bool) -> list[Read]:
    return [read(data_dir, source_type, path, postgres=postgres) for source_type, path in files]


def _exit_with(parent: int) -> None:
    """In a worker: exit once ``parent`` is gone (a reindex killed alone would otherwise
    leave its workers waiting for work forever)."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_CHECK_SECONDS)
        os._exit(1)

    threading.Thread(target=watch, name="sgme-reindex-parent", daemon=True).start()


def read_all(
    data_dir: Path,
    files: Iterable[tuple[str, Path]],
    *,
    postgres: bool,
    workers: int,
    ahead_files: int = 0,
) -> Iterator[Read]:
    """:func:`read` over ``files`` (``(source_type, path)``), in their order: in this process
    when ``workers`` is 0, else in that many worker processes, at most ``2 × workers`` chunks
    and ``ahead_files`` files ahead of the caller."""
    if workers <= 0:
        for source_type, path in files:
            yield read(data_dir, source_type, path, postgres=postgres)
        return
    # spawn, not fork: the caller has threads and database connections a fork would copy
    context = multiprocessing.get_context("spawn")
    most_ahead = 2 * workers + -(-ahead_files // CHUNK)  # chunks
    with concurrent.futures.ProcessPoolExecutor(
        workers, mp_context=context, initializer=_exit_with, initargs=(os.getpid(),)
    ) as pool:
        ahead: collections.deque[concurrent.futures.Future[list[Read]]] = collections.deque()
        chunk: list[tuple[str, Path]] = []
        for item in files:
            chunk.append(item)
            if len(chunk) == CHUNK:
                ahead.append(pool.submit(_read_chunk, data_dir, chunk, postgres))
                chunk = []
                while len(ahead) > most_ahead:
                    yield from ahead.popleft().result()
        if chunk:
            ahead.append(pool.submit(_read_chunk, data_dir, chunk, postgres))
        while ahead:
            yield from ahead.popleft().result()
