"""pipeline.document: the L0 file format (docs/design.md §2) — parse, render, validation, hash
chain."""

from __future__ import annotations

import datetime as dt
import hashlib
import itertools
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline import document, errors, validation

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "golden"
SEED_LOOSE = re.compile(r"^#{1,2} .* (user|assistant|tool|system)$", re.MULTILINE)
FILE_ID = "3f2c1a9e-8b7d-4c6e-9a5f-1e2d3c4b5a69"
FAST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def header(**changes: Any) -> document.Header:
    fields: dict[str, Any] = {
        "file_id": FILE_ID,
        "session_key": "s1",
        "agent_id": "hermes",
        "source_type": "session",
        "started_at": "2026-08-03T11:18:06Z",
    }
    return document.Header(**{**fields, **changes})


def msg(
    role: str, content: str, ts: str = "2026-08-03T11:18:06Z", tool: str | None = None
) -> document.Message:
    return document.Message(role=role, content=content, ts=ts, tool_name=tool)


def as_json(doc: document.Document) -> dict[str, Any]:
    h = doc.header
    return {
        "header": {
            "format_version": h.format_version,
            "file_id": h.file_id,
            "session_key": h.session_key,
            "agent_id": h.agent_id,
            "source_type": h.source_type,
            "started_at": h.started_at,
            "metadata": dict(h.metadata),
        },
        "messages": [
            {
                "seq": m.seq,
                "ts": m.ts,
                "role": m.role,
                "tool_name": m.tool_name,
                "content": m.content,
            }
            for m in doc.messages
        ],
    }


# ---------------------------------------------------------------------------------------------
# the seed's own example (shared/seed/000_79e965d39cb260dc.txt §2), unquoted YAML and all

SEED_EXAMPLE = """\
---
format_version: 1
file_id: a1b2c3d4-...
session_key: 20260803_191806_5b6c69
agent_id: hermes
source_type: session
started_at: 2026-08-03T11:18:06Z
metadata:
  app: hermes-desktop
---

# 2026-08-03T11:18:06Z user

> 用户消息正文，Markdown 原样保留（含代码块）

## 2026-08-03T11:20:00Z assistant

助手回复正文

## 2026-08-03T11:20:05Z tool

**tool**: read_file

工具输出（原样）

## 2026-08-03T11:25:00Z assistant

（……后续消息……）
"""


def test_seed_example_parses() -> None:
    doc = document.parse(SEED_EXAMPLE)
    assert doc.header == document.Header(
        file_id="a1b2c3d4-...",
        session_key="20260803_191806_5b6c69",
        agent_id="hermes",
        source_type="session",
        started_at="2026-08-03T11:18:06Z",
        metadata={"app": "hermes-desktop"},
        format_version=1,
    )
    assert [(m.seq, m.ts, m.role, m.tool_name, m.content) for m in doc.messages] == [
        (1, "2026-08-03T11:18:06Z", "user", None, "> 用户消息正文，Markdown 原样保留（含代码块）"),
        (2, "2026-08-03T11:20:00Z", "assistant", None, "助手回复正文"),
        (3, "2026-08-03T11:20:05Z", "tool", "read_file", "工具输出（原样）"),
        (4, "2026-08-03T11:25:00Z", "assistant", None, "（……后续消息……）"),
    ]
    assert doc.source_ref(3) == "a1b2c3d4-...:3"


def test_seed_example_block_count_matches_chain() -> None:
    _, blocks = document.chain(SEED_EXAMPLE.encode())
    assert blocks == 4


# ---------------------------------------------------------------------------------------------
# golden files: tests/data/golden/*.md next to the expected parse in *.json

GOLDEN_FILES = sorted(GOLDEN.glob("*.md"))


def expected_of(path: Path) -> dict[str, Any]:
    """The expected parse of a golden file, from the .json next to it."""
    expected: dict[str, Any] = json.loads(path.with_suffix(".json").read_text(encoding="utf-8"))
    return expected


def test_golden_files_present() -> None:
    assert [p.name for p in GOLDEN_FILES] == [
        "external.md",
        "hand_written.md",
        "session_tool.md",
        "upload.md",
    ]


