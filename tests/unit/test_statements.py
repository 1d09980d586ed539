"""Prepared statements' binding (pipeline.database.statements): the values handed to the
driver for many rows at once are those :meth:`_Compiled.bind` gives each row alone."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy.dialects import postgresql, sqlite

from pipeline import database, tables

MESSAGE_ROW = database.Prepared(
    sa.insert(tables.messages).values(id=sa.bindparam("id"), **database.binds(tables.messages))
)
ONE = database.Prepared(
    sa.delete(tables.messages).where(tables.messages.c.id == sa.bindparam("id"))
)

row = st.fixed_dictionaries(
    {
        "id": st.integers(1, 2**40),
        "file_id": st.text(max_size=8),
        "seq": st.integers(1, 10**6),
        "byte_offset": st.integers(0, 2**40),
        "byte_length": st.integers(0, 2**20),
        "ts": st.datetimes(min_value=dt.datetime(1, 1, 1)),
        "role": st.sampled_from(["user", "assistant", "tool"]),
    },
    # a key may be left out: its default (None) is bound
    optional={"tool_name": st.one_of(st.none(), st.text(max_size=8))},
)


@given(st.lists(row, max_size=6))
def test_many_rows_bind_as_each_alone(rows: list[dict[str, Any]]) -> None:
    pg = postgresql.psycopg.dialect()  # type: ignore[no-untyped-call]
    for dialect in (sqlite.dialect(), pg):
        compiled = MESSAGE_ROW._for(dialect)
        assert compiled.bind_many(rows) == [compiled.bind(r) for r in rows]
        one = ONE._for(dialect)
        ids = [{"id": r["id"]} for r in rows]
        assert one.bind_many(ids) == [one.bind(r) for r in ids]


def test_a_datetime_is_converted_and_a_missing_key_defaults(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    compiled = MESSAGE_ROW._for(sqlite.dialect())
    alone: list[dict[str, Any]] = []  # the rows bound one by one: only the one missing a key
    real_bind = compiled.bind

    def bind(params: dict[str, Any]) -> Any:
        alone.append(params)
        return real_bind(params)

    monkeypatch.setattr(compiled, "bind", bind)
    when = dt.datetime(2026, 12, 3, 9, 30, 1, 5)
    full = {"id": 1, "file_id": "f", "seq": 1, "byte_offset": 0, "byte_length": 9, "ts": when}
    bound = compiled.bind_many(
        [{**full, "role": "tool", "tool_name": "grep"}, {**full, "role": "user"}]
    )
    assert [row.get("tool_name", "missing") for row in alone] == ["missing"]
    assert [b[-3:] for b in bound] == [
        ("2026-12-03 09:30:01.000005", "tool", "grep"),
        ("2026-12-03 09:30:01.000005", "user", None),
    ]
