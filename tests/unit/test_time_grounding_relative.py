"""Time grounding of relative dates: "yesterday", "two days ago", "last week", "last summer" …,
counted from the moment the cue is asked (docs/adr/0036-time-grounding.md)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.recall.time_grounding import cue_periods, relative_periods

#: A Thursday afternoon.
ASKED = datetime(2026, 12, 3, 15, 30, tzinfo=UTC)


def _day(y: int, m: int, d: int) -> datetime:
    return datetime(y, m, d, tzinfo=UTC)


@pytest.mark.parametrize(
    ("cue", "start", "end"),
    [
        ("What did I order today?", _day(2026, 12, 3), _day(2026, 12, 4)),
        ("What failed yesterday?", _day(2026, 12, 2), _day(2026, 12, 3)),
        ("And the day before yesterday?", _day(2026, 12, 1), _day(2026, 12, 2)),
        ("What did Alice ask two days ago?", _day(2026, 12, 1), _day(2026, 12, 2)),
        ("a couple of days ago", _day(2026, 12, 1), _day(2026, 12, 2)),
        ("10 days ago", _day(2026, 11, 23), _day(2026, 11, 24)),
        ("What did we decide last week?", _day(2026, 11, 23), ASKED),
        ("the past week", _day(2026, 11, 26), ASKED),
        ("anything this week", _day(2026, 11, 30), _day(2026, 12, 7)),
        ("three weeks ago", _day(2026, 11, 9), _day(2026, 11, 16)),
        ("last month", _day(2026, 11, 1), _day(2026, 12, 1)),
        ("this month", _day(2026, 12, 1), _day(2027, 1, 1)),
        ("a month ago", _day(2026, 11, 1), _day(2026, 12, 1)),
        ("twelve months ago", _day(2025, 12, 1), _day(2026, 1, 1)),
        ("last year", _day(2025, 1, 1), _day(2026, 1, 1)),
        ("two years ago", _day(2024, 1, 1), _day(2025, 1, 1)),
        ("last Monday", _day(2026, 11, 30), _day(2026, 12, 1)),
        ("last Thursday", _day(2026, 11, 26), _day(2026, 11, 27)),
        ("last weekend", _day(2026, 11, 28), _day(2026, 11, 30)),
        ("Where did we go last summer?", _day(2026, 6, 1), _day(2026, 9, 1)),
        ("last autumn", _day(2026, 9, 1), _day(2026, 12, 1)),  # over two days ago
        ("last winter", _day(2025, 12, 1), _day(2026, 3, 1)),
        ("this winter", _day(2026, 12, 1), _day(2027, 3, 1)),
    ],
)
def test_relative_dates_name_the_period_counted_from_the_moment_asked(
    cue: str, start: datetime, end: datetime
) -> None:
    assert [(p.start, p.end) for p in cue_periods(cue, ASKED)] == [(start, end)]


@pytest.mark.parametrize(
    "cue",
    [
        "What is planned for tomorrow?",
        "next week's release",
        "this Friday",  # may be ahead
        "the last thing we did",
        "0 days ago",
        "500 days ago",
        "the weekend",
    ],
)
def test_future_vague_or_absurd_relative_times_name_nothing(cue: str) -> None:
    assert relative_periods(cue, ASKED) == []


def test_without_a_moment_asked_only_absolute_dates_are_read() -> None:
    """Callers that give no moment (the ablation, older code) see the absolute reading alone."""
    assert cue_periods("What did we decide last week, on 9 November, 2026?") == cue_periods(
        "on 9 November, 2026"
    )


def test_month_and_year_edges() -> None:
    """January's "last month" is December of the year before; 1 March's "yesterday" is 29
    February in a leap year; a Monday's "last weekend" ends that morning."""
    assert [(p.start, p.end) for p in relative_periods("last month", _day(2027, 1, 15))] == [
        (_day(2026, 12, 1), _day(2027, 1, 1))
    ]
    assert [(p.start, p.end) for p in relative_periods("yesterday", _day(2028, 3, 1))] == [
        (_day(2028, 2, 29), _day(2028, 3, 1))
    ]
    assert [(p.start, p.end) for p in relative_periods("last weekend", _day(2026, 11, 30))] == [
        (_day(2026, 11, 28), _day(2026, 11, 30))
    ]
    # In the middle of summer, "last summer" is the year before's.
    assert [(p.start, p.end) for p in relative_periods("last summer", _day(2026, 7, 15))] == [
        (_day(2025, 6, 1), _day(2025, 9, 1))
    ]


_moments = st.datetimes(
    min_value=datetime(1990, 1, 1), max_value=datetime(2200, 1, 1), timezones=st.just(UTC)
)


@given(asked=_moments, n=st.integers(min_value=1, max_value=200))
def test_n_days_ago_is_the_calendar_day_n_days_back(asked: datetime, n: int) -> None:
    (period,) = relative_periods(f"{n} days ago", asked)
    back = asked - timedelta(days=n)
    assert period.start == datetime(back.year, back.month, back.day, tzinfo=UTC)
    assert period.end - period.start == timedelta(days=1)
    assert period.holds(back)


@given(
    asked=_moments,
    phrase=st.sampled_from(
        [
            "yesterday",
            "the day before yesterday",
            "last week",
            "the past week",
            "last month",
            "the past month",
            "last year",
            "last weekend",
            "last monday",
            "last sunday",
            "last spring",
            "last summer",
            "last fall",
            "last winter",
            "three weeks ago",
            "a month ago",
            "two years ago",
        ]
    ),
)
def test_a_past_phrase_names_one_nonempty_period_that_is_over_by_the_moment_asked(
    asked: datetime, phrase: str
) -> None:
    (period,) = relative_periods(f"What happened {phrase}?", asked)
    assert period.start < period.end <= asked
    # … and not so long before it: nothing these phrases say reaches back more than three years.
    assert asked - period.start <= timedelta(days=3 * 366 + 31)


@given(asked=_moments, n=st.integers(min_value=1, max_value=24))
def test_n_months_ago_is_a_whole_calendar_month_n_months_back(asked: datetime, n: int) -> None:
    (period,) = relative_periods(f"{n} months ago", asked)
    assert period.start.day == 1
    assert period.end.day == 1
    months_back = (asked.year - period.start.year) * 12 + asked.month - period.start.month
    assert months_back == n
    assert 28 <= (period.end - period.start).days <= 31


@given(asked=_moments, season=st.sampled_from(["spring", "summer", "autumn", "fall", "winter"]))
def test_last_season_is_the_latest_three_month_season_over_and_this_one_has_begun(
    asked: datetime, season: str
) -> None:
    (last,) = relative_periods(f"last {season}", asked)
    (this,) = relative_periods(f"this {season}", asked)
    assert last.end <= asked < last.end + timedelta(days=366)
    assert this.start <= asked
    assert 89 <= (last.end - last.start).days <= 92
    assert last.start.month == {"spring": 3, "summer": 6, "autumn": 9, "fall": 9, "winter": 12}[season]