@pytest.mark.parametrize("path", GOLDEN_FILES, ids=lambda p: p.stem)
def test_golden_parse(path: Path) -> None:
    text = path.read_bytes().decode("utf-8")
    expected = expected_of(path)
    got = as_json(document.parse(text))
    assert got["header"] == expected["header"]
    assert got["messages"] == expected["messages"]
    # ints stay ints, floats floats (1 == 1.0 would hide that)
    assert json.dumps(got["header"]["metadata"]) == json.dumps(expected["header"]["metadata"])
    _, blocks = document.chain(text.encode("utf-8"))
    assert blocks == len(expected["messages"])
    if expected["header"]["source_type"] != "upload":  # reindex's one scan for the headings
        data = text.encode("utf-8")
        starts = [f.offset for f in document.locate(data)]
        assert document.chain(data, starts=starts) == document.chain(data)


#: the golden files written in the writer's canonical form (hand_written.md is not)
CANONICAL_FILES = [p for p in GOLDEN_FILES if expected_of(p)["canonical"]]


def test_canonical_golden_files() -> None:
    assert [p.name for p in CANONICAL_FILES] == ["external.md", "session_tool.md", "upload.md"]


@pytest.mark.parametrize("path", CANONICAL_FILES, ids=lambda p: p.stem)
def test_golden_render_is_byte_exact(path: Path) -> None:
    expected = expected_of(path)
    head = document.Header(**expected["header"])
    messages = [document.Message(**m) for m in expected["messages"]]
    if head.source_type == "upload":
        rendered = document.render_frontmatter(head) + document.render_upload(messages[0].content)
    else:
        rendered = document.render(head, messages)
    assert rendered.encode("utf-8") == path.read_bytes()


def test_golden_escapes_are_what_the_file_holds() -> None:
    text = (GOLDEN / "session_tool.md").read_text(encoding="utf-8")
    assert "\n\\# Display the results to the user\n" in text
    assert "\n\\## 2026-08-03T11:18:06Z user\n" in text
    assert "\n\\\\# not a heading either user\n" in text
    assert "\n\\## Notes for the user\n" in text
    assert "\n# Sales report\n" in text  # no role at the end: not heading-like, not escaped


# ---------------------------------------------------------------------------------------------
# round trips (hypothesis)

CHARS = st.characters(exclude_categories=["Cs"], exclude_characters="\x00")
TRICKY_LINES = [
    "# 2026-08-03T11:18:06Z user",
    "## 2026-08-03T11:18:06.123456Z tool",
    "# 2026-08-03T11:18:06Z user\r",
    "\\# 2026-08-03T11:18:06Z user",
    "\\# … user",
    "\\\\## x assistant",
    "\\\\\\# x system",
    "## Notes for the user",
    "# Display the results to the user",
    "### Third level user",
    " # indented user",
    "#  two spaces user",
    "# x user ",
    "#user",
    "---",
    "...",
    "**tool**: read_file",
    "```python",
    "```",
    "~~~",
    "",
    "\r",
    "\r\n",
    "\u2028",
    "\x85",
    "\x0b",
    "\x1c",
    "\t",
    " ",
    "\\",
]
PIECES = st.one_of(st.sampled_from(TRICKY_LINES), st.text(CHARS, max_size=12))
SEPARATORS = st.sampled_from(["\n", "\n", "\n", "\r\n", "\r", "", "\n\n"])
TRICKY_TEXT = st.lists(st.tuples(PIECES, SEPARATORS), max_size=12).map(
    lambda parts: "".join(p + s for p, s in parts)
)
EDGES = st.sampled_from(["", "\n", "\n\n", "\r\n", "\r\n\r\n", "\r", "\n\r", " \n", "\t"])
CONTENT = st.one_of(
    st.text(CHARS),
    TRICKY_TEXT,
    st.builds(lambda a, b, c: a + b + c, EDGES, TRICKY_TEXT, EDGES),
)
TIMESTAMPS = st.datetimes(
    min_value=dt.datetime(1, 1, 1), max_value=dt.datetime(9999, 12, 31, 23, 59, 59)
).map(document.format_ts)
TOOL_NAMES = st.text(
    st.characters(blacklist_categories=("Cs", "Cc", "Zl", "Zp")), min_size=1, max_size=30
).filter(str.strip)


@st.composite
def messages(draw: st.DrawFn) -> document.Message:
    role = draw(st.sampled_from(document.ROLES))
    tool = draw(TOOL_NAMES) if role == "tool" else None
    return msg(role, draw(CONTENT), draw(TIMESTAMPS), tool)


