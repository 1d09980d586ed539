"""Search terms: the words-only fast path gives what the general tokenizer gives."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pipeline import terms


def general(text: str) -> list[str]:
    """The terms by the general path (CJK runs and words), for comparison."""
    text = text[: terms.MAX_INDEXED_CHARS]
    return [t for run, cjk in terms._runs(text) for t in terms._split(run, cjk)]


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
        "strasse",
        "file",
        "name",
        "x" * terms.MAX_TERM,
        "3",
        "14",
    ]


def test_cjk_runs_become_bigrams() -> None:
    assert terms.terms("数据库 ok") == ["数据", "据库", "ok"]
    assert terms.terms("字") == ["字"]
