"""Search terms of a text, the same on SQLite and PostgreSQL (docs/design.md §6): pure functions, no
I/O.

A text becomes a sequence of terms in reading order: each run of letters and digits is one
term (NFKC-normalised, case-folded, and an English word reduced to its Snowball stem, so
"decided", "decides" and "deciding" are one term), and each run of Chinese, Japanese or Korean
characters becomes its overlapping bigrams (a run of one character, that character) — so any
substring of two or more CJK characters is a phrase of adjacent bigrams, found wherever it
occurs, without a dictionary. Stop words stay in the index (a quoted phrase with "the" in it
still matches); a ranked query leaves them out.

A query is a list of phrases: a quoted phrase, a word, or a word that splits into several
terms (``e-mail``, a CJK run), each matched as adjacent terms. Under ``match=all`` every phrase
must match; under ``match=any`` (docs/search.md) a message matches any phrase that is not a
stop word, and ranking does the rest.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import operator
import re
import unicodedata
from typing import Literal

import Stemmer

from pipeline import errors

Match = Literal["any", "all"]
MATCHES: tuple[Match, ...] = ("any", "all")

#: characters of the scripts written without spaces between words: kana, CJK ideographs
#: (with extensions and compatibility forms), Hangul, half-width kana
_CJK = (
    "\u3040-\u30ff\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
    "\uac00-\ud7af\u1100-\u11ff\u3130-\u318f\uff66-\uff9f\U00020000-\U0003134f"
)
_QUERY_PART = re.compile(r'"([^"]*)"?|(\S+)')
MAX_TERM = 64  #: characters of one term; the rest of a longer run (a hash, base64) is dropped
#: PostgreSQL's bounds on one ``tsvector``: positions 1 to 16,383, and at most 256 positions
#: of a term (it drops the rest without a word: a phrase there would not be found)
PG_MAX_POSITION = 16_383
PG_MAX_TERM_POSITIONS = 256
#: bytes of a ``tsvector``'s terms and positions kept under PostgreSQL's 1 MiB (1,048,575:
#: each term's UTF-8 bytes, about 3 more, and 2 a position) — a segment of long unique words
#: (hashes) reaches it before its 16,383 positions
PG_MAX_BYTES = 1_000_000
#: terms a PostgreSQL segment of a long message repeats from the end of the one before
#: (:func:`segments`), so that a phrase of up to :data:`MAX_PHRASE_TERMS` terms that crosses
#: the boundary is whole in one of them; at most half :data:`PG_MAX_TERM_POSITIONS`, so every
#: segment moves on by as many new terms at least
SEGMENT_OVERLAP = 128
#: terms of a quoted phrase matched as adjacent terms; a longer phrase is matched as its
#: consecutive pieces of this many terms, each adjacent (docs/search.md)
MAX_PHRASE_TERMS = SEGMENT_OVERLAP + 1
#: characters a text is turned into terms at a time (cut where a space is), so that a long
#: upload's words are not all held at once on their way to their terms
_CHUNK_CHARS = 1 << 20


_HAS_CJK = re.compile(f"[{_CJK}]")
#: words the stemmer is given: English letters only (a word with digits or other scripts is
#: kept as it is, so "v2", "zoë" and "данные" are their own terms on both databases)
_ENGLISH = re.compile(r"[a-z]+")
_STEMMER = Stemmer.Stemmer("english")


class _Stems(dict[str, str]):
    """Stems already computed, by word: the write path stems every word of every message, and
    a store's vocabulary is mostly a few thousand words (cleared past :data:`_STEMS_MAX`, so a
    stream of unique tokens cannot grow it without bound). A word not in it is stemmed where
    it is looked up (``__missing__``), so :func:`_stems` looks a message's words up in one
    pass in C and pays for its misses (a number, a name) only."""

    def __missing__(self, word: str) -> str:
        if len(word) > MAX_TERM:  # its first MAX_TERM characters' term, the word not kept
            return self[word[:MAX_TERM]]
        found = _stemmed(word)
        if len(self) >= _STEMS_MAX:
            self.clear()
        self[word] = found
        return found


_STEMS = _Stems()
_STEMS_MAX = 200_000


def stem(word: str) -> str:
    """The index term of one folded word: its English Snowball stem, or the word itself."""
    if len(word) > MAX_TERM:  # not a term's word (:func:`_stems` cuts it): not kept
        return _stemmed(word)
    return _STEMS[word]


def _stemmed(word: str) -> str:
    """:func:`stem`, not cached."""
    return _STEMMER.stemWord(word) if _ENGLISH.fullmatch(word) else word


#: ASCII letters and digits lowered, every other ASCII character a space. On ASCII text NFKC
#: changes nothing and case-folding is lowering, and a word (:data:`_TOKEN`) is a run of
#: ``[a-z0-9]``: so translating and splitting on spaces finds the words a regex would, at a
#: third of its cost (the terms are most of a flush's and a reindex's CPU time)
_ASCII_WORDS = str.maketrans(
    {chr(c): chr(c).lower() if chr(c).isalnum() else " " for c in range(128)}
)
#: the same on UTF-8 bytes, which leaves the bytes of other characters as they are (no ASCII
#: byte occurs in them): the spaces cut a text into pieces no word or CJK run crosses
_ASCII_SPACES = bytes(c if c >= 128 or chr(c).isalnum() else 32 for c in range(256))
_TOKEN = re.compile(rf"([{_CJK}]+)|([^\W_{_CJK}]+)")


def _stems(words: list[str]) -> list[str]:
    """The term of each word (:func:`stem` of its first :data:`MAX_TERM` characters)."""
    # the cache looked up in one pass: a call per word costs as much as the rest of terms()
    return list(map(_STEMS.__getitem__, words))


def terms(text: str) -> list[str]:
    """The terms of ``text`` (all of it, however long), in order."""
    if len(text) <= _CHUNK_CHARS:
        return _terms(text)
    found: list[str] = []
    start = 0
    while start < len(text):
        # cut after a space (no word, CJK run or NFKC composition crosses one): the last in
        # the chunk, else the first after it
        end = start + _CHUNK_CHARS
        if end < len(text):
            space = max(text.rfind(c, start, end) for c in " \n\t")
            if space < start:
                space = min(
                    (i for i in (text.find(c, end) for c in " \n\t") if i >= 0), default=len(text)
                )
            end = space + 1
        found += _terms(text[start:end])
        start = end
    return found


def _terms(text: str) -> list[str]:
    if not text.isascii():  # on ASCII, NFKC changes nothing and folding is lowering
        text = unicodedata.normalize("NFKC", text).casefold()
        if not text.isascii():
            return _mixed(text)
    return _stems(text.translate(_ASCII_WORDS).split())


def _mixed(folded: str) -> list[str]:
    """:func:`terms` of a normalised, case-folded text with characters past ASCII."""
    raw = folded.encode("utf-8", "surrogatepass").translate(_ASCII_SPACES)
    found: list[str] = []
    words: list[str] = []  # words not yet stemmed, in order after ``found``
    for piece in raw.decode("utf-8", "surrogatepass").split():
        if piece.isascii():
            words.append(piece)
            continue
        for cjk, word in _TOKEN.findall(piece):
            if word:
                words.append(word)
                continue
            if words:
                found += _stems(words)
                words = []
            # a run's overlapping bigrams; a run of one character is its own term
            found += map(operator.add, cjk[:-1], cjk[1:]) if len(cjk) > 1 else (cjk,)
    if words:
        found += _stems(words)
    return found


#: English words a ranked query leaves out (they say how a question is asked, not what about);
#: the index keeps them, so a quoted phrase may hold them
STOP_WORDS = frozenset(
    """a about above after again against all am an and any are as at be because been before
    being below between both but by can could did do does doing down during each few for from
    further had has have having he her here hers herself him himself his how i if in into is it
    its itself just me more most my myself no nor not now of off on once only or other our ours
    ourselves out over own same she should so some such than that the their theirs them
    themselves then there these they this those through to too under until up very was we were
    what when where which while who whom why will with would you your yours yourself yourselves
    s t don ll re ve d m o y""".split()  # noqa: SIM905 - a list to read, not to diff
)


@functools.lru_cache(maxsize=1)
def _stop_terms() -> frozenset[str]:
    return frozenset(stem(w) for w in STOP_WORDS)


def stop_terms() -> frozenset[str]:
    """The terms of :data:`STOP_WORDS` (which a ranked query leaves out)."""
    return _stop_terms()


@dataclasses.dataclass(frozen=True)
class Query:
    """Phrases (each a sequence of adjacent terms) that must all match (``match="all"``) or
    of which any may (``match="any"``: the stop words left out, ranking does the rest)."""

    phrases: tuple[tuple[str, ...], ...]
    #: what to look for in a message's text to cut its snippet, case-folded
    needles: tuple[str, ...]
    match: Match = "all"


def parse_query(q: str, *, match: Match = "all") -> Query:
    """A user's query: ``"quoted phrases"`` and words. InvalidInput when nothing in it can be
    searched for. Under ``match="any"``, a word (not a quoted phrase) whose terms are all stop
    words is left out — unless every word of the query is one."""
    if match not in MATCHES:
        raise errors.InvalidInput(f"match must be 'any' or 'all', got {match!r}")
    phrases: list[tuple[str, ...]] = []
    needles: list[str] = []
    stops: list[bool] = []
    stop_terms = _stop_terms()
    for found_match in _QUERY_PART.finditer(q):
        quoted, word = found_match.groups()
        part = quoted if quoted is not None else word
        found = tuple(terms(part))
        needle = unicodedata.normalize("NFKC", part).casefold().strip()
        # ranked, an unquoted CJK run is its bigrams, each on its own: a question's run holds
        # its question words too ("叫什么"), which the answer does not
        split = match == "any" and quoted is None and len(found) > 1 and _HAS_CJK.search(part)
        # a phrase longer than a PostgreSQL segment may hold whole: its pieces, on both
        step = 1 if split else MAX_PHRASE_TERMS
        for phrase in (found[i : i + step] for i in range(0, len(found), step)):
            if phrase and phrase not in phrases:
                phrases.append(phrase)
                needles.append(phrase[0] if split else needle)
                stops.append(quoted is None and all(t in stop_terms for t in phrase))
    if not phrases:
        raise errors.InvalidInput(f"q has no word to search for: {q[:80]!r}")
    if match == "any" and not all(stops):
        kept = [i for i, stop in enumerate(stops) if not stop]
        phrases = [phrases[i] for i in kept]
        needles = [needles[i] for i in kept]
    return Query(tuple(phrases), tuple(needles), match)


@functools.lru_cache(maxsize=4096)
def tag(kind: str, value: str) -> str:
    """A term that stands for a fact about a message (its agent, file, role): letters and
    digits only, so every tokenizer keeps it whole."""
    return kind + hashlib.sha256(value.encode("utf-8")).hexdigest()[:20]


# ---------------------------------------------------------------------------------------------
# the two databases' query languages


def _fts_phrase(phrase: tuple[str, ...]) -> str:
    return '"' + " ".join(t.replace('"', '""') for t in phrase) + '"'


def fts5_match(query: Query, *, tags: list[list[str]], columns: str = "terms") -> str:
    """An FTS5 MATCH expression: every phrase (``match="any"``: one of them) in the ``terms``
    column (or the ``columns`` named, e.g. ``{terms context}``), and for each group of
    ``tags`` one of them in the ``tags`` column."""
    if query.match == "any":
        parts = [f"{columns} : (" + " OR ".join(_fts_phrase(p) for p in query.phrases) + ")"]
    else:
        parts = [f"{columns} : {_fts_phrase(p)}" for p in query.phrases]
    for group in tags:
        parts.append("(" + " OR ".join(f'tags : "{t}"' for t in group) + ")")
    return " AND ".join(parts)


def _lexeme(term: str) -> str:
    return "'" + term.replace("\\", "\\\\").replace("'", "''") + "'"


def tsquery(query: Query) -> str:
    """A PostgreSQL tsquery literal: phrases joined by ``&`` (``match="any"``: by ``|``), a
    phrase's terms by ``<->``."""
    join = " | " if query.match == "any" else " & "
    return join.join(phrase_tsquery(p) for p in query.phrases)


