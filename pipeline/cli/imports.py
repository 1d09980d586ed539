"""``sgme import``: the transcripts people already have (Hermes ``state.db``, Codex and Claude
Code logs, ShareGPT and OpenAI chat datasets), into the data directory and index the command
is given, through the same ingest path as the API.

Each source turn is one append with a deterministic idempotency key
(:mod:`pipeline.importers.runner`), sent through :meth:`pipeline.service.Service.append` — the
API's validation, backlog and disk admission, and journal — and each file that got new
messages is flushed once its session is in, so the import's files are written as it goes.
Running the same import again writes nothing; an interrupted one, run again, completes.

Progress is counted in source records (a conversation of a dataset, a transcript): a live line
on a terminal, and a plain line every :data:`PLAIN_EVERY` seconds otherwise (a log, a pipe).
Exit codes: 0 when everything was imported (records with nothing in them are counted, not
errors; units erased on purpose are counted, not written), 1 when some records could not be
read or were refused (they are listed, each by its line; every other record is imported), 2
when the import could not run or stopped. File names and details are printed with control
characters escaped, so a hostile name cannot drive the terminal.
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline import errors, importers
from pipeline.cli.context import EXIT_PROBLEMS, Add, Context
from pipeline.importers import runner

if TYPE_CHECKING:
    from pipeline.service import Service

PLAIN_EVERY = 10.0  #: seconds between plain progress lines when stderr is not a terminal
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def cmd_import(ctx: Context) -> int:
    """Import one source's transcripts."""
    from pipeline import validation

    a = ctx.args
    reader = importers.reader(a.source)
    path = Path(a.path)
    agent_id = validation.check_agent_id(a.agent_id or a.source)
    settings = ctx.settings()
    service = None if a.dry_run else ctx.service(settings)
    touched: set[str] = set()

    def ingest(body: dict[str, Any]) -> Any:
        assert service is not None  # a dry run sends nothing
        result = service.append(validation.parse_append(body, settings.limits)).result
        touched.add(result.file_id)
        return result

    def flush(file_id: str) -> None:
        assert service is not None
        service.flush(file_id)

    try:
        with _progress(f"import {a.source}") as show:
            report = runner.run(
                reader,
                path,
                agent_id=agent_id,
                ingest=ingest,
                flush=flush,
                progress=show,
                dry_run=a.dry_run,
                max_messages=settings.limits.max_append_messages,
                max_bytes=settings.limits.max_append_bytes,
            )
        if service is not None:
            _flush_leftovers(service, touched)
    except errors.TransientError as exc:
        exc.detail += (
            "; the import stopped there. Nothing acknowledged is lost: run the same import "
            "again to continue"
        )
        raise
    _print(report, as_json=a.json, dry_run=a.dry_run)
    return EXIT_PROBLEMS if report.errors else 0


def _flush_leftovers(service: Service, touched: set[str]) -> None:
    """Write what earlier runs acknowledged but never wrote to the import's files (a run
    stopped between an append and its flush): this run replays those keys, so the runner
    has nothing new to flush there, and with no server running nothing else would."""
    for file_id in sorted(touched & set(service.sweep(age=0.0))):
        service.flush(file_id)


@contextlib.contextmanager
def _progress(label: str) -> Iterator[Callable[[runner.Progress], None]]:
    """A live count of records on a terminal (rich); a plain line every
    :data:`PLAIN_EVERY` seconds on stderr otherwise."""
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    if not console.is_terminal:
        last = time.monotonic()

        def plain(event: runner.Progress) -> None:
            nonlocal last
            if time.monotonic() - last >= PLAIN_EVERY:
                last = time.monotonic()
                print(f"sgme {label}: {_status(event)}", file=sys.stderr, flush=True)

        yield plain
        return
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TextColumn("{task.fields[status]}", markup=False),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as bar:
        task = bar.add_task(label, total=None, status="")

        def live(event: runner.Progress) -> None:
            bar.update(task, status=_status(event))

        yield live


def _status(event: runner.Progress) -> str:
    report = event.report
    return (
        f"{report.records} records, {event.files_done}/{event.files_total} files, "
        f"{report.messages} messages new, {report.replayed} already imported"
    )


def printable(text: str) -> str:
    """``text`` with control characters (terminal escape sequences among them) escaped."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def _print(report: runner.Report, *, as_json: bool, dry_run: bool) -> None:
    """The summary on stdout (``--json``: one line, the last), the problems on stderr."""
    if as_json:
        print(json.dumps(report.to_json(), ensure_ascii=False))
        return
    for problem in report.errors:
        print(f"sgme import: {printable(str(problem))}", file=sys.stderr)
    verb = "would import" if dry_run else "imported"
    refused = len(report.errors) - report.unreadable
    print(
        f"{verb} {report.messages} messages into {report.files} files "
        f"({report.replayed} already imported, {report.erased} erased, "
        f"{report.skipped} skipped on purpose, {_count(report.empty, 'empty record')}, "
        f"{_count(report.unreadable, 'unreadable record')}, {refused} refused)"
    )


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def register(add: Add) -> None:
    """Declare ``sgme import``."""
    p = add("import", cmd_import, "import transcripts: Hermes, Codex, Claude Code, chat datasets")
    p.add_argument("source", choices=tuple(importers.SOURCES), help="what PATH holds")
    p.add_argument(
        "path",
        metavar="PATH",
        help="a file, or a directory to walk (hermes: a state.db or a Hermes home)",
    )
    p.add_argument("--agent-id", help="the agent_id to store them under (default: the source)")
    p.add_argument(
        "--dry-run", action="store_true", help="read and report, send nothing (no index needed)"
    )
    p.add_argument(
        "--json",
        action="store_true",
        help='print {"files", "messages", "replayed", "erased", "skipped", "unreadable", '
        '"empty", "errors"} as the last line',
    )
