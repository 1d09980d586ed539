"""Search terms: the words-only fast path gives what the general tokenizer gives."""

from __future__ import annotations

import unicodedata

from hypothesis import given
from hypothesis import strategies as st

from pipeline import terms


def general(text: str) -> list[str]:
    """The terms by the general path (CJK runs and words), for comparison."""
    folded = unicodedata.normalize("NFKC", text[: terms.MAX_INDEXED_CHARS]).casefold()
    return [t for run, cjk in terms._runs(folded) for t in terms._split(run, cjk)]


@given(
    st.text(
        alphabet=st.one_of(
            st.sampled_from(list("abcXYZ019_-.\\ \n\t\"'ßİﬁⅫ")),  # folding and NFKC cases
            st.characters(codec="utf-8"),
        ),
        max_size=200,
    )
)
def test_fast_path_matches_the_general_one(text: str) -> None:
    assert terms.terms(text) == general(text)


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