@FAST
@given(st.lists(messages(), min_size=1, max_size=6))
def test_parse_render_round_trip(msgs: list[document.Message]) -> None:
    text = document.render(header(), msgs)
    doc = document.parse(text, file_id=FILE_ID)
    data = text.encode()
    starts = [f.offset for f in document.locate(data)]
    assert document.chain(data, starts=starts) == document.chain(data)
    assert [(m.seq, m.role, m.ts, m.tool_name, m.content) for m in doc.messages] == [
        (i + 1, m.role, m.ts, m.tool_name, document.canonical(m.content))
        for i, m in enumerate(msgs)
    ]


@FAST
@given(CONTENT)
def test_upload_round_trip(content: str) -> None:
    text = document.render_frontmatter(header(source_type="upload")) + document.render_upload(
        content
    )
    doc = document.parse(text)
    assert [(m.seq, m.role, m.ts, m.tool_name, m.content) for m in doc.messages] == [
        (1, "user", "2026-08-03T11:18:06Z", None, document.canonical(content))
    ]
    assert document.chain(text.encode())[1] == 1


@FAST
@given(CONTENT, TOOL_NAMES)
def test_tool_message_keeps_tool_name(content: str, tool: str) -> None:
    text = document.render(header(), [msg("user", "hi"), msg("tool", content, tool=tool)])
    (_, got) = document.parse(text).messages
    assert (got.role, got.tool_name, got.content) == ("tool", tool, document.canonical(content))


def test_tool_block_layout() -> None:
    text = document.render_block(msg("tool", "out\n", tool="read_file"), first=False)
    assert text == "## 2026-08-03T11:18:06Z tool\n\n**tool**: read_file\n\nout\n\n"
    empty = document.render_block(msg("tool", "", tool="grep"), first=True)
    assert empty == "# 2026-08-03T11:18:06Z tool\n\n**tool**: grep\n\n"
    (_, m) = document.parse(document.render_frontmatter(header()) + text + empty).messages
    assert (m.tool_name, m.content) == ("grep", "")


@FAST
@given(st.lists(messages(), min_size=1, max_size=6))
def test_seed_loose_regex_finds_exactly_our_blocks(msgs: list[document.Message]) -> None:
    text = document.render(header(session_key="# 2026-08-03T11:18:06Z user"), msgs)
    loose = list(SEED_LOOSE.finditer(text))
    doc = document.parse(text)
    assert len(loose) == len(doc.messages) == len(msgs)
    assert [(m.group(0).split()[1], m.group(1)) for m in loose] == [(m.ts, m.role) for m in msgs]


SESSION_KEYS = st.one_of(
    st.sampled_from(
        [
            "0123",
            "0o17",
            "0x1F",
            "1_000",
            "1e3",
            ".inf",
            "yes",
            "no",
            "on",
            "null",
            "Null",
            "~",
            "true",
            "a: b",
            "- a",
            "[a, b]",
            "{a: b}",
            "---",
            "...",
            "# comment",
            "&anchor",
            "*alias",
            "!tag",
            "|",
            ">",
            "%YAML",
            "@x",
            "`x`",
            "'single'",
            '"double"',
            "back\\slash\\",
            "\\n",
            "line one\nline two\n",
            "cr\rlf\r\n",
            " padded ",
            "\t",
            "tab\tinside",
            "\ufeffbom",
            "\u2028\u2029\x85",
            "\x7f\x9f\x01\x1b",
            "\ufffe\uffff",
            "2026-08-03T11:18:06Z",
            "2026-08-03",
            "é日本語🎉",
        ]
    ),
    st.text(CHARS, min_size=1, max_size=60),
)
JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from([1e16, 1e-7, 1.5e300, -0.0, 0.1, 123456789.0, 5e-324])
    | st.text(CHARS, max_size=20)
    | SESSION_KEYS,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(CHARS, max_size=8) | SESSION_KEYS, inner, max_size=4)
    ),
    max_leaves=16,
)
LONG_KEYS = st.builds(
    lambda c, n: c * n, st.sampled_from(["k", "\n", "é", "\x01"]), st.integers(990, 1030)
)
METADATA = st.dictionaries(
    st.text(CHARS, max_size=8) | SESSION_KEYS | LONG_KEYS, JSON_VALUES, max_size=5
)


