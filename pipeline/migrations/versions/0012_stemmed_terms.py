"""stemmed search terms: the terms of every message made again, now with English words reduced
to their Snowball stems (docs/search.md), from the files when the data directory is known
(``sgme migrate``, ``sgme serve``: asked for as the ``catalog`` refill, which the caller's code
does once the schema is at head); otherwise ``sgme reindex`` must be run, and until then the
ranked search misses inflected words of the messages indexed before. No table changes: the
same FTS5 table and tsvector column hold other terms.

Revision ID: 0012
Revises: 0009
Create Date: 2026-12-01 21:30:00
"""

from __future__ import annotations

import logging

from alembic import context

revision = "0012"
down_revision = "0009"
branch_labels = None
depends_on = None
log = logging.getLogger("alembic.runtime.migration")


def upgrade() -> None:
    refill = context.config.attributes.get("refill")
    if refill is None:
        log.warning(
            "search terms are now stemmed; no data directory given: run `sgme reindex` so "
            "that every message is found by its stemmed words"
        )
        return
    refill.add("catalog")


def downgrade() -> None:
    log.warning("search terms stay stemmed: run `sgme reindex` with the older version")
