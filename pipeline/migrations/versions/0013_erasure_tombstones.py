"""erasure tombstones: an erasure keeps its file's idempotency keys (without what they held),
and the audit trail counts them (``audit_log.keys``); a release of a tombstone is an audit row
of its own (action ``release``). Keys of files erased before this version went with them: those
erasures have no tombstone (docs/privacy.md).

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-05 12:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("audit_log", schema=None) as batch_op:
        batch_op.add_column(sa.Column("keys", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("audit_log", schema=None) as batch_op:
        batch_op.drop_column("keys")
