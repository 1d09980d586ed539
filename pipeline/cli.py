"""The ``sgme`` command.

Every command takes ``--data-dir`` (env ``SGME_DATA_DIR``, default ``./data``),
``--database-url`` (env ``SGME_DATABASE_URL``, default a SQLite file in the data dir) and
``--config`` (env ``SGME_CONFIG``). Errors print one line to stderr and exit 2; ``fsck``
exits 1 when it finds a problem.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import json
import logging
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from pipeline import errors, index, integrity, journal, raw
from pipeline.settings import Settings

EXIT_PROBLEMS = 1
EXIT_ERROR = 2


def _settings(args: argparse.Namespace, **extra: Any) -> Settings:
    return Settings.load(
        args.config, data_dir=args.data_dir, database_url=args.database_url, **extra
    )


#: engines made by this run of :func:`main`, disposed when it returns (pooled psycopg
#: connections left to the garbage collector raise ResourceWarning)
_engines: list[sa.Engine] = []


def _engine(settings: Settings, *, migrate: bool = True) -> sa.Engine:
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    engine = index.create_engine(settings.index_url, busy_timeout=settings.sqlite_busy_timeout)
    _engines.append(engine)
    if migrate:
        index.migrate(engine)
    return engine


def _print_json(value: Any) -> None:
    json.dump(value, sys.stdout, ensure_ascii=False, indent=2)
    sys.stdout.write("\n")


@contextlib.contextmanager
def _progress(label: str, total: int) -> Iterator[Callable[[int], None]]:
    """A rich progress bar on stderr when it is a terminal; silent otherwise."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    console = Console(stderr=True)
    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=console,
        disable=not console.is_terminal,
        transient=True,
    ) as bar:
        task = bar.add_task(label, total=total)
        yield lambda n: bar.advance(task, n)


# ---------------------------------------------------------------------------------------------
# commands


def cmd_migrate(args: argparse.Namespace) -> int:
    settings = _settings(args)
    _engine(settings)
    print(f"index at {settings.index_url} is up to date")
    return 0


def _check_bind(settings: Settings) -> None:
    if not _is_loopback(settings.host) and not settings.trust_network:
        raise errors.InvalidInput(
            f"refusing to listen on {settings.host}: there is no authentication yet, so the "
            "server binds loopback addresses only (127.0.0.1, ::1, localhost) unless "
            "SGME_TRUST_NETWORK=true says every client that can reach it is trusted"
        )


def _celery(settings: Settings, engine: sa.Engine) -> Any:
    """Configure the Celery app for ``settings`` and share ``engine`` with its tasks."""
    from workers import app as worker_app
    from workers import tasks

    worker_app.configure(settings)
    worker_app.runtime().engine = engine
    return tasks


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from pipeline import api
    from workers import embedded

    settings = _settings(args, host=args.host, port=args.port, broker_url=args.broker_url)
    _check_bind(settings)
    engine = _engine(settings)
    tasks = _celery(settings, engine)
    runner = embedded.Embedded(data_dir=settings.data_dir, concurrency=args.concurrency)
    runner.start()
    app = api.create_app(
        settings,
        engine=engine,
        kick=lambda file_id: tasks.flush.delay(file_id),
        dispatch=lambda file_id: tasks.dispatch_refinements.delay(),
    )
    print(
        f"sgme: data in {settings.data_dir.resolve()}, index {settings.index_url}, "
        f"broker {settings.broker_url}",
        file=sys.stderr,
    )
    # uvicorn shuts down gracefully on SIGTERM and then raises the signal again; with the default
    # handler that kills the process before the embedded worker and beat are stopped (the task
    # in progress dies with it). Raising SystemExit instead runs the ``finally`` below.
    signal.signal(signal.SIGTERM, _exit_on_signal)
    try:
        uvicorn.run(app, host=settings.host, port=settings.port, log_level=args.log_level)
    finally:
        runner.stop()
    return 0


def _exit_on_signal(signum: int, _frame: Any) -> None:
    raise SystemExit(0)


