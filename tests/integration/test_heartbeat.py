"""A live worker keeps its messages: with an ack_wait far shorter than a model call, distill's
in-progress heartbeats stop JetStream from redelivering the batch it is working on to another
worker waiting on the same durable (a second replica)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from uuid import UUID

import pytest
from nats.aio.client import Client
from pydantic import SecretStr

from services.runtime import running_services
from shared.adapters.distillers.openai_compat import OpenAICompatDistiller
from shared.runtime.settings import EngramSettings
from shared.storage.db.engine import Database
from tests.faults.workload import audit_count
from tests.platform import eventually, publish_session, session_payload
from tests.support.fake_openai import FakeOpenAI
from tests.support.servers import SecuredNatsServer

pytestmark = pytest.mark.integration

#: Short against a model call, but not so short that a busy machine's event-loop stall (a loaded
#: CI host, a collection) outlasts the gap between two heartbeats (ack_wait/3): with 1 s, a 0.7 s
#: stall was a redelivery. Production's default is 5 s.
ACK_WAIT_S = 3.0
#: Each model call outlasts the ack_wait three times over.
MODEL_DELAY_S = 9.0
SESSIONS = 2
LESSONS = [{"text": "Deploys to staging need the VPN.", "importance": 0.7, "memory_type": "procedural"}]


@pytest.fixture(scope="module")
async def slow_model() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI(mode="slow", lessons=LESSONS, delay_s=MODEL_DELAY_S) as server:
        yield server


async def test_a_slow_batch_is_not_redelivered_while_its_worker_lives(
    nats_proc: SecuredNatsServer,
    settings: EngramSettings,
    slow_model: FakeOpenAI,
    nc: Client,
    observer_nc: Client,
    db: Database,
    org: UUID,
    agent: UUID,
    service_token: str,
) -> None:
    """Sessions whose distillation takes 3x the ack_wait are delivered once each and the model is
    asked once per session, though a second distill replica is fetching from the same durable:
    the heartbeat, not a long ack_wait, holds them."""
    short = settings.model_copy(update={"ack_wait_s": ACK_WAIT_S})
    # The replica runs as `engram serve distill` would: under distill's own NATS identity.
    replica = short.model_copy(update={"nats_nkey_seed": SecretStr(nats_proc.service_seeds["distill"])})

    def distiller() -> OpenAICompatDistiller:
        return OpenAICompatDistiller(slow_model.base_url, "fake-model", timeout_s=30, retries=0)

    async with (
        running_services(short, distiller=distiller()),
        running_services(replica, ["distill"], distiller=distiller()),
    ):
        for _ in range(SESSIONS):
            await publish_session(nc, session_payload(org, agent), service_token)

        async def distilled() -> bool:
            return await audit_count(db, org, "distill.completed") >= SESSIONS

        await eventually(distilled, timeout=120, interval=0.2, what="both slow sessions distilled")
        info = await observer_nc.jetstream().consumer_info("ENGRAM_SESSIONS", "distill")
    assert info.config.ack_wait == ACK_WAIT_S, "the durable was not created with the short ack_wait"
    assert info.delivered.consumer_seq == SESSIONS, f"redelivered: {info.delivered}"
    assert info.num_redelivered == 0
    assert slow_model.request_count == SESSIONS
