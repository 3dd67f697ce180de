"""The decision records and the benchmark log hold together (STYLE 21): every record is numbered and
has its four sections and a status, the index lists each one, every ``docs/adr/…`` path and every
benchmarks entry cited anywhere exists, and the log is dated, newest first."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import date
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ADR = ROOT / "docs" / "adr"
INDEX = ADR / "README.md"
BENCHMARKS = ROOT / "docs" / "benchmarks.md"

#: Where citations live: the packages, tests, deployment files, docs and the top-level files.
_SEARCHED = (
    "contracts",
    "shared",
    "services",
    "tests",
    "infra",
    "docs",
    "README.md",
    "Makefile",
    "pyproject.toml",
)
_SKIPPED_PARTS = {"__pycache__", ".results", "node_modules"}
_THIS_FILE = Path(__file__).resolve()
_RECORD_NAME = re.compile(r"^(\d{4})-[a-z0-9]+(?:-[a-z0-9]+)*\.md$")
_SECTIONS = ("## Context", "## Decision", "## Consequences", "## Status")
_STATUS = re.compile(r"^(Accepted|Superseded by \[(\d{4})\]\((\d{4}-[a-z0-9-]+\.md)\))\.$")
#: A record says what holds; these are the marks of a diary (which round of work wrote it).
_DIARY = re.compile(r"\b(?:[Ss]ession|[Ii]ssue|[Rr]ound) \d+\b")
_CITED_RECORD = re.compile(r"docs/adr/[A-Za-z0-9_.-]+\.md")
_ENTRY_HEADING = re.compile(r"^## (\d{4}-\d{2}-\d{2}) — (.+)$")
_CITED_ENTRY = re.compile(r'"(\d{4}-\d{2}-\d{2} — [^"]+)"')


def _text_files() -> Iterator[tuple[Path, str]]:
    for name in _SEARCHED:
        top = ROOT / name
        paths = [top] if top.is_file() else sorted(p for p in top.rglob("*") if p.is_file())
        for path in paths:
            if _SKIPPED_PARTS & set(path.relative_to(ROOT).parts) or path == _THIS_FILE:
                continue  # this file names what it looks for
            try:
                yield path, path.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue  # binary: an image, a wheel, model data


def _records() -> list[Path]:
    return sorted(p for p in ADR.glob("*.md") if p != INDEX)


def _sections(record: Path) -> dict[str, str]:
    """Each ``## `` section's text (stripped), in order of appearance."""
    parts = re.split(r"^(## .+)$", record.read_text(), flags=re.MULTILINE)
    return {head: body.strip() for head, body in zip(parts[1::2], parts[2::2], strict=True)}


def _title(record: Path) -> str:
    first = record.read_text().splitlines()[0]
    assert first.startswith("# "), f"{record.name}: the first line is the title ('# …')"
    return first.removeprefix("# ")


def _status(record: Path) -> str:
    return _sections(record)["## Status"].splitlines()[0]


def test_there_is_no_decisions_diary() -> None:
    """docs/decisions.md is gone and nothing points at it: decisions are records, figures a log."""
    assert not (ROOT / "docs" / "decisions.md").exists()
    citing = [str(path.relative_to(ROOT)) for path, text in _text_files() if "docs/decisions.md" in text]
    assert citing == [], "cite a record in docs/adr/ or an entry of docs/benchmarks.md instead"


def test_every_cited_record_exists() -> None:
    """Every ``docs/adr/<name>.md`` written anywhere in the repository names a file that exists."""
    missing = sorted(
        f"{path.relative_to(ROOT)}: {cited}"
        for path, text in _text_files()
        for cited in set(_CITED_RECORD.findall(text))
        if not (ROOT / cited).is_file()
    )
    assert missing == [], "stale record paths (records are numbered: docs/adr/NNNN-title.md)"


def test_records_are_numbered_in_sequence() -> None:
    """Records are ``NNNN-kebab-title.md``, numbered 0001, 0002, … without gaps or repeats; an
    unnumbered record (from a branch written before numbering) takes the next number."""
    names = [p.name for p in _records()]
    unnumbered = [n for n in names if not _RECORD_NAME.match(n)]
    assert unnumbered == [], (
        f"rename to NNNN-title.md, the next number being {len(names) - len(unnumbered) + 1:04d}"
    )
    numbers = [int(n[:4]) for n in names]
    assert numbers == list(range(1, len(names) + 1)), numbers


@pytest.mark.parametrize("record", _records(), ids=lambda p: p.name)
def test_a_record_has_its_four_sections_and_a_status(record: Path) -> None:
    """A record has a title, then Context, Decision, Consequences and Status, in that order and not
    empty, and its status is ``Accepted.`` or ``Superseded by [NNNN](NNNN-….md).`` naming a record."""
    _title(record)
    sections = _sections(record)
    assert tuple(sections) == _SECTIONS, f"{record.name}: sections {tuple(sections)}"
    assert all(sections.values()), f"{record.name}: an empty section"
    status = _STATUS.match(_status(record))
    assert status, f"{record.name}: status {_status(record)!r}"
    if status.group(3):
        assert (ADR / status.group(3)).is_file()
        assert status.group(3).startswith(status.group(2))


@pytest.mark.parametrize("record", _records(), ids=lambda p: p.name)
def test_a_record_states_the_current_state(record: Path) -> None:
    """A record does not say which round of work wrote it ("session 8", "issue 11")."""
    assert _DIARY.findall(record.read_text()) == []


def test_the_index_lists_every_record_with_its_title_and_status() -> None:
    """docs/adr/README.md has one row per record: its number linking to it, its title, its status."""
    rows = re.findall(
        r"^\| \[(\d{4})\]\(([^)]+)\) \| (.+?) \| (.+?) \| (.+?) \|$", INDEX.read_text(), re.MULTILINE
    )
    listed = {file: (number, title, status) for number, file, title, status, _ in rows}
    assert len(listed) == len(rows), "a record is listed twice"
    expected = {p.name: (p.name[:4], _title(p), _status(p).rstrip(".")) for p in _records()}
    assert listed == expected


def _entries() -> list[tuple[date, str, str]]:
    """The log's entries: date, title and body."""
    parts = re.split(r"^(## .+)$", BENCHMARKS.read_text(), flags=re.MULTILINE)
    entries = []
    for head, body in zip(parts[1::2], parts[2::2], strict=True):
        match = _ENTRY_HEADING.match(head)
        assert match, f"benchmarks heading {head!r} is not '## YYYY-MM-DD — title'"
        entries.append((date.fromisoformat(match.group(1)), match.group(2), body))
    return entries


def test_the_benchmark_log_is_dated_newest_first_with_command_and_machine() -> None:
    """Every benchmarks entry is dated, newest first, and says the command and the machine."""
    entries = _entries()
    assert entries, "docs/benchmarks.md has no entries"
    dates = [day for day, _, _ in entries]
    assert dates == sorted(dates, reverse=True), "newest first"
    incomplete = [
        title for _, title, body in entries if "**Command**:" not in body or "**Machine**:" not in body
    ]
    assert incomplete == []


def test_every_cited_benchmarks_entry_exists() -> None:
    """A quoted ``"YYYY-MM-DD — title"`` anywhere (records, code comments, README) is an entry."""
    headings = {f"{day.isoformat()} — {title}" for day, title, _ in _entries()}
    missing = sorted(
        f"{path.relative_to(ROOT)}: {cited}"
        for path, text in _text_files()
        for cited in set(_CITED_ENTRY.findall(re.sub(r"\s*\n\s*(?:#:?\s*)?", " ", text)))
        if cited not in headings
    )
    assert missing == []