def cmd_api(args: argparse.Namespace) -> int:
    import uvicorn

    from pipeline import api

    settings = _settings(args, host=args.host, port=args.port, broker_url=args.broker_url)
    _check_bind(settings)
    engine = _engine(settings, migrate=False)
    tasks = _celery(settings, engine)
    app = api.create_app(
        settings,
        engine=engine,
        kick=lambda file_id: tasks.flush.delay(file_id),
        dispatch=lambda file_id: tasks.dispatch_refinements.delay(),
    )
    uvicorn.run(app, host=settings.host, port=settings.port, log_level=args.log_level)
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    settings = _settings(args, broker_url=args.broker_url)
    tasks = _celery(settings, _engine(settings, migrate=False))
    argv = [
        "worker",
        "--queues",
        args.queues,
        "--loglevel",
        args.log_level.upper(),
        "--concurrency",
        str(args.concurrency),
        "--pool",
        args.pool,
        "-E",
    ]
    tasks.app.worker_main(argv)
    return 0


def cmd_beat(args: argparse.Namespace) -> int:
    settings = _settings(args, broker_url=args.broker_url)
    tasks = _celery(settings, _engine(settings, migrate=False))
    schedule = str(settings.data_dir / ".celerybeat-schedule")
    tasks.app.start(["beat", "--loglevel", args.log_level.upper(), "--schedule", schedule])
    return 0


def cmd_refine(args: argparse.Namespace) -> int:
    from pipeline import refine

    settings = _settings(args)
    engine = _engine(settings)
    if args.full:
        refine.request_full(engine, args.file_id)
    refiner = refine.load_refiner(settings.refiner, settings.refiner_options)
    stored = 0
    while True:
        c = refine.claim(engine, args.file_id, lease_seconds=settings.refine_lease_seconds)
        if c is None:
            break
        items = refine.run(
            engine,
            settings.data_dir,
            refiner,
            c,
            budget_tokens=settings.refine_window_tokens,
            overlap=settings.refine_overlap_messages,
        )
        if refine.commit(engine, c, items, refiner=settings.refiner):
            stored += len(items)
    row = raw.get_file(engine, args.file_id)
    _print_json(
        {
            "file_id": row.file_id,
            "status": row.status,
            "last_refined_seq": row.last_refined_seq,
            "items": stored,
        }
    )
    return 0


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def cmd_append(args: argparse.Namespace) -> int:
    settings = _settings(args)
    try:
        body = json.load(sys.stdin)
    except json.JSONDecodeError as exc:
        raise errors.InvalidInput(f"stdin is not JSON: {exc}") from None
    engine = _engine(settings)
    result = journal.ingest(engine, body, limits=settings.limits)
    journal.flush(engine, settings.data_dir, result.file_id, lock_timeout=settings.lock_timeout)
    _print_json(result.to_json() | {"status": raw.get_file(engine, result.file_id).status})
    return 0