@FAST
@given(
    session_key=SESSION_KEYS,
    agent_id=st.from_regex(r"[A-Za-z0-9_.-]{1,64}", fullmatch=True),
    source_type=st.sampled_from(document.SOURCE_TYPES),
    started_at=TIMESTAMPS,
    metadata=METADATA,
)
def test_frontmatter_round_trip(
    session_key: str, agent_id: str, source_type: str, started_at: str, metadata: dict[str, Any]
) -> None:
    head = header(
        session_key=session_key,
        agent_id=agent_id,
        source_type=source_type,
        started_at=started_at,
        metadata=metadata,
    )
    text = document.render_frontmatter(head)
    assert text.startswith(
        f'---\nformat_version: 1\nfile_id: "{FILE_ID}"\nsession_key: "'
    ) and text.endswith("\n---\n\n")
    got = document.parse(text).header
    assert got == head
    # exactly: 1 and 1.0 compare equal, their JSON does not; key order is kept too
    assert json.dumps(dict(got.metadata)) == json.dumps(metadata)


def test_frontmatter_long_metadata_key_uses_explicit_form() -> None:
    short, long = "k" * 998, "k" * 999  # quoted: 1000 and 1001 characters
    text = document.render_frontmatter(header(metadata={short: 1, long: {"a": [2]}}))
    assert f'\n  "{short}": 1\n' in text
    assert f'\n  ? "{long}"\n  :\n    "a":\n      - 2\n' in text
    assert document.parse(text).header.metadata == {short: 1, long: {"a": [2]}}


def test_frontmatter_layout() -> None:
    head = header(session_key='a "b"\n\\', metadata={"n": 1, "f": 1e16, "l": [True, None]})
    assert document.render_frontmatter(head) == (
        "---\n"
        "format_version: 1\n"
        f'file_id: "{FILE_ID}"\n'
        'session_key: "a \\"b\\"\\n\\\\"\n'
        'agent_id: "hermes"\n'
        'source_type: "session"\n'
        'started_at: "2026-08-03T11:18:06Z"\n'
        "metadata:\n"
        '  "n": 1\n'
        '  "f": 1.0e+16\n'
        '  "l":\n'
        "    - true\n"
        "    - null\n"
        "---\n\n"
    )


@pytest.mark.parametrize("ch", ["\x85", "\r", "\u2028", "\t", "\ufeff"])
def test_raw_special_characters_in_quoted_frontmatter_read_as_yaml_does(ch: str) -> None:
    # a hand-written file, not ours: the fast path must not read it differently from YAML
    text = document.render_frontmatter(header()).replace('"s1"', f'"a{ch}b"')
    expected = yaml.safe_load(text.split("---\n")[1])["session_key"]
    assert document.parse(text).header.session_key == expected


def test_started_at_as_yaml_timestamp_or_quoted() -> None:
    base = document.render_frontmatter(header())
    for raw, want in [
        ("2026-08-03T13:18:06+02:00", "2026-08-03T11:18:06Z"),
        ("2026-08-03 11:18:06.5", "2026-08-03T11:18:06.5Z"),
        ('"2026-08-03T11:18:06.000001Z"', "2026-08-03T11:18:06.000001Z"),
    ]:
        text = base.replace('started_at: "2026-08-03T11:18:06Z"', f"started_at: {raw}")
        assert document.parse(text).header.started_at == want


# ---------------------------------------------------------------------------------------------
# canonical, escape


@FAST
@given(CONTENT)
def test_canonical_is_idempotent_and_strips_only_edge_breaks(text: str) -> None:
    once = document.canonical(text)
    assert document.canonical(once) == once
    assert not once.startswith(("\n", "\r\n")) and not once.endswith(("\n", "\r"))
    # only edge characters go, and only line-break characters
    start = text.find(once) if once else 0
    assert once == text[start : start + len(once)]
    assert set(text[:start]) <= {"\r", "\n"} and set(text[start + len(once) :]) <= {"\r", "\n"}
    assert text[:start].replace("\r\n", "").replace("\n", "") == ""


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        ("", ""),
        ("\n\n", ""),
        ("\r\n\r\nx\r\n\r\n", "x"),
        ("\n x \n", " x "),
        ("\rx", "\rx"),  # a lone leading \r is not a line break
        ("\n\r\nx", "x"),
        ("x\r", "x"),  # trailing \r goes: it would read back as half of a \r\n break
        ("x\n\r\r", "x"),
        ("\tx\t", "\tx\t"),
        ("\u2028x\u2028", "\u2028x\u2028"),
        ("a\n\nb", "a\n\nb"),
    ],
)
def test_canonical_examples(raw: str, want: str) -> None:
    assert document.canonical(raw) == want


