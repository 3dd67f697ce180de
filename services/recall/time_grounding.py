"""Time grounding for hybrid: a cue that names a date asks about what happened then.

"What did Nate cook on 9 November, 2022?" names a day; "in May 2022" a month; "in 2023" a year.
Entries carry when they happened (``occurred_at``, as their writer said; else ``created_at``, when
they were stored), so the entries of the named period can come first. It is a filter that ranks
instead of excluding: relevance still orders the entries inside the period, and those outside
follow, so a cue whose date matches nothing is answered as without it.

Absolute dates in English are read (day month year, month day year, month year, a year after
"in"/"during"); a month without a year is too ambiguous to use. So are relative ones, counted from
the moment the cue is asked (the request's ``as_of``, else now), in its calendar (UTC):

- "today", "yesterday", "the day before yesterday", "N days ago" (digits or one to twelve, "a",
  "a couple of", "a few" = 3): that day;
- "N weeks ago": the week (Monday to Sunday) holding the day N*7 days back; "last week": from the
  Monday of the previous week to the moment asked (the previous calendar week or the last seven
  days, whichever the speaker meant); "this week": this Monday to Sunday;
- "N months ago", "last month", "this month"; "N years ago", "last year", "this year": that
  calendar month or year; "the past week/month/year": the last 7/31/366 days;
- "last Monday" … "last Sunday": the latest such day before today; "last weekend": the latest
  Saturday and Sunday that are over;
- "last spring/summer/autumn/fall/winter": the latest such season that is over, "this summer" …
  the latest that has begun (northern meteorological seasons: spring March-May, summer
  June-August, autumn September-November, winter December-February).

Future ones ("tomorrow", "next week") and other languages are left alone: memories record what
happened. A period is widened by the largest UTC offsets (14 hours before, 12 after) because the
cue's date has no time zone and ``occurred_at`` is stored in UTC.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from services.recall.ranking import Ranked

__all__ = ["Period", "cue_periods", "grounded", "relative_periods"]

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


def cue_periods(cue: str, asked_at: datetime | None = None) -> list[Period]:
    """The periods a cue names by absolute date, then (with ``asked_at``, the moment the cue is
    asked from) by relative date, each kind in the order found (none for most cues)."""
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
    if asked_at is not None:
        found += relative_periods(cue, asked_at)
    return found


_NUMBERS = {
    "a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
    "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "a couple of": 2, "a few": 3,
}  # fmt: skip
_COUNT = (
    r"(?P<n>\d{1,3}|a couple of|a few|an|a|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve)"
)
_WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
#: A season's first month and length in months (northern meteorological seasons).
_SEASONS = {"spring": 3, "summer": 6, "autumn": 9, "fall": 9, "winter": 12}
_RELATIVE = re.compile(
    rf"\b(?:(?P<before>the\s+day\s+before\s+yesterday)|(?P<yesterday>yesterday)|(?P<today>today|tonight|this\s+morning)"
    rf"|{_COUNT}\s+(?P<unit>day|week|month|year)s?\s+ago"
    rf"|(?P<which>last|this|past)\s+(?P<what>week|month|year|weekend|{'|'.join(_WEEKDAYS)}|{'|'.join(_SEASONS)})"
    r")\b",
    re.IGNORECASE,
)
#: "the past week/month/year": that many days back to the moment asked.
_ROLLING = {"week": 7, "month": 31, "year": 366}
#: "N days ago" further back than this is read as no period (a typo, or no date worth ranking by).
_MAX_AGO = 200


def relative_periods(cue: str, asked_at: datetime) -> list[Period]:
    """The periods a cue names relative to ``asked_at`` (see the module docstring), in order."""
    now = asked_at.astimezone(UTC)
    today = datetime(now.year, now.month, now.day, tzinfo=UTC)
    found: list[Period] = []
    for m in _RELATIVE.finditer(cue):
        period = _relative(m, now, today)
        if period is not None and period.start < period.end:
            found.append(period)
    return found


def _relative(m: re.Match[str], now: datetime, today: datetime) -> Period | None:
    day = timedelta(days=1)
    if m["today"]:
        return Period(today, today + day)
    if m["yesterday"]:
        return Period(today - day, today)
    if m["before"]:
        return Period(today - 2 * day, today - day)
    if m["unit"]:
        n = int(m["n"]) if m["n"].isdigit() else _NUMBERS[re.sub(r"\s+", " ", m["n"].lower())]
        unit = m["unit"].lower()
        if not 0 < n <= _MAX_AGO:
            return None
        if unit == "day":
            return Period(today - n * day, today - (n - 1) * day)
        if unit == "week":
            then = today - 7 * n * day
            monday = then - then.weekday() * day
            return Period(monday, monday + 7 * day)
        if unit == "month":
            return _month(now.year, now.month - n)
        return Period(datetime(now.year - n, 1, 1, tzinfo=UTC), datetime(now.year - n + 1, 1, 1, tzinfo=UTC))
    which, what = m["which"].lower(), m["what"].lower()
    if which == "past" and what in _ROLLING:  # "the past week": the days just gone
        return Period(today - _ROLLING[what] * day, now)
    last = which != "this"
    monday = today - today.weekday() * day
    if what == "week":
        return Period(monday - 7 * day, now) if last else Period(monday, monday + 7 * day)
    if what == "month":
        return _month(now.year, now.month - 1 if last else now.month)
    if what == "year":
        year = now.year - 1 if last else now.year
        return Period(datetime(year, 1, 1, tzinfo=UTC), datetime(year + 1, 1, 1, tzinfo=UTC))
    if what == "weekend":
        if not last:
            return None  # "this weekend" is as often the coming one
        saturday = monday - 2 * day  # the latest Saturday whose weekend is over by today
        return Period(saturday, monday)
    if what in _WEEKDAYS:
        if not last:
            return None  # "this Friday" may be ahead
        back = (today.weekday() - _WEEKDAYS.index(what) - 1) % 7 + 1
        return Period(today - back * day, today - (back - 1) * day)
    # This year's, last year's, the year before's (winter: the one that starts in that December).
    seasons = [_season(_SEASONS[what], year) for year in (now.year, now.year - 1, now.year - 2)]
    if last:  # the latest that is over
        return next(p for p in seasons if p.end <= today)
    return next(p for p in seasons if p.start <= today)  # the latest that has begun


def _season(first_month: int, year: int) -> Period:
    return Period(datetime(year, first_month, 1, tzinfo=UTC), _month(year, first_month + 3).start)


def _month(year: int, month: int) -> Period:
    """The calendar month ``month`` of ``year``; months outside 1-12 roll into other years."""
    year, index = year + (month - 1) // 12, (month - 1) % 12
    start = datetime(year, index + 1, 1, tzinfo=UTC)
    following = datetime(year + (index + 1) // 12, (index + 1) % 12 + 1, 1, tzinfo=UTC)
    return Period(start, following)


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
