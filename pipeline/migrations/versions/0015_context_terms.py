"""context terms and speakers: each message is also indexed with the terms of the turns before
it in its session (docs/search.md, "Context terms"), in a column of their own — SQLite's FTS5
table is made again with a third column, ``context``; PostgreSQL's ``message_terms`` gains a
second ``tsvector``, ``ctx``, with a GIN index of its own — and with who said it where its
file names its speakers (a tag on SQLite; PostgreSQL's new ``speaker`` column). Every
message's terms are made again from the files when the data directory is known (``sgme
migrate``, ``sgme serve``: asked for as the ``catalog`` refill, which the caller's code does
once the schema is at head); otherwise the search finds nothing until ``sgme reindex`` has
run (it says so).

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-05 13:30:00
"""

from __future__ import annotations

import logging

import sqlalchemy as sa
from alembic import context, op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None
log = logging.getLogger("alembic.runtime.migration")

_FTS = (
    "CREATE VIRTUAL TABLE message_terms USING fts5({columns}, content='', "
    "tokenize='unicode61 remove_diacritics 0')"
)


def upgrade() -> None:
    conn = op.get_bind()
    if conn.dialect.name == "postgresql":
        # a long message's segments go with its message_terms row (made again together)
        op.execute("TRUNCATE message_term_parts, message_terms")
        op.execute("ALTER TABLE message_terms ADD COLUMN ctx tsvector NOT NULL DEFAULT ''")
        op.execute("ALTER TABLE message_terms ALTER COLUMN ctx DROP DEFAULT")
        op.execute("CREATE INDEX ix_message_terms_ctx ON message_terms USING GIN (ctx)")
        op.execute("ALTER TABLE message_terms ADD COLUMN speaker TEXT")
    else:
        # a contentless FTS5 table's columns cannot change: it is made again, empty
        op.execute("DROP TABLE message_terms")
        op.execute(_FTS.format(columns="terms, tags, context"))
    if conn.execute(sa.text("SELECT 1 FROM raw_files WHERE flushed_bytes > 0")).first() is None:
        return  # no message to index
    refill = context.config.attributes.get("refill")
    if refill is None:
        log.warning(
            "search terms now hold each message's context; no data directory given: run "
            "`sgme reindex` (until then the search finds nothing)"
        )
        return
    refill.add("catalog")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP INDEX ix_message_terms_ctx")
        op.execute("ALTER TABLE message_terms DROP COLUMN ctx")
        op.execute("ALTER TABLE message_terms DROP COLUMN speaker")
    else:
        op.execute("DROP TABLE message_terms")
        op.execute(_FTS.format(columns="terms, tags"))
    log.warning("search terms: run `sgme reindex` with the older version")
