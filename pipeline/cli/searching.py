"""``sgme search``: full-text search over every raw message, from the command line."""

from __future__ import annotations

from pipeline import catalog, search
from pipeline.cli.context import Add, Context, print_json


def cmd_search(ctx: Context) -> int:
    """Print the messages that best match a query, each with its source_ref."""
    a = ctx.args
    settings = ctx.settings()
    filters = catalog.Filters(agent_id=a.agent_id, session_key=a.session_key, role=a.role)
    found = ctx.service(settings).search(a.query, filters, limit=a.limit)
    if a.json:
        print_json(search.hits_of(found))
        return 0
    from rich.console import Console
    from rich.text import Text

    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=160)  # a pipe has no width
    for hit in found:
        head = Text(f"{hit.source_ref}  {hit.ts}  {hit.role}  ", style="bold")
        head.append(Text(f"{hit.agent_id}/{hit.session_key}", style="dim"))
        console.print(head)
        console.print(Text("  " + hit.snippet))  # user text, never markup
    if not found:
        console.print("no message matches", style="dim")
    return 0


def register(add: Add) -> None:
    """Declare ``sgme search``."""
    p = add("search", cmd_search, "find messages by words and quoted phrases (any language)")
    p.add_argument("query", help='words (all must occur) and "quoted phrases"')
    p.add_argument("--agent-id")
    p.add_argument("--session-key")
    p.add_argument("--role", choices=("user", "assistant", "tool", "system"))
    p.add_argument("--limit", type=int, default=search.DEFAULT_LIMIT)
    p.add_argument("--json", action="store_true")
