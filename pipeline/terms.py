"""Search terms of a text, the same on SQLite and PostgreSQL (docs/design.md §6): pure functions, no
I/O.

A text becomes a sequence of terms in reading order: each run of letters and digits is one
term (NFKC-normalised and case-folded), and each run of Chinese, Japanese or Korean characters
becomes its overlapping bigrams (a run of one character, that character) — so any substring
of two or more CJK characters is a phrase of adjacent bigrams, found wherever it occurs,
without a dictionary. A query is a list of phrases, all of which must match: a quoted phrase,
a word, or a word that splits into several terms (``e-mail``, a CJK run), each matched as
adjacent terms.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import re
import unicodedata

from pipeline import errors

#: characters of the scripts written without spaces between words: kana, CJK ideographs
#: (with extensions and compatibility forms), Hangul, half-width kana
_CJK = (
    "\u3040-\u30ff\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
    "\uac00-\ud7af\u1100-\u11ff\u3130-\u318f\uff66-\uff9f\U00020000-\U0003134f"
)
_TOKEN = re.compile(rf"([{_CJK}]+)|([^\W_{_CJK}]+)")
_QUERY_PART = re.compile(r'"([^"]*)"?|(\S+)')
MAX_TERM = 64  #: characters of one term; the rest of a longer run (a hash, base64) is dropped
#: characters of a message that are indexed (PostgreSQL keeps positions up to 16,383 and a
#: tsvector up to 1 MB: past this, words are not searchable — on both databases alike)
MAX_INDEXED_CHARS = 100_000


_HAS_CJK = re.compile(f"[{_CJK}]")
_WORD = re.compile(rf"[^\W_{_CJK}]+")


def _runs(text: str) -> list[tuple[str, bool]]:
    """``(run, is_cjk)`` in reading order, normalised and case-folded."""
    found = []
    for match in _TOKEN.finditer(unicodedata.normalize("NFKC", text).casefold()):
        cjk, word = match.groups()
        found.append((cjk, True) if cjk else (word[:MAX_TERM], False))
    return found


def _split(run: str, cjk: bool) -> list[str]:
    if not cjk or len(run) == 1:
        return [run]
    return [run[i : i + 2] for i in range(len(run) - 1)]


def terms(text: str) -> list[str]:
    """The terms of ``text`` (its first :data:`MAX_INDEXED_CHARS` characters), in order."""
    text = text[:MAX_INDEXED_CHARS]
    folded = unicodedata.normalize("NFKC", text).casefold()
    if not _HAS_CJK.search(folded):  # the common case: words only
        return [w[:MAX_TERM] if len(w) > MAX_TERM else w for w in _WORD.findall(folded)]
    found: list[str] = []
    for run, cjk in _runs(text):
        found.extend(_split(run, cjk))
    return found


@dataclasses.dataclass(frozen=True)
class Query:
    """Phrases that must all match (each a sequence of adjacent terms)."""

    phrases: tuple[tuple[str, ...], ...]
    #: what to look for in a message's text to cut its snippet, case-folded
    needles: tuple[str, ...]


def parse_query(q: str) -> Query:
    """A user's query: ``"quoted phrases"`` and words, every one required. InvalidInput when
    nothing in it can be searched for."""
    phrases: list[tuple[str, ...]] = []
    needles: list[str] = []
    for match in _QUERY_PART.finditer(q):
        quoted, word = match.groups()
        part = quoted if quoted is not None else word
        found = tuple(terms(part))
        if found and found not in phrases:
            phrases.append(found)
            needles.append(unicodedata.normalize("NFKC", part).casefold().strip())
    if not phrases:
        raise errors.InvalidInput(f"q has no word to search for: {q[:80]!r}")
    return Query(tuple(phrases), tuple(needles))


@functools.lru_cache(maxsize=4096)
def tag(kind: str, value: str) -> str:
    """A term that stands for a fact about a message (its agent, file, role): letters and
    digits only, so every tokenizer keeps it whole."""
    return kind + hashlib.sha256(value.encode("utf-8")).hexdigest()[:20]


# ---------------------------------------------------------------------------------------------
# the two databases' query languages


def _fts_phrase(phrase: tuple[str, ...]) -> str:
    return '"' + " ".join(t.replace('"', '""') for t in phrase) + '"'


def fts5_match(query: Query, *, tags: list[list[str]]) -> str:
    """An FTS5 MATCH expression: every phrase in the ``terms`` column, and for each group of
    ``tags`` one of them in the ``tags`` column."""
    parts = [f"terms : {_fts_phrase(p)}" for p in query.phrases]
    for group in tags:
        parts.append("(" + " OR ".join(f'tags : "{t}"' for t in group) + ")")
    return " AND ".join(parts)


def _lexeme(term: str) -> str:
    return "'" + term.replace("\\", "\\\\").replace("'", "''") + "'"


def tsquery(query: Query) -> str:
    """A PostgreSQL tsquery literal: phrases joined by ``&``, a phrase's terms by ``<->``."""
    return " & ".join("(" + " <-> ".join(_lexeme(t) for t in p) + ")" for p in query.phrases)


def tsvector(found: list[str]) -> str:
    """A PostgreSQL tsvector literal of terms in order (positions from 1, as PostgreSQL keeps
    them: at most 16,383; :data:`MAX_INDEXED_CHARS` keeps a message under that)."""
    positions: dict[str, list[int]] = {}
    for i, term in enumerate(found, 1):
        positions.setdefault(term, []).append(min(i, 16383))
    return " ".join(
        f"{_lexeme(term)}:{','.join(map(str, sorted(set(ps))))}" for term, ps in positions.items()
    )


# ---------------------------------------------------------------------------------------------
# snippets


def snippet(text: str, query: Query, *, width: int = 160) -> str:
    """About ``width`` characters of ``text`` around the first place a query word occurs, on
    one line, with ``…`` where it was cut."""
    folded = unicodedata.normalize("NFKC", text).casefold()
    at = -1
    for needle in query.needles:
        at = folded.find(needle)
        if at >= 0:
            break
    if at < 0:  # matched through terms the needle does not spell (punctuation between them)
        first = " ".join(query.phrases[0])
        at = max(folded.find(query.phrases[0][0]), 0) if first else 0
    # NFKC may change lengths; the folded position is close enough to cut the original at
    start = max(0, min(at, len(text)) - width // 3)
    end = min(len(text), start + width)
    piece = " ".join(text[start:end].split())
    return ("…" if start > 0 else "") + piece + ("…" if end < len(text) else "")
