"""The built-in offline refiner: deterministic, no model, the embedded default.

It keeps what is cheap to recognise and worth remembering: statements users make about
themselves, their preferences, decisions (from anyone), and a one-line summary of each tool
result — in English and Chinese. Code blocks are skipped, and so are what the clients'
convention marks as not conversation (docs/format.md, "Tool calls"): tool calls, the model's
thinking and compaction summaries (which repeat what came before); a result's call id is not
its output.
"""

from __future__ import annotations

import re

from pipeline import convention, errors, refine

MAX_ITEM_CHARS = 300

_PATTERNS: tuple[tuple[str, tuple[str, ...], re.Pattern[str]], ...] = (
    (
        "preference",
        ("user",),
        re.compile(
            r"\bI(?: really| much| usually| always| generally)? (?:prefer|like|love|enjoy|hate|"
            r"dislike|can't stand|don't like|do not like|would rather)\b|\bI'd rather\b|"
            r"\bmy favou?rite\b|我(?:更|很|最|比较|不|非常)?(?:喜欢|偏好|讨厌|爱|想要|习惯)",
            re.IGNORECASE,
        ),
    ),
    (
        "decision",
        ("user", "assistant", "system"),
        re.compile(
            r"\b(?:we|I) (?:have )?(?:decided|agreed|chose|settled on)\b|\blet's go with\b|"
            r"\bwe(?:'ll| will) (?:use|go with)\b|\bdecision:|决定|定下来|就用|选定",
            re.IGNORECASE,
        ),
    ),
    (
        "profile",
        ("user",),
        re.compile(
            r"\b(?:I am|I'm) (?:(?:a|an|the|from|based|working)\b|\d)|\bmy name is\b|"
            r"\bcall me\b|"
            r"\bI (?:work|live|study) (?:at|in|for|on)\b|\bmy (?:job|role|team|company|"
            r"timezone|time zone|email|birthday)\b|"
            r"我(?:是|叫|在.{0,12}(?:工作|上班|读书)|住在|的(?:名字|工作|职业|生日|邮箱))",
            re.IGNORECASE,
        ),
    ),
)
_SENTENCE = re.compile(r"[^\n.!?。！？]*(?:[.!?。！？]+|$)")
_FENCE = re.compile(r"^(```|~~~)")


def _prose_lines(text: str) -> list[str]:
    lines, fenced = [], False
    for line in text.split("\n"):
        if _FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if not fenced and line.strip():
            lines.append(line.strip())
    return lines


def _clip(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_ITEM_CHARS else text[: MAX_ITEM_CHARS - 1] + "…"


class BuiltinRefiner:
    """Pattern-based extraction; same input, same items."""

    name = "builtin"
    parallel = False  #: its work is Python in this process: jobs take turns (Refiners.turn)

    def __init__(self, **options: object) -> None:
        if options:
            raise errors.InvalidInput(
                f"the builtin refiner takes no options; got {', '.join(sorted(options))}"
            )

    def refine(self, window: refine.Window) -> list[refine.Item]:
        """Items from each message (or part) of the window."""
        items: list[refine.Item] = []
        seen: set[tuple[str, str]] = set()
        for part in window.parts:
            marked = convention.kind(part.role, part.content)
            if marked in ("call", "thinking", "summary"):
                continue
            if marked == "result":
                output = convention.result_output(convention.parse_result(part.content)[1])
                first = next(iter(_prose_lines(output)), "")
                found = [("tool_result", f"{part.tool_name}: {_clip(first)}" if first else "")]
            else:
                found = []
                for line in _prose_lines(part.content):
                    for sentence in _SENTENCE.findall(line):
                        for kind, roles, pattern in _PATTERNS:
                            if part.role in roles and pattern.search(sentence):
                                found.append((kind, _clip(sentence)))
                                break
            for kind, content in found:
                if content and (kind, content) not in seen:
                    seen.add((kind, content))
                    items.append(refine.Item(kind, content, (window.source_ref(part),)))
        return items
