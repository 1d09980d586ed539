"""Reading the memory in a terminal: ``sgme show`` (a session as a conversation) and ``sgme l1``
(what refinement made of it, each item with the messages it stands on)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from pipeline import errors, refs
from pipeline.cli.context import Add, Context, print_json
from pipeline.cli.files import printable

if TYPE_CHECKING:
    # a command imports what it uses when it runs, so that ``sgme --help`` loads none of it
    from pipeline import sessions
    from pipeline.service import Service

PAGE = 500  #: messages read at a time
FOLDED_CHARS = 100  #: characters of a folded call, result or thinking shown on its line
#: what a folded message is called, by :func:`render.classify`'s kind (text is not folded)
_LABELS = {
    "call": "tool call",
    "result": "tool result",
    "thinking": "thinking",
    "summary": "compaction summary",
}


def _find(ctx: Context, service: Service, given: str) -> sessions.Session:
    """The session a session_key or a file_id names (``--agent-id`` picks among agents). A
    session_key first: Claude Code's and Codex's session ids are UUIDs, as file_ids are."""
    from pipeline import sessions

    a = ctx.args
    filters = sessions.Filters(agent_id=a.agent_id, session_key=given)
    page = service.browsing.list_sessions(filters, limit=20)
    if not page.sessions and re.fullmatch(refs.FILE_ID_PATTERN, given):
        try:
            return service.browsing.get_session(given)
        except errors.NotFound:
            pass  # said below, as for any other name
    if not page.sessions:
        raise errors.NotFound(f"no session with session_key or file_id {given!r}")
    if page.total > 1:
        which = ", ".join(f"{s.agent_id}/{s.source_type} {s.file_id}" for s in page.sessions)
        raise errors.InvalidInput(
            f"session_key {given!r} names {page.total} sessions ({which}): give the file_id, "
            "or --agent-id"
        )
    return page.sessions[0]


def cmd_show(ctx: Context) -> int:
    """Print a session as a conversation: tool calls, results and thinking folded to one
    line each unless ``--full``."""
    from pipeline import sessions

    a = ctx.args
    service = ctx.service(ctx.settings())
    session = _find(ctx, service, a.session)
    if a.json:
        listed = service.messages(session.file_id, after_seq=a.after, limit=min(a.limit, PAGE))
        print_json({**session.to_json(), "messages": [m.to_json(session.file_id) for m in listed]})
        return 0
    from rich.console import Console
    from rich.rule import Rule
    from rich.text import Text

    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=120)
    console.print(Text(printable(session.title or "(untitled)"), style="bold"))
    facts = (
        f"{session.session_key} · {session.agent_id} · {session.source_type} · "
        f"{sessions.span(session)} UTC · {session.message_count} messages · {session.file_id}"
    )
    console.print(Text(printable(facts), style="dim"))
    after, left = a.after, a.limit
    while left > 0:
        found = service.messages(session.file_id, after_seq=after, limit=min(PAGE, left))
        if not found:
            break
        for message in found:
            _print(console, Rule, Text, message, full=a.full)
        after, left = found[-1].seq, left - len(found)
    return 0


def _print(console: Any, rule: Any, text: Any, message: Any, *, full: bool) -> None:
    from pipeline.ui import render

    kind, name, body = render.classify(message)
    label = _LABELS.get(kind)
    head = f"{message.seq} · {message.ts.replace('T', ' ')[:19]} · {message.role}"
    if label:
        head += f" · {label}" + (f" {name}" if name else "")
    console.print(rule(text(printable(head)), align="left", style="dim"))
    if label and not full:
        lines = body.count("\n") + 1 if body else 0
        line = " ".join(body.split())
        if len(line) > FOLDED_CHARS:
            line = line[: FOLDED_CHARS - 1] + "…"
        note = f"  ({lines} lines; --full shows them)" if lines > 1 else ""
        console.print(text(f"▸ {printable(line)}{note}", style="dim"))
        return
    console.print(text(printable(body)))


def cmd_l1(ctx: Context) -> int:
    """Print L1 items, oldest first, each with the source_refs it stands on."""
    a = ctx.args
    service = ctx.service(ctx.settings())
    agents = None if a.agent_id is None else [a.agent_id]
    if a.file_id is not None:
        refs.check_file_id(a.file_id)
    items = service.l1_items(file_id=a.file_id, agents=agents, after=a.after, limit=a.limit)
    if a.json:
        print_json([item.to_json() for item in items])
        return 0
    from rich.console import Console
    from rich.text import Text

    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=160)
    for item in items:
        shown = item.to_json()
        line = Text(f"{shown['id']} ", style="dim")
        line.append(Text(f"{item.kind}: ", style="bold"))
        line.append(Text(printable(item.content)))
        console.print(line)
        console.print(Text("    from " + " ".join(shown["source_refs"]), style="dim"))
    if not items:
        console.print("no L1 items", style="dim")
    elif len(items) == a.limit:
        console.print(Text(f"more after --after {items[-1].id}"), style="dim")
    return 0


def register(add: Add) -> None:
    """Declare ``sgme show`` and ``sgme l1``."""
    p = add("show", cmd_show, "print a session as a conversation, tool calls folded")
    p.add_argument(
        "session", metavar="SESSION_OR_FILE", help="a session_key, else a file_id (tried second)"
    )
    p.add_argument("--agent-id", help="the agent whose session_key it is (when several have it)")
    p.add_argument("--full", action="store_true", help="unfold tool calls, results and thinking")
    p.add_argument("--after", type=int, default=0, help="start after this message number")
    p.add_argument("--limit", type=int, default=10_000, help="messages to print at most")
    p.add_argument("--json", action="store_true", help="print the session and messages as JSON")
    p = add("l1", cmd_l1, "list L1 items (what refinement made), with their source_refs")
    p.add_argument("--file-id", help="only the items of this file")
    p.add_argument("--agent-id", help="only this agent's items")
    p.add_argument("--after", type=int, default=0, help="items with an id above this")
    p.add_argument("--limit", type=int, default=100, help="items to print at most")
    p.add_argument("--json", action="store_true", help="print JSON")
