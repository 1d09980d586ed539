"""Putting messages in and reading them back: ``append``, ``upload``, ``ls``, ``cat``, ``ref``."""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

from pipeline import errors, paging, vocabulary
from pipeline.cli.context import Add, Context, print_json


def cmd_append(ctx: Context) -> int:
    """Append messages (a ``/v1/append`` body on stdin) and write them to the file."""
    from pipeline import validation

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
    from pipeline import validation

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
    """List sessions newest first, with titles, and say how many there are in all."""
    from pipeline import sessions

    a = ctx.args
    settings = ctx.settings()
    service = ctx.service(settings)
    filters = sessions.Filters(
        agent_id=a.agent_id, source_type=a.source_type, status=a.status, unflushed=True
    )
    limit = sessions.MAX_LIMIT if a.all else a.limit
    page = service.browsing.list_sessions(filters, offset=a.offset, limit=limit)
    found = list(page.sessions)
    while a.all and page.next_offset is not None:
        page = service.browsing.list_sessions(filters, offset=page.next_offset, limit=limit)
        found += page.sessions
    if a.json:
        print_json([{**s.file.to_json(), "title": s.title} for s in found])
        return 0
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table("when (UTC)", "agent", "title", "session_key", "msgs", box=None)
    table.add_column("file_id", no_wrap=True, min_width=36)  # whole: scripts copy it
    for s in found:
        # Text, not markup: a title like "[/bold]" or "[link=…]" is shown as sent.
        cells = (sessions.span(s), s.agent_id, printable(s.title), printable(s.session_key)[:40])
        table.add_row(*(Text(c) for c in cells), str(s.message_count), s.file_id)
    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(width=160, highlight=False)  # a pipe has no width
    console.print(table)
    first = a.offset + 1 if found else 0
    more = "" if a.all or a.offset + len(found) >= page.total else " (--all for every one)"
    noun = "session" if page.total == 1 else "sessions"
    console.print(
        Text(f"{first}–{a.offset + len(found)} of {page.total} {noun}, newest first{more}"),
        style="dim",
    )
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
        tool = f" ({printable(m.tool_name)})" if m.tool_name else ""
        print(f"{mark} {file_id}:{m.seq} {m.ts} {m.role}{tool}")
        print("  " + printable(m.content).replace("\n", "\n  "))
    return 0


def register(add: Add) -> None:
    """Declare the file commands."""
    add("append", cmd_append, "append messages: an /v1/append JSON body on stdin")
    p = add("upload", cmd_upload, "store a UTF-8 text file as an upload")
    p.add_argument("file", help="the text file to store")
    p.add_argument("--agent-id", required=True, help="the agent the upload belongs to")
    p.add_argument("--filename", help="name to record (default: the file's name)")
    p = add("ls", cmd_ls, "list sessions newest first, with titles and message counts")
    p.add_argument("--agent-id", help="only this agent's sessions")
    p.add_argument("--status", choices=vocabulary.STATUSES, help="only files in this status")
    p.add_argument(
        "--source-type", choices=vocabulary.SOURCE_TYPES, help="only sessions, uploads or external"
    )
    p.add_argument(
        "--limit",
        type=_count(paging.SESSIONS_MAX_LIMIT),
        default=paging.SESSIONS_DEFAULT_LIMIT,
        help=f"sessions to show (default {paging.SESSIONS_DEFAULT_LIMIT}, "
        f"at most {paging.SESSIONS_MAX_LIMIT})",
    )
    p.add_argument("--offset", type=_count(paging.SESSIONS_MAX_OFFSET, low=0), default=0,
                   help="skip this many of the newest (the next page)")  # fmt: skip
    p.add_argument("--all", action="store_true", help="every session, not one page")
    p.add_argument("--json", action="store_true", help="print JSON: the file rows with titles")
    p = add("cat", cmd_cat, "print a file's raw bytes")
    p.add_argument("file_id", help="the file's id (sgme ls shows it)")
    p = add("ref", cmd_ref, "show the message a source_ref (FILE_ID:SEQ) names")
    p.add_argument("ref", help="FILE_ID:SEQ, as search hits and L1 items give it")
    p.add_argument("--context", type=int, default=1, help="neighbours to show on each side")
    p.add_argument("--json", action="store_true", help="print JSON")


def _count(high: int, *, low: int = 1) -> Callable[[str], int]:
    """An argparse type: a whole number ``low..high``."""

    def parse(text: str) -> int:
        if not text.isascii() or not text.isdigit() or not low <= int(text) <= high:
            raise argparse.ArgumentTypeError(f"a whole number {low}..{high}, got {text!r}")
        return int(text)

    return parse


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """``text`` safe for a terminal: control characters (escape sequences that would move
    the cursor, retitle the window or hide text) shown as ``\\xNN`` instead of sent raw."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
