"""anomalies: one row per (file, kind, key), counted

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30 23:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("anomalies", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("key", sa.String(length=100), server_default="", nullable=False)
        )
        batch_op.add_column(sa.Column("count", sa.Integer(), server_default="1", nullable=False))
        batch_op.add_column(sa.Column("last_seen_at", sa.DateTime(), nullable=True))
    # Fold the repeats recorded before this revision into one counted row per (file, kind).
    op.execute(
        "UPDATE anomalies SET count = (SELECT COUNT(*) FROM anomalies AS a2 "
        "WHERE a2.file_id = anomalies.file_id AND a2.kind = anomalies.kind), "
        "last_seen_at = (SELECT MAX(a2.created_at) FROM anomalies AS a2 "
        "WHERE a2.file_id = anomalies.file_id AND a2.kind = anomalies.kind) "
        "WHERE file_id IS NOT NULL"
    )
    op.execute(
        "DELETE FROM anomalies WHERE file_id IS NOT NULL AND id NOT IN "
        "(SELECT MIN(id) FROM anomalies WHERE file_id IS NOT NULL GROUP BY file_id, kind)"
    )
    with op.batch_alter_table("anomalies", schema=None) as batch_op:
        batch_op.create_index("uq_anomalies_once", ["file_id", "kind", "key"], unique=True)


def downgrade() -> None:
    with op.batch_alter_table("anomalies", schema=None) as batch_op:
        batch_op.drop_index("uq_anomalies_once")
        batch_op.drop_column("last_seen_at")
        batch_op.drop_column("count")
        batch_op.drop_column("key")