@FAST
@given(CONTENT)
def test_unescape_inverts_escape(text: str) -> None:
    escaped = document.escape(text)
    assert document.unescape(escaped) == text
    assert not SEED_LOOSE.search(escaped)
    assert not any(document.HEADING.fullmatch(line) for line in escaped.split("\n"))


def test_escape_examples() -> None:
    assert document.escape("# Display the results to the user") == (
        "\\# Display the results to the user"
    )
    assert document.escape("\\## x assistant\n### y user\n#z user") == (
        "\\\\## x assistant\n### y user\n#z user"
    )
    assert document.unescape("\\\\# x system\n\\y user") == "\\# x system\n\\y user"


# ---------------------------------------------------------------------------------------------
# parsing rules


def reference_parse(text: str) -> list[tuple[str, str, str | None, str]]:
    """docs/design.md §2 read literally, line by line: ``(ts, role, tool_name, content)`` per
    message."""
    _, offset = document.split_frontmatter(text)
    blocks: list[tuple[str, str, list[str]]] = []
    preamble: list[str] = []
    for line in text[offset:].split("\n"):
        heading = document.HEADING.fullmatch(line)
        if heading:
            blocks.append((heading.group(2), heading.group(3), []))
        else:
            (blocks[-1][2] if blocks else preamble).append(line)

    def strip(raw: str) -> str:
        found = re.fullmatch(r"(?:\r?\n)*(.*?)(?:\r?\n)*", raw, re.DOTALL)
        assert found
        return found.group(1)

    def unescape(body: str) -> str:
        loose = re.compile(r"\\+#{1,2} .* (user|assistant|tool|system)")
        return "\n".join(x[1:] if loose.fullmatch(x) else x for x in body.split("\n"))

    if not blocks:
        return [("2026-08-03T11:18:06Z", "user", None, unescape(strip("\n".join(preamble))))]
    out = []
    for i, (ts, role, lines) in enumerate(blocks):
        # the line break before the next heading belongs to this block's text
        body = strip("\n".join(lines) + ("\n" if i + 1 < len(blocks) else ""))
        tool_name = None
        first, _, rest = body.partition("\n")
        tool = re.fullmatch(r"\*\*tool\*\*: (.*)", first)
        if role == "tool" and tool:
            tool_name, body = tool.group(1), strip(rest)
        out.append((ts, role, tool_name, unescape(body)))
    return out


HEADING_LINES = st.sampled_from(
    [
        "# 2026-08-03T11:18:06Z user",
        "## 2026-08-03T11:18:07.5Z tool",
        "## 2026-08-03T11:18:08Z assistant",
        "# 2026-08-03T11:18:09.123456Z system",
        "**tool**: read_file",
        "**tool**: x\r",
        "**tool**:",
    ]
)
HAND_WRITTEN = st.lists(st.tuples(st.one_of(HEADING_LINES, PIECES), SEPARATORS), max_size=16).map(
    lambda parts: "".join(p + s for p, s in parts)
)


@FAST
@given(HAND_WRITTEN, st.sampled_from(["", "\n", "\r\n"]))
def test_parse_agrees_with_a_line_by_line_reading(body: str, gap: str) -> None:
    # any text, not only what the writer makes: hand-edited and imported files parse the same
    text = document.render_frontmatter(header())[:-1] + gap + body
    got = [(m.ts, m.role, m.tool_name, m.content) for m in document.parse(text).messages]
    assert got == reference_parse(text)
    assert [m.seq for m in document.parse(text).messages] == list(range(1, len(got) + 1))
    assert document.chain(text.encode())[1] == len(got)


def test_heading_must_match_in_full() -> None:
    body = (
        "# 2026-08-03T11:18:06Z user\n\none\n\n"
        "### 2026-08-03T11:18:07Z user\n"
        "## 2026-08-03T11:18:07Z User\n"
        "## 2026-08-03T11:18:07 user\n"
        "## 2026-08-03T11:18:07.1234567Z user\n"
        "## 2026-08-03T11:18:07Z user \n"
        "## 2026-08-03T11:18:07Z user\r\n"
        "## ２０２６-08-03T11:18:07Z user\n"
        "## 2026-08-03T11:18:08Z system\nlast\n"
    )
    doc = document.parse(document.render_frontmatter(header()) + body)
    assert [(m.ts, m.role) for m in doc.messages] == [
        ("2026-08-03T11:18:06Z", "user"),
        ("2026-08-03T11:18:08Z", "system"),
    ]
    assert doc.messages[0].content.split("\n")[0] == "one"
    assert len(doc.messages[0].content.split("\n")) == 9
    assert doc.messages[1].content == "last"


