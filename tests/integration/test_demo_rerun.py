"""`make run` a second time: the demo reports its own sessions only (not other clients' events in
the same organization) and says "(purged)" for an owner whose memory was purged, instead of
polling for lessons that can never come back."""

from __future__ import annotations

import io
from uuid import uuid4

import pytest
from nats.aio.client import Client
from rich.console import Console

from contracts.common import Principal
from services.cli.demo import run_demo
from shared.embedded.stack import DevIdentity
from shared.runtime.settings import EngramSettings
from shared.security.auth import ALL_PERMISSIONS, TokenService
from shared.security.nats_auth.store import Identity
from shared.service.infra import Infra
from tests.conftest import TEST_KID, TEST_SECRET, nats_options
from tests.platform import eventually, publish_session, request, session_payload

pytestmark = pytest.mark.integration


async def test_a_rerun_counts_its_own_sessions_and_marks_purged_owners(
    engram: Infra, settings: EngramSettings, nc: Client, tokens: TokenService, nats_proc: object
) -> None:
    identity = DevIdentity(org_id=uuid4(), agent_config_id=uuid4(), kid=TEST_KID, secret=TEST_SECRET)
    client: Identity = nats_proc.client  # type: ignore[attr-defined]
    options = nats_options(client)

    async def demo() -> tuple[object, str]:
        out = io.StringIO()
        report = await run_demo(
            settings.nats_url,
            settings.database_url,
            identity,
            Console(file=out, width=200, color_system=None),
            timeout_s=180,
            nats_options=options,
        )
        return report, out.getvalue()

    first, _ = await demo()
    assert first.distilled > 0  # type: ignore[attr-defined]

    token = tokens.mint(
        org_id=identity.org_id, principal=Principal(kind="service", id="runner"), permissions=ALL_PERMISSIONS
    )
    # Another client's session in the same organization, fully distilled before the re-run.
    other = session_payload(identity.org_id, identity.agent_config_id, status="failed", steps=3)
    await publish_session(nc, other, token)

    async def distilled() -> bool:
        reply = await request(nc, "engram.audit.query", {"kind": "distill.completed", "limit": 1000}, token)
        return any(r["details"].get("event_id") == other["event_id"] for r in reply.get("records", []))

    await eventually(distilled, timeout=60, what="the other client's session distilled")
    purge = {"actor_ref": "end_user:alice"}
    assert "error" not in await request(nc, "engram.memory.purge", purge, token)

    second, out = await demo()
    assert second.distilled == first.distilled  # type: ignore[attr-defined]
    assert second.published == first.published  # type: ignore[attr-defined]
    assert "end_user:alice" in second.purged  # type: ignore[attr-defined]
    assert "recall for end_user:alice: 'refund card declined' — (purged)" in out
