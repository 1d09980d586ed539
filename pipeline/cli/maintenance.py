"""Looking after the store: ``migrate``, ``refine``, ``archive``, ``restore``, ``fsck``,
``reindex``, ``embed``."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any

from pipeline import errors
from pipeline.cli.context import EXIT_PROBLEMS, Add, Context, print_json, progress

if TYPE_CHECKING:
    from pipeline.service import Service


def cmd_migrate(ctx: Context) -> int:
    """Create or upgrade the index schema."""
    settings = ctx.settings()
    ctx.runtime(settings, migrate=True)
    print(f"index at {settings.index_url} is up to date")
    return 0


def cmd_refine(ctx: Context) -> int:
    """Refine a file's unrefined messages now, in this process."""
    a = ctx.args
    service = ctx.service(ctx.settings())
    before = _count_items(service, a.file_id)
    service.refine_now(a.file_id, full=a.full)
    row = service.get_file(a.file_id)
    now = _count_items(service, a.file_id)
    # "items" is what the file has now; "new_items" what this run made (0 when the background
    # refiner had already refined everything: the file's items are still "items")
    print_json(
        {
            "file_id": row.file_id,
            "status": row.status,
            "last_refined_seq": row.last_refined_seq,
            "items": now,
            "new_items": now if a.full else now - before,
        }
    )
    return 0


def _count_items(service: Service, file_id: str) -> int:
    return len(service.l1_items(file_id=file_id, limit=1_000_000))


def cmd_archive(ctx: Context) -> int:
    """Compress cold, fully refined files."""
    a = ctx.args
    settings = ctx.settings()
    service = ctx.service(settings)
    days = settings.archive.after_days if a.older_than is None else a.older_than
    if days < 0:
        raise errors.InvalidInput(f"--older-than must be >= 0 days, got {days}")
    summary: dict[str, Any] = {"older_than_days": days, "dry_run": a.dry_run}
    if a.dry_run:
        rows = service.upkeep.archive_candidates(days)
        summary.update(files=len(rows), bytes_before=sum(r.flushed_bytes for r in rows))
    else:
        total = len(service.upkeep.archive_candidates(days))
        with progress("archive", total) as advance:
            report = service.upkeep.archive_cold(older_than_days=days, progress=advance)
        summary.update(
            cleaned_up=report.cleaned_up,
            unrefined_cold_flagged=report.unrefined_flagged,
            files=report.files,
            bytes_before=report.bytes_before,
            bytes_after=report.bytes_after,
            ratio=report.ratio,
            failed=[{"file_id": f, "error": d} for f, d in report.failed],
        )
    if a.json:
        print_json(summary)
    elif a.dry_run:
        print(
            f"archive --dry-run: {summary['files']} files ({summary['bytes_before']} bytes) "
            f"unchanged for {days} days would be compressed"
        )
    else:
        print(
            f"archive: {summary['files']} files, {summary['bytes_before']} -> "
            f"{summary['bytes_after']} bytes (ratio {summary['ratio']}), "
            f"{len(summary['failed'])} failed, "
            f"{summary['unrefined_cold_flagged']} cold but unrefined flagged"
        )
        for item in summary["failed"]:
            print(f"  {item['file_id']}: {item['error']}")
    return EXIT_PROBLEMS if summary.get("failed") else 0


def cmd_restore(ctx: Context) -> int:
    """Move an archived file back to its live place."""
    row = ctx.service(ctx.settings()).upkeep.restore(ctx.args.file_id)
    print_json({"file_id": row.file_id, "status": row.status, "path": row.path})
    return 0


