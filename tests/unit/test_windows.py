"""pipeline.refine.windows: a segment rendered in the L0 format, packed into windows that fit
the refiner's budget, with overlap, and with oversized messages split into parts that keep
their source_ref (docs/design.md §4)."""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence

import factories
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline import document, refine, tables

FILE_ID = "5b0e7c1d-2a3f-4e6b-8c9d-0a1b2c3d4e5f"
TS = "2026-08-03T11:18:06Z"
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def file_row() -> tables.FileRow:
    return factories.file_row(FILE_ID)


def header() -> document.Header:
    return document.Header(
        file_id=FILE_ID, session_key="s1", agent_id="hermes", source_type="session", started_at=TS
    )


def msg(seq: int, role: str, content: str, tool: str | None = None) -> document.Message:
    return document.Message(role=role, content=content, ts=TS, tool_name=tool, seq=seq)


def ref(seq: int) -> str:
    return f"{FILE_ID}:{seq}"


def parsed(window: refine.Window) -> list[document.Message]:
    """The window's text read back as an L0 file."""
    return list(document.parse(document.render_frontmatter(header()) + window.text).messages)


def check_invariants(
    ws: Sequence[refine.Window],
    messages: Sequence[document.Message],
    budget: int,
    overlap: int,
) -> None:
    """What holds for every segment: the L0 round trip, the budget, refs, coverage, and each
    window repeating at most ``overlap`` parts of the one before and then carrying on."""
    assert ws, "a non-empty segment gives at least one window"
    for w in ws:
        assert (w.file_id, w.agent_id, w.session_key) == (FILE_ID, "hermes", "s1")
        assert refine.estimate_tokens(w.text) <= budget
        back = parsed(w)
        assert [(m.role, m.ts, m.tool_name, m.content) for m in back] == [
            (p.role, p.ts, p.tool_name, document.canonical(p.content)) for p in w.parts
        ]
        for p in w.parts:
            assert w.source_ref(p) == ref(p.seq)
        assert w.source_refs == tuple(dict.fromkeys(ref(p.seq) for p in w.parts))
        seqs = [p.seq for p in w.parts]
        assert seqs == sorted(seqs)

    # Without overlap the windows partition the segment's parts: each message, cut into parts
    # that together are its content again (less the line breaks cut at split points).
    parts = [
        p
        for w in refine.windows(file_row(), messages, budget_tokens=budget, overlap=0)
        for p in w.parts
    ]
    assert [p.seq for p in parts] == sorted(p.seq for p in parts)
    assert {p.seq for p in parts} == {m.seq for m in messages}
    for m in messages:
        joined = "".join(p.content for p in parts if p.seq == m.seq)
        assert re.sub("[\r\n]", "", joined) == re.sub("[\r\n]", "", m.content)

    # With overlap, each window first repeats (some of) the last ``overlap`` parts of the one
    # before — never an earlier part of the message it goes on with — and then carries on with
    # the next parts not yet sent: nothing skipped, nothing new sent twice. Parts can be equal
    # in value, so every consistent reading is followed, not just the first.
    assert list(ws[0].parts) == parts[: len(ws[0].parts)]
    reachable = {len(ws[0].parts)}
    for before, after in itertools.pairwise(ws):
        tails = [before.parts[len(before.parts) - j :] for j in range(overlap + 1)]
        reachable = {
            pos + len(after.parts) - k
            for pos in reachable
            for k in range(min(overlap, len(after.parts) - 1) + 1)
            if any(
                list(after.parts[:k]) == [p for p in tail if p.seq != after.parts[k].seq]
                for tail in tails
            )
            and list(after.parts[k:]) == parts[pos : pos + len(after.parts) - k]
        }
        assert reachable, f"window {after.source_refs} does not continue {before.source_refs}"
    assert len(parts) in reachable


# ---------------------------------------------------------------------------------------------
# the L0 format itself


def test_window_text_is_the_l0_blocks_of_its_messages() -> None:
    messages = [
        msg(1, "user", "Hello, can you read config.yaml?"),
        msg(2, "assistant", "Sure."),
        msg(3, "tool", "key: value\nother: 1", tool="read_file"),
        msg(4, "user", "## 2026-08-03T11:18:06Z user\nnot a heading"),
    ]
    [w] = refine.windows(file_row(), messages, budget_tokens=6000, overlap=1)
    assert w.text == (
        "# 2026-08-03T11:18:06Z user\n\nHello, can you read config.yaml?\n\n"
        "## 2026-08-03T11:18:06Z assistant\n\nSure.\n\n"
        "## 2026-08-03T11:18:06Z tool\n\n**tool**: read_file\n\nkey: value\nother: 1\n\n"
        "## 2026-08-03T11:18:06Z user\n\n\\## 2026-08-03T11:18:06Z user\nnot a heading\n\n"
    )
    assert [p.seq for p in w.parts] == [1, 2, 3, 4]
    assert w.source_refs == (ref(1), ref(2), ref(3), ref(4))
    back = parsed(w)
    assert [(m.role, m.content, m.tool_name) for m in back] == [
        ("user", "Hello, can you read config.yaml?", None),
        ("assistant", "Sure.", None),
        ("tool", "key: value\nother: 1", "read_file"),
        ("user", "## 2026-08-03T11:18:06Z user\nnot a heading", None),
    ]


