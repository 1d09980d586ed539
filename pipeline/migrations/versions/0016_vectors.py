"""message vectors: the semantic leg of search (pipeline.vectors, docs/search.md) — blocks of
consecutive messages' vectors with the model that made them, and each file's embedding
watermark.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-05 13:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "message_vectors",
        sa.Column("file_id", sa.String(36), primary_key=True),
        sa.Column("model", sa.String(200), primary_key=True),
        sa.Column("lo", sa.Integer, primary_key=True),
        sa.Column("hi", sa.Integer, nullable=False),
        sa.Column("dim", sa.Integer, nullable=False),
        sa.Column("vectors", sa.LargeBinary, nullable=False),
    )
    op.create_index("ix_message_vectors_model", "message_vectors", ["model", "file_id"])
    op.create_table(
        "embed_marks",
        sa.Column("file_id", sa.String(36), primary_key=True),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("embedded_seq", sa.Integer, nullable=False, server_default="0"),
        sa.Column("epoch", sa.Integer, nullable=False, server_default="0"),
        sa.Column("lease_until", sa.DateTime),
        sa.Column("embedded_at", sa.DateTime),
    )


def downgrade() -> None:
    op.drop_table("embed_marks")
    op.drop_index("ix_message_vectors_model", table_name="message_vectors")
    op.drop_table("message_vectors")
