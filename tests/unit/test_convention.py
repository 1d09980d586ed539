"""The tool-call convention: call bodies (fenced arguments, call ids) parse back, results name
the call they answer, thinking and summaries are marked, text never reads as any of them, old
bodies still read, keys stay the keys of earlier versions, batches respect the append limits."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from pipeline.importers import chat, convention


def test_call_body_round_trips() -> None:
    message = convention.tool_call("read_file", '{"path": "a.txt"}', "2026-08-03T11:18:06Z", "c1")
    assert message == {
        "role": "assistant",
        "content": '**tool call**: read_file\n**call id**: c1\n\n```json\n{"path": "a.txt"}\n```',
        "ts": "2026-08-03T11:18:06Z",
    }
    assert convention.parse_call(message["content"]) == convention.Call(
        "read_file", '{"path": "a.txt"}', "c1"
    )
    assert convention.parse_tool_call(message["content"]) == ("read_file", '{"path": "a.txt"}')
    assert convention.tool_call("now", "", None)["content"] == "**tool call**: now"
    assert convention.parse_tool_call("**tool call**: now") == ("now", "")
    assert convention.kind("assistant", message["content"]) == "call"


def test_raw_arguments_get_a_plain_fence_longer_than_any_backticks_in_them() -> None:
    raw = "*** Begin Patch\n```py\nx = 1\n```\n````\n"
    body = convention.tool_call("apply_patch", raw, None)["content"]
    assert body == f"**tool call**: apply_patch\n\n`````\n{raw}\n`````"
    assert convention.parse_tool_call(body) == ("apply_patch", raw)


@given(st.text(), st.one_of(st.none(), st.text(min_size=1)))
def test_any_arguments_round_trip(arguments: str, identifier: str | None) -> None:
    arguments = convention.clean_text(arguments)
    body = convention.tool_call("t", arguments, None, identifier)["content"]
    found = convention.parse_call(body)
    assert found is not None and found.arguments == arguments
    assert found.call_id == convention.call_id(identifier)


def test_calls_written_before_fences_and_ids_still_read() -> None:
    assert convention.parse_call('**tool call**: read_file\n\n{"path": "a"}') == (
        convention.Call("read_file", '{"path": "a"}', None)
    )


def test_arguments_that_are_not_a_string_are_json() -> None:
    body = convention.tool_call("edit", {"path": "é", "n": 1}, None)["content"]
    assert convention.parse_tool_call(body) == ("edit", '{"path": "é", "n": 1}')
    assert "```json\n" in body


def test_results_name_their_call_and_outputs_that_look_like_it_are_escaped() -> None:
    result = convention.tool_result("read_file", "hello", None, "c1")
    assert result == {
        "role": "tool",
        "content": "**call id**: c1\n\nhello",
        "tool_name": "read_file",
    }
    assert convention.parse_result(result["content"]) == ("c1", "hello")
    sly = convention.tool_result("x", "**call id**: fake\n\nout", None)["content"]
    assert sly == "\\**call id**: fake\n\nout"
    assert convention.parse_result(sly) == (None, "**call id**: fake\n\nout")


CODEX_SHELL = '{"output":"total 12\\nfile_a\\n","metadata":{"exit_code":0,"duration_seconds":0.1}}'


def test_a_codex_shell_result_reads_as_its_output_text() -> None:
    """Codex records its shell tools' results as JSON: a reader shows the output text (its
    exit code when it is not 0); what is stored stays as sent."""
    assert convention.result_output(CODEX_SHELL) == "total 12\nfile_a\n"
    failed = '{"output": "no such file\\n", "metadata": {"exit_code": 2}}'
    assert convention.result_output(failed) == "no such file\n(exit code 2)"
    assert convention.result_output('{"output": "bare"}') == "bare"
    body = convention.result_body(CODEX_SHELL, "call_1")
    assert convention.parse_result(body) == ("call_1", CODEX_SHELL)  # stored as sent
    # any other output, JSON or not, reads as it is
    for other in (
        '{"output": "x", "error": "y"}',
        '{"output": 3}',
        '["output"]',
        '{"output": "x"',
        "plain text",
        "",
    ):
        assert convention.result_output(other) == other


def test_thinking_and_summaries_are_marked() -> None:
    thought = convention.thinking("Let me check.", "2026-08-03T11:18:06Z")
    assert thought == {
        "role": "assistant",
        "content": "**thinking**\n\nLet me check.",
        "ts": "2026-08-03T11:18:06Z",
    }
    assert convention.kind("assistant", thought["content"]) == "thinking"
    assert convention.marked_text(thought["content"]) == "Let me check."
    assert convention.thinking("  ", None) is None
    summary = convention.summary("We fixed the bug.", None)
    assert summary == {"role": "system", "content": "**compaction summary**\n\nWe fixed the bug."}
    assert convention.kind("system", summary["content"]) == "summary"


def test_text_that_looks_marked_is_escaped_where_the_marker_means_something() -> None:
    for role, text in (
        ("assistant", "**tool call**: not really\n\nhello"),
        ("assistant", "**thinking**\n\nnot really"),
        ("system", "**compaction summary**"),
    ):
        message = convention.text_message(role, text, None)
        assert message["content"] == "\\" + text
        assert convention.kind(role, message["content"]) == "text"
        assert convention.unescape_text(message["content"], role) == text
    # a user message is never marked, so it is left alone
    text = "**tool call**: x"
    assert convention.text_message("user", text, None)["content"] == text
    assert convention.text_message("assistant", "**thinking** hard", None)["content"] == (
        "**thinking** hard"
    )


@given(st.text(), st.sampled_from(["assistant", "tool", "system", "user"]))
def test_escape_is_reversible(text: str, role: str) -> None:
    escaped = convention.escape_text(text, role)
    assert convention.unescape_text(escaped, role) == text
    assert convention.kind(role, escaped) in ("text", "result")
    assert convention.parse_tool_call(convention.escape_text(text)) is None


def test_assistant_turn_is_text_then_calls_in_order() -> None:
    messages = convention.assistant_turn(
        "Let me look.", [("a", "{}", "1"), ("b", '{"x":1}', "2")], None
    )
    assert [m["content"] for m in messages] == [
        "Let me look.",
        "**tool call**: a\n**call id**: 1\n\n```json\n{}\n```",
        '**tool call**: b\n**call id**: 2\n\n```json\n{"x":1}\n```',
    ]
    assert convention.assistant_turn(None, [("a", None)], None)[0]["content"] == "**tool call**: a"


def test_keys_hash_what_a_turn_says_as_earlier_versions_wrote_it() -> None:
    """A turn imported before fences, call ids and thinking keeps its key: the new body of the
    same turn is then a conflict on that key, which clients take as already stored."""
    when = "2026-08-03T11:18:06Z"
    old: list[dict[str, Any]] = [
        {"role": "user", "content": "List files", "ts": when},
        {"role": "assistant", "content": '**tool call**: ls\n\n{"d": "."}', "ts": when},
        {"role": "tool", "content": "a.txt", "tool_name": "ls", "ts": when},
        {"role": "assistant", "content": "\\**tool call**: joke", "ts": when},
    ]
    thought = convention.thinking("They want a listing.", when)
    assert thought is not None
    new = [
        old[0],
        thought,
        convention.tool_call("ls", '{"d": "."}', when, "c1"),
        convention.tool_result("ls", "a.txt", when, "c1"),
        convention.text_message("assistant", "**tool call**: joke", when),
    ]
    assert convention.key("claude-code", "s", "u1", new) == convention.key(
        "claude-code", "s", "u1", old
    )
    assert convention.key("claude-code", "s", "u1", new[:3]) != convention.key(
        "claude-code", "s", "u1", old
    )


def test_hermes_keys_ignore_times() -> None:
    one = [{"role": "user", "content": "hi", "ts": "2026-08-03T11:18:06Z"}]
    later = [{"role": "user", "content": "hi", "ts": "2027-01-01T00:00:00Z"}]
    assert convention.hermes_key("s", 3, one) == convention.hermes_key("s", 3, later)
    assert convention.hermes_key("s", 3, one).startswith("hermes:s:3:")
    assert convention.hermes_key("s", 3, one) != convention.hermes_key("s", 4, one)


def test_chat_turns_are_numbered_by_their_user_message() -> None:
    messages = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
    ]
    assert [(n, len(t)) for n, t in chat.turns(messages)] == [(0, 1), (1, 2), (2, 1)]


def test_tool_names_are_one_line() -> None:
    assert convention.tool_name("bad\nname") == "bad name"
    assert convention.tool_name("") == "tool"
    assert len(convention.tool_name("x" * 500)) == 200


def test_text_the_format_refuses_is_made_storable() -> None:
    assert convention.clean_text("a\x00b") == "a\ufffdb"
    assert convention.clean_text("a\ud800b") == "a\ufffdb"
    parts = [{"type": "text", "text": "one"}, {"type": "image_url"}, {"type": "text", "text": "2"}]
    assert convention.content_text(parts) == "one\n[image_url]\n2"


def test_timestamps() -> None:
    assert convention.ts(1785755886.25) == "2026-08-03T11:18:06.25Z"
    assert convention.ts(1785755886250) == "2026-08-03T11:18:06.25Z"  # milliseconds
    assert convention.ts("2026-08-03T13:18:06+02:00") == "2026-08-03T11:18:06Z"
    assert convention.ts("2026-08-03T11:18:06") == "2026-08-03T11:18:06Z"
    assert convention.ts("yesterday") is None
    assert convention.ts(None) is None
    assert convention.ts(True) is None


def test_keys_are_deterministic_short_and_change_with_content() -> None:
    messages = [{"role": "user", "content": "hi", "ts": "2026-08-03T11:18:06Z"}]
    key = convention.key("codex", "s1", "t1", messages)
    assert key == convention.key("codex", "s1", "t1", [dict(m) for m in messages])
    assert key.startswith("codex:s1:t1:")
    assert key != convention.key("codex", "s1", "t1", [{**messages[0], "content": "hi!"}])
    long = convention.key("claude-code", "s" * 600, "p" * 600, messages)
    assert len(long) <= convention.MAX_IDEMPOTENCY_KEY


def test_large_messages_and_appends_are_split_without_loss() -> None:
    message = {"role": "tool", "tool_name": "cat", "content": "é" * 3000}
    parts = convention.split_large(message, limit=1000)
    assert "".join(p["content"] for p in parts) == message["content"]
    assert all(len(p["content"].encode()) <= 1000 and p["tool_name"] == "cat" for p in parts)
    batches = list(convention.batches([message] * 5, max_messages=2))
    assert [len(b) for b in batches] == [2, 2, 1]
    batches = list(convention.batches([message] * 5, max_bytes=13000))
    assert [len(b) for b in batches] == [2, 2, 1]


def test_metadata_is_small_plain_json() -> None:
    meta = convention.metadata({"a": None, "b": "", "title": "t" * 5000, "n": 3})
    assert meta == {"title": "t" * 1000, "n": 3}
    deep: object = "x"
    for _ in range(50):
        deep = [deep]
    assert convention.metadata({"model": float("nan"), "deep": deep, "ok": [1.5]}) == {"ok": [1.5]}
    big = convention.metadata({f"k{i}": "v" * 900 for i in range(20)})
    assert len(str(big)) < 9000 and "k0" in big