def cmd_upload(args: argparse.Namespace) -> int:
    settings = _settings(args)
    path = Path(args.file)
    try:
        content = path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise errors.InvalidInput(f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise errors.InvalidInput(
            f"{path} is not UTF-8 text (bad byte at offset {exc.start}); uploads are text only"
        ) from None
    engine = _engine(settings)
    body = {"agent_id": args.agent_id, "filename": args.filename or path.name, "content": content}
    result = journal.ingest_upload(engine, body, limits=settings.limits)
    journal.flush(engine, settings.data_dir, result.file_id, lock_timeout=settings.lock_timeout)
    _print_json({"file_id": result.file_id, "source_ref": result.source_refs[0]})
    return 0


def cmd_ls(args: argparse.Namespace) -> int:
    settings = _settings(args)
    engine = _engine(settings)
    with index.transaction(engine) as conn:
        rows = index.list_files(
            conn,
            agent_id=args.agent_id,
            status=args.status,
            source_type=args.source_type,
            limit=args.limit,
        )
    if args.json:
        _print_json([row.to_json() for row in rows])
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table("file_id", "agent", "type", "session_key", "msgs", "status", "ended_at")
    for row in rows:
        ended = row.ended_at.strftime("%Y-%m-%d %H:%M:%S") if row.ended_at else ""
        table.add_row(
            row.file_id,
            row.agent_id,
            row.source_type,
            row.session_key[:40],
            str(row.flushed_seq),
            row.status,
            ended,
        )
    Console().print(table)
    return 0


def cmd_cat(args: argparse.Namespace) -> int:
    settings = _settings(args)
    engine = _engine(settings)
    data = raw.read_bytes(settings.data_dir, raw.get_file(engine, args.file_id))
    sys.stdout.buffer.write(data)
    sys.stdout.flush()
    return 0


def cmd_ref(args: argparse.Namespace) -> int:
    settings = _settings(args)
    engine = _engine(settings)
    found = raw.resolve(engine, settings.data_dir, args.ref, context=args.context)
    if args.json:

        def one(m: Any) -> dict[str, Any]:
            return {
                "seq": m.seq,
                "ts": m.ts,
                "role": m.role,
                "tool_name": m.tool_name,
                "content": m.content,
                "source_ref": f"{found.file.file_id}:{m.seq}",
            }

        _print_json(
            {
                "message": one(found.message),
                "before": [one(m) for m in found.before],
                "after": [one(m) for m in found.after],
            }
        )
        return 0
    for m in (*found.before, found.message, *found.after):
        mark = ">" if m.seq == found.message.seq else " "
        tool = f" ({m.tool_name})" if m.tool_name else ""
        print(f"{mark} {found.file.file_id}:{m.seq} {m.ts} {m.role}{tool}")
        print("  " + m.content.replace("\n", "\n  "))
    return 0


def cmd_fsck(args: argparse.Namespace) -> int:
    settings = _settings(args)
    engine = _engine(settings)
    with _progress("fsck", integrity.count_files(engine)) as advance:
        problems = integrity.fsck(engine, settings.data_dir, progress=advance)
    if args.json:
        by_file: dict[str, list[dict[str, str]]] = {}
        for p in problems:
            by_file.setdefault(p.file_id, []).append({"kind": p.kind, "detail": p.detail})
        _print_json(
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


def cmd_reindex(args: argparse.Namespace) -> int:
    settings = _settings(args)
    engine = _engine(settings)
    total = sum(1 for _ in settings.data_dir.glob("raw/*/*.md"))
    with _progress("reindex", total) as advance:
        report = integrity.reindex(
            engine, settings.data_dir, lock_timeout=settings.lock_timeout, progress=advance
        )
    summary = {
        "scanned": report.scanned,
        "inserted": report.inserted,
        "updated": report.updated,
        "failed": [p.to_json() for p in report.failed],
    }
    if args.json:
        _print_json(summary)
    else:
        print(
            f"reindex: {report.scanned} files, {report.inserted} inserted, "
            f"{report.updated} updated, {len(report.failed)} failed"
        )
        for p in report.failed:
            print(f"  {p.file_id}: {p.kind}: {p.detail}")
    return EXIT_PROBLEMS if report.failed else 0


def cmd_archive(args: argparse.Namespace) -> int:
    from pipeline import archive

    settings = _settings(args)
    engine = _engine(settings)
    days = settings.archive_after_days if args.older_than is None else args.older_than
    if days < 0:
        raise errors.InvalidInput(f"--older-than must be >= 0 days, got {days}")
    candidates = archive.cold_files(engine, older_than_days=days, limit=1_000_000)
    summary: dict[str, Any] = {"older_than_days": days, "dry_run": args.dry_run}
    if args.dry_run:
        with index.transaction(engine) as conn:
            sizes = [index.get_file(conn, file_id) for file_id in candidates]
        summary.update(files=len(candidates), bytes_before=sum(r.flushed_bytes for r in sizes if r))
    else:
        with _progress("archive", len(candidates)) as advance:
            report = archive.archive_cold(
                engine,
                settings.data_dir,
                older_than_days=days,
                level=settings.archive_level,
                threads=settings.archive_threads,
                workers=settings.archive_workers,
                lock_timeout=settings.lock_timeout,
                progress=advance,
            )
        summary.update(
            cleaned_up=report.cleaned_up,
            unrefined_cold_flagged=report.unrefined_flagged,
            files=report.files,
            bytes_before=report.bytes_before,
            bytes_after=report.bytes_after,
            ratio=report.ratio,
            failed=[{"file_id": f, "error": d} for f, d in report.failed],
        )
    if args.json:
        _print_json(summary)
    elif args.dry_run:
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


def cmd_restore(args: argparse.Namespace) -> int:
    from pipeline import archive

    settings = _settings(args)
    engine = _engine(settings)
    if not archive.restore(
        engine, settings.data_dir, args.file_id, lock_timeout=settings.lock_timeout
    ):
        raise errors.Conflict(f"file {args.file_id} is not archived")
    row = raw.get_file(engine, args.file_id)
    _print_json({"file_id": row.file_id, "status": row.status, "path": row.path})
    return 0


# ---------------------------------------------------------------------------------------------
# argument parsing


def build_parser() -> argparse.ArgumentParser:
    """The ``sgme`` argument parser."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--data-dir", help="data directory (env SGME_DATA_DIR, default ./data)")
    common.add_argument(
        "--database-url",
        help="index database URL (env SGME_DATABASE_URL, default SQLite in the data dir)",
    )
    common.add_argument("--config", help="YAML settings file (env SGME_CONFIG)")

    parser = argparse.ArgumentParser(prog="sgme", description="SGME L0: the raw layer.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(
        name: str, func: Callable[[argparse.Namespace], int], help: str
    ) -> argparse.ArgumentParser:
        p = sub.add_parser(name, parents=[common], help=help, description=help)
        p.set_defaults(func=func)
        return p

    for name, func, text in (
        ("serve", cmd_serve, "run the API with an in-process worker and beat (embedded)"),
        ("api", cmd_api, "run the API only; work goes to Celery workers via the broker"),
    ):
        p = add(name, func, text)
        p.add_argument("--host", help="address to bind (default 127.0.0.1)")
        p.add_argument("--port", type=int, help="port (default 8765)")
        p.add_argument("--broker-url", help="Celery broker (env SGME_BROKER_URL)")
        p.add_argument("--log-level", default="info")
        if name == "serve":
            p.add_argument("--concurrency", type=int, default=4, help="worker threads")
    p = add("worker", cmd_worker, "run a Celery worker (production)")
    p.add_argument("--broker-url", help="Celery broker (env SGME_BROKER_URL)")
    p.add_argument("--queues", default="append,refine,archive")
    p.add_argument("--concurrency", type=int, default=2)
    p.add_argument("--pool", default="prefork", choices=["prefork", "threads", "solo"])
    p.add_argument("--log-level", default="info")
    p = add("beat", cmd_beat, "run the Celery beat scheduler (exactly one per deployment)")
    p.add_argument("--broker-url", help="Celery broker (env SGME_BROKER_URL)")
    p.add_argument("--log-level", default="info")
    p = add("refine", cmd_refine, "refine a file's unrefined messages now (in this process)")
    p.add_argument("file_id")
    p.add_argument(
        "--full", action="store_true", help="re-refine from seq 1, replacing its L1 items"
    )
    add("migrate", cmd_migrate, "create or upgrade the index schema")
    add("append", cmd_append, "append messages: an /v1/append JSON body on stdin")
    p = add("upload", cmd_upload, "store a UTF-8 text file as an upload")
    p.add_argument("file")
    p.add_argument("--agent-id", required=True)
    p.add_argument("--filename", help="name to record (default: the file's name)")
    p = add("ls", cmd_ls, "list files")
    p.add_argument("--agent-id")
    p.add_argument("--status", choices=index.STATUSES)
    p.add_argument("--source-type", choices=("session", "upload", "external"))
    p.add_argument("--limit", type=int, default=100)
    p.add_argument("--json", action="store_true")
    p = add("cat", cmd_cat, "print a file's raw bytes")
    p.add_argument("file_id")
    p = add("ref", cmd_ref, "show the message a source_ref (FILE_ID:SEQ) names")
    p.add_argument("ref")
    p.add_argument("--context", type=int, default=1)
    p.add_argument("--json", action="store_true")
    p = add("archive", cmd_archive, "compress cold, fully refined files (zstd)")
    p.add_argument(
        "--older-than",
        type=float,
        metavar="DAYS",
        help="days unchanged (default: archive_after_days, 90)",
    )
    p.add_argument("--dry-run", action="store_true", help="only say what would be archived")
    p.add_argument("--json", action="store_true")
    p = add("restore", cmd_restore, "move an archived file back to its live place")
    p.add_argument("file_id")
    p = add("fsck", cmd_fsck, "check every file against the index (exit 1 on problems)")
    p.add_argument("--json", action="store_true")
    p = add("reindex", cmd_reindex, "rebuild the index from the files")
    p.add_argument("--json", action="store_true")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``sgme`` console script."""
    args = build_parser().parse_args(argv)
    level = str(getattr(args, "log_level", "info")).upper()
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # One log line per task is Flower's job; keep the console for warnings unless asked.
    if level != "DEBUG":
        logging.getLogger("celery").setLevel(logging.WARNING)
    try:
        return int(args.func(args))
    except errors.SgmeError as exc:
        # One line, even when the detail quotes a multi-line message (a YAML parser's).
        detail = " ".join(line.strip() for line in exc.detail.splitlines() if line.strip())
        print(f"sgme {args.command}: {detail}", file=sys.stderr)
        return EXIT_ERROR
    except OSError as exc:
        print(f"sgme {args.command}: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130
    finally:
        while _engines:
            _engines.pop().dispose()


if __name__ == "__main__":
    sys.exit(main())