def phrase_tsquery(phrase: tuple[str, ...]) -> str:
    """The tsquery literal of one phrase: its terms adjacent, in order."""
    return "(" + " <-> ".join(_lexeme(t) for t in phrase) + ")"


def phrase_fts5(phrase: tuple[str, ...], *, columns: str = "terms") -> str:
    """The FTS5 MATCH expression of one phrase in the ``terms`` column (or ``columns``)."""
    return f"{columns} : {_fts_phrase(phrase)}"


def tsvector(found: list[str]) -> str:
    """A PostgreSQL tsvector literal of terms in order, positions from 1: one of
    :func:`segments`, which PostgreSQL keeps whole."""
    positions: dict[str, list[int]] = {}
    for i, term in enumerate(found, 1):
        positions.setdefault(term, []).append(i)
    return " ".join(f"{_lexeme(term)}:{','.join(map(str, ps))}" for term, ps in positions.items())


def segments(found: list[str]) -> list[tuple[int, list[str]]]:
    """A message's terms as PostgreSQL indexes them: ``(terms before it, its terms)`` of each
    segment, in order — one for any message within PostgreSQL's bounds on a ``tsvector``
    (:data:`PG_MAX_POSITION` terms, none more than :data:`PG_MAX_TERM_POSITIONS` times, at
    most :data:`PG_MAX_BYTES`), else
    as many as it takes, each starting :data:`SEGMENT_OVERLAP` terms before the one before
    ends. So every run of :data:`MAX_PHRASE_TERMS` terms is whole in a segment: a phrase is
    found anywhere (SQLite's one row has no such bounds)."""
    if len(found) <= PG_MAX_TERM_POSITIONS:  # at most 256 * (64 * 4 + 5) bytes
        return [(0, found)]
    if len(found) <= PG_MAX_POSITION:
        counts = collections.Counter(found)
        size = sum(map(_size, counts)) + 2 * len(found)
        if max(counts.values()) <= PG_MAX_TERM_POSITIONS and size <= PG_MAX_BYTES:
            return [(0, found)]
    made: list[tuple[int, list[str]]] = []
    start = 0
    while True:
        counts = collections.Counter()
        end, last, size = start, min(len(found), start + PG_MAX_POSITION), 0
        while end < last:
            term = found[end]
            seen = counts[term]
            size += 2 if seen else _size(term) + 2
            if seen == PG_MAX_TERM_POSITIONS or size > PG_MAX_BYTES:
                break
            counts[term] = seen + 1
            end += 1
        made.append((start, found[start:end]))
        if end == len(found):
            return made
        # a segment holds PG_MAX_TERM_POSITIONS terms at least (PG_MAX_BYTES, over 3,800 of
        # the longest), twice the overlap: it moves on
        start = end - SEGMENT_OVERLAP


def _size(term: str) -> int:
    """The bytes a term takes in a ``tsvector`` but its positions (:data:`PG_MAX_BYTES`)."""
    return (len(term) if term.isascii() else len(term.encode("utf-8", "surrogatepass"))) + 3


def phrase_count(positions: dict[str, list[int]], phrase: tuple[str, ...]) -> int:
    """How many times ``phrase`` occurs, its terms adjacent, in a message's term positions."""
    first = positions.get(phrase[0])
    if not first:
        return 0
    if len(phrase) == 1:
        return len(first)
    rest = [set(positions.get(t, ())) for t in phrase[1:]]
    return sum(1 for p in first if all(p + k in s for k, s in enumerate(rest, 1)))


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
