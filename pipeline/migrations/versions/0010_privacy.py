"""agent_policies and audit_log: secrets redacted on the way in (with a per-agent choice),
messages redacted and files erased on purpose, each recorded (issue 20)

Revision ID: 0010
Revises: 0011
Create Date: 2026-12-10 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "agent_policies",
        sa.Column("agent_id", sa.String(length=64), nullable=False),
        sa.Column("redact_secrets", sa.Boolean(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.Column("updated_by", sa.String(length=300), server_default="", nullable=False),
        sa.PrimaryKeyConstraint("agent_id"),
    )
    op.create_table(
        "audit_log",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("action", sa.String(length=16), nullable=False),
        sa.Column("file_id", sa.String(length=36), nullable=False),
        sa.Column("agent_id", sa.String(length=64), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=True),
        sa.Column("reason", sa.Text(), server_default="", nullable=False),
        sa.Column("actor", sa.String(length=300), nullable=False),
        sa.Column("token_id", sa.String(length=32), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.Column("removed_sha256", sa.String(length=64), server_default="", nullable=False),
        sa.Column("removed_bytes", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("messages", sa.Integer(), server_default="0", nullable=False),
        sa.Column("tombstone", sa.Text(), nullable=True),
        sa.Column("old_chain_head", sa.String(length=64), nullable=True),
        sa.Column("new_chain_head", sa.String(length=64), nullable=True),
        sa.Column("old_size", sa.BigInteger(), nullable=True),
        sa.Column("new_size", sa.BigInteger(), nullable=True),
        sa.Column("paths_json", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("audit_log", schema=None) as batch_op:
        batch_op.create_index("ix_audit_log_file", ["file_id", "seq"], unique=False)
        batch_op.create_index("ix_audit_log_unfinished", ["finished_at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("audit_log", schema=None) as batch_op:
        batch_op.drop_index("ix_audit_log_unfinished")
        batch_op.drop_index("ix_audit_log_file")
    op.drop_table("audit_log")
    op.drop_table("agent_policies")
