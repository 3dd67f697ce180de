"""At INFO the services log what matters, not every message they handle."""

from __future__ import annotations

import logging
from uuid import UUID

import pytest
from nats.aio.client import Client

from shared.service.infra import Infra
from tests.platform import eventually, publish_session, request, session_payload

pytestmark = pytest.mark.integration


async def test_handled_messages_are_logged_at_debug_only(
    engram: Infra,
    nc: Client,
    service_token: str,
    org: UUID,
    agent: UUID,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A stream message is logged by FastStream at DEBUG only; a request to the edge (nats-py,
    not FastStream) is not logged at all at INFO."""
    caplog.set_level(logging.DEBUG)
    for _ in range(3):
        reply = await request(nc, "engram.recall", {"agent_config_id": str(agent)}, service_token)
        assert "warnings" in reply, reply
    # Where a per-request line would come from (background work may log INFO meanwhile).
    per_request = ("engram.broker", "shared.service.edge", "services.recall")
    loud = [r for r in caplog.records if r.levelno >= logging.INFO and r.name.startswith(per_request)]
    assert [r.getMessage() for r in loud] == []

    await publish_session(nc, session_payload(org, agent), service_token)

    async def received() -> bool:
        return any(r.name == "engram.broker" and "Received" in r.getMessage() for r in caplog.records)

    await eventually(received, timeout=30, what="FastStream's DEBUG line for the session")
    broker = [r for r in caplog.records if r.name == "engram.broker"]
    assert [r.getMessage() for r in broker if r.levelno >= logging.INFO] == []
