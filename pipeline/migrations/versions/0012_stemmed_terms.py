"""stemmed search terms: English words reduced to their Snowball stems (docs/search.md). No
table changes: the same FTS5 table and tsvector column hold other terms. The terms of every
message are made again by revision 0014 (from the files when the data directory is known,
else by ``sgme reindex``), which also changes the index's columns.

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
