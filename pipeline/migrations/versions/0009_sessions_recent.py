"""raw_files indexes for the sessions listing: newest first, for all agents or one

Revision ID: 0009
Revises: 0010
Create Date: 2026-12-10 10:00:00
"""

from __future__ import annotations

from alembic import op

revision = "0009"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_raw_files_recent", "raw_files", ["ended_at", "file_id"])
    op.create_index("ix_raw_files_agent_recent", "raw_files", ["agent_id", "ended_at", "file_id"])


def downgrade() -> None:
    op.drop_index("ix_raw_files_agent_recent", table_name="raw_files")
    op.drop_index("ix_raw_files_recent", table_name="raw_files")
