"""How the web view (and ``sgme show``) reads a message (:mod:`pipeline.ui.render`): by the
clients' convention of docs/format.md — calls with ids and fenced arguments, results with
ids, thinking, compaction summaries, escaped text, and the files written before call ids —
and every piece of HTML in a message shown as text."""

from __future__ import annotations

import pytest

from pipeline import document
from pipeline.importers import convention
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
