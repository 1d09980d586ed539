"""append_journal without its created_at index: every acknowledgement wrote a page of it, and
the sweeper finds a file's waiting age from its first journal row instead
(ledger.stale_journal_files, through the (file_id, first_seq) key).

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-05 21:40:00
"""

from __future__ import annotations

from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_index("ix_append_journal_created", table_name="append_journal")


def downgrade() -> None:
    op.create_index("ix_append_journal_created", "append_journal", ["created_at"])
