"""The catalog's values made without the database: SQLite's form of a message's timestamp."""

from __future__ import annotations

import datetime as dt

from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy.dialects import sqlite

from pipeline import catalog, document, tables

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
