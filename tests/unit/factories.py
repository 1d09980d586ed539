"""Records for unit tests that need an index row without a database."""

from __future__ import annotations

import datetime as dt

from pipeline import tables


def file_row(file_id: str) -> tables.FileRow:
    """A fresh session's ``raw_files`` row, as ingest would create it."""
    when = dt.datetime(2026, 8, 3, 11, 18, 6)
    return tables.FileRow(
        file_id=file_id,
        path=f"raw/sessions/{file_id}.md",
        source_type="session",
        agent_id="hermes",
        session_key="s1",
        metadata_json="{}",
        started_at=when,
        ended_at=None,
        status="new",
        next_seq=1,
        flushed_seq=0,
        flushed_bytes=0,
        chain_head=None,
        flush_pending=False,
        flushed_at=when,
        last_refined_seq=0,
        refined_at=None,
        refine_epoch=0,
        refine_lease_until=None,
        archived_at=None,
        created_at=when,
        updated_at=when,
    )