def test_no_heading_is_one_user_message_at_started_at() -> None:
    doc = document.parse(document.render_frontmatter(header()) + "just text\n")
    assert doc.messages == (
        document.Message(role="user", content="just text", ts="2026-08-03T11:18:06Z", seq=1),
    )


def test_first_heading_right_after_frontmatter() -> None:
    text = "---\nformat_version: 1\nfile_id: x\nsession_key: k\nagent_id: a\n"
    text += "source_type: session\nstarted_at: 2026-08-03T11:18:06Z\n---\n"
    text += "# 2026-08-03T11:18:06Z user\nhi"
    assert [(m.role, m.content) for m in document.parse(text).messages] == [("user", "hi")]


def test_tool_line_only_on_tool_role() -> None:
    text = document.render(header(), [msg("user", "**tool**: fake\n\nbody")])
    (m,) = document.parse(text).messages
    assert (m.tool_name, m.content) == (None, "**tool**: fake\n\nbody")


# ---------------------------------------------------------------------------------------------
# hash chain


def sample_file() -> bytes:
    msgs = [
        msg("user", "hello", "2026-08-03T11:18:06Z"),
        msg("assistant", "# Display the results to the user\nok", "2026-08-03T11:18:07Z"),
        msg("tool", "out", "2026-08-03T11:18:08Z", "read_file"),
        msg("assistant", "done", "2026-08-03T11:18:09Z"),
    ]
    return document.render(header(), msgs).encode("utf-8")


def test_chain_is_the_documented_sha256_chain() -> None:
    data = sample_file()
    starts = [m.start() for m in re.finditer(rb"^#{1,2} \d", data, re.M)]
    assert len(starts) == 4
    head = hashlib.sha256(data[: starts[0]]).digest()
    for lo, hi in zip(starts, [*starts[1:], len(data)], strict=True):
        head = hashlib.sha256(head + data[lo:hi]).digest()
    assert document.chain(data) == (head, 4)
    assert document.block_offsets(data) == (starts[0] - 1, starts)


def test_chain_of_upload_is_one_block_after_frontmatter() -> None:
    front = document.render_frontmatter(header(source_type="upload")).encode()
    data = front + document.render_upload("# x user\nbody").encode()
    head = hashlib.sha256(front[:-1]).digest()
    assert document.chain(data) == (hashlib.sha256(head + data[len(front) - 1 :]).digest(), 1)


def test_chain_extends_incrementally() -> None:
    data = sample_file()
    first = document.render(header(), [msg("user", "hello")]).encode()
    more = (
        document.render_block(msg("assistant", "a\n# x user"), first=False)
        + document.render_block(msg("tool", "t", tool="x"), first=False)
    ).encode()
    head, _ = document.chain(first)
    blocks = document.split_rendered(more)
    assert len(blocks) == 2
    for block in blocks:
        head = document.chain_extend(head, block)
    assert document.chain(first + more) == (head, 3)
    assert document.chain(data)[1] == len(document.parse(data.decode()).messages) == 4


def test_chain_detects_every_changed_byte() -> None:
    data = sample_file()
    head, _ = document.chain(data)
    for i in range(len(data)):
        changed = data[:i] + bytes([data[i] ^ 0x01]) + data[i + 1 :]
        try:
            other, _ = document.chain(changed)
        except errors.FormatError:
            continue  # the frontmatter markers themselves: refused outright
        assert other != head, f"byte {i} changed undetected"


def test_chain_detects_removed_swapped_and_edited_blocks() -> None:
    data = sample_file()
    head, count = document.chain(data)
    _, starts = document.block_offsets(data)
    bounds = [*starts, len(data)]
    blocks = [data[lo:hi] for lo, hi in itertools.pairwise(bounds)]
    prefix = data[: starts[0]]
    assert prefix + b"".join(blocks) == data
    removed = prefix + blocks[0] + blocks[1] + blocks[3]
    swapped = prefix + blocks[0] + blocks[2] + blocks[1] + blocks[3]
    role = data.replace(b"## 2026-08-03T11:18:09Z assistant", b"## 2026-08-03T11:18:09Z system")
    ts = data.replace(b"## 2026-08-03T11:18:09Z", b"## 2026-08-03T11:18:10Z")
    truncated = data[:-1]
    appended = data + b"x"
    replayed = data + blocks[3]
    for variant in (removed, swapped, role, ts, truncated, appended, replayed):
        assert variant != data
        assert document.chain(variant)[0] != head
    assert document.chain(removed)[1] == 3
    assert document.chain(replayed)[1] == 5
    assert document.chain(swapped)[1] == count


