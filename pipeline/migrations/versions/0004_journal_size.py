"""append_journal.size: the bytes of each acknowledged append, for bounded flushes and the
backlog limits

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30 23:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("append_journal", schema=None) as batch_op:
        batch_op.add_column(sa.Column("size", sa.BigInteger(), server_default="0", nullable=False))
    # Characters, not bytes, for rows journaled before this revision: close enough for a
    # budget, and the journal is usually empty at an upgrade.
    op.execute("UPDATE append_journal SET size = LENGTH(data)")


def downgrade() -> None:
    with op.batch_alter_table("append_journal", schema=None) as batch_op:
        batch_op.drop_column("size")
