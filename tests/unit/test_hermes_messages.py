"""The Hermes provider re-implements the convention (it runs without our package): for the
same OpenAI-style messages it must produce exactly the messages the importers produce."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from pipeline.importers import convention, openai

PLUGIN = Path(__file__).resolve().parents[2] / "integrations" / "hermes" / "sgme"


def load_messages() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sgme_plugin_messages", PLUGIN / "messages.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


plugin = load_messages()
WHEN = "2026-08-03T11:18:06Z"

HERMES_TURN: list[Any] = [
    {"role": "system", "content": "You are Hermes."},
    {"role": "user", "content": "Earlier question"},
    {"role": "assistant", "content": "Earlier answer"},
    {"role": "user", "content": "List files", "timestamp": 1785755886.5},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "terminal", "arguments": '{"command": "ls"}'},
            }
        ],
        "reasoning": "think",
    },
    {
        "role": "tool",
        "name": "terminal",
        "tool_name": "terminal",
        "content": "a.txt\x00",
        "tool_call_id": "call_1",
    },
    {"role": "tool", "content": "orphan", "tool_call_id": "call_1"},
    {"role": "assistant", "content": [{"type": "text", "text": "One file."}, {"type": "image"}]},
    {"role": "assistant", "content": "**tool call**: x"},
    {"role": "developer", "content": "note"},
    {"role": "session_meta", "content": "x"},
    "not a message",
]


def test_same_messages_as_the_importers() -> None:
    assert plugin.convert(HERMES_TURN, when=WHEN) == openai.convert(HERMES_TURN, when=WHEN)
    converted, _ = plugin.convert(HERMES_TURN, when=WHEN)
    assert converted[4]["content"] == convention.call_body("terminal", '{"command": "ls"}')
    assert converted[3]["ts"] == "2026-08-03T11:18:06.5Z"


text = st.text(alphabet=st.characters(codec="utf-8") | st.sampled_from("\x00\n*#\\"))
message = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["system", "developer", "user", "assistant", "tool", "x"]),
        "content": st.one_of(
            st.none(),
            text,
            st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": text})),
        ),
    },
    optional={
        "tool_calls": st.lists(
            st.fixed_dictionaries(
                {
                    "id": st.text(max_size=3),
                    "function": st.fixed_dictionaries({"name": text, "arguments": text}),
                }
            ),
            max_size=3,
        ),
        "tool_call_id": st.text(max_size=3),
        "name": text,
        "timestamp": st.one_of(st.floats(0, 4e9), st.integers(0, 4_000_000_000_000), text),
    },
)


@given(st.lists(message, max_size=8))
def test_same_messages_for_any_input(messages: list[dict[str, Any]]) -> None:
    assert plugin.convert(messages, when=WHEN) == openai.convert(messages, when=WHEN)


def test_helpers_agree() -> None:
    for value in (None, 0, 1785755886.25, 1785755886250, "2026-08-03T13:18:06+02:00", "x", True):
        assert plugin.ts(value) == convention.ts(value)
    big = {"role": "tool", "tool_name": "t", "content": "é" * 5000}
    assert plugin.split_large(big, limit=1000) == convention.split_large(big, limit=1000)


def test_current_turn_is_the_last_exchange() -> None:
    position, turn = plugin.current_turn(HERMES_TURN[:8], "List files", "One file.")
    assert position == 3
    assert [m["role"] for m in turn] == ["user", "assistant", "tool", "tool", "assistant"]
    # without a text match: the last user message before the last assistant message
    assert plugin.current_turn(HERMES_TURN[:8], "?", "?")[0] == 3
    assert plugin.current_turn([{"role": "assistant", "content": "x"}], "u", "x") == (-1, [])


def test_turn_keys_ignore_times_but_not_content() -> None:
    one = [{"role": "user", "content": "hi", "ts": WHEN}]
    later = [{"role": "user", "content": "hi", "ts": "2027-01-01T00:00:00Z"}]
    assert plugin.turn_key("s", 3, one) == plugin.turn_key("s", 3, later)
    assert plugin.turn_key("s", 3, one) != plugin.turn_key("s", 5, one)
    assert plugin.turn_key("s", 3, one) != plugin.turn_key("s", 3, [{**one[0], "content": "ho"}])
    assert len(plugin.turn_key("s" * 500, 10**9, one)) <= 200