# ---------------------------------------------------------------------------------------------
# timestamps


def test_year_below_1000_keeps_four_digits_and_stays_a_heading() -> None:
    # strftime("%Y") writes "999": the heading would stop matching and the message would
    # silently merge into the one before it
    ts = validation.normalize_ts("0999-01-01T00:00:00Z")
    text = document.render(header(), [msg("user", "a"), msg("user", "b", ts)])
    assert [(m.ts, m.content) for m in document.parse(text).messages] == [
        ("2026-08-03T11:18:06Z", "a"),
        ("0999-01-01T00:00:00Z", "b"),
    ]


@FAST
@given(st.datetimes(min_value=dt.datetime(1, 1, 1), max_value=dt.datetime(9999, 12, 31)))
def test_format_ts_round_trips(when: dt.datetime) -> None:
    text = document.format_ts(when)
    assert document.HEADING.fullmatch(f"## {text} tool")
    assert document.parse_ts(text) == when.replace(tzinfo=dt.UTC)
    assert validation.normalize_ts(text) == text


@FAST
@given(
    st.datetimes(
        min_value=dt.datetime(2, 1, 1),
        max_value=dt.datetime(9998, 12, 31),
        timezones=st.one_of(st.none(), st.just(dt.UTC), st.timezones()),
    )
)
def test_format_ts_writes_each_part_as_the_file_format_says(when: dt.datetime) -> None:
    """Four-digit year, two-digit fields, a fraction without trailing zeros only when there
    is one, in UTC: the same text as the fields written out one by one."""
    utc = when.astimezone(dt.UTC) if when.tzinfo else when
    expected = (
        f"{utc.year:04d}-{utc.month:02d}-{utc.day:02d}"
        f"T{utc.hour:02d}:{utc.minute:02d}:{utc.second:02d}"
    )
    if utc.microsecond:
        expected += f".{utc.microsecond:06d}".rstrip("0")
    assert document.format_ts(when) == expected + "Z"


# ---------------------------------------------------------------------------------------------
# format errors say where and what

FRONT = document.render_frontmatter(header())


@pytest.mark.parametrize(
    ("text", "detail"),
    [
        (
            "# 2026-08-03T11:18:06Z user\nhi\n",
            "line 1: expected '---' to open the frontmatter, got '# 2026-08-03T11:18:06Z user'",
        ),
        ("", "line 1: expected '---' to open the frontmatter, got ''"),
        ("\ufeff" + FRONT, "line 1: expected '---' to open the frontmatter, got '\\ufeff---'"),
        (
            "---\nformat_version: 1\n# 2026-08-03T11:18:06Z user\n",
            "line 1: unterminated frontmatter (no closing '---' line)",
        ),
        ("---\n---\n", "frontmatter is not a YAML mapping"),
        (FRONT.replace("format_version: 1", "format_version: 2"), "unknown format_version 2"),
        (FRONT.replace("format_version: 1", "format_version: '1'"), "unknown format_version '1'"),
        (FRONT.replace("format_version: 1", "format_version: 1.0"), "unknown format_version 1.0"),
        (FRONT.replace("format_version: 1\n", ""), "unknown format_version None"),
        (
            FRONT.replace('session_key: "s1"', "session_key: 0123"),
            "frontmatter field session_key must be a string, got 83",
        ),
        (
            FRONT.replace('started_at: "2026-08-03T11:18:06Z"', 'started_at: "yesterday"'),
            "frontmatter field started_at is not a UTC timestamp: 'yesterday'",
        ),
        (
            FRONT.replace('source_type: "session"', 'source_type: "mail"'),
            "frontmatter source_type 'mail' is unknown",
        ),
        (
            FRONT.replace("---\n\n", 'metadata: "x"\n---\n\n'),
            "frontmatter metadata must be a mapping, got 'x'",
        ),
        (
            FRONT.replace("---\n\n", "metadata: false\n---\n\n"),
            "frontmatter metadata must be a mapping, got False",
        ),
    ],
)
def test_format_errors(text: str, detail: str) -> None:
    with pytest.raises(errors.FormatError) as info:
        document.parse(text)
    assert info.value.detail == detail


