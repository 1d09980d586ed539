"""stemmed search terms: the terms of every message made again, now with English words reduced
to their Snowball stems (docs/search.md), from the files when the data directory is known
(``sgme migrate``, ``sgme serve``); otherwise ``sgme reindex`` must be run, and until then the
ranked search misses inflected words of the messages indexed before. No table changes: the
same FTS5 table and tsvector column hold other terms.

Revision ID: 0012
Revises: 0009
Create Date: 2026-12-01 21:30:00
"""

from __future__ import annotations

import logging

revision = "0012"
down_revision = "0009"
branch_labels = None
depends_on = None
log = logging.getLogger("alembic.runtime.migration")


def upgrade() -> None:
    # The terms are made again from the files by 0014 (with today's code, whose columns they
    # must fit); nothing to do here.
    pass


def downgrade() -> None:
    log.warning("search terms stay stemmed: run `sgme reindex` with the older version")
