"""How the web view (and ``sgme show``) reads a message (:mod:`pipeline.ui.render`): by the
clients' convention of docs/format.md — calls with ids and fenced arguments, results with
ids, thinking, compaction summaries, escaped text, and the files written before call ids —
and every piece of HTML in a message shown as text."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline import document
from pipeline.importers import convention
from pipeline.settings import Ui
from pipeline.ui import render

FILE_ID = "0b6c3e6e-5d1f-4f1e-9a65-3b1c2d4e5f60"


def _message(role: str, content: str, tool_name: str | None = None) -> document.Message:
    return document.Message(role, content, "2026-08-03T11:20:00Z", tool_name, seq=7)


@pytest.mark.parametrize(
    ("role", "content", "tool_name", "expected"),
    [
        # a call as the convention writes it now: its id and its arguments in a fence
        (
            "assistant",
            convention.call_body("read_file", '{"path": "a.md"}', "toolu_01A"),
            "read_file",
            ("call", "read_file", '{"path": "a.md"}'),
        ),
        # and as files written before call ids and fences have it
        (
            "assistant",
            '**tool call**: read_file\n\n{"path": "a.md"}',
            "read_file",
            ("call", "read_file", '{"path": "a.md"}'),
        ),
        (
            "tool",
            convention.result_body("line one\nline two", "toolu_01A"),
            "read_file",
            ("result", "read_file", "line one\nline two"),
        ),
        ("tool", "no id here", "grep", ("result", "grep", "no id here")),
        # Codex's shell results are JSON: shown by their output text
        (
            "tool",
            convention.result_body('{"output":"a\\nb\\n","metadata":{"exit_code":0}}', "c1"),
            "shell",
            ("result", "shell", "a\nb\n"),
        ),
        (
            "assistant",
            "**thinking**\n\nthe user wants it short",
            None,
            ("thinking", None, "the user wants it short"),
        ),
        (
            "system",
            "**compaction summary**\n\nwe chose Postgres",
            None,
            ("summary", None, "we chose Postgres"),
        ),
        # text that only looks like a marker: escaped when written, shown as said
        (
            "assistant",
            convention.escape_text("**thinking**\nis a word I use"),
            None,
            ("text", None, "**thinking**\nis a word I use"),
        ),
        # a user's words are never a marker
        ("user", "**thinking**\n\nout loud", None, ("text", None, "**thinking**\n\nout loud")),
    ],
)
def test_what_a_message_is(
    role: str, content: str, tool_name: str | None, expected: tuple[str, str | None, str]
) -> None:
    assert render.classify(_message(role, content, tool_name)) == expected


def test_a_call_shows_its_arguments_highlighted_and_its_source_ref() -> None:
    body = convention.call_body("read_file", '{"path": "<a.md>"}', "toolu_01A")
    shown = render.show(_message("assistant", body, "read_file"), FILE_ID, chars=1000)
    assert (shown.kind, shown.name, shown.source_ref) == ("call", "read_file", f"{FILE_ID}:7")
    assert 'class="highlight"' in shown.body and "&lt;a.md&gt;" in shown.body
    assert "call id" not in shown.body and "```" not in shown.body


def test_html_in_a_message_is_text_and_a_long_one_is_rendered_in_part() -> None:
    text = "<script>alert(1)</script> <img src=x onerror=alert(1)> [x](javascript:alert(1))"
    shown = render.show(_message("assistant", text), FILE_ID, chars=1000)
    assert "<script" not in shown.body and "<img" not in shown.body
    assert "&lt;script&gt;" in shown.body and 'href="javascript:' not in shown.body
    long = render.show(_message("user", "*a* " + "<b>" * 10), FILE_ID, chars=4)
    assert long.body.startswith("<p><em>a</em></p>")
    assert '<pre class="rest">' in long.body and "&lt;b&gt;" in long.body


@pytest.fixture
def rule_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The work markdown-it does, counted: every call of one of its rules (core, block,
    inline) on the renderer the view uses. Deterministic, unlike the seconds it takes."""
    md = render._markdown.__wrapped__()
    calls = [0]

    def counted(fn: Any) -> Any:
        def rule(*args: Any, **kwargs: Any) -> Any:
            calls[0] += 1
            return fn(*args, **kwargs)

        return rule

    for ruler in (md.core.ruler, md.block.ruler, md.inline.ruler, md.inline.ruler2):
        for each in ruler.__rules__:
            each.fn = counted(each.fn)
        ruler.__compile__()
    monkeypatch.setattr(render, "_markdown", lambda: md)
    return calls


def test_a_pathological_page_costs_a_bounded_amount_of_work(rule_calls: list[int]) -> None:
    """One append of ten messages of ``"![" * 100000``: markdown-it makes about 21 rule
    calls for each of those 2,000,000 characters (a minute of CPU for the page). Within the
    page's budget of marks, the page costs what the budget allows, whatever it holds; the
    rest is shown as plain, escaped text."""
    budget = render.Budget(100_000)
    shown = [
        render.show(_message("user", "![" * 100_000), FILE_ID, chars=200_000, budget=budget)
        for _ in range(10)
    ]
    assert budget.ran_out and budget.spent == 100_000 and budget.left == 0
    assert rule_calls[0] <= 25 * 100_000
    # the first message is rendered up to the budget (half of it), the others as plain text
    assert shown[0].body.startswith("<p>![![") and '<pre class="rest">![![' in shown[0].body
    for later in shown[1:]:
        assert later.body == f'<pre class="rest">{"![" * 100_000}</pre>'
    # plain text costs no rendering: the count did not move past the first message
    before = rule_calls[0]
    render.show(_message("user", "![" * 100_000), FILE_ID, chars=200_000, budget=budget)
    assert rule_calls[0] == before


def test_an_ordinary_page_is_rendered_whole_within_the_budget(rule_calls: list[int]) -> None:
    """200 messages of prose, lists, links and code (the page size of ``ui_page_messages``):
    all of it Markdown, highlighted, well within the default budget."""
    text = (
        "We chose **PostgreSQL** for the index; see [the notes](https://example.org/n).\n\n"
        "- one `item`\n- two _items_\n\n```python\ndef f(x: int) -> dict[str, int]:\n"
        "    return {'a': x * 2}  # doubled\n```\n"
    )
    budget = render.Budget(Ui().render_page_marks)
    shown = [render.show(_message("assistant", text), FILE_ID, chars=200_000, budget=budget)]
    shown += [
        render.show(_message("assistant", text), FILE_ID, chars=200_000, budget=budget)
        for _ in range(199)
    ]
    assert not budget.ran_out and budget.spent == 200 * render.marks(text)
    assert all('class="rest"' not in s.body and 'class="highlight"' in s.body for s in shown)
    assert rule_calls[0] > 0


def test_a_call_past_the_budget_is_shown_unhighlighted() -> None:
    budget = render.Budget(3)
    body = convention.call_body("read_file", '{"path": "<a.md>"}', "toolu_01A")
    shown = render.show(
        _message("assistant", body, "read_file"), FILE_ID, chars=1000, budget=budget
    )
    assert shown.body.startswith('<pre class="code"><code>{&#34;path&#34;')
    assert "&lt;a.md&gt;" in shown.body and budget.ran_out
