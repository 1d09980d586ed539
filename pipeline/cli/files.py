"""Putting messages in and reading them back: ``append``, ``upload``, ``ls``, ``cat``, ``ref``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pipeline import errors, store, tables, validation
from pipeline.cli.context import Add, Context, print_json


def cmd_append(ctx: Context) -> int:
    """Append messages (a ``/v1/append`` body on stdin) and write them to the file."""
    settings = ctx.settings()
    try:
        body = json.load(sys.stdin)
    except json.JSONDecodeError as exc:
        raise errors.InvalidInput(f"stdin is not JSON: {exc}") from None
    parsed = validation.parse_append(body, settings.limits)
    done = ctx.service(settings).append(parsed, wait=True)
    print_json(done.to_json())
    return 0


def cmd_upload(ctx: Context) -> int:
    """Store a UTF-8 text file as an upload."""
    a = ctx.args
    settings = ctx.settings()
    path = Path(a.file)
    try:
        content = path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise errors.InvalidInput(f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise errors.InvalidInput(
            f"{path} is not UTF-8 text (bad byte at offset {exc.start}); uploads are text only"
        ) from None
    body = {"agent_id": a.agent_id, "filename": a.filename or path.name, "content": content}
    parsed = validation.parse_upload(body, settings.limits)
    done = ctx.service(settings).upload(parsed, wait=True)
    result = done.result
    print_json(
        {"file_id": result.file_id, "source_ref": result.source_refs[0], "redacted": done.redacted}
    )
    return 0


def cmd_ls(ctx: Context) -> int:
    """List files."""
    a = ctx.args
    settings = ctx.settings()
    rows = ctx.service(settings).list_files(
        agents=None if a.agent_id is None else [a.agent_id],
        status=a.status,
        source_type=a.source_type,
        limit=a.limit,
    )
    if a.json:
        print_json([row.to_json() for row in rows])
        return 0
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table("agent", "type", "session_key", "msgs", "status", "ended_at")
    table.add_column("file_id", no_wrap=True, min_width=36)  # whole: scripts copy it
    for row in rows:
        ended = row.ended_at.strftime("%Y-%m-%d %H:%M:%S") if row.ended_at else ""
        # Text, not markup: a session_key like "[/bold]" or "[link=…]" is shown as sent.
        cells = (row.agent_id, row.source_type, row.session_key[:40])
        table.add_row(
            *(Text(c) for c in cells), str(row.flushed_seq), row.status, ended, row.file_id
        )
    console = Console()
    if not console.is_terminal:
        console = Console(width=160)  # a pipe has no width: don't squeeze the columns
    console.print(table)
    return 0


def cmd_cat(ctx: Context) -> int:
    """Print a file's committed bytes."""
    settings = ctx.settings()
    _, chunks = ctx.service(settings).raw(ctx.args.file_id)
    for chunk in chunks:
        sys.stdout.buffer.write(chunk)
    sys.stdout.flush()
    return 0


def cmd_ref(ctx: Context) -> int:
    """Show the message a source_ref names, with its neighbours."""
    a = ctx.args
    settings = ctx.settings()
    found = ctx.service(settings).resolve(a.ref, context=a.context)
    file_id = found.file.file_id
    if a.json:
        print_json(
            {
                "message": found.message.to_json(file_id),
                "before": [m.to_json(file_id) for m in found.before],
                "after": [m.to_json(file_id) for m in found.after],
            }
        )
        return 0
    for m in (*found.before, found.message, *found.after):
        mark = ">" if m.seq == found.message.seq else " "
        tool = f" ({m.tool_name})" if m.tool_name else ""
        print(f"{mark} {file_id}:{m.seq} {m.ts} {m.role}{tool}")
        print("  " + m.content.replace("\n", "\n  "))
    return 0


def register(add: Add) -> None:
    """Declare the file commands."""
    add("append", cmd_append, "append messages: an /v1/append JSON body on stdin")
    p = add("upload", cmd_upload, "store a UTF-8 text file as an upload")
    p.add_argument("file")
    p.add_argument("--agent-id", required=True)
    p.add_argument("--filename", help="name to record (default: the file's name)")
    p = add("ls", cmd_ls, "list files")
    p.add_argument("--agent-id")
    p.add_argument("--status", choices=tables.STATUSES)
    p.add_argument("--source-type", choices=tuple(store.SUBDIRS))
    p.add_argument("--limit", type=int, default=100)
    p.add_argument("--json", action="store_true")
    p = add("cat", cmd_cat, "print a file's raw bytes")
    p.add_argument("file_id")
    p = add("ref", cmd_ref, "show the message a source_ref (FILE_ID:SEQ) names")
    p.add_argument("ref")
    p.add_argument("--context", type=int, default=1)
    p.add_argument("--json", action="store_true")
