"""Dates named in a question, as a time window (docs/search.md, "Dates in a question"): pure
functions, no I/O.

"What did Ana cook on March 14?", "in May 2023", "last Tuesday", "two weeks ago", "昨天",
"上周", "2023年5月": :func:`window` finds the first such expression in a question and
resolves it against a reference time (the time the question is asked: now, or a time the
caller gives, for a question asked inside an old conversation) into a window of UTC times. The
ranked search fuses the hits within that window with the hits without it, so a date read wrong
costs little.

A small grammar, not a general parser: English day, month and year dates (``May 12, 2026``,
``12 May 2026``, ``2026-05-12``, ``May 12``, ``May 2026``, ``in 2026``), English relative ones
(``today``, ``yesterday``, ``last``/``this`` ``week``/``month``/``year``, ``last Tuesday``,
``N days/weeks/months/years ago`` with N in digits or words up to twelve), and the common
Chinese forms (``2023年5月12日``, ``2023年5月``, ``5月12日``, ``2023年``, ``今天``, ``昨天``,
``前天``, ``上周``/``上星期``, ``本周``/``这周``, ``上个月``, ``这个月``/``本月``, ``去年``,
``今年``, ``N天前``/``N周前``/``N个月前``/``N年前``). A window is widened by
:data:`SLACK` on each side: a message's time is UTC, the asker's day may not be.
"""

from __future__ import annotations

import calendar
import dataclasses
import datetime as dt
import re
from collections.abc import Callable

#: added to each side of a window: the asker's day is not UTC's
SLACK = dt.timedelta(days=1)
#: half the width of "N weeks ago" (the day N weeks ago, give or take this)
WEEKS_SPREAD = dt.timedelta(days=3)
#: half the width of "N months ago"
MONTHS_SPREAD = dt.timedelta(days=15)

_MONTHS = {name.lower(): i for i, name in enumerate(calendar.month_name) if name}
_MONTHS |= {name.lower(): i for i, name in enumerate(calendar.month_abbr) if name}
_MONTHS["sept"] = 9
_DAYS = {name.lower(): i for i, name in enumerate(calendar.day_name)}
_NUMBERS = {
    "a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6,
    "seven": 7, "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12,
}  # fmt: skip
_CN_NUMBERS = dict(zip("一二两三四五六七八九十", (1, 2, 2, 3, 4, 5, 6, 7, 8, 9, 10), strict=True))

_MONTH = r"(?P<month>" + "|".join(sorted(_MONTHS, key=len, reverse=True)) + r")\.?"
_DAY = r"(?P<day>[0-3]?\d)(?:st|nd|rd|th)?"
_YEAR = r"(?P<year>(?:19|20)\d\d)"
_N = r"(?P<n>\d{1,3}|" + "|".join(_NUMBERS) + ")"
_CN_N = r"(?P<n>\d{1,3}|[一二两三四五六七八九十])"


@dataclasses.dataclass(frozen=True)
class Window:
    """A time window a question names: ``since <= t <= until`` (naive UTC), the words that
    named it, and the question without them."""

    since: dt.datetime
    until: dt.datetime
    matched: str
    rest: str


def window(question: str, ref: dt.datetime) -> Window | None:
    """The window of the first date ``question`` names, resolved against ``ref`` (an aware
    time, or naive UTC); None when it names none."""
    now = ref.astimezone(dt.UTC).replace(tzinfo=None) if ref.tzinfo else ref
    today = now.date()
    for pattern, resolve in _RULES:
        for found in pattern.finditer(question):
            span = resolve(found, today)
            if span is None:
                continue
            first, last = span
            since = dt.datetime.combine(first, dt.time()) - SLACK
            until = dt.datetime.combine(last, dt.time.max) + SLACK
            rest = (question[: found.start()] + " " + question[found.end() :]).strip()
            return Window(since, until, found.group(0).strip(), " ".join(rest.split()))
    return None


Span = tuple[dt.date, dt.date] | None  #: the first and last day named


def _date(year: int, month: int, day: int) -> dt.date | None:
    try:
        return dt.date(year, month, day)
    except ValueError:
        return None