def test_window_to_json_carries_text_refs_and_parts() -> None:
    messages = [msg(7, "user", "hi"), msg(8, "tool", "ok", tool="ls")]
    [w] = refine.windows(file_row(), messages, budget_tokens=6000)
    assert w.to_json() == {
        "file_id": FILE_ID,
        "agent_id": "hermes",
        "session_key": "s1",
        "text": w.text,
        "source_refs": [ref(7), ref(8)],
        "messages": [
            {
                "seq": 7,
                "ts": TS,
                "role": "user",
                "content": "hi",
                "tool_name": None,
                "source_ref": ref(7),
            },
            {
                "seq": 8,
                "ts": TS,
                "role": "tool",
                "content": "ok",
                "tool_name": "ls",
                "source_ref": ref(8),
            },
        ],
    }


def test_a_segment_not_starting_at_seq_1_uses_level_two_headings() -> None:
    [w] = refine.windows(file_row(), [msg(5, "user", "five")], budget_tokens=6000)
    assert w.text == "## 2026-08-03T11:18:06Z user\n\nfive\n\n"


def test_empty_segment_has_no_windows() -> None:
    assert refine.windows(file_row(), [], budget_tokens=6000) == []


# ---------------------------------------------------------------------------------------------
# packing and overlap


def distinct_parts(
    messages: Sequence[document.Message], budget: int, seq: int
) -> list[document.Message]:
    """The parts of message ``seq``, each once (as windows without overlap hold them)."""
    ws = refine.windows(file_row(), messages, budget_tokens=budget, overlap=0)
    return [p for w in ws for p in w.parts if p.seq == seq]


def block_tokens(m: document.Message) -> int:
    return refine.estimate_tokens(document.render_block(m, first=m.seq == 1))


@pytest.mark.parametrize("overlap", [0, 1, 2, 3])
def test_windows_fit_the_budget_and_overlap_by_the_configured_messages(overlap: int) -> None:
    messages = [msg(seq, "user", f"message {seq:03d} " + "x" * 60) for seq in range(101, 141)]
    cost = block_tokens(messages[0])
    assert all(block_tokens(m) == cost for m in messages)
    budget = cost * 6  # six messages per window
    ws = refine.windows(file_row(), messages, budget_tokens=budget, overlap=overlap)

    check_invariants(ws, messages, budget, overlap)
    assert all(len(w.parts) == 6 for w in ws[:-1])
    for before, after in itertools.pairwise(ws):
        assert [p.seq for p in after.parts[:overlap]] == [
            p.seq for p in before.parts[len(before.parts) - overlap :]
        ]
        assert after.parts[overlap].seq == before.parts[-1].seq + 1
    # The windows advance by 6 - overlap messages; every message is new in exactly one.
    step = 6 - overlap
    assert [w.parts[0].seq for w in ws] == list(range(101, 101 + step * len(ws), step))
    assert ws[-1].parts[-1].seq == 140
    assert ws[-2].parts[-1].seq < 140
    news = [p.seq for i, w in enumerate(ws) for p in w.parts[(overlap if i else 0) :]]
    assert news == list(range(101, 141))


@pytest.mark.parametrize(("overlap", "expected"), [(1, [[1, 2, 3], [3, 4]]), (2, [[1, 2, 3], [4]])])
def test_overlap_is_dropped_when_it_would_not_fit_with_the_next_message(
    overlap: int, expected: list[list[int]]
) -> None:
    small = [msg(i, "user", f"small {i}") for i in range(1, 4)]
    big = msg(4, "assistant", "b" * 700)
    budget = block_tokens(big) + block_tokens(small[2])  # big + one small, not two smalls
    assert block_tokens(big) + block_tokens(small[1]) + block_tokens(small[2]) > budget
    ws = refine.windows(file_row(), [*small, big], budget_tokens=budget, overlap=overlap)
    check_invariants(ws, [*small, big], budget, overlap)
    assert [[p.seq for p in w.parts] for w in ws] == expected


