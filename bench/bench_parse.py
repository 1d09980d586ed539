"""Throughput of ``pipeline.document.parse`` against a naive split with the seed's loose regex.

    .venv/bin/python bench/bench_parse.py            # full corpora (~75 MB + ~50 MB)
    .venv/bin/python bench/bench_parse.py --quick    # ~14 MB + ~8 MB, for CI / a smoke run

The corpus is made in memory with ``document.render`` from a fixed random seed, so every run
parses the same bytes: many small sessions (5-30 messages) and a few large ones (thousands of
messages), with code blocks, Markdown headings inside bodies, Python comments such as
``# Display the results to the user``, CJK text and tool outputs.

Each contender runs over the whole corpus ``--repeat`` times, round-robin; the best run counts.
Time is the process's CPU time (robust on a shared machine). MB/s is UTF-8 megabytes
(10**6 bytes) of file text per CPU second, frontmatter included.

Two corpora: the target one (agent sessions, where tools now and then return whole source
files, mean message ~1.6 KB) and, for honesty, short messages only (~1 KB mean), where
``parse``'s per-message cost weighs most against the naive split's per-byte cost.

Baselines (what a reader following the seed literally would do):
  naive split        ``re.finditer(r'^#{1,2} .* (user|assistant|tool|system)$', text, re.M)``
                     over the text after the frontmatter, slicing out each block's body
  naive split+yaml   the same plus ``yaml.safe_load`` of the frontmatter
Neither baseline strips, unescapes or validates anything; ``document.parse`` does all of that.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import platform
import random
import re
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

# the repo itself, so the script also runs where the package is not installed
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline import document

SEED = 20260803
TARGET_MBPS = 200.0
TARGET_RATIO = 1.5
LOOSE = re.compile(r"^#{1,2} .* (user|assistant|tool|system)$", re.M)

# ---------------------------------------------------------------------------------------------
# corpus

_VOCABULARY = """
the a data file result user agent memory session function value list test error output config
server request response model token context window layer index query cache build deploy schema
table column record parse render append flush archive refine segment
"""
WORDS = tuple(_VOCABULARY.split())
CJK = (
    "请帮我把这个函数改成异步的，并且加上错误处理。",
    "我们需要在周五之前完成数据迁移，注意备份。",
    "这段代码的时间复杂度是多少？能不能优化一下？",
    "記憶層のテストはすべて成功しました。",
    "다음 단계로 배포 스크립트를 실행하세요.",
)
HEADINGS = ("## Summary", "### Steps", "# Plan", "## Notes for the user", "#### Details")
#: code comments; the role-ending ones are heading-like and get escaped in the file
PY_COMMENTS = (
    "# Display the results to the user",
    "# Load the data",
    "# TODO: handle the empty case",
    "## Step 2: send the report to the assistant",
    "# retry with backoff",
    "# keep the order stable for the index",
    "# see docs/design.md §3 before changing this",
    "# normalise before hashing",
)
TOOLS = ("read_file", "run_shell", "search", "http_get", "python", "list_dir")
#: lines of code-heavy transcripts: backslashes (regexes, Windows paths, escapes, LaTeX, shell
#: continuations), comments and Markdown headings at the start of lines, long lines
CODE_LINES = (
    'pattern = re.compile(r"^\\s*(\\d+)\\.(\\d+)\\s*$")',
    'path = "C:\\Users\\agent\\project\\src\\main.py"',
    'print("line one\\nline two\\ttabbed")',
    "\\begin{equation} x = \\frac{a}{b} \\end{equation}",
    "docker run --rm \\",
    "    -v $(pwd):/work \\",
    "# Display the results to the user",
    "## Step 2: send the report to the assistant",
    "# 2026-08-03T11:18:06Z user",
    "\\# 2026-08-03T11:18:06Z tool",
    "### Implementation notes",
    "#!/usr/bin/env bash",
    "    return {k: v for k, v in items if not k.startswith('#')}",
    "SELECT id, body FROM messages WHERE body LIKE '%\\_%' ESCAPE '\\';",
)


def sentence(rng: random.Random, lo: int = 6, hi: int = 20) -> str:
    words = rng.choices(WORDS, k=rng.randint(lo, hi))
    return " ".join(words).capitalize() + "."


def paragraph(rng: random.Random) -> str:
    if rng.random() < 0.2:
        return "".join(rng.choices(CJK, k=rng.randint(1, 4)))
    return " ".join(sentence(rng) for _ in range(rng.randint(1, 5)))


def code_block(rng: random.Random) -> str:
    lines = ["```python", "import pandas as pd", ""]
    for _ in range(rng.randint(3, 25)):
        roll = rng.random()
        if roll < 0.2:
            lines.append(rng.choice(PY_COMMENTS))
        elif roll < 0.3:
            lines.append("")
        else:
            name = rng.choice(WORDS)
            lines.append(f"{name} = compute({rng.choice(WORDS)!r}, limit={rng.randint(1, 999)})")
    lines.append("print(df.head())")
    lines.append("```")
    return "\n".join(lines)


def user_text(rng: random.Random) -> str:
    parts = [paragraph(rng) for _ in range(rng.randint(1, 3))]
    if rng.random() < 0.15:
        parts.append(code_block(rng))
    return "\n\n".join(parts)


def assistant_text(rng: random.Random) -> str:
    parts: list[str] = []
    for _ in range(rng.randint(1, 6)):
        roll = rng.random()
        if roll < 0.2:
            parts.append(rng.choice(HEADINGS))
        elif roll < 0.45:
            parts.append(code_block(rng))
        elif roll < 0.6:
            parts.append("\n".join(f"- {sentence(rng, 3, 8)}" for _ in range(rng.randint(2, 6))))
        else:
            parts.append(paragraph(rng))
    return "\n\n".join(parts)


def source_file(rng: random.Random) -> str:
    """What ``read_file`` returns in agent sessions: a numbered source file, often long."""
    lines = ['"""' + sentence(rng) + '"""', "", "from __future__ import annotations", ""]
    for _ in range(rng.randint(20, 300)):
        roll = rng.random()
        if roll < 0.08:
            lines += ["", f"def {rng.choice(WORDS)}_{rng.choice(WORDS)}(value, *, limit=10):"]
        elif roll < 0.16:
            lines.append("    " + rng.choice(PY_COMMENTS))
        elif roll < 0.22:
            lines.append("")
        else:
            name = rng.choice(WORDS)
            lines.append(f"    {name} = {rng.choice(WORDS)}.get({name!r}, {rng.randint(0, 99)})")
    return "\n".join(f"{i:>6}\t{line}" for i, line in enumerate(lines, 1))


def tool_text(rng: random.Random, *, reads: bool) -> str:
    roll = rng.random()
    if reads and roll < 0.35:
        return source_file(rng)
    roll = rng.random()
    if roll < 0.2:
        items = ",\n".join(
            f'  "{rng.choice(WORDS)}": {rng.randint(0, 10**6)}' for _ in range(rng.randint(3, 40))
        )
        return "{\n" + items + "\n}"
    if roll < 0.4:
        return "\n".join(
            f"src/{rng.choice(WORDS)}/{rng.choice(WORDS)}.py:{rng.randint(1, 999)}: "
            + sentence(rng, 3, 9)
            for _ in range(rng.randint(3, 40))
        )
    if roll < 0.55:
        return "\n".join(
            f"-rw-r--r-- 1 agent agent {rng.randint(0, 10**6):>8} {rng.choice(WORDS)}.py"
            for _ in range(rng.randint(3, 40))
        )
    if roll < 0.7:
        # a transcript pasted into a tool output: heading-like lines that must be escaped
        return "\n".join(
            f"## 2026-08-0{rng.randint(1, 9)}T12:00:00Z {rng.choice(document.ROLES)}\n"
            + sentence(rng)
            for _ in range(rng.randint(1, 4))
        )
    return "\n".join(
        f"2026-08-03 11:{i % 60:02d}:00 INFO {sentence(rng, 4, 12)}"
        for i in range(rng.randint(5, 80))
    )


def code_heavy_text(rng: random.Random) -> str:
    """A long message that is mostly code: fenced blocks of :data:`CODE_LINES` and code-like
    lines, with some prose between them."""
    parts: list[str] = []
    for _ in range(rng.randint(2, 8)):
        if rng.random() < 0.25:
            parts.append(paragraph(rng))
            continue
        lines = [rng.choice(("```python", "```bash", "```latex", "```"))]
        for _ in range(rng.randint(10, 80)):
            if rng.random() < 0.45:
                lines.append(rng.choice(CODE_LINES))
            else:
                name = rng.choice(WORDS)
                lines.append(
                    f"    {name} = {rng.choice(WORDS)}.get({name!r}, {rng.randint(0, 99)})"
                )
        lines.append("```")
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def message(
    rng: random.Random, when: dt.datetime, *, reads: bool, code: bool = False
) -> document.Message:
    roll = rng.random()
    ts = document.format_ts(when)
    if code and roll < 0.8:
        role = rng.choice(("assistant", "tool", "user"))
        tool = rng.choice(TOOLS) if role == "tool" else None
        return document.Message(role=role, content=code_heavy_text(rng), ts=ts, tool_name=tool)
    if roll < 0.3:
        return document.Message(role="user", content=user_text(rng), ts=ts)
    if roll < 0.68:
        return document.Message(role="assistant", content=assistant_text(rng), ts=ts)
    if roll < 0.98:
        content = tool_text(rng, reads=reads)
        return document.Message(role="tool", content=content, ts=ts, tool_name=rng.choice(TOOLS))
    return document.Message(role="system", content=sentence(rng), ts=ts)


def session_file(
    rng: random.Random, count: int, *, reads: bool, code: bool = False
) -> tuple[str, int]:
    start = dt.datetime(2026, 8, 3, 11, 18, 6, tzinfo=dt.UTC) + dt.timedelta(
        seconds=rng.randint(0, 10**7)
    )
    header = document.Header(
        file_id=str(uuid.UUID(int=rng.getrandbits(128), version=4)),
        session_key=f"{start:%Y%m%d_%H%M%S}_{rng.getrandbits(24):06x}",
        agent_id=rng.choice(("hermes", "claude-code", "codex")),
        source_type="session",
        started_at=document.format_ts(start),
        metadata={"app": "hermes-desktop", "platform": rng.choice(("linux", "macos"))},
    )
    messages = []
    when = start
    for _ in range(count):
        messages.append(message(rng, when, reads=reads, code=code))
        when += dt.timedelta(seconds=rng.randint(1, 120), microseconds=rng.choice((0, 250000)))
    return document.render(header, messages), count


def corpus(*, quick: bool, reads: bool = True, code: bool = False) -> list[tuple[str, int]]:
    """``(file text, message count)`` pairs, the same for every run.

    ``reads``: tools return whole source files now and then, as agents' ``read_file`` does;
    without them every message is short (chat-like), the hardest case for ``parse``, whose
    cost is mostly per message while the naive split's is per byte. ``code``: most messages
    are long and mostly code (:func:`code_heavy_text`).
    """
    rng = random.Random(SEED)
    small, large, large_size = (300, 2, (1000, 2000)) if quick else (2000, 4, (2000, 5000))
    if code:
        small, large, large_size = (150, 1, (300, 600)) if quick else (800, 2, (600, 1500))
    files = [session_file(rng, rng.randint(5, 30), reads=reads, code=code) for _ in range(small)]
    files += [
        session_file(rng, rng.randint(*large_size), reads=reads, code=code) for _ in range(large)
    ]
    return files


# ---------------------------------------------------------------------------------------------
# contenders


def naive_split(text: str) -> list[tuple[str, str]]:
    """The seed literally: frontmatter between the ``---`` lines, blocks by the loose regex."""
    end = text.find("\n---\n", 3)
    body = end + 5
    matches = list(LOOSE.finditer(text, body))
    blocks = []
    for i, m in enumerate(matches):
        stop = matches[i + 1].start() if i + 1 < len(matches) else len(text)
        blocks.append((m.group(0), text[m.end() + 1 : stop]))
    return blocks


def naive_split_yaml(text: str) -> tuple[Any, list[tuple[str, str]]]:
    end = text.find("\n---\n", 3)
    return yaml.safe_load(text[4 : end + 1]), naive_split(text)


def best_of(funcs: list[Callable[[str], object]], texts: list[str], repeat: int) -> list[float]:
    """Best CPU time of each ``func`` over every text, in ``repeat`` rounds.

    CPU time of this process rather than wall time, and round-robin (each round runs every
    contender once), so that other processes on a shared machine disturb the result as little
    as possible and all contenders alike; on an idle machine the two clocks agree.
    """
    best = [float("inf")] * len(funcs)
    for _ in range(repeat):
        for i, func in enumerate(funcs):
            gc.collect()
            gc.disable()
            try:
                t0 = time.process_time()
                for text in texts:
                    func(text)
                best[i] = min(best[i], time.process_time() - t0)
            finally:
                gc.enable()
    return best


def print_table(rows: list[tuple[str, float]], size: int) -> None:
    ours = rows[0][1]
    header = f"{'contender':<20} {'best s':>8} {'MB/s':>8} {'parse is':>9}"
    print(header)
    print("-" * len(header))
    for name, seconds in rows:
        ratio = "" if name == rows[0][0] else f"{seconds / ours:.2f}x"
        print(f"{name:<20} {seconds:>8.4f} {size / seconds / 1e6:>8.1f} {ratio:>9}")


def run(title: str, files: list[tuple[str, int]], repeat: int) -> tuple[float, float]:
    """Print one table; return parse's MB/s and its speed-up over the naive split."""
    texts = [text for text, _ in files]
    size = sum(len(text.encode("utf-8")) for text in texts)
    expected = sum(count for _, count in files)
    # the corpus is what it claims to be, and parse reads it back (not timed)
    parsed = sum(len(document.parse(text).messages) for text in texts)
    split = sum(len(naive_split(text)) for text in texts)
    if parsed != expected or split != expected:
        raise SystemExit(f"{title}: {expected} messages made, parse {parsed}, split {split}")
    big = max(len(t.encode("utf-8")) for t in texts)
    print(f"## {title}")
    print(
        f"{len(texts)} files, {expected} messages, {size / 1e6:.1f} MB "
        f"(mean message {size / expected:,.0f} B, largest file {big / 1e6:.1f} MB)"
    )
    names = ["document.parse", "naive split", "naive split+yaml"]
    times = best_of([document.parse, naive_split, naive_split_yaml], texts, repeat)
    rows = list(zip(names, times, strict=True))
    print_table(rows, size)
    print()
    return size / rows[0][1] / 1e6, rows[1][1] / rows[0][1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small corpus, fewer repeats")
    parser.add_argument("--repeat", type=int, default=None, help="runs per contender (best)")
    args = parser.parse_args(argv)
    repeat = args.repeat or (5 if args.quick else 9)
    print(
        f"python {platform.python_version()} ({platform.machine()}), PyYAML {yaml.__version__}, "
        f"seed {SEED}, best of {repeat} (CPU time); 'parse is' = contender time / parse time"
    )
    print()
    results = {
        "agent sessions": run("agent sessions", corpus(quick=args.quick), repeat),
        "code-heavy": run(
            "code-heavy sessions (backslashes, # lines in code, long messages)",
            corpus(quick=args.quick, code=True),
            repeat,
        ),
        "chat": run("chat (short messages only)", corpus(quick=args.quick, reads=False), repeat),
    }
    for name, (mbps, ratio) in results.items():
        ok = mbps >= TARGET_MBPS and ratio >= TARGET_RATIO
        print(
            f"{name}: {mbps:.0f} MB/s, {ratio:.2f}x the naive split "
            f"(targets >= {TARGET_MBPS:.0f} MB/s, >= {TARGET_RATIO}x): {'met' if ok else 'NOT met'}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