def cmd_fsck(ctx: Context) -> int:
    """Check every file against the index; exit 1 when something differs."""
    service = ctx.service(ctx.settings())
    with progress("fsck", service.upkeep.count_files()) as advance:
        problems = service.upkeep.fsck(progress=advance)
    if ctx.args.json:
        by_file: dict[str, list[dict[str, str]]] = {}
        for p in problems:
            by_file.setdefault(p.file_id, []).append({"kind": p.kind, "detail": p.detail})
        print_json(
            {
                "ok": not problems,
                "files": [{"file_id": f, "problems": ps} for f, ps in by_file.items()],
            }
        )
    else:
        for p in problems:
            print(f"{p.file_id}: {p.kind}: {p.detail}")
        print(
            "fsck: clean" if not problems else f"fsck: {len(problems)} problem(s)", file=sys.stderr
        )
    return EXIT_PROBLEMS if problems else 0


def cmd_reindex(ctx: Context) -> int:
    """Rebuild the index from the files."""
    settings = ctx.settings()
    service = ctx.service(settings)
    total = sum(1 for _ in settings.data_dir.glob("raw/*/*.md"))
    with progress("reindex", total) as advance:
        report = service.upkeep.reindex(progress=advance)
    summary = {
        "scanned": report.scanned,
        "inserted": report.inserted,
        "updated": report.updated,
        "failed": [p.to_json() for p in report.failed],
    }
    if ctx.args.json:
        print_json(summary)
    else:
        print(
            f"reindex: {report.scanned} files, {report.inserted} inserted, "
            f"{report.updated} updated, {len(report.failed)} failed"
        )
        for p in report.failed:
            print(f"  {p.file_id}: {p.kind}: {p.detail}")
    return EXIT_PROBLEMS if report.failed else 0


def cmd_embed(ctx: Context) -> int:
    """Say how far the vectors are behind; with ``--backfill``, embed every flushed message
    that has no vector of the configured model, in this process (docs/search.md)."""
    service = ctx.service(ctx.settings())
    embedder = service.hybrid.embedder
    if embedder is None:
        raise errors.InvalidInput("no embedder is configured: set search_embedder (local, openai)")
    behind = service.hybrid.embedding_lag() or 0
    done, started = 0, time.monotonic()
    if ctx.args.backfill:
        with progress("embed", behind) as advance:
            while True:
                n = service.hybrid.embed_round()
                advance(n)
                done += n
                if n == 0:
                    break
    seconds = time.monotonic() - started
    report = {
        "model": embedder.model,
        "embedded": done,
        "seconds": round(seconds, 3),
        "messages_per_second": round(done / seconds, 1) if done else None,
        "embedding_lag": service.hybrid.embedding_lag(),
    }
    if ctx.args.json:
        print_json(report)
    else:
        rate = f" ({report['messages_per_second']} messages/s)" if done else ""
        print(
            f"embed: {done} messages embedded with {embedder.model} in {seconds:.1f} s{rate}; "
            f"{report['embedding_lag']} still without a vector"
        )
    return 0


def register(add: Add) -> None:
    """Declare the maintenance commands."""
    p = add("refine", cmd_refine, "refine a file's unrefined messages now (in this process)")
    p.add_argument("file_id", help="the file to refine")
    p.add_argument(
        "--full", action="store_true", help="re-refine from seq 1, replacing its L1 items"
    )
    add("migrate", cmd_migrate, "create or upgrade the index schema")
    p = add("archive", cmd_archive, "compress cold, fully refined files (zstd)")
    p.add_argument(
        "--older-than",
        type=float,
        metavar="DAYS",
        help="days unchanged (default: archive_after_days, 90)",
    )
    p.add_argument("--dry-run", action="store_true", help="only say what would be archived")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p = add("restore", cmd_restore, "move an archived file back to its live place")
    p.add_argument("file_id", help="the archived file")
    p = add("fsck", cmd_fsck, "check every file against the index (exit 1 on problems)")
    p.add_argument("--json", action="store_true", help="print the problems as JSON")
    p = add("reindex", cmd_reindex, "rebuild the index from the files")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p = add("embed", cmd_embed, "the vectors' lag; --backfill embeds what has none")
    p.add_argument(
        "--backfill",
        action="store_true",
        help="embed every flushed message without a vector of the model, in this process",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
