"""Builders for wire objects in tests: valid defaults, override what the test is about."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from uuid import UUID, uuid4

from contracts.errors import Forbidden, NotFound
from contracts.events import SessionEnded, ToolCall, TranscriptTurn

__all__ = ["AgentConfigsOf", "make_call", "make_session", "make_turn"]

ORG_ID = UUID("00000000-0000-4000-8000-000000000001")
AGENT_CONFIG_ID = UUID("00000000-0000-4000-8000-000000000002")


class AgentConfigsOf:
    """Whose each agent config is, in memory (``shared.security.access.AgentConfigs``) for an edge under
    test without Postgres: ``owners`` maps an agent config to its organization; one not in it is
    unknown (any organization may claim it, none has it ``known``)."""

    def __init__(self, owners: dict[UUID, UUID] | None = None) -> None:
        self.owners = dict(owners or {})

    async def check(self, org_id: UUID, agent_config_id: UUID, *, known: bool) -> None:
        owner = self.owners.get(agent_config_id)
        if owner is not None and owner != org_id:
            raise Forbidden("agent config belongs to another organization")
        if owner is None and known:
            raise NotFound("agent config not found")


def make_call(
    tool: str = "search", input: Any = None, output: Any = "ok", error: str | None = None
) -> ToolCall:
    """One tool call; pass ``error`` to make it a failed one (its output then defaults to None)."""
    if error is not None and output == "ok":
        output = None
    return ToolCall(tool=tool, input=input if input is not None else {}, output=output, error=error)


def make_turn(content: str, role: str = "user") -> TranscriptTurn:
    return TranscriptTurn(role=role, content=content)


def make_session(**overrides: Any) -> SessionEnded:
    """A valid ``session.ended`` (success, 3 steps, empty trace) with ``overrides`` applied."""
    fields: dict[str, Any] = {
        "event_id": uuid4(),
        "schema_version": 1,
        "org_id": ORG_ID,
        "agent_config_id": AGENT_CONFIG_ID,
        "session_id": "session-1",
        "status": "success",
        "principal": {"kind": "end_user", "id": "alice"},
        "steps": 3,
        "task": "Deploy the billing service to staging",
        "tool_trace": [],
        "ended_at": datetime(2025, 1, 1, 12, 0, tzinfo=UTC),
    }
    fields.update(overrides)
    return SessionEnded.model_validate(fields)
