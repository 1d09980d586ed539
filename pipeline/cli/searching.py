"""``sgme search``: full-text search over every raw message, from the command line."""

from __future__ import annotations

import argparse
import datetime as dt
import re
from typing import TYPE_CHECKING

from pipeline import clock, paging, vocabulary
from pipeline.cli.context import Add, Context, print_json

if TYPE_CHECKING:
    from pipeline import terms


def cmd_search(ctx: Context) -> int:
    """Print the messages that best match a query, each with its source_ref."""
    from pipeline import catalog, search

    a = ctx.args
    settings = ctx.settings()
    filters = catalog.Filters(
        agent_id=a.agent_id,
        session_key=a.session_key,
        file_id=a.file_id,
        role=a.role,
        since=a.since,
        until=a.until,
    )
    query = " ".join(a.query)
    match: terms.Match = "all" if a.all else "any"
    service = ctx.service(settings)
    # a date the query names is a window, as GET /v1/search makes it (docs/search.md)
    window = service.window(query) if match == "any" else None
    found, how = service.hybrid.ranked(
        query, filters, limit=a.limit, match=match, mode=a.mode, window=window
    )
    if a.json:
        print_json({**search.hits_of(found, window), "ranking": how.to_json()})
        return 0
    from rich.console import Console
    from rich.text import Text

    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=160)  # a pipe has no width
    for hit in found:
        head = Text(f"{hit.source_ref}  {hit.ts}  {hit.role}  ", style="bold")
        head.append(Text(visible(f"{hit.agent_id}/{hit.session_key}"), style="dim"))
        console.print(head)
        console.print(Text("  " + visible(hit.snippet)))  # user text, never markup
    if not found:
        console.print("no message matches", style="dim")
    if how.fallback:
        console.print(f"ranked by words only: {how.fallback}", style="dim")
    return 0


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def visible(text: str) -> str:
    """``text`` with its control characters escaped (``\x1b``): a message may hold terminal
    escape sequences, which must not move the cursor or recolour the terminal of the person
    reading the hits."""
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


def register(add: Add) -> None:
    """Declare ``sgme search``."""
    p = add("search", cmd_search, "find the messages that answer a question (any language)")
    p.add_argument(
        "query",
        nargs="+",
        metavar="WORD",
        help='a question, words and "quoted phrases" (quote a phrase for the shell too: '
        "'\"green tea\"')",
    )
    p.add_argument(
        "--all",
        action="store_true",
        help="only messages holding every word and phrase (default: ranked by relevance)",
    )
    p.add_argument("--agent-id", help="only this agent's messages")
    p.add_argument("--session-key", help="only this session's messages")
    p.add_argument("--file-id", help="only this file's messages")
    p.add_argument("--role", choices=vocabulary.ROLES, help="only this role")
    p.add_argument("--since", type=_time, help="only messages at or after (ISO 8601; UTC if bare)")
    p.add_argument("--until", type=_time, help="only messages at or before (ISO 8601)")
    p.add_argument(
        "--limit",
        type=int,
        default=paging.SEARCH_DEFAULT_LIMIT,
        help=f"hits to show (default {paging.SEARCH_DEFAULT_LIMIT}, "
        f"at most {paging.SEARCH_MAX_LIMIT})",
    )
    p.add_argument(
        "--mode",
        choices=vocabulary.SEARCH_MODES,
        help="lexical: by words only; hybrid: words and meaning fused (without "
        "search_embedder set: by words, and it says so); default: hybrid when an embedder "
        "is set",
    )
    p.add_argument("--json", action="store_true", help="print the hits and how they were ranked")


def _time(text: str) -> dt.datetime:
    """An argparse type: an ISO 8601 date or time, as the naive UTC the index keeps."""
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO 8601 date or time: {text!r}") from None
    return clock.naive_utc(when)
