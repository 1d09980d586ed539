"""``sgme secrets``: ``scan`` shows what the secret redaction would replace in a text, and why
(the rule that found each secret); ``policy`` shows or sets whether an agent's appends have
their secrets redacted.

``scan`` reads a file (or stdin, ``-``) and stores nothing: it is for people checking their own
text before they send it, or checking why something was redacted."""

from __future__ import annotations

import sys
from pathlib import Path

from pipeline import errors
from pipeline.cli.context import Add, Context, print_json

#: how much of a line ``scan`` shows around a secret's marker
PREVIEW = 100  #: characters


def _read(target: str) -> str:
    try:
        if target == "-":
            return sys.stdin.read()
        return Path(target).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise errors.InvalidInput(f"cannot read {target}: {exc}") from None


def _preview(redacted_line: str, at: int) -> str:
    """The redacted line, cut to :data:`PREVIEW` characters around ``at`` (its marker)."""
    if len(redacted_line) <= PREVIEW:
        return redacted_line
    start = max(0, min(at - PREVIEW // 3, len(redacted_line) - PREVIEW))
    cut = redacted_line[start : start + PREVIEW]
    return ("…" if start else "") + cut + ("…" if start + PREVIEW < len(redacted_line) else "")


def cmd_scan(ctx: Context) -> int:
    """Show what the secret redaction would replace in a text, and which rule found each."""
    from pipeline import redactor

    a = ctx.args
    text = _read(a.target)
    found = redactor.scan(text)
    if a.redacted:
        sys.stdout.write(redactor.replace(text, found).text)
        print(f"\n# {len(found)} secret(s) would be redacted", file=sys.stderr)
        return 0
    rows = []
    for f in found:
        line_start = text.rfind("\n", 0, f.start) + 1
        line_end = text.find("\n", f.start)
        line_end = len(text) if line_end < 0 else line_end
        on_line = [
            redactor.Finding(g.kind, g.start - line_start, min(g.end, line_end) - line_start)
            for g in found
            if line_start <= g.start < line_end
        ]
        redacted = redactor.replace(text[line_start:line_end], on_line).text
        # where this secret's marker stands in the redacted line
        at = (
            f.start
            - line_start
            + sum(
                len(redactor.marker(g.kind)) - (g.end - g.start)
                for g in on_line
                if g.end <= f.start - line_start
            )
        )
        rows.append(
            {
                "line": text.count("\n", 0, f.start) + 1,
                "column": f.start - line_start + 1,
                "start": f.start,
                "end": f.end,
                "length": f.end - f.start,
                "kind": f.kind,
                "rule": f.rule,
                "preview": _preview(redacted, at),
            }
        )
    if a.json:
        print_json(rows)
        return 0
    for row in rows:
        print(f"{row['line']}:{row['column']}\t{row['kind']}\t{row['rule']}\t{row['preview']}")
    print(f"# {len(rows)} secret(s) would be redacted", file=sys.stderr)
    return 0


def cmd_policy(ctx: Context) -> int:
    """Show or set whether an agent's appends have their secrets redacted."""
    from pipeline import audit

    a = ctx.args
    service = ctx.service(ctx.settings())
    a.agent_id = a.target
    if a.agent_id is None:
        if a.redact is not None:
            raise errors.InvalidInput("--redact needs an AGENT_ID")
        found = [p.to_json() for p in service.policies.listed()]
        if a.json:
            print_json({"default": service.settings.redact_secrets, "agents": found})
        else:
            print(f"redact_secrets setting: {service.settings.redact_secrets}")
            for p in found:
                print(f"{p['agent_id']}: redact_secrets={p['redact_secrets']} ({p['updated_by']})")
        return 0
    if a.redact is not None:
        value = {"on": True, "off": False, "default": None}[a.redact]
        policy = service.policies.set(a.agent_id, value, actor=audit.local_actor())
    else:
        policy = service.policies.get(a.agent_id)
    if a.json:
        print_json(policy.to_json())
    else:
        source = "the redact_secrets setting" if policy.own is None else "its own policy"
        state = "redacted" if policy.redact_secrets else "stored as sent"
        print(f"{policy.agent_id}: secrets are {state} ({source})")
    return 0


def cmd_secrets(ctx: Context) -> int:
    """Run ``secrets scan`` or ``secrets policy``."""
    a = ctx.args
    if a.action == "scan":
        if a.target is None:
            raise errors.InvalidInput("secrets scan needs a FILE (or - for stdin)")
        return cmd_scan(ctx)
    if a.redacted:
        raise errors.InvalidInput("--redacted goes with secrets scan")
    return cmd_policy(ctx)


def register(add: Add) -> None:
    """Declare ``sgme secrets``."""
    p = add(
        "secrets",
        cmd_secrets,
        "secret redaction: `secrets scan FILE` (- for stdin) lists what would be redacted in "
        "a text and the rule that found each (--redacted: print the text as it would be "
        "stored); `secrets policy [AGENT_ID] [--redact on|off|default]` shows or sets an "
        "agent's policy",
    )
    p.add_argument("action", choices=("scan", "policy"), help="scan a text, or show a policy")
    p.add_argument("target", nargs="?", help="scan: a text file or -; policy: an agent_id")
    p.add_argument("--redact", choices=("on", "off", "default"), help="policy: set it")
    p.add_argument(
        "--redacted", action="store_true", help="scan: print the text as it would be stored"
    )
    p.add_argument("--json", action="store_true", help="print JSON")