def _month_span(year: int, month: int) -> Span:
    if not 1 <= month <= 12:
        return None
    return dt.date(year, month, 1), dt.date(year, month, calendar.monthrange(year, month)[1])


def _day(day: dt.date | None) -> Span:
    return None if day is None else (day, day)


def _past(today: dt.date, month: int, day: int) -> Span:
    """A day without its year: the last one on or before today."""
    found = _date(today.year, month, day)
    if found is not None and found > today:
        found = _date(today.year - 1, month, day)
    return _day(found)


def _months_back(today: dt.date, n: int) -> tuple[int, int]:
    index = today.year * 12 + today.month - 1 - n
    return index // 12, index % 12 + 1


def _month(m: re.Match[str]) -> int:
    """The month a match names; 0 for "may" in lower case, the verb more often than not."""
    name = m["month"]
    return 0 if name == "may" else _MONTHS[name.lower()]


def _number(text: str) -> int:
    if text.isdigit():
        return int(text)
    return _NUMBERS.get(text.lower()) or _CN_NUMBERS[text]


def _ago(n: int, unit: str, today: dt.date) -> Span:
    unit = unit.lower()
    if unit.startswith(("day", "天")):
        return _day(today - dt.timedelta(days=n))
    if unit.startswith(("week", "周", "星期", "个星期")):
        at = today - dt.timedelta(weeks=n)
        return at - WEEKS_SPREAD, at + WEEKS_SPREAD
    if unit.startswith(("month", "个月", "月")):
        year, month = _months_back(today, n)
        day = min(today.day, calendar.monthrange(year, month)[1])
        at = dt.date(year, month, day)
        return at - MONTHS_SPREAD, at + MONTHS_SPREAD
    return dt.date(today.year - n, 1, 1), dt.date(today.year - n, 12, 31)


def _week(today: dt.date, back: int) -> Span:
    monday = today - dt.timedelta(days=today.weekday()) - dt.timedelta(weeks=back)
    return monday, monday + dt.timedelta(days=6)


def _relative(word: str, today: dt.date) -> Span:
    word = word.lower()
    if word in ("today", "今天"):
        return today, today
    if word in ("yesterday", "昨天"):
        return _day(today - dt.timedelta(days=1))
    if word == "前天":
        return _day(today - dt.timedelta(days=2))
    if word in ("last week", "上周", "上星期", "上个星期"):
        return _week(today, 1)
    if word in ("this week", "本周", "这周", "这个星期"):
        return _week(today, 0)
    if word in ("last month", "上个月", "上月"):
        return _month_span(*_months_back(today, 1))
    if word in ("this month", "这个月", "本月"):
        return _month_span(today.year, today.month)
    if word in ("last year", "去年"):
        return dt.date(today.year - 1, 1, 1), dt.date(today.year - 1, 12, 31)
    if word in ("this year", "今年"):
        return dt.date(today.year, 1, 1), dt.date(today.year, 12, 31)
    return None


def _last_weekday(name: str, today: dt.date) -> Span:
    back = (today.weekday() - _DAYS[name.lower()]) % 7 or 7
    return _day(today - dt.timedelta(days=back))


_I = re.IGNORECASE
Resolve = Callable[[re.Match[str], dt.date], Span]
#: the patterns in the order they are tried, each with what makes its match a span of days
_RULES: list[tuple[re.Pattern[str], Resolve]] = []


def _rule(pattern: str, flags: int = _I) -> Callable[[Resolve], Resolve]:
    def add(resolve: Resolve) -> Resolve:
        _RULES.append((re.compile(pattern, flags), resolve))
        return resolve

    return add


# most specific first: a full date before a month and year, before a month alone
@_rule(r"\b(?P<year>(?:19|20)\d\d)-(?P<month>[01]?\d)-(?P<day>[0-3]?\d)\b")
def _iso(m: re.Match[str], today: dt.date) -> Span:
    return _day(_date(int(m["year"]), int(m["month"]), int(m["day"])))


@_rule(rf"\b(?:on\s+)?{_MONTH}\s+{_DAY},?\s+{_YEAR}\b")
def _month_day_year(m: re.Match[str], today: dt.date) -> Span:
    return _day(_date(int(m["year"]), _month(m), int(m["day"])))


