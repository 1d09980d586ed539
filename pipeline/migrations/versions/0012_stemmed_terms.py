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
from pathlib import Path

from alembic import context, op

revision = "0012"
down_revision = "0009"
branch_labels = None
depends_on = None
log = logging.getLogger("alembic.runtime.migration")


def upgrade() -> None:
    from pipeline import catalog, integrity

    data_dir = context.config.attributes.get("data_dir")
    if data_dir is None:
        log.warning(
            "search terms are now stemmed; no data directory given: run `sgme reindex` so "
            "that every message is found by its stemmed words"
        )
        return
    conn = op.get_bind()
    catalog.clear(conn)
    done, failed = integrity.catalog_all(conn, Path(data_dir))
    log.info(
        "search terms: %d files indexed again (%d could not be read: see sgme fsck)", done, failed
    )


def downgrade() -> None:
    log.warning("search terms stay stemmed: run `sgme reindex` with the older version")
