"""Messages as the web view shows them: Markdown rendered with every piece of HTML in the text
escaped (messages hold HTML, scripts and Markdown, and all of it must show as text), code
highlighted by Pygments with CSS classes (no inline style: the Content-Security-Policy allows
none), and each message sorted into what it is — text, a tool call, a tool result, thinking,
a compaction summary — so all but the text can be folded.

What a message is, is the clients' convention (docs/format.md, "Tool calls"), read back by
:mod:`pipeline.importers.convention`: a call's name, call id and fenced arguments, a result's
call id and output, the marker line of thinking and of a compaction summary, and the one
backslash that keeps a text that looks like a marker from being one.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Literal

from markdown_it import MarkdownIt
from markupsafe import Markup, escape
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import get_lexer_by_name
from pygments.util import ClassNotFound

from pipeline import document, refs
from pipeline.importers import convention

Kind = Literal["text", "call", "result", "thinking", "summary"]

_FORMATTER = HtmlFormatter(cssclass="highlight", nowrap=True)


def pygments_css() -> str:
    """The stylesheet of the highlighted code (served as a static file)."""
    return str(_FORMATTER.get_style_defs(".highlight"))  # type: ignore[no-untyped-call]


def _highlight(code: str, lang: str, _attrs: str) -> str:
    """A fenced block's code as highlighted HTML; "" (markdown-it's own escaped ``<pre>``)
    when the language is unknown."""
    if not lang:
        return ""
    try:
        lexer = get_lexer_by_name(lang.split()[0], stripnl=False)
    except ClassNotFound:
        return ""
    # starts with "<pre": markdown-it then uses it as it is
    return f'<pre class="highlight"><code>{highlight(code, lexer, _FORMATTER)}</code></pre>\n'


@functools.cache
def _markdown() -> MarkdownIt:
    # "html": False is what keeps a message's own HTML from ever reaching the page as markup:
    # markdown-it escapes it like any other text. Links keep markdown-it's scheme check
    # (no javascript:, vbscript:, file:, data: other than images).
    md = MarkdownIt("commonmark", {"html": False, "linkify": False, "highlight": _highlight})
    md.enable("table").enable("strikethrough")

    def link_open(renderer: Any, tokens: Any, idx: int, options: Any, env: Any) -> str:
        tokens[idx].attrSet("rel", "noopener noreferrer nofollow")
        return str(renderer.renderToken(tokens, idx, options, env))

    md.add_render_rule("link_open", link_open)
    return md


def markdown(text: str, *, chars: int) -> Markup:
    """``text`` as HTML: Markdown rendered, every HTML tag in it escaped. Past ``chars``
    characters (``ui_render_chars``) the rest is shown as plain (escaped) text."""
    head, tail = text[:chars], text[chars:]
    html = _markdown().render(head)
    if tail:
        html += f'<pre class="rest">{escape(tail)}</pre>'
    return Markup(html)


@dataclasses.dataclass(frozen=True)
class Shown:
    """One message, ready for the template."""

    seq: int
    source_ref: str
    ts: str
    role: str
    kind: Kind
    name: str | None  #: the tool's name, for a call or a result
    body: Markup  #: rendered: Markdown for text and thinking, a code block for a call or result
    lines: int  #: lines of the content (a folded message says how long it is)


def classify(message: document.Message) -> tuple[Kind, str | None, str]:
    """What a message is, the tool's name (a call's or a result's), and the text to show: a
    call's arguments out of their fence, a result's output without its call id, the text of
    thinking or a summary without its marker line, a text without its escaping backslash."""
    content, role = message.content, message.role
    kind = convention.kind(role, content)
    if kind == "result":
        return "result", message.tool_name, convention.parse_result(content)[1]
    call = convention.parse_call(content) if kind == "call" else None
    if call is not None:
        return "call", call.name, call.arguments
    if kind == "thinking":
        return "thinking", None, convention.marked_text(content)
    if kind == "summary":
        return "summary", None, convention.marked_text(content)
    return "text", None, convention.unescape_text(content, role)


def _code(text: str, lang: str = "") -> Markup:
    if lang:
        done = _highlight(text, lang, "")
        if done:
            return Markup(done)
    return Markup('<pre class="code"><code>{}</code></pre>').format(text)


def show(message: document.Message, file_id: str, *, chars: int) -> Shown:
    """A message as the session page shows it (Markdown rendered up to ``chars``)."""
    kind, name, text = classify(message)
    if kind == "call":
        body = _code(text, "json" if text.lstrip().startswith(("{", "[")) else "")
    elif kind == "result":
        body = _code(text)
    else:
        body = markdown(text, chars=chars)
    return Shown(
        seq=message.seq,
        source_ref=refs.format(file_id, message.seq),
        ts=message.ts,
        role=message.role,
        kind=kind,
        name=name,
        body=body,
        lines=text.count("\n") + 1 if text else 0,
    )