def test_budget_below_the_floor_is_raised_to_64_tokens() -> None:
    messages = [msg(i, "user", "y" * 100) for i in range(1, 6)]
    ws = refine.windows(file_row(), messages, budget_tokens=1, overlap=0)
    check_invariants(ws, messages, 64, 0)
    assert len(ws) == 5  # one 41-token message per 64-token window


# ---------------------------------------------------------------------------------------------
# messages larger than a window


def test_a_large_message_is_split_at_line_breaks_into_parts_that_keep_its_ref() -> None:
    lines = [f"line {i:04d} " + "z" * 40 for i in range(200)]
    content = "\n".join(lines)
    messages = [
        msg(1, "user", "before"),
        msg(2, "tool", content, tool="cat"),
        msg(3, "user", "after"),
    ]
    budget = 256
    ws = refine.windows(file_row(), messages, budget_tokens=budget, overlap=1)
    check_invariants(ws, messages, budget, 1)

    parts = distinct_parts(messages, budget, 2)
    assert len(parts) > 1
    # The next part of a message carries on without repeating the one before as overlap.
    for w in ws:
        assert len({p.content for p in w.parts}) == len(w.parts)
    assert all(ref(p.seq) == ref(2) and p.tool_name == "cat" for p in parts)
    # Cut at line breaks: the parts are whole lines, and joined by the cut newlines they are
    # the content again.
    assert "\n".join(p.content for p in parts) == content
    assert all(
        refine.estimate_tokens(document.render_block(msg(2, "tool", p.content, "cat"), first=False))
        <= budget
        for p in parts
    )
    for w in ws:
        for back, part in zip(parsed(w), w.parts, strict=True):
            assert back.tool_name == part.tool_name


def test_a_line_longer_than_a_window_is_cut_inside_the_line() -> None:
    content = "".join(f"{i % 10}" for i in range(5000))
    messages = [msg(1, "assistant", content)]
    ws = refine.windows(file_row(), messages, budget_tokens=100, overlap=1)
    check_invariants(ws, messages, 100, 1)
    assert len(ws) > 1
    assert all(len(w.parts) == 1 for w in ws)
    assert "".join(w.parts[0].content for w in ws) == content


@pytest.mark.parametrize(
    "unit",
    ["😀", "汉", "é", "a😀汉é"],
    ids=["4-byte", "3-byte", "2-byte", "mixed"],
)
@pytest.mark.parametrize("budget", [64, 100, 1000])
def test_multibyte_text_is_split_by_bytes_within_the_budget(unit: str, budget: int) -> None:
    content = unit * 3000
    messages = [msg(1, "user", content), msg(2, "tool", unit * 50, tool="t" * 60)]
    ws = refine.windows(file_row(), messages, budget_tokens=budget, overlap=1)
    check_invariants(ws, messages, budget, 1)
    parts = distinct_parts(messages, budget, 1)
    assert len(parts) > 1
    assert all(p.seq == 1 for p in parts)
    assert "".join(p.content for p in parts) == content


def test_lines_that_look_like_headings_are_escaped_within_the_budget() -> None:
    content = "\n".join("#  user" for _ in range(2000))
    messages = [msg(1, "user", content)]
    ws = refine.windows(file_row(), messages, budget_tokens=80, overlap=0)
    check_invariants(ws, messages, 80, 0)
    assert all("\\#  user" in w.text for w in ws)
    assert "\n".join(w.parts[0].content for w in ws) == content


# ---------------------------------------------------------------------------------------------
# property: any segment


_TEXT = st.lists(
    st.sampled_from(
        [
            "a",
            "b",
            " ",
            "#",
            "## ",
            "\n",
            "\r",
            "\\",
            "*",
            "`",
            "😀",
            "汉",
            "é",
            "user",
            " tool",
            "**tool**: x",
            "2026-08-03T11:18:06Z",
        ]
    ),
    max_size=120,
).map("".join)


@st.composite
def segments(draw: st.DrawFn) -> list[document.Message]:
    count = draw(st.integers(1, 12))
    first = draw(st.integers(1, 50))
    out = []
    for seq in range(first, first + count):
        role = draw(st.sampled_from(document.ROLES))
        pieces = draw(st.lists(_TEXT, max_size=8))
        content = document.canonical("".join(pieces))
        tool = draw(st.sampled_from(["read_file", "grep", "工具"])) if role == "tool" else None
        out.append(msg(seq, role, content, tool))
    return out


@FAST
@given(segments(), st.integers(64, 600), st.integers(0, 3))
def test_any_segment_packs_into_valid_windows(
    messages: list[document.Message], budget: int, overlap: int
) -> None:
    ws = refine.windows(file_row(), messages, budget_tokens=budget, overlap=overlap)
    check_invariants(ws, messages, budget, overlap)
