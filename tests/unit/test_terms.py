"""Search terms: :func:`terms.terms` gives what the plain algorithm that defines the stored terms
gives (:func:`reference`), for any text."""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections import Counter

import Stemmer
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline import terms

_TOKEN = re.compile(rf"([{terms._CJK}]+)|([^\W_{terms._CJK}]+)")
_STEMMER = Stemmer.Stemmer("english")


def reference(text: str) -> list[str]:
    """The terms as the plain algorithm makes them, with no cache and no shortcut: NFKC, case
    folding, then each CJK run as its bigrams and each word, cut to MAX_TERM characters, as
    its Snowball stem when it is English letters only."""
    folded = unicodedata.normalize("NFKC", text).casefold()
    found: list[str] = []
    for match in _TOKEN.finditer(folded):
        cjk, word = match.groups()
        if cjk:
            found.extend([cjk] if len(cjk) == 1 else [cjk[i : i + 2] for i in range(len(cjk) - 1)])
        else:
            word = word[: terms.MAX_TERM]
            found.append(_STEMMER.stemWord(word) if re.fullmatch("[a-z]+", word) else word)
    return found


_PIECES = st.one_of(
    st.sampled_from(list("abcXYZ019_-.\\ \n\t\"'ßİﬁⅫ")),  # folding and NFKC cases
    st.sampled_from(["\u3000", "\xa0", "\u2028", "—", "§", "。"]),  # spaces and signs past ASCII
    st.sampled_from(list("éèàçñøÅÉÎöüœ")),  # Latin accents
    st.sampled_from(list("数据库的系统字ひらがなカタカナ㐀𠀀豈")),  # CJK, kana, extensions
    st.sampled_from(list("한국어데이터ᄀᄁㄱ")),  # Hangul, jamo
    st.sampled_from(list("ＡＢＣａｂｃ０１２＿ｶﾀｶﾅ")),  # full-width, half-width kana
    st.sampled_from(["deciding", "decided", "supports", "the", "v2", "zoë", "данные", "123"]),
    st.text(alphabet="abcdefghij0123456789", min_size=60, max_size=140),  # past MAX_TERM
    st.text(alphabet="Ａ数a", min_size=60, max_size=140),
    st.text(alphabet="aéZ9", min_size=60, max_size=140),  # a long word past ASCII
    st.characters(codec="utf-8"),
)


@settings(max_examples=500)
@given(st.lists(_PIECES, max_size=60).map("".join))
def test_terms_are_what_the_reference_makes(text: str) -> None:
    assert terms.terms(text) == reference(text)
    assert terms.terms(text) == reference(text)  # again, from the stem cache


@given(st.text(alphabet=st.characters(codec="ascii"), max_size=300))
def test_ascii_text_gives_the_reference_terms(text: str) -> None:
    assert terms.terms(text) == reference(text)


@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=200))
def test_any_text_gives_the_reference_terms(text: str) -> None:
    assert terms.terms(text) == reference(text)


def test_lone_surrogates_are_neither_words_nor_errors() -> None:
    text = "a\ud800b 数\udfff据 Zoë\udc80x"
    assert terms.terms(text) == reference(text)


def test_a_long_word_is_stemmed_by_its_first_characters_even_when_cached_uncut() -> None:
    long = "decidingly" * 10
    terms.stem(long)  # a caller may stem a longer word itself: it must not become its term
    assert terms.terms(long) == reference(long) == [_STEMMER.stemWord(long[: terms.MAX_TERM])]


def test_all_of_a_long_text_is_terms_across_the_pieces_it_is_read_in() -> None:
    text = "word 数据 Zoë " * 200_000 + "beyond " + "x" * (terms._CHUNK_CHARS + 10) + " last"
    assert len(text) > 3 * terms._CHUNK_CHARS
    found = terms.terms(text)
    assert found == reference(text)
    assert found[-3:] == ["beyond", "x" * terms.MAX_TERM, "last"]


def _segments_hold(found: list[str]) -> list[tuple[int, list[str]]]:
    """``terms.segments(found)``, checked: within PostgreSQL's bounds, each where its base
    says, and every run of MAX_PHRASE_TERMS terms whole in one of them."""
    made = terms.segments(found)
    covered = 0  # every run starting before this is whole in a segment
    for base, part in made:
        assert part == found[base : base + len(part)]
        assert len(part) <= terms.PG_MAX_POSITION
        assert max(Counter(part).values(), default=0) <= terms.PG_MAX_TERM_POSITIONS
        size = sum(len(t.encode()) + 3 for t in set(part)) + 2 * len(part)
        assert size <= terms.PG_MAX_BYTES
        assert base <= covered
        end = base + len(part)
        covered = len(found) if end == len(found) else end - terms.MAX_PHRASE_TERMS + 1
    assert covered == len(found)
    return made


