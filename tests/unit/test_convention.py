"""The tool-call convention: call bodies parse back, text never reads as a call, keys and
batches respect the append limits."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pipeline.importers import convention


def test_call_body_round_trips() -> None:
    message = convention.tool_call("read_file", '{"path": "a.txt"}', "2026-08-03T11:18:06Z")
    assert message == {
        "role": "assistant",
        "content": '**tool call**: read_file\n\n{"path": "a.txt"}',
        "ts": "2026-08-03T11:18:06Z",
    }
    assert convention.parse_tool_call(message["content"]) == ("read_file", '{"path": "a.txt"}')
    assert convention.tool_call("now", "", None)["content"] == "**tool call**: now"
    assert convention.parse_tool_call("**tool call**: now") == ("now", "")


def test_arguments_that_are_not_a_string_are_json() -> None:
    body = convention.tool_call("edit", {"path": "é", "n": 1}, None)["content"]
    assert convention.parse_tool_call(body) == ("edit", '{"path": "é", "n": 1}')


def test_assistant_text_that_looks_like_a_call_is_escaped() -> None:
    text = "**tool call**: not really\n\nhello"
    message = convention.text_message("assistant", text, None)
    assert message["content"] == "\\" + text
    assert convention.parse_tool_call(message["content"]) is None
    assert convention.unescape_text(message["content"]) == text
    # a user message is never a call, so it is left alone
    assert convention.text_message("user", text, None)["content"] == text


@given(st.text())
def test_escape_is_reversible(text: str) -> None:
    assert convention.unescape_text(convention.escape_text(text)) == text
    assert convention.parse_tool_call(convention.escape_text(text)) is None


def test_assistant_turn_is_text_then_calls_in_order() -> None:
    messages = convention.assistant_turn("Let me look.", [("a", "{}"), ("b", '{"x":1}')], None)
    assert [m["content"] for m in messages] == [
        "Let me look.",
        "**tool call**: a\n\n{}",
        '**tool call**: b\n\n{"x":1}',
    ]
    assert convention.assistant_turn(None, [("a", None)], None)[0]["content"] == "**tool call**: a"


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
    big = convention.metadata({f"k{i}": "v" * 900 for i in range(20)})
    assert len(str(big)) < 9000 and "k0" in big
