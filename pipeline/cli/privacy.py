"""Removing on purpose: ``redact``, ``erase`` and ``audit`` (keeping secrets out is
``sgme secrets``, in :mod:`pipeline.cli.secrets`).

These act on the store directly, as the operator (the audit trail names the system user and
host); the HTTP API offers the same to an ``admin`` token."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pipeline import errors
from pipeline.cli.context import Add, Context, print_json, progress

if TYPE_CHECKING:
    from pipeline import rewrite


def _who(reason: str | None, *, required: bool) -> rewrite.Who:
    from pipeline import audit, redaction, rewrite

    return rewrite.Who(audit.local_actor(), redaction.check_reason(reason, required=required), None)


def cmd_redact(ctx: Context) -> int:
    """Redact messages by source_ref: each body becomes a tombstone naming when and why."""
    a = ctx.args
    settings = ctx.settings()
    service = ctx.service(settings)
    who = _who(a.reason, required=True)
    service.removals.finish_interrupted(age=0)
    records = service.removals.redact(a.refs, who)
    if a.json:
        print_json([record.to_json() for record in records])
        return 0
    for record in records:
        print(
            f"{record.file_id}:{record.seq} redacted at {record.created_at:%Y-%m-%d %H:%M:%S}Z "
            f"(audit {record.id}, removed body sha256 {record.removed_sha256[:16]}…)"
        )
    return 0


def cmd_erase(ctx: Context) -> int:
    """Erase a file, or every file of an agent (of one session); or (``--release``) let go
    of an erased file's tombstone."""
    a = ctx.args
    if a.release:
        return _release(ctx)
    if not a.yes:
        raise errors.InvalidInput("erasing cannot be undone: add --yes to go ahead")
    if (a.file_id is None) == (a.agent_id is None):
        raise errors.InvalidInput("give exactly one of --file-id or --agent-id")
    if a.session_key is not None and a.agent_id is None:
        raise errors.InvalidInput("--session-key needs --agent-id")
    settings = ctx.settings()
    service = ctx.service(settings)
    who = _who(a.reason, required=False)
    service.removals.finish_interrupted(age=0)
    if a.file_id is not None:
        erased, other = [service.removals.erase_file(a.file_id, who)], 0
    else:
        total = service.removals.count_agent_files(a.agent_id, a.session_key)
        with progress("erase", total) as advance:
            erased, other = service.removals.erase_agent(
                a.agent_id, who, session_key=a.session_key, progress=advance
            )
    summary: dict[str, Any] = {
        "files": len(erased),
        "messages": sum(e.record.messages for e in erased),
        "bytes": sum(e.record.removed_bytes for e in erased),
        "keys": sum(e.record.keys for e in erased),
        "other_rows": other,
        "erased": [e.to_json() for e in erased],
    }
    if a.json:
        print_json(summary)
        return 0
    print(
        f"erased {summary['files']} file(s), {summary['messages']} message(s), "
        f"{summary['bytes']} bytes; {other} waiting append(s) and idempotency record(s)"
    )
    print(
        f"{summary['keys']} idempotency key(s) kept as the tombstone: importing or capturing "
        "the same source writes nothing of it again (`sgme erase --release` lets it)"
    )
    if any(e.terms_left for e in erased):
        print("some files could not be read: run `sgme reindex` to drop their search terms")
    return 0


def _release(ctx: Context) -> int:
    """``sgme erase --release --file-id F --yes``: the erased file's units may be written
    again by the next import or capture of their source."""
    a = ctx.args
    if a.file_id is None or a.agent_id is not None:
        raise errors.InvalidInput("--release needs --file-id (an erased file) and no --agent-id")
    if not a.yes:
        raise errors.InvalidInput(
            "releasing lets an import or a capture bring the erased content back: add --yes"
        )
    service = ctx.service(ctx.settings())
    record = service.removals.release_erased(a.file_id, _who(a.reason, required=False))
    if a.json:
        print_json(record.to_json())
        return 0
    print(
        f"released the tombstone of {record.file_id}: {record.keys} idempotency key(s) let go "
        f"(audit {record.id}); the next import or capture of its source writes it again, as a "
        "new file"
    )
    return 0


def cmd_audit(ctx: Context) -> int:
    """List the audit trail of redactions and erasures."""
    a = ctx.args
    service = ctx.service(ctx.settings())
    rows = service.removals.audit_trail(file_id=a.file_id, limit=a.limit)
    if a.json:
        print_json([row.to_json() for row in rows])
        return 0
    for row in rows:
        where = row.file_id if row.seq is None else f"{row.file_id}:{row.seq}"
        state = "" if row.finished_at else " (unfinished)"
        print(f"{row.id} {row.created_at:%Y-%m-%d %H:%M:%S}Z {row.action} {where}{state}")
        print(f"    by {row.actor}: {row.reason or '(no reason given)'}")
    return 0


def register(add: Add) -> None:
    """Declare the privacy commands."""
    p = add("redact", cmd_redact, "redact messages (FILE_ID:SEQ ...): replace each by a tombstone")
    p.add_argument("refs", nargs="+", metavar="REF", help="a message's FILE_ID:SEQ (several)")
    p.add_argument("--reason", required=True, help="why (kept in the tombstone and audit trail)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p = add("erase", cmd_erase, "erase a file, or every file of an agent or of one session")
    p.add_argument("--file-id", help="the file to erase")
    p.add_argument("--agent-id", help="erase every file of this agent")
    p.add_argument("--session-key", help="with --agent-id: only this session's files")
    p.add_argument("--reason", help="why (kept in the audit trail)")
    p.add_argument("--yes", action="store_true", help="go ahead: erasing cannot be undone")
    p.add_argument(
        "--release",
        action="store_true",
        help="with --file-id of an erased file: let go of its tombstone, so that importing or "
        "capturing its source writes it again (audited)",
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p = add("audit", cmd_audit, "list the audit trail of redactions and erasures")
    p.add_argument("--file-id", help="only this file's entries")
    p.add_argument("--limit", type=int, default=1000, help="entries to list (default 1000)")
    p.add_argument("--json", action="store_true", help="print JSON")
