"""raw_files.next_sequence and waiting_appends: a sender's append order kept (issue 13)

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # NULL for every existing session: none of them used sequences
    with op.batch_alter_table("raw_files", schema=None) as batch_op:
        batch_op.add_column(sa.Column("next_sequence", sa.Integer(), nullable=True))
    op.create_table(
        "waiting_appends",
        sa.Column("agent_id", sa.String(length=64), nullable=False),
        sa.Column("source_type", sa.String(length=16), nullable=False),
        sa.Column("session_key", sa.Text(), nullable=False),
        sa.Column("sequence", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("idempotency_key", sa.String(length=200), nullable=False),
        sa.Column("request_hash", sa.String(length=64), nullable=False),
        sa.Column("append_json", sa.Text(), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("received_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("agent_id", "source_type", "session_key", "sequence"),
    )
    with op.batch_alter_table("waiting_appends", schema=None) as batch_op:
        batch_op.create_index("ix_waiting_appends_received", ["received_at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("waiting_appends", schema=None) as batch_op:
        batch_op.drop_index("ix_waiting_appends_received")
    op.drop_table("waiting_appends")
    # not in a batch: on SQLite that copies the table, which the foreign keys to raw_files
    # refuse; ALTER TABLE … DROP COLUMN does it in place (SQLite 3.35 and later)
    op.drop_column("raw_files", "next_sequence")
