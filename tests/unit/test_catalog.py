"""The catalog's values made without the database: SQLite's form of a message's timestamp, a
message's last words (what its neighbours' context terms are made of)."""

from __future__ import annotations

import datetime as dt

from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy.dialects import sqlite

from pipeline import catalog, document, tables, terms

_DIALECT = sqlite.dialect()
_STORED = tables.messages.c.ts.type.dialect_impl(_DIALECT).bind_processor(_DIALECT)


def stored(text: str) -> str:
    """What SQLAlchemy stores on SQLite for a timestamp of a file's form."""
    assert _STORED is not None
    return str(_STORED(document.parse_ts(text).replace(tzinfo=None)))


@given(st.datetimes(min_value=dt.datetime(1, 1, 1), max_value=dt.datetime(9999, 12, 31)))
def test_a_timestamp_is_stored_as_sqlalchemy_stores_it(when: dt.datetime) -> None:
    text = document.format_ts(when)
    assert document.TS.fullmatch(text)
    assert catalog._sqlite_ts(text) == stored(text)


def test_written_fractions_of_any_length_read_as_their_microseconds() -> None:
    # a file's heading may hold a fraction of one to six digits, trailing zeros or not
    for text, expected in [
        ("2026-08-03T11:18:06Z", "2026-08-03 11:18:06.000000"),
        ("2026-08-03T11:18:06.5Z", "2026-08-03 11:18:06.500000"),
        ("2026-08-03T11:18:06.10Z", "2026-08-03 11:18:06.100000"),
        ("0999-01-02T03:04:05.000007Z", "0999-01-02 03:04:05.000007"),
    ]:
        assert catalog._sqlite_ts(text) == expected == stored(text)


def last_words(found: list[str]) -> list[str]:
    """:func:`catalog._last_words` as its docstring says it, written plainly."""
    stops = terms.stop_terms()
    distinct = [t for t in dict.fromkeys(reversed(found)) if t not in stops]
    return distinct[: catalog.CONTEXT_TERMS][::-1]


_WORDS = st.sampled_from(["the", "a", "jam", "quince", "market", "toast", "plum", "x1", "到了"])


@given(st.lists(_WORDS, max_size=300))
def test_a_messages_last_words_are_its_last_distinct_terms_but_stop_words(
    found: list[str],
) -> None:
    # few distinct words, up to 300 terms: a walk back that ends early, late or not at all
    made = catalog._last_words(found, terms.stop_terms())
    assert made == last_words(found)
    assert catalog._last_words(made, terms.stop_terms()) == made  # a flush keeps it (Recent)


def test_last_words_of_a_long_message_come_from_its_end() -> None:
    found = [f"w{i}" for i in range(10_000)] + ["the"] * 100 + ["jam"] * 100
    expected = [f"w{i}" for i in range(10_000 - catalog.CONTEXT_TERMS + 1, 10_000)] + ["jam"]
    assert catalog._last_words(found, terms.stop_terms()) == expected
