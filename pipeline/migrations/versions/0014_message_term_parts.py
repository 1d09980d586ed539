"""every word of a long message searchable: the terms of a message are no longer cut after its
first 100,000 characters, and on PostgreSQL a message past what one ``tsvector`` holds (16,383
positions, 256 of one term) has its terms in ``message_term_parts``, one row per overlapping
segment (docs/search.md). The terms of every message are made again from the files when the
data directory is known (``sgme migrate``, ``sgme serve``: asked for as the ``catalog`` refill,
which the caller's code does once the schema is at head); otherwise ``sgme reindex`` must be
run — until then the words past the old cut are not found, and on SQLite redacting or erasing
such a message leaves its old terms in the index (compaction does not reach them).

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-05 13:00:00
"""

from __future__ import annotations

import logging

import sqlalchemy as sa
from alembic import context, op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None
log = logging.getLogger("alembic.runtime.migration")


def upgrade() -> None:
    conn = op.get_bind()
    if conn.dialect.name == "postgresql":
        op.execute(
            "CREATE TABLE message_term_parts (id BIGINT NOT NULL REFERENCES messages(id), "
            "part INTEGER NOT NULL, base INTEGER NOT NULL, tsv tsvector NOT NULL, "
            "PRIMARY KEY (id, part))"
        )
        op.execute("CREATE INDEX ix_message_term_parts_tsv ON message_term_parts USING GIN (tsv)")
    if conn.execute(sa.text("SELECT 1 FROM raw_files WHERE flushed_bytes > 0")).first() is None:
        return  # no message to index
    refill = context.config.attributes.get("refill")
    if refill is None:
        log.warning(
            "search terms now hold all of a long message; no data directory given: run "
            "`sgme reindex` so that the words past its first 100,000 characters are found"
        )
        return
    refill.add("catalog")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TABLE message_term_parts")
    log.warning(
        "long messages' terms are left as they are: run `sgme reindex` with the older version"
    )
