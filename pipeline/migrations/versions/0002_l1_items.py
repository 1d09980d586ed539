"""l1_items

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30 08:28:03.534563
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:

    op.create_table(
        "l1_items",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("file_id", sa.String(length=36), nullable=False),
        sa.Column("agent_id", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=40), nullable=False),
        sa.Column("content", sa.Text(), nullable=False),
        sa.Column("source_refs", sa.Text(), nullable=False),
        sa.Column("refiner", sa.String(length=64), nullable=False),
        sa.Column("segment_lo", sa.Integer(), nullable=False),
        sa.Column("segment_hi", sa.Integer(), nullable=False),
        sa.Column("item_hash", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["file_id"],
            ["raw_files.file_id"],
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("file_id", "item_hash", name="uq_l1_items_hash"),
    )
    with op.batch_alter_table("l1_items", schema=None) as batch_op:
        batch_op.create_index("ix_l1_items_agent", ["agent_id", "id"], unique=False)


def downgrade() -> None:

    with op.batch_alter_table("l1_items", schema=None) as batch_op:
        batch_op.drop_index("ix_l1_items_agent")

    op.drop_table("l1_items")
