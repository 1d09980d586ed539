"""raw_files, append_journal, append_keys, anomalies

Revision ID: 0001
Revises:
Create Date: 2026-11-30 08:23:20.966416
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:

    op.create_table(
        "anomalies",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("file_id", sa.String(length=36), nullable=True),
        sa.Column("kind", sa.String(length=40), nullable=False),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("anomalies", schema=None) as batch_op:
        batch_op.create_index("ix_anomalies_file", ["file_id"], unique=False)
        batch_op.create_index("ix_anomalies_kind", ["kind"], unique=False)

    op.create_table(
        "append_keys",
        sa.Column("agent_id", sa.String(length=64), nullable=False),
        sa.Column("idempotency_key", sa.String(length=200), nullable=False),
        sa.Column("request_hash", sa.String(length=64), nullable=False),
        sa.Column("response_json", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("agent_id", "idempotency_key"),
    )
    op.create_table(
        "raw_files",
        sa.Column("file_id", sa.String(length=36), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("source_type", sa.String(length=16), nullable=False),
        sa.Column("agent_id", sa.String(length=64), nullable=False),
        sa.Column("session_key", sa.Text(), nullable=False),
        sa.Column("metadata_json", sa.Text(), server_default="{}", nullable=False),
        sa.Column("started_at", sa.DateTime(), nullable=False),
        sa.Column("ended_at", sa.DateTime(), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("next_seq", sa.Integer(), server_default="1", nullable=False),
        sa.Column("flushed_seq", sa.Integer(), server_default="0", nullable=False),
        sa.Column("flushed_bytes", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("chain_head", sa.String(length=64), nullable=True),
        sa.Column("flush_pending", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("flushed_at", sa.DateTime(), nullable=True),
        sa.Column("last_refined_seq", sa.Integer(), server_default="0", nullable=False),
        sa.Column("refined_at", sa.DateTime(), nullable=True),
        sa.Column("refine_epoch", sa.Integer(), server_default="0", nullable=False),
        sa.Column("refine_lease_until", sa.DateTime(), nullable=True),
        sa.Column("archived_at", sa.DateTime(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("file_id"),
        sa.UniqueConstraint("agent_id", "source_type", "session_key", name="uq_raw_files_session"),
    )
    with op.batch_alter_table("raw_files", schema=None) as batch_op:
        batch_op.create_index("ix_raw_files_agent", ["agent_id", "file_id"], unique=False)
        batch_op.create_index("ix_raw_files_status", ["status"], unique=False)

    op.create_table(
        "append_journal",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("file_id", sa.String(length=36), nullable=False),
        sa.Column("first_seq", sa.Integer(), nullable=False),
        sa.Column("last_seq", sa.Integer(), nullable=False),
        sa.Column("last_ts", sa.String(length=40), nullable=False),
        sa.Column("data", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["file_id"],
            ["raw_files.file_id"],
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("file_id", "first_seq", name="uq_append_journal_seq"),
    )
    with op.batch_alter_table("append_journal", schema=None) as batch_op:
        batch_op.create_index("ix_append_journal_created", ["created_at"], unique=False)


def downgrade() -> None:

    with op.batch_alter_table("append_journal", schema=None) as batch_op:
        batch_op.drop_index("ix_append_journal_created")

    op.drop_table("append_journal")
    with op.batch_alter_table("raw_files", schema=None) as batch_op:
        batch_op.drop_index("ix_raw_files_status")
        batch_op.drop_index("ix_raw_files_agent")

    op.drop_table("raw_files")
    op.drop_table("append_keys")
    with op.batch_alter_table("anomalies", schema=None) as batch_op:
        batch_op.drop_index("ix_anomalies_kind")
        batch_op.drop_index("ix_anomalies_file")

    op.drop_table("anomalies")