@_rule(rf"\b(?:on\s+)?(?:the\s+)?{_DAY}\s+(?:of\s+)?{_MONTH},?\s+{_YEAR}\b")
def _day_month_year(m: re.Match[str], today: dt.date) -> Span:
    return _day(_date(int(m["year"]), _month(m), int(m["day"])))


@_rule(r"(?P<year>(?:19|20)\d\d)\s*年\s*(?P<month>[01]?\d)\s*月\s*(?P<day>[0-3]?\d)\s*[日号]", 0)
def _cn_full(m: re.Match[str], today: dt.date) -> Span:
    return _day(_date(int(m["year"]), int(m["month"]), int(m["day"])))


@_rule(rf"\b(?:in\s+)?{_MONTH},?\s+{_YEAR}\b")
def _month_year(m: re.Match[str], today: dt.date) -> Span:
    return _month_span(int(m["year"]), _month(m))


@_rule(r"(?P<year>(?:19|20)\d\d)\s*年\s*(?P<month>[01]?\d)\s*月", 0)
def _cn_month_year(m: re.Match[str], today: dt.date) -> Span:
    return _month_span(int(m["year"]), int(m["month"]))


@_rule(r"(?P<month>[01]?\d)\s*月\s*(?P<day>[0-3]?\d)\s*[日号]", 0)
def _cn_month_day(m: re.Match[str], today: dt.date) -> Span:
    return _past(today, int(m["month"]), int(m["day"]))


@_rule(rf"\b(?:on\s+)?{_MONTH}\s+{_DAY}\b(?!\s*(?:,\s*)?(?:19|20)\d\d)")
def _month_day(m: re.Match[str], today: dt.date) -> Span:
    return _past(today, _month(m), int(m["day"]))


@_rule(rf"\b(?:on\s+)?(?:the\s+)?{_DAY}\s+(?:of\s+)?{_MONTH}\b")
def _day_month(m: re.Match[str], today: dt.date) -> Span:
    return _past(today, _month(m), int(m["day"]))


@_rule(rf"\b{_N}\s+(?P<unit>days?|weeks?|months?|years?)\s+ago\b")
def _ago_en(m: re.Match[str], today: dt.date) -> Span:
    return _ago(_number(m["n"]), m["unit"], today)


@_rule(rf"{_CN_N}\s*(?P<unit>天|周|个星期|星期|个月|年)\s*(?:前|以前|之前)", 0)
def _ago_cn(m: re.Match[str], today: dt.date) -> Span:
    return _ago(_number(m["n"]), m["unit"], today)


@_rule(r"\blast\s+(?P<name>monday|tuesday|wednesday|thursday|friday|saturday|sunday)\b")
def _last_day(m: re.Match[str], today: dt.date) -> Span:
    return _last_weekday(m["name"], today)


@_rule(r"\b(?:today|yesterday|(?:last|this)\s+(?:week|month|year))\b")
def _relative_en(m: re.Match[str], today: dt.date) -> Span:
    return _relative(" ".join(m.group(0).split()), today)


@_rule(
    r"今天|昨天|前天|上个星期|上星期|上周|这个星期|本周|这周|上个月|上月|这个月|本月|去年|今年", 0
)
def _relative_cn(m: re.Match[str], today: dt.date) -> Span:
    return _relative(m.group(0), today)


@_rule(r"(?P<year>(?:19|20)\d\d)\s*年(?!\s*[01]?\d\s*月)", 0)
def _cn_year(m: re.Match[str], today: dt.date) -> Span:
    return dt.date(int(m["year"]), 1, 1), dt.date(int(m["year"]), 12, 31)


@_rule(rf"\b(?:in|during|since)\s+{_MONTH}\b")
def _month_alone(m: re.Match[str], today: dt.date) -> Span:
    month = _month(m)
    year = today.year if month <= today.month else today.year - 1
    return _month_span(year, month)


@_rule(rf"\b(?:in|during)\s+{_YEAR}\b")
def _year(m: re.Match[str], today: dt.date) -> Span:
    return dt.date(int(m["year"]), 1, 1), dt.date(int(m["year"]), 12, 31)
