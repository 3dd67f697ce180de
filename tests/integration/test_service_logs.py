"""At INFO the services log what matters, not every message they handle."""

from __future__ import annotations

import logging
from uuid import UUID

import pytest
from nats.aio.client import Client

from shared.infra import Infra
from tests.platform import request

pytestmark = pytest.mark.integration


async def test_handled_messages_are_logged_at_debug_only(
    engram: Infra, nc: Client, service_token: str, agent: UUID, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="engram.broker")
    for _ in range(3):
        reply = await request(nc, "engram.recall", {"agent_config_id": str(agent)}, service_token)
        assert "warnings" in reply, reply
    broker = [r for r in caplog.records if r.name == "engram.broker"]
    assert any("Received" in r.getMessage() for r in broker), "the test would prove nothing"
    assert [r.getMessage() for r in broker if r.levelno >= logging.INFO] == []
