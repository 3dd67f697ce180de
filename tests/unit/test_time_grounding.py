"""Time grounding: the dates a cue names, and the entries of those dates first."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from services.recall.ranking import Ranked
from services.recall.time_grounding import Period, cue_periods, grounded
from tests.unit.recall_support import cand, uid


def _day(y: int, m: int, d: int) -> datetime:
    return datetime(y, m, d, tzinfo=UTC)


@pytest.mark.parametrize(
    ("cue", "expected"),
    [
        ("What did Nate cook on 9 November, 2022?", [(_day(2022, 11, 9), _day(2022, 11, 10))]),
        ("Which book did Tim finish on 8th December, 2023?", [(_day(2023, 12, 8), _day(2023, 12, 9))]),
        ("Where was the picture shared on December 1,2023 taken?", [(_day(2023, 12, 1), _day(2023, 12, 2))]),
        ("How many tournaments had he won by July 10, 2022?", [(_day(2022, 7, 10), _day(2022, 7, 11))]),
        ("What cake did Joanna bake in May 2022?", [(_day(2022, 5, 1), _day(2022, 6, 1))]),
        ("Which instrument in December 2023?", [(_day(2023, 12, 1), _day(2024, 1, 1))]),
        ("What charity event did John organize in 2024?", [(_day(2024, 1, 1), _day(2025, 1, 1))]),
        # No such day: the month it names still stands.
        ("What happened on 31 February, 2023?", [(_day(2023, 2, 1), _day(2023, 3, 1))]),
        (
            "Between 3 March 2023 and April 2023?",
            [(_day(2023, 3, 3), _day(2023, 3, 4)), (_day(2023, 4, 1), _day(2023, 5, 1))],
        ),
    ],
)
def test_absolute_dates_in_a_cue_are_read_as_periods(
    cue: str, expected: list[tuple[datetime, datetime]]
) -> None:
    """A day, a month or a year after "in" becomes the half-open period it names."""
    assert [(p.start, p.end) for p in cue_periods(cue)] == expected


@pytest.mark.parametrize(
    "cue",
    [
        "What did we decide last week?",
        "May I ask what the deploy rule is?",
        "Which deal did John get in December?",
        "We walked 2023 steps",
        "Did the run take in 5000 seconds?",
        "",
    ],
)
def test_cues_without_an_absolute_date_name_no_period(cue: str) -> None:
    """Relative times (without a moment to count them from), a month without a year and a bare
    number name nothing."""
    assert cue_periods(cue) == []


def test_entries_of_the_named_period_come_first_in_their_order() -> None:
    """A stable partition: inside the period by score, then the rest by score; ``occurred_at``
    decides, ``created_at`` stands in where it is not set."""
    may = _day(2022, 5, 10)
    ranked = [
        Ranked(cand(1), 0.9),
        Ranked(cand(2, occurred_at=may), 0.5),
        Ranked(cand(3), 0.4),
        Ranked(cand(4, occurred_at=may + timedelta(days=3)), 0.3),
    ]
    periods = cue_periods("in May 2022")
    assert [r.candidate.id for r in grounded(ranked, periods)] == [uid(2), uid(4), uid(1), uid(3)]
    assert grounded(ranked, []) == ranked
    assert grounded(ranked, cue_periods("in May 1999")) == ranked


def test_a_named_day_reaches_every_time_zone() -> None:
    """The cue's day has no zone: 14 hours before its UTC start and 12 after its end still count."""
    (day,) = cue_periods("on 25 May, 2022")
    start = _day(2022, 5, 25)
    assert day == Period(start, start + timedelta(days=1))
    assert day.holds(start - timedelta(hours=14))
    assert not day.holds(start - timedelta(hours=14, seconds=1))
    assert day.holds(start + timedelta(days=1, hours=11, minutes=59))
    assert not day.holds(start + timedelta(days=1, hours=12))