def test_a_message_within_postgresql_bounds_is_one_segment() -> None:
    found = terms.terms("the cat sat on the mat " * 40)
    assert terms.segments(found) == [(0, found)]


def test_long_messages_are_overlapping_segments_postgresql_holds_whole() -> None:
    words = terms.terms(" ".join(f"w{i % 997}" for i in range(20_000)) + " crimson walrus")
    made = _segments_hold(words)
    assert len(made) == 2 and made[1][0] == terms.PG_MAX_POSITION - terms.SEGMENT_OVERLAP
    assert made[1][1][-2:] == ["crimson", "walrus"]
    # one word again and again: segments of 256, each moving on by at least the overlap
    same = ["ab"] * 10_000 + ["end"]
    made = _segments_hold(same)
    assert all(len(p) == terms.PG_MAX_TERM_POSITIONS for _, p in made[:-1])
    assert len(made) == -(-(10_001 - 256) // (256 - terms.SEGMENT_OVERLAP)) + 1
    _segments_hold(["a", "b"] * 300 + ["c"] * 20_000 + ["a"])


def test_segments_of_long_unique_words_stay_under_postgresqls_bytes() -> None:
    hashes = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(16_000)]
    made = _segments_hold(hashes)
    assert len(made) == 2 and len(made[0][1]) == terms.PG_MAX_BYTES // (64 + 3 + 2)
    cjk = terms.terms("".join(chr(0x4E00 + i) for i in range(15_000)))  # 14,999 bigrams
    assert len(_segments_hold(cjk)) == 1  # 6 bytes each


@settings(max_examples=200)
@given(st.lists(st.sampled_from(["a", "b", "c", "d"]), min_size=250, max_size=3000))
def test_segments_always_hold_every_phrase_whole(found: list[str]) -> None:
    _segments_hold(found)


def test_a_phrase_longer_than_a_segment_holds_is_matched_in_pieces() -> None:
    words = [f"w{i}" for i in range(terms.MAX_PHRASE_TERMS * 2 + 5)]
    query = terms.parse_query('"' + " ".join(words) + '"')
    assert [len(p) for p in query.phrases] == [terms.MAX_PHRASE_TERMS] * 2 + [5]
    assert [t for p in query.phrases for t in p] == words


def test_words_are_folded_and_cut() -> None:
    long = "x" * 100
    assert terms.terms(f"Straße ﬁle_name {long} 3.14") == [
        "strass",  # folded, then stemmed
        "file",
        "name",
        "x" * terms.MAX_TERM,
        "3",
        "14",
    ]


def test_cjk_runs_become_bigrams() -> None:
    assert terms.terms("数据库 ok") == ["数据", "据库", "ok"]
    assert terms.terms("字") == ["字"]


def test_english_words_are_stemmed_others_kept() -> None:
    assert terms.terms("Deciding decided DECIDES the supports v2 zoë") == [
        "decid",
        "decid",
        "decid",
        "the",  # stop words stay in the index: a quoted phrase may hold them
        "support",
        "v2",
        "zoë",
    ]


def test_a_ranked_query_leaves_stop_words_out_unless_quoted() -> None:
    q = terms.parse_query('When did Caroline go to "the support group"?', match="any")
    assert q.phrases == (("carolin",), ("go",), ("the", "support", "group"))
    assert terms.tsquery(q) == "('carolin') | ('go') | ('the' <-> 'support' <-> 'group')"
    assert terms.fts5_match(q, tags=[["t1", "t2"]]) == (
        'terms : ("carolin" OR "go" OR "the support group") AND (tags : "t1" OR tags : "t2")'
    )
    # every word a stop word: they are searched for after all
    assert terms.parse_query("what was it", match="any").phrases == (("what",), ("was",), ("it",))
    # match=all keeps every word, as before
    assert terms.parse_query("when did it", match="all").phrases == (
        ("when",),
        ("did",),
        ("it",),
    )


def test_phrases_are_counted_from_term_positions() -> None:
    positions = {"x": [3, 5, 7], "y": [4, 6]}
    assert terms.phrase_count(positions, ("x", "y")) == 2
    assert terms.phrase_count(positions, ("y", "x")) == 2
    assert terms.phrase_count(positions, ("x",)) == 3
    assert terms.phrase_count(positions, ("z",)) == 0
