"""Event contracts: times without a zone are UTC, so comparisons downstream never mix kinds."""

from __future__ import annotations

from datetime import UTC
from uuid import uuid4

from contracts.events import SessionEnded
from tests.platform import session_payload


def test_a_session_time_without_a_zone_is_utc() -> None:
    session = SessionEnded.model_validate(session_payload(uuid4(), uuid4(), ended_at="2026-11-30T05:00:00"))
    assert session.ended_at.tzinfo is UTC
    assert session.occurred_at == session.ended_at


def test_an_explicit_occurred_at_without_a_zone_is_utc_too() -> None:
    payload = session_payload(
        uuid4(), uuid4(), ended_at="2026-11-30T05:00:00+02:00", occurred_at="2026-11-30T03:00:01"
    )
    session = SessionEnded.model_validate(payload)
    assert session.occurred_at is not None
    assert session.occurred_at.tzinfo is UTC
    assert session.occurred_at > session.ended_at  # 03:00:01Z is after 05:00+02:00 (03:00Z)
