"""Reading --since/--until/--period: dates, times, relative offsets from the anchor, open ends."""

from __future__ import annotations

import datetime as dt

import pytest

from headway.audit.periods import PeriodError, Window, parse_period, parse_time, parse_window

ANCHOR = dt.datetime(2026, 3, 20, 12, 0, tzinfo=dt.UTC)


def test_relative_times_count_back_from_the_anchor_with_or_without_a_minus() -> None:
    assert parse_time("30d", anchor=ANCHOR) == ANCHOR - dt.timedelta(days=30)
    assert parse_time("-30d", anchor=ANCHOR) == ANCHOR - dt.timedelta(days=30)
    assert parse_time("12h", anchor=ANCHOR) == ANCHOR - dt.timedelta(hours=12)
    assert parse_time("2w", anchor=ANCHOR) == ANCHOR - dt.timedelta(days=14)
    assert parse_time("1.5d", anchor=ANCHOR) == ANCHOR - dt.timedelta(hours=36)


def test_a_bare_end_date_includes_that_whole_day_and_times_are_utc() -> None:
    assert parse_time("2026-03-01", anchor=None) == dt.datetime(2026, 3, 1, tzinfo=dt.UTC)
    assert parse_time("2026-03-01", anchor=None, end=True) == dt.datetime(2026, 3, 2, tzinfo=dt.UTC)
    assert parse_time("2026-03-01T06:30", anchor=None) == dt.datetime(2026, 3, 1, 6, 30, tzinfo=dt.UTC)
    assert parse_time("2026-03-01T06:30+02:00", anchor=None) == dt.datetime(2026, 3, 1, 4, 30, tzinfo=dt.UTC)


def test_periods_allow_open_ends() -> None:
    assert parse_period("-14d..-7d", anchor=ANCHOR) == Window(
        ANCHOR - dt.timedelta(days=14), ANCHOR - dt.timedelta(days=7)
    )
    assert parse_period("-7d..", anchor=ANCHOR) == Window(ANCHOR - dt.timedelta(days=7), None)
    assert parse_period("..2026-03-01", anchor=ANCHOR) == Window(None, dt.datetime(2026, 3, 2, tzinfo=dt.UTC))
    assert parse_period("..", anchor=ANCHOR) == Window(None, None)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("2026-03-01", "expected a period A..B"),
        ("-7d..-14d", "empty window"),
        ("last week..", "expected a date"),
    ],
)
def test_bad_periods_raise_one_readable_error(text: str, message: str) -> None:
    with pytest.raises(PeriodError, match=message):
        parse_period(text, anchor=ANCHOR)


def test_relative_time_without_an_anchor_is_an_error_not_a_crash() -> None:
    with pytest.raises(PeriodError, match="relative time needs jobs"):
        parse_window("30d", None, anchor=None)


def test_window_serialises_to_iso_strings() -> None:
    w = parse_window("2026-03-01", "2026-03-07", anchor=None)
    assert w.to_json() == {"since": "2026-03-01T00:00:00+00:00", "until": "2026-03-08T00:00:00+00:00"}
    assert w.label() == "2026-03-01 .. 2026-03-08"


def test_periods_that_share_time_report_the_shared_window() -> None:
    nov = parse_period("2026-11-01..2026-12-01", anchor=None)
    octo = parse_period("2026-10-01..2026-11-01", anchor=None)  # its end includes all of Nov 1
    assert nov.overlap(octo) == Window(
        dt.datetime(2026, 11, 1, tzinfo=dt.UTC), dt.datetime(2026, 11, 2, tzinfo=dt.UTC)
    )
    assert nov.overlap(parse_period("2026-10-01..2026-10-31", anchor=None)) is None
    assert nov.overlap(parse_period("..", anchor=None)) == nov  # an open period holds the other
    assert parse_period("-7d..", anchor=ANCHOR).overlap(parse_period("-14d..-7d", anchor=ANCHOR)) is None
