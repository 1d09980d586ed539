import datetime as dt

import pytest

from pipeline import clock


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (dt.datetime(2026, 8, 3, 11, 18), dt.datetime(2026, 8, 3, 11, 18)),
        (
            dt.datetime(2026, 8, 3, 13, 18, tzinfo=dt.timezone(dt.timedelta(hours=2))),
            dt.datetime(2026, 8, 3, 11, 18),
        ),
        (dt.datetime(1, 1, 1, tzinfo=dt.timezone(dt.timedelta(minutes=1))), dt.datetime.min),
        (
            dt.datetime(9999, 12, 31, 23, 59, 59, tzinfo=dt.timezone(-dt.timedelta(minutes=1))),
            dt.datetime.max,
        ),
    ],
)
def test_naive_utc_converts_and_clamps_at_the_calendars_ends(
    given: dt.datetime, expected: dt.datetime
) -> None:
    assert clock.naive_utc(given) == expected
