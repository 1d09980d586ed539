"""``sgme token create | ls | revoke``: the API's bearer tokens (:mod:`pipeline.auth`).

A secret is printed once, by ``create``, and never again: the index holds only its sha256.
Running servers see a new or revoked token within ``token_cache_seconds``.
"""

from __future__ import annotations

import argparse
import datetime as dt

from pipeline import vocabulary
from pipeline.cli.context import Add, Command, Context, print_json


def cmd_create(ctx: Context) -> int:
    """Make a token; the secret is shown this once (the last line of the plain output)."""
    a = ctx.args
    scopes = [s for given in a.scope for s in given.split(",")]
    service = ctx.service(ctx.settings())
    made = service.create_token(agent_ids=a.agent_id, scopes=scopes, name=a.name)
    token = made.token
    if a.json:
        print_json(
            {
                "token_id": token.token_id,
                "token": made.secret,
                "agent_ids": list(token.agent_ids),
                "scopes": list(token.scopes),
                "name": token.name,
            }
        )
        return 0
    print(f"token_id:  {token.token_id}")
    print(f"name:      {token.name}")
    print(f"agent_ids: {', '.join(token.agent_ids)}")
    print(f"scopes:    {', '.join(token.scopes)}")
    print("The token is shown only now; keep it secret (send it as Authorization: Bearer …):")
    print(made.secret)
    return 0


def cmd_ls(ctx: Context) -> int:
    """List tokens (never their secrets), revoked ones too."""
    from pipeline import tables

    found = ctx.service(ctx.settings()).list_tokens()
    if ctx.args.json:
        print_json([token.to_json() for token in found])
        return 0
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table("token_id", "name", "agent_ids", "scopes", "created", "last used", "revoked")

    def when(value: dt.datetime | None) -> str:
        return "-" if value is None else tables.iso(value)[:19] + "Z"

    for token in found:
        table.add_row(
            token.token_id,
            Text(token.name),  # as given, never Rich markup: "[red]x" shows as "[red]x"
            ",".join(token.agent_ids),
            ",".join(token.scopes),
            when(token.created_at),
            when(token.last_used_at),
            when(token.revoked_at),
        )
    Console(width=200).print(table)
    return 0


def cmd_revoke(ctx: Context) -> int:
    """Revoke a token: running servers refuse it within ``token_cache_seconds``."""
    from pipeline import tables

    token = ctx.service(ctx.settings()).revoke_token(ctx.args.token_id)
    assert token.revoked_at is not None
    print(f"revoked {token.token_id} at {tables.iso(token.revoked_at)}")
    return 0


def register(add: Add) -> None:
    """Declare ``sgme token`` and its subcommands."""
    p = add("token", cmd_create, "make, list and revoke the API's bearer tokens")
    sub = p.add_subparsers(dest="token_command", required=True, metavar="ACTION")

    def action(name: str, func: Command, text: str) -> argparse.ArgumentParser:
        q = sub.add_parser(name, help=text, description=text)
        # The common options after the action too (`sgme token ls --data-dir D`); SUPPRESS
        # keeps one given before the action from being reset to None.
        for flag in ("--data-dir", "--database-url", "--config"):
            q.add_argument(flag, default=argparse.SUPPRESS, help="as for every command")
        q.set_defaults(func=func)
        return q

    q = action("create", cmd_create, "make a token; its secret is printed this once")
    q.add_argument(
        "--agent-id",
        action="append",
        required=True,
        help="an agent the token may see and write as (repeat for more; '*' for every agent)",
    )
    q.add_argument(
        "--scope",
        action="append",
        required=True,
        help=f"comma-separated, from {','.join(vocabulary.SCOPES)} (admin implies the others)",
    )
    q.add_argument("--name", default="", help="what the token is for (shown by `token ls`)")
    q.add_argument("--json", action="store_true", help="print a JSON object")
    q = action("ls", cmd_ls, "list tokens (never their secrets)")
    q.add_argument("--json", action="store_true", help="print JSON")
    q = action("revoke", cmd_revoke, "revoke a token (running servers refuse it within seconds)")
    q.add_argument("token_id", help="the token's id (token ls shows it)")
