"""The library's entry points by the name programs that embed it first used:
``journal.ingest``, ``journal.ingest_upload`` and ``journal.flush`` are those of
:mod:`pipeline.library` (the facade), and stay. The journal itself — the acknowledged appends
waiting for their flush, with the idempotency records and the held appends — is
:mod:`pipeline.ledger`'s.
"""

from __future__ import annotations

from pipeline.library import AppendResult, FlushResult, flush, ingest, ingest_upload

__all__ = ["AppendResult", "FlushResult", "flush", "ingest", "ingest_upload"]
