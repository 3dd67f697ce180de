"""Time grounding for hybrid: a cue that names a date asks about what happened then.

"What did Nate cook on 9 November, 2022?" names a day; "in May 2022" a month; "in 2023" a year.
Entries carry when they happened (``occurred_at``, as their writer said; else ``created_at``, when
they were stored), so the entries of the named period can come first. It is a filter that ranks
instead of excluding: relevance still orders the entries inside the period, and those outside
follow, so a cue whose date matches nothing is answered as without it.

Only absolute dates in English are read (day month year, month day year, month year, a year after
"in"/"during"); relative ones ("last week") and other languages are left alone, and a month without
a year is too ambiguous to use. A period is widened by the largest UTC offsets (14 hours before,
12 after) because the cue's date has no time zone and ``occurred_at`` is stored in UTC.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from services.recall.ranking import Ranked

__all__ = ["Period", "cue_periods", "grounded"]

_MONTHS = (
    "january",
    "february",
    "march",
    "april",
    "may",
    "june",
    "july",
    "august",
    "september",
    "october",
    "november",
    "december",
)
_MONTH = "|".join(_MONTHS)
_DAY = r"(?P<day>\d{1,2})(?:st|nd|rd|th)?"
_YEAR = r"(?P<year>\d{4})"
#: Most specific first: a span one pattern read is not read again by a later one.
_PATTERNS = (
    ("day", re.compile(rf"\b{_DAY}\s+(?:of\s+)?(?P<month>{_MONTH}),?\s*{_YEAR}\b", re.IGNORECASE)),
    ("day", re.compile(rf"\b(?P<month>{_MONTH})\s+{_DAY},?\s*{_YEAR}\b", re.IGNORECASE)),
    ("month", re.compile(rf"\b(?P<month>{_MONTH}),?\s+(?:of\s+)?{_YEAR}\b", re.IGNORECASE)),
    ("year", re.compile(r"\b(?:in|during|throughout)\s+(?:the\s+year\s+)?(?P<year>\d{4})\b", re.IGNORECASE)),
)
#: The cue's date may be meant in any time zone: UTC-12 to UTC+14.
_EARLIEST_ZONE = timedelta(hours=14)
_LATEST_ZONE = timedelta(hours=12)


@dataclass(frozen=True)
class Period:
    """A half-open interval of time, ``start <= t < end``, in UTC."""

    start: datetime
    end: datetime

    def holds(self, moment: datetime) -> bool:
        return self.start - _EARLIEST_ZONE <= moment < self.end + _LATEST_ZONE


def cue_periods(cue: str) -> list[Period]:
    """The periods a cue names by absolute date, in the order found (none for most cues)."""
    found: list[Period] = []
    taken: list[tuple[int, int]] = []
    for kind, pattern in _PATTERNS:
        for m in pattern.finditer(cue):
            if any(start < m.end() and m.start() < end for start, end in taken):
                continue
            period = _period(kind, m)
            if period is not None:
                taken.append(m.span())
                found.append(period)
    return found


def _period(kind: str, m: re.Match[str]) -> Period | None:
    year = int(m["year"])
    if not 1900 <= year <= 2200:  # "in 5000 steps" is no year
        return None
    try:
        if kind == "year":
            return Period(datetime(year, 1, 1, tzinfo=UTC), datetime(year + 1, 1, 1, tzinfo=UTC))
        month = _MONTHS.index(m["month"].lower()) + 1
        if kind == "month":
            following = datetime(year + month // 12, month % 12 + 1, 1, tzinfo=UTC)
            return Period(datetime(year, month, 1, tzinfo=UTC), following)
        day = datetime(year, month, int(m["day"]), tzinfo=UTC)
    except ValueError:  # "31 February 2023"
        return None
    return Period(day, day + timedelta(days=1))


def grounded(ranked: Sequence[Ranked], periods: Sequence[Period]) -> list[Ranked]:
    """``ranked`` with the entries that happened within one of ``periods`` first, each part in
    its order (a stable partition): when nothing falls within them, ``ranked`` unchanged."""
    if not periods:
        return list(ranked)

    def within(r: Ranked) -> bool:
        moment = r.candidate.occurred_at or r.candidate.created_at
        return any(p.holds(moment) for p in periods)

    inside = [r for r in ranked if within(r)]
    return [*inside, *(r for r in ranked if not within(r))]
