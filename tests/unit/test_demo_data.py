"""The bundled demo dataset: valid ``session.ended`` payloads covering what the demo must show."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import pytest

from contracts.events import SessionEnded
from services.cli.demo_data import DEMO_AGENT_B, DEMO_ORG_B, DEMO_RECALL_HINTS, demo_sessions

ORG_A = UUID("11111111-1111-4111-8111-111111111111")
AGENT_A = UUID("22222222-2222-4222-8222-222222222222")
NOW = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


def _sessions(now: datetime = NOW) -> list[dict[str, Any]]:
    return demo_sessions(ORG_A, AGENT_A, DEMO_ORG_B, DEMO_AGENT_B, now=now)


@pytest.fixture(scope="module")
def parsed() -> list[SessionEnded]:
    return [SessionEnded.model_validate(p) for p in _sessions()]


def test_every_payload_validates_and_survives_json(parsed: list[SessionEnded]) -> None:
    """Every payload is JSON-serializable and round-trips through SessionEnded."""
    for payload in _sessions():
        SessionEnded.model_validate_json(json.dumps(payload))
    assert len(parsed) >= 20


def test_two_orgs_with_most_sessions_in_org_a(parsed: list[SessionEnded]) -> None:
    """Sessions span two organizations, most of them in org A."""
    orgs = Counter(s.org_id for s in parsed)
    assert set(orgs) == {ORG_A, DEMO_ORG_B}
    assert orgs[ORG_A] > orgs[DEMO_ORG_B] > 0
    assert {s.agent_config_id for s in parsed if s.org_id == DEMO_ORG_B} == {DEMO_AGENT_B}


def test_event_ids_unique_and_stable_across_calls() -> None:
    """Event and session ids are unique and identical on a second call, even at a later time."""
    first, second = _sessions(), _sessions(NOW + timedelta(days=2))
    ids = [p["event_id"] for p in first]
    assert len(set(ids)) == len(ids)
    assert ids == [p["event_id"] for p in second]
    assert [p["session_id"] for p in first] == [p["session_id"] for p in second]


def test_timestamps_are_relative_to_now(parsed: list[SessionEnded]) -> None:
    """Sessions end before now, oldest first, and tool calls start before their session ends."""
    ends = [s.ended_at for s in parsed]
    assert ends == sorted(ends)
    assert all(NOW - timedelta(days=7) < e < NOW for e in ends)
    assert all(c.started_at and c.started_at < s.ended_at for s in parsed for c in s.tool_trace)


def test_every_status_and_principal_kind_appears(parsed: list[SessionEnded]) -> None:
    """At least one session per status and per principal kind used by the demo."""
    assert {s.status for s in parsed} == {"success", "failed", "cancelled", "timeout"}
    assert {"end_user", "actor", "none"} <= {s.principal.kind for s in parsed}


def test_sensitive_data_and_injections_present() -> None:
    """The payloads carry an e-mail, a test card, an AWS-style key and an injection phrase."""
    blob = json.dumps(_sessions())
    assert "@example.com" in blob
    assert "4111 1111 1111 1111" in blob
    assert "AKIAIOSFODNN7EXAMPLE" in blob
    assert "ignore all previous instructions" in blob.lower()
    assert "<system>" in blob


def test_gate_skips_short_sessions(parsed: list[SessionEnded]) -> None:
    """At least two sessions ran fewer than two steps, so the distill gate skips them."""
    assert sum(s.steps < 2 for s in parsed) >= 2


def test_repeated_failures_for_reinforcement(parsed: list[SessionEnded]) -> None:
    """At least three (owner, tool, error) failures repeat across sessions of one agent config."""
    per_session = [
        {(s.agent_config_id, s.principal.ref, c.tool, c.error) for c in s.tool_trace if c.error}
        for s in parsed
    ]
    repeats = Counter(key for keys in per_session for key in keys)
    assert sum(n >= 2 for n in repeats.values()) >= 3


def test_recall_hints_name_owners_of_org_a(parsed: list[SessionEnded]) -> None:
    """Each recall hint names a principal that has sessions in org A."""
    refs = {s.principal.ref for s in parsed if s.org_id == ORG_A}
    assert DEMO_RECALL_HINTS
    assert all(ref in refs and cue for ref, cue in DEMO_RECALL_HINTS)
