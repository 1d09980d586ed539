"""Bounded work (docs/design.md §3): what is acknowledged but not yet in its file stays under
limits (:class:`pipeline.settings.Backlog`), and past them an append is refused with a
``Retry-After`` rather than acknowledged.

Two checks, both counting the bytes the journal will hold:

* :class:`Admission`, before ingest: the journal's whole backlog (and the appends held for
  their predecessors) under ``max_total_bytes``, and the backlog plus this append fitting in
  the data volume's free space above ``min_free_bytes`` — nothing is acknowledged that the
  disk could not take. Both figures are measured at most every :attr:`Admission.REFRESH`
  seconds, not per append.
* :func:`check_file`, inside ingest's transaction, under the session's row lock: the file's
  unwritten messages under ``max_file_messages``.
"""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path

from pipeline import database, errors, ledger, store, validation
from pipeline.settings import Backlog

#: bytes a message's heading (and its framing) adds to its content in the journal, at most
#: about: ``## <ts> <role>`` with a microsecond timestamp, blank lines, a tool line
HEADING_BYTES = 96


def estimate(append: validation.Append) -> int:
    """About the bytes ``append`` will hold in the journal (its blocks: UTF-8 content and
    headings); compared with a backlog counted in the same bytes."""
    return sum(len(m.content.encode("utf-8")) + HEADING_BYTES for m in append.messages)


def check_file(waiting: int, adding: int, limits: Backlog) -> None:
    """Refuse ``adding`` more messages to a file that has ``waiting`` unwritten ones, past
    ``max_file_messages`` (:class:`errors.Overloaded`)."""
    if waiting + adding > limits.max_file_messages:
        raise errors.Overloaded(
            f"{waiting} messages of this session wait to be written; at most "
            f"{limits.max_file_messages} may (backlog_max_file_messages)",
            retry_after=limits.retry_after,
        )


class Admission:
    """Whether the store can take one more append of ``size`` bytes (:meth:`check`)."""

    REFRESH = 0.5  #: seconds a measured backlog or free space is reused

    def __init__(self, db: database.Database, data_dir: Path, limits: Backlog) -> None:
        self.db = db
        self.data_dir = data_dir
        self.limits = limits
        self._measured = -math.inf
        self._figures = (0, 0)  #: the journal's backlog and the free bytes, as last measured
        self._counting = threading.Lock()  #: held by the one caller measuring

    def check(self, size: int) -> None:
        """Raise :class:`errors.Overloaded` or :class:`errors.InsufficientStorage` (each with
        ``retry_after``) if ``size`` more bytes should not be acknowledged now."""
        journal_bytes, free = self._measure()
        b = self.limits
        if journal_bytes + size > b.max_total_bytes:
            raise errors.Overloaded(
                f"{journal_bytes} bytes of appends wait to be written; at most "
                f"{b.max_total_bytes} may (backlog_max_total_bytes)",
                retry_after=b.retry_after,
            )
        if journal_bytes + size > free - b.min_free_bytes:
            raise errors.InsufficientStorage(
                f"the data volume has {free} bytes free: not enough for {journal_bytes} bytes "
                f"waiting to be written and this append above the {b.min_free_bytes}-byte "
                "reserve (backlog_min_free_bytes)",
                retry_after=b.retry_after,
            )

    def _measure(self) -> tuple[int, int]:
        """The journal's backlog and the free bytes, at most :attr:`REFRESH` seconds old.

        Counting the backlog reads the whole journal: about 150 ms for 300,000 rows, and a
        backlog near ``max_total_bytes`` holds millions — when the flushes are behind, which
        is when appends must go on being answered. So one caller measures while the others
        go on with the last figures (at most one measurement older); only the very first
        measurement is waited for, there being no figures before it."""
        if time.monotonic() - self._measured < self.REFRESH:
            return self._figures
        if not self._counting.acquire(blocking=self._measured == -math.inf):
            return self._figures  # another caller is counting
        try:
            now = time.monotonic()
            if now - self._measured >= self.REFRESH:  # not counted while this one waited
                self._figures = self._take()
                self._measured = now
        finally:
            self._counting.release()
        return self._figures

    def _take(self) -> tuple[int, int]:
        with self.db.reading() as conn:
            # held appends (pipeline.ordering) are waiting to be written as well
            journal_bytes = ledger.journal_backlog(conn)[2] + ledger.waiting_backlog(conn)[1]
        return journal_bytes, store.free_bytes(self.data_dir)
