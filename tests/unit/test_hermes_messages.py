"""The Hermes provider's turns, as ``sgme hermes install`` lays the provider out (its own modules
and this package's convention.py and spool.py beside them): the turn it takes from Hermes'
transcript gets the key and the messages the state.db importer gives the same turn, so
importing what the provider stored (or the reverse) writes nothing twice."""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pipeline.cli import hermes
from pipeline.importers import chat, convention, runner, source

WHEN = "2026-08-03T11:18:06Z"

TRANSCRIPT: list[dict[str, Any]] = [
    {"role": "user", "content": "Earlier question", "timestamp": 1785755800.0},
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
        "content": "a.txt",
        "tool_call_id": "call_1",
    },
    {"role": "assistant", "content": [{"type": "text", "text": "One file."}]},
]


@pytest.fixture(scope="module")
def plugin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[types.ModuleType]:
    """The installed provider's ``messages`` module (its ``__init__`` needs Hermes itself)."""
    home = tmp_path_factory.mktemp("hermes-home")
    directory = hermes.install(home)
    package = types.ModuleType("sgme_plugin_under_test")
    package.__path__ = [str(directory)]
    sys.modules[package.__name__] = package
    try:
        yield importlib.import_module(f"{package.__name__}.messages")
    finally:
        for name in [n for n in sys.modules if n.startswith(package.__name__)]:
            del sys.modules[name]


def test_the_installed_convention_is_this_package_s_file(plugin: types.ModuleType) -> None:
    assert plugin.__file__ is not None
    installed = Path(plugin.__file__).with_name("convention.py")
    assert installed.read_bytes() == Path(convention.__file__).read_bytes()


def test_the_provider_s_turn_has_the_importer_s_key(plugin: types.ModuleType) -> None:
    found = plugin.current_turn(TRANSCRIPT, "One file.", when=WHEN)
    assert found is not None
    number, turn = found
    assert number == 2
    assert [m["role"] for m in turn] == ["user", "assistant", "tool", "assistant"]
    assert turn[0]["ts"] == "2026-08-03T11:18:06.5Z" and turn[1]["ts"] == WHEN
    key, bodies = plugin.bodies("s1", number, turn, agent_id="hermes", metadata={"a": "b"})
    assert [b["idempotency_key"] for b in bodies] == [key]

    # the importer on the same rows, as state.db holds them: other times, the same turns
    rows = [{**m, "timestamp": 1785750000.0 + i} for i, m in enumerate(TRANSCRIPT)]
    converted, _ = chat.convert(rows)
    session = source.Session(
        source=convention.HERMES,
        session_key="s1",
        metadata={},
        units=tuple(
            source.Unit(position=str(n), messages=tuple(t)) for n, t in chat.turns(converted)
        ),
        origin="state.db",
        times=False,
    )
    imported = [body for _, body in runner.bodies(session, agent_id="hermes")]
    assert imported[1]["idempotency_key"] == key
    assert [(m["role"], m["content"]) for m in imported[1]["messages"]] == [
        (m["role"], m["content"]) for m in bodies[0]["messages"]
    ]


def test_the_answer_ends_the_turn_and_a_transcript_without_users_has_none(
    plugin: types.ModuleType,
) -> None:
    number, turn = plugin.current_turn(TRANSCRIPT[:2], "Earlier answer", when=WHEN)
    assert (number, [m["content"] for m in turn]) == (1, ["Earlier question", "Earlier answer"])
    # no text match: the last turn as it is
    assert plugin.current_turn(TRANSCRIPT, "?", when=WHEN)[0] == 2
    assert plugin.current_turn([{"role": "assistant", "content": "x"}], "x", when=WHEN) is None


def test_branch_names_what_a_rewind_took_back() -> None:
    """The places a rewind marker names, counted back from it over what was stored: the live
    turns from the rewind's turn number on; earlier markers and turns already taken back are
    counted as places but not named again."""

    def said(question: str, parts: int) -> list[dict[str, Any]]:
        return [{"role": "user", "content": question}] + [
            {"role": "assistant", "content": f"{question} {n}"} for n in range(parts - 1)
        ]

    branch = chat.Branch()
    branch.add(1, said("one", 2))
    branch.add(2, said("two", 3))
    branch.add(3, said("three", 2))
    assert branch.rewound(4) == []  # nothing stored from turn 4 on: no marker
    assert branch.rewound(3) == [1, 2]
    branch.rewind(3)  # its marker stored; "three" taken back
    branch.add(3, said("three again", 2))
    # back to turn 2: "three again" (1-2), the marker (3), "three" already back (4-5), "two" (6-8)
    assert branch.rewound(2) == [1, 2, 6, 7, 8]
    branch.rewind(2)
    branch.add(2, said("two again", 2))
    assert branch.rewound(2) == [1, 2]
    assert branch.rewound(1) == [1, 2, 12, 13]  # "two again", and "one" past all the rest
