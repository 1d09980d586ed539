"""deployment: the identity of a store, which its Celery tasks carry

Revision ID: 0011
Revises: 0007
Create Date: 2026-12-01 18:00:00
"""

from __future__ import annotations

import datetime as dt
import uuid

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    table = op.create_table(
        "deployment",
        sa.Column("id", sa.String(length=36), primary_key=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
    )
    now = dt.datetime.now(dt.UTC).replace(tzinfo=None)
    op.bulk_insert(table, [{"id": str(uuid.uuid4()), "created_at": now}])


def downgrade() -> None:
    op.drop_table("deployment")
