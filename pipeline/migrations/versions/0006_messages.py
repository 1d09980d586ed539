"""messages and message_terms: the message catalog and its search index (docs/design.md §6),
backfilled from the files when the data directory is known (``sgme migrate``, ``sgme serve``;
otherwise ``sgme reindex`` fills them)

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01 01:00:00
"""

from __future__ import annotations

import logging

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None
log = logging.getLogger("alembic.runtime.migration")


def upgrade() -> None:
    op.create_table(
        "messages",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("file_id", sa.String(length=36), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("byte_offset", sa.BigInteger(), nullable=False),
        sa.Column("byte_length", sa.Integer(), nullable=False),
        sa.Column("ts", sa.DateTime(), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("tool_name", sa.String(length=200), nullable=True),
        sa.ForeignKeyConstraint(["file_id"], ["raw_files.file_id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("file_id", "seq", name="uq_messages_seq"),
    )
    with op.batch_alter_table("messages", schema=None) as batch_op:
        batch_op.create_index("ix_messages_ts", ["ts"], unique=False)
    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            "CREATE TABLE message_terms (id BIGINT PRIMARY KEY REFERENCES messages(id), "
            "tsv tsvector NOT NULL)"
        )
        op.execute("CREATE INDEX ix_message_terms_tsv ON message_terms USING GIN (tsv)")
    else:
        # contentless: the text stays in the files; the index holds terms and tags only
        op.execute(
            "CREATE VIRTUAL TABLE message_terms USING fts5(terms, tags, content='', "
            "tokenize='unicode61 remove_diacritics 0')"
        )
    # The catalog is filled from the files by 0014, which makes the search index's columns
    # what today's code writes (filling it here, with today's code, would not fit them).


def downgrade() -> None:
    op.execute("DROP TABLE message_terms")
    with op.batch_alter_table("messages", schema=None) as batch_op:
        batch_op.drop_index("ix_messages_ts")
    op.drop_table("messages")
