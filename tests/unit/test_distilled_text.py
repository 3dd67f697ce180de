"""The text written from a trace (observations, the summary a model reads, built-in lessons) and
the demo's tables: no literal ``null``, no stray redaction placeholder."""

from __future__ import annotations

import io
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import pytest
from rich.console import Console

from contracts.events import SessionEnded
from services.cli.demo import _lessons_table, _observations_table
from services.cli.demo_data import DEMO_AGENT_B, DEMO_ORG_B, demo_sessions
from services.distill.observations import observation_drafts
from services.distill.summary import summarize_trace
from shared.adapters.distillers.builtin import distill_session
from shared.storage.db.models import MemoryEntry
from shared.text.policy import apply_write_policy
from tests.factories import make_call, make_session
from tests.stored_text import artefacts, readme_http_trace

ORG_A = UUID("11111111-1111-4111-8111-111111111111")
AGENT_A = UUID("22222222-2222-4222-8222-222222222222")


def _stored(text: str) -> str:
    """The text as the save path stores it under the default ``pii_handling`` (redact)."""
    return apply_write_policy(text, "redact").text


def _readme_session() -> SessionEnded:
    trace = readme_http_trace()
    return make_session(status="failed", steps=2, session_id="run-43", task="", tool_trace=trace)


def _demo() -> list[SessionEnded]:
    payloads = demo_sessions(ORG_A, AGENT_A, DEMO_ORG_B, DEMO_AGENT_B, now=datetime(2025, 3, 1, tzinfo=UTC))
    return [SessionEnded.model_validate(p) for p in payloads]


def test_the_readme_session_reads_without_null() -> None:
    """The README's HTTP example (a failed call without input) is observed as
    ``refund_payment() error: card declined`` and summarized without ``null``; its lessons are clean."""
    session = _readme_session()
    [observation] = observation_drafts(session)
    assert observation.text == "refund_payment() error: card declined"
    assert "#0 refund_payment() [ERROR: card declined]" in summarize_trace(session).text.splitlines()
    lessons = [lesson.text for lesson in distill_session(session)]
    assert lessons
    assert {text: artefacts(text) for text in lessons} == {text: [] for text in lessons}


@pytest.mark.parametrize("nothing", [None, {}, [], ""])
def test_a_call_without_input_or_output_is_written_bare(nothing: Any) -> None:
    """No input reads ``tool()``; a call that worked without output is just that, never ``-> null``."""
    session = make_session(tool_trace=[make_call("ls")])
    session.tool_trace[0] = session.tool_trace[0].model_copy(update={"input": nothing, "output": nothing})
    assert [draft.text for draft in observation_drafts(session)] == ["ls()"]
    assert summarize_trace(session).text.splitlines()[2] == "#0 ls()"


def test_a_retry_without_input_says_so() -> None:
    """A tool that failed with input and worked when retried without any is phrased "without input"."""
    session = make_session(
        tool_trace=[
            make_call("refund_payment", {"order_id": "A-1"}, error="card declined"),
            make_call("refund_payment", None, output="ok"),
        ]
    )
    session.tool_trace[1] = session.tool_trace[1].model_copy(update={"input": None})
    [recovery] = [lesson.text for lesson in distill_session(session) if "worked" in lesson.text]
    assert recovery.endswith("retrying refund_payment without input worked.")


def test_a_recovery_names_what_changed_not_the_values_that_stayed() -> None:
    """The demo's digest that worked on port 465 teaches "port=465": the unchanged recipient (an
    e-mail address, redacted to a placeholder in storage) stays out of the lesson."""
    [digest] = [s for s in _demo() if s.session_id == "demo-helpdesk-04"]
    [recovery] = [_stored(lesson.text) for lesson in distill_session(digest) if "worked" in lesson.text]
    assert recovery == (
        "After send_email failed with 'ECONNRESET: socket hang up (smtp.example.com:587)' while working on "
        "'Send the nightly open-tickets digest', retrying send_email with port=465 worked."
    )


def test_a_recovery_names_added_and_dropped_input_keys() -> None:
    """The demo's declined card refund that worked as store credit names the new method and the
    card that was left out (not the card number)."""
    [refund] = [s for s in _demo() if s.session_id == "demo-helpdesk-00"]
    [recovery] = [lesson.text for lesson in distill_session(refund) if "worked" in lesson.text]
    assert recovery.endswith('retrying refund_payment with method="store_credit" and without card worked.')


def test_every_demo_lesson_and_observation_is_stored_without_artefacts() -> None:
    """Every lesson and observation the demo's sessions give, as stored after redaction, has no
    literal null and is not mostly placeholders; no lesson ends on one outside a quoted value."""
    sessions = _demo()
    lessons = [_stored(lesson.text) for session in sessions for lesson in distill_session(session)]
    observations = [_stored(draft.text) for session in sessions for draft in observation_drafts(session)]
    assert any("[SECRET]" in text for text in lessons)  # redaction still happens
    assert any("[EMAIL]" in text for text in observations)
    found = {text: artefacts(text) for text in lessons}
    found |= {text: artefacts(text, sentence=False) for text in observations}
    assert {text: problems for text, problems in found.items() if problems} == {}


def _rendered(table: Any) -> str:
    console = Console(file=io.StringIO(), width=400, color_system=None)
    console.print(table)
    output: str = console.file.getvalue()  # type: ignore[attr-defined]
    return output


def _entry(text: str, redaction: list[str], quarantined: bool = False) -> MemoryEntry:
    return MemoryEntry(
        text=text,
        redaction=redaction,
        quarantined=quarantined,
        owner_key="end_user:alice",
        memory_type="lesson",
        importance=0.6,
        reinforcement_count=0,
    )


def test_the_demo_lessons_table_shows_redactions_beside_the_lesson() -> None:
    """`make run` prints a lesson as stored and the redacted kinds in a column of their own, not as
    a stray ``[EMAIL]`` after the sentence."""
    text = "Send the digest to [EMAIL] on port 465."
    out = _rendered(_lessons_table([_entry(text, ["EMAIL"])]))
    assert "port 465. [EMAIL]" not in out
    [line] = [line for line in out.splitlines() if text in line]
    cells = [cell.strip() for cell in line.split("│")]
    assert cells[cells.index(text) + 1] == "EMAIL"


def test_the_demo_tables_print_stored_text_literally() -> None:
    """Bracketed text is printed as written, never read as console markup: a stored
    ``[bold]…`` stays, and the "quarantined" notices are visible."""
    lessons = _rendered(_lessons_table([_entry("Use [bold] flags", []), _entry("x", [], quarantined=True)]))
    assert "Use [bold] flags" in lessons
    assert "[quarantined: not shown]" in lessons
    observations = _rendered(_observations_table([_entry("y", [], quarantined=True)]))
    assert "[quarantined: never rendered into a prompt]" in observations
