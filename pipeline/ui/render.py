"""Messages as the web view shows them: Markdown rendered with every piece of HTML in the text
escaped (messages hold HTML, scripts and Markdown, and all of it must show as text), code
highlighted by Pygments with CSS classes (no inline style: the Content-Security-Policy allows
none), and each message sorted into what it is — text, a tool call, a tool result, thinking,
a compaction summary — so all but the text can be folded.

What a message is, is the clients' convention (docs/format.md, "Tool calls"), read back by
:mod:`pipeline.convention`: a call's name, call id and fenced arguments, a result's
call id and output, the marker line of thinking and of a compaction summary, and the one
backslash that keeps a text that looks like a marker from being one.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import re
from typing import Any, Literal

from markdown_it import MarkdownIt
from markupsafe import Markup, escape
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import get_lexer_by_name
from pygments.util import ClassNotFound

from pipeline import convention, document, refs

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


#: the characters Markdown acts on: markdown-it's inline parser stops at each one (its
#: ``isTerminatorChar``) and tries its rules there, and a line break starts the block rules.
#: Rendering a text costs about as much as it holds of them (8–15 µs each, with the
#: highlighting of its code; a run of plain words next to nothing), whatever they spell:
#: ``"![" * 100000`` is 200,000 of them
MARKS = "\n!#$%&*+-:<=>@[\\]^_`{}~"
_NOT_MARKS = str.maketrans("", "", MARKS)
_MARK = re.compile(f"[{re.escape(MARKS)}]")


def marks(text: str) -> int:
    """How many :data:`MARKS` ``text`` holds: what rendering it costs."""
    return len(text) - len(text.translate(_NOT_MARKS))


class Budget:
    """What one page may still render: ``left`` marks (:data:`MARKS`, ``ui_render_page_marks``).
    Markdown and highlighting past it are not done: that text is shown as plain (escaped)
    text, so a page costs a bounded amount of work however its messages are made."""

    def __init__(self, left: int) -> None:
        self.left = left
        self.spent = 0
        self.ran_out = False  #: some text of the page was shown plain for want of budget

    def take(self, text: str) -> int:
        """How much of ``text`` (its first characters) may be rendered; its marks are spent.
        A text that does not fit whole is cut at its last line break before the budget ran
        out (or where it ran out, on a line that long)."""
        cost = marks(text)
        if cost <= self.left:
            self.left -= cost
            self.spent += cost
            return len(text)
        self.ran_out = True
        past = next(itertools.islice(_MARK.finditer(text), self.left, None))
        line = text.rfind("\n", 0, past.start())
        cut = line + 1 if line >= 0 else past.start()
        self.spent += marks(text[:cut])
        self.left = 0
        return cut


def markdown(text: str, *, chars: int, budget: Budget | None = None) -> Markup:
    """``text`` as HTML: Markdown rendered, every HTML tag in it escaped. Past ``chars``
    characters (``ui_render_chars``), or once ``budget`` is spent, the rest is shown as plain
    (escaped) text."""
    head, tail = text[:chars], text[chars:]
    if budget is not None:
        fit = budget.take(head)
        head, tail = head[:fit], head[fit:] + tail
    html = _markdown().render(head) if head else ""
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
    call's arguments out of their fence, a result's output without its call id (a Codex
    result's JSON by its output text: :func:`convention.result_output`), the text of
    thinking or a summary without its marker line, a text without its escaping backslash."""
    content, role = message.content, message.role
    kind = convention.kind(role, content)
    if kind == "result":
        output = convention.result_output(convention.parse_result(content)[1])
        return "result", message.tool_name, output
    call = convention.parse_call(content) if kind == "call" else None
    if call is not None:
        return "call", call.name, call.arguments
    if kind == "thinking":
        return "thinking", None, convention.marked_text(content)
    if kind == "summary":
        return "summary", None, convention.marked_text(content)
    return "text", None, convention.unescape_text(content, role)


def _code(text: str, lang: str = "", *, budget: Budget | None = None) -> Markup:
    """A block of code, highlighted as ``lang`` when the budget holds all of it."""
    if lang and (budget is None or budget.take(text) == len(text)):
        done = _highlight(text, lang, "")
        if done:
            return Markup(done)
    return Markup('<pre class="code"><code>{}</code></pre>').format(text)


def show(
    message: document.Message, file_id: str, *, chars: int, budget: Budget | None = None
) -> Shown:
    """A message as the session page shows it (Markdown rendered up to ``chars``, and within
    the page's ``budget``)."""
    kind, name, text = classify(message)
    if kind == "call":
        body = _code(text, "json" if text.lstrip().startswith(("{", "[")) else "", budget=budget)
    elif kind == "result":
        body = _code(text)
    else:
        body = markdown(text, chars=chars, budget=budget)
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