def test_format_error_for_bad_yaml_names_the_line() -> None:
    text = FRONT.replace('agent_id: "hermes"', 'agent_id: "hermes": x')  # agent_id is line 5
    with pytest.raises(errors.FormatError) as info:
        document.parse(text)
    assert info.value.detail.startswith(
        "line 5: frontmatter is not valid YAML: mapping values are not allowed here"
    )


def test_file_id_must_be_the_files_own() -> None:
    other = "00000000-0000-4000-8000-000000000000"
    with pytest.raises(errors.FormatError) as info:
        document.parse(FRONT, file_id=other)
    assert info.value.detail == f"line 3: file_id {FILE_ID!r} is not the file's own id {other!r}"
    assert document.parse(FRONT, file_id=FILE_ID).header.file_id == FILE_ID


def test_block_offsets_format_errors() -> None:
    with pytest.raises(errors.FormatError) as info:
        document.block_offsets(b"# 2026-08-03T11:18:06Z user\n")
    assert info.value.detail == (
        "line 1: expected '---' to open the frontmatter, got '# 2026-08-03T11:18:06Z user'"
    )
    with pytest.raises(errors.FormatError) as info:
        document.block_offsets(b"---\nformat_version: 1\n")
    assert info.value.detail == "line 1: unterminated frontmatter (no closing '---' line)"


@pytest.mark.parametrize(
    "text",
    [
        "---\n---",
        "---\n---\n",
        FRONT.rstrip("\n"),
        FRONT.rstrip("\n").removesuffix("\n---") + "\n---",
        FRONT + "# 2026-08-03T11:18:06Z user\n\nhi\n\n",
        "---\nformat_version: 1\n",
        "# 2026-08-03T11:18:06Z user\n",
        "---\n---x\n",
    ],
)
def test_parse_and_chain_agree_on_the_frontmatter(text: str) -> None:
    """One rule for where a frontmatter ends, for parse (text) and chain (bytes): the same
    offset, or the same error. A frontmatter-only file without a final newline is one."""

    def where(func: Any, value: Any) -> object:
        try:
            return func(value)
        except errors.FormatError as exc:
            return exc.detail

    by_parse = where(lambda t: document.split_frontmatter(t)[1], text)
    by_chain = where(lambda b: document.block_offsets(b)[0], text.encode())
    assert by_parse == by_chain
    if isinstance(by_parse, int) and text.startswith(FRONT.rstrip("\n")):
        assert len(document.parse(text).messages) == document.chain(text.encode())[1]


@FAST
@given(HAND_WRITTEN, st.sampled_from(["", "\n", "\r\n"]), st.booleans())
def test_locate_finds_the_blocks_of_ascii_text_as_the_general_way_does(
    body: str, gap: str, whole: bool
) -> None:
    # locate reads ASCII (most chat) by one scan of the text, as parse does: the same blocks,
    # offsets and messages as decoding and parsing each block, on any text
    frontmatter = document.render_frontmatter(header())[:-1] + gap
    data = (frontmatter + body).encode("ascii", "replace")
    base = 0 if whole else len(frontmatter)
    if not whole:  # rendered blocks after a file's first bytes, as a flush reads them
        data = data[base:]
    try:
        expected = document._located(data, base, 7, None)
    except errors.FormatError as exc:  # an upload without a heading, a body not UTF-8
        with pytest.raises(errors.FormatError, match=re.escape(exc.detail)):
            document.locate(data, base=base, first_seq=7)
        return
    fast = document._located_ascii(data, base, 7)
    if fast is not None:  # no heading: an upload, which only the general way reads
        assert fast == expected
    assert document.locate(data, base=base, first_seq=7) == expected


def test_rendered_ascii_blocks_are_located_by_one_scan() -> None:
    blocks = [
        msg("user", "hello\n# 2026-08-03T11:18:06Z user\nthere", "2026-08-03T11:18:06Z"),
        msg("tool", "out", "2026-08-03T11:18:07Z", "read_file"),
    ]
    data = "".join(document.render_block(m, first=False) for m in blocks).encode()
    found = document._located_ascii(data, 500, 3)
    assert found is not None  # the scan, not the general way, read them
    assert found == document._located(data, 500, 3, None)
    assert [(f.offset, f.message.seq, f.message.content) for f in found] == [
        (500, 3, blocks[0].content),
        (500 + found[0].length, 4, "out"),
    ]
    assert found[1].message.tool_name == "read_file"
