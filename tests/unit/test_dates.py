"""Dates named in a question (:mod:`pipeline.dates`): each form the grammar knows, resolved
against a reference time into a window of whole days widened by ``dates.SLACK``."""

from __future__ import annotations

import datetime as dt

import pytest

from pipeline import dates

#: a Saturday
REF = dt.datetime(2026, 12, 5, 12, 0, tzinfo=dt.UTC)


def days(question: str, ref: dt.datetime = REF) -> tuple[str, str, str, str] | None:
    """The first and last day a question names (the window without its slack), the words
    that named it and the rest of the question."""
    found = dates.window(question, ref)
    if found is None:
        return None
    first = (found.since + dates.SLACK).date().isoformat()
    last = (found.until - dates.SLACK).date().isoformat()
    assert found.since.time() == dt.time() and found.until.time() == dt.time.max
    return first, last, found.matched, found.rest


@pytest.mark.parametrize(
    ("question", "first", "last", "matched"),
    [
        ("What did Bruno cook on July 27, 2026?", "2026-07-27", "2026-07-27", "on July 27, 2026"),
        ("dinner on 11 June 2026?", "2026-06-11", "2026-06-11", "on 11 June 2026"),
        ("the 3rd of March 2025", "2025-03-03", "2025-03-03", "the 3rd of March 2025"),
        ("notes from 2026-01-16", "2026-01-16", "2026-01-16", "2026-01-16"),
        ("what happened in May 2023", "2023-05-01", "2023-05-31", "in May 2023"),
        ("Sept. 2024 trip", "2024-09-01", "2024-09-30", "Sept. 2024"),
        ("in 2024 we moved", "2024-01-01", "2024-12-31", "in 2024"),
        # a day without a year: the last one on or before the reference day
        ("on August 22", "2026-08-22", "2026-08-22", "on August 22"),
        ("on December 25", "2025-12-25", "2025-12-25", "on December 25"),
        ("in March", "2026-03-01", "2026-03-31", "in March"),
        ("today", "2026-12-05", "2026-12-05", "today"),
        ("what did I say yesterday", "2026-12-04", "2026-12-04", "yesterday"),
        ("last Tuesday we met", "2026-12-01", "2026-12-01", "last Tuesday"),
        ("last Saturday", "2026-11-28", "2026-11-28", "last Saturday"),
        ("last week", "2026-11-23", "2026-11-29", "last week"),
        ("this week", "2026-11-30", "2026-12-06", "this week"),
        ("last month", "2026-11-01", "2026-11-30", "last month"),
        ("last year", "2025-01-01", "2025-12-31", "last year"),
        ("three days ago", "2026-12-02", "2026-12-02", "three days ago"),
        ("two weeks ago I said", "2026-11-18", "2026-11-24", "two weeks ago"),
        ("a month ago", "2026-10-21", "2026-11-20", "a month ago"),
        ("2 years ago", "2024-01-01", "2024-12-31", "2 years ago"),
        ("昨天说了什么", "2026-12-04", "2026-12-04", "昨天"),
        ("前天", "2026-12-03", "2026-12-03", "前天"),
        ("上周的会议", "2026-11-23", "2026-11-29", "上周"),
        ("上个月", "2026-11-01", "2026-11-30", "上个月"),
        ("去年", "2025-01-01", "2025-12-31", "去年"),
        ("2023年5月的旅行", "2023-05-01", "2023-05-31", "2023年5月"),
        ("2023年5月12日", "2023-05-12", "2023-05-12", "2023年5月12日"),
        ("5月12日吃了什么", "2026-05-12", "2026-05-12", "5月12日"),
        ("三天前", "2026-12-02", "2026-12-02", "三天前"),
        ("2024年的计划", "2024-01-01", "2024-12-31", "2024年"),
    ],
)
def test_each_form_is_a_window_of_days(question: str, first: str, last: str, matched: str) -> None:
    found = days(question)
    assert found is not None and found[:3] == (first, last, matched)


def test_the_rest_of_the_question_is_searched_within_the_window() -> None:
    assert days("What did Bruno cook on July 27, 2026?") == (
        "2026-07-27",
        "2026-07-27",
        "on July 27, 2026",
        "What did Bruno cook ?",
    )


@pytest.mark.parametrize(
    "question",
    ["which tea do you like?", "I may 5 times", "the 45th of June", "version 2026", "May I?"],
)
def test_no_date_no_window(question: str) -> None:
    assert dates.window(question, REF) is None


def test_the_reference_time_decides_relative_dates() -> None:
    asked = dt.datetime(2023, 6, 2, 23, 30, tzinfo=dt.timezone(dt.timedelta(hours=-5)))
    # 04:30 UTC on June 3: the day is UTC's
    assert days("yesterday", asked) == ("2023-06-02", "2023-06-02", "yesterday", "")
    naive = dt.datetime(2023, 6, 3, 4, 30)  # naive: UTC
    assert days("yesterday", naive) == days("yesterday", asked)
    assert days("on June 10", naive) == ("2022-06-10", "2022-06-10", "on June 10", "")
