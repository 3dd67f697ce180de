"""A forged outcome for a waiting save (``engram.save.result.<request id>``, core NATS): with NATS
permissions opened (the test's observer may publish anything), an attacker who sees the request
id answers first. ingest runs alone here, so the only genuine outcome is the one this test signs
as distill would, after the forgeries: the caller gets it, and each forgery is dead-lettered."""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import AsyncIterator
from uuid import UUID, uuid4

import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from pydantic import SecretStr
from sqlalchemy import func, select

from contracts.requests import SaveOutcome
from contracts.subjects import MEMORY_SAVE_ACCEPTED, save_result_subject
from services.runtime import running_services
from shared.runtime.settings import EngramSettings
from shared.security.provenance import SIGNATURE_HEADER, MessageSigner
from shared.service.infra import Infra
from shared.storage import audit
from shared.storage.db.engine import Database
from shared.storage.db.models import AUDIT_LOG
from tests.conftest import TEST_KID
from tests.platform import eventually, request
from tests.security.support import report
from tests.support.servers import SecuredNatsServer

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
async def engram(settings: EngramSettings, nats_proc: SecuredNatsServer) -> AsyncIterator[Infra]:
    """ingest alone, under its own NATS identity: no distill will answer."""
    own = settings.model_copy(update={"nats_nkey_seed": SecretStr(nats_proc.service_seeds["ingest"])})
    async with running_services(own, ["ingest"]) as infra:
        yield infra


async def _refused(db: Database) -> int:
    async with db.read() as s:
        query = (
            select(func.count())
            .select_from(AUDIT_LOG)
            .where(AUDIT_LOG.c.org_id == audit.SYSTEM_ORG, AUDIT_LOG.c.kind == "internal.rejected")
        )
        return int((await s.execute(query)).scalar_one())


async def test_a_forged_save_outcome_never_reaches_the_caller(
    engram: Infra,
    nc: Client,
    observer_nc: Client,
    db: Database,
    agent: UUID,
    service_token: str,
) -> None:
    """Unsigned, garbage-signed and guessed-key outcomes published before distill's are each
    dead-lettered; the waiting caller gets the genuine outcome."""
    request_id = uuid4()
    accepted: asyncio.Future[Msg] = asyncio.get_running_loop().create_future()

    async def on_accepted(msg: Msg) -> None:
        if not accepted.done() and json.loads(msg.data)["request_id"] == str(request_id):
            accepted.set_result(msg)

    # The attacker watches the hand-off: it is published after ingest subscribed for the outcome.
    watch = await observer_nc.subscribe(MEMORY_SAVE_ACCEPTED, cb=on_accepted)
    await observer_nc.flush()
    before = await _refused(db)
    body = {
        "agent_config_id": str(agent),
        "request_id": str(request_id),
        "wait": True,
        "principal": {"kind": "end_user", "id": "alice"},
        "entries": [{"text": "Alice's PIN is never asked for by phone.", "importance": 0.7}],
    }
    caller = asyncio.create_task(request(nc, "engram.memory.save", body, service_token, timeout=20))
    await asyncio.wait_for(accepted, 15)
    subject = save_result_subject(str(request_id))
    lie = json.dumps({"request_id": str(request_id), "saved": 9, "skipped": 0, "reinforced": 0, "ids": []})
    guessed = MessageSigner({TEST_KID: secrets.token_urlsafe(40)})
    forged = [
        {},
        {SIGNATURE_HEADER: f"v1:{TEST_KID}:{secrets.token_urlsafe(32)}"},
        guessed.sign(subject, lie.encode()),
    ]
    for headers in forged:
        await observer_nc.publish(subject, lie.encode(), headers=headers or None)
    # distill's answer, signed with the deployment's key, after the forgeries (one connection
    # keeps its order, so ingest meets every forgery first).
    genuine = SaveOutcome(request_id=request_id, saved=1, skipped=0, reinforced=0, ids=[uuid4()])
    data = genuine.model_dump_json().encode()
    await observer_nc.publish(subject, data, headers=engram.signer.sign(subject, data))
    reply = await caller
    await watch.unsubscribe()

    async def audited() -> bool:
        return await _refused(db) - before >= len(forged)

    await eventually(audited, what="each forged outcome audited")
    refused = await _refused(db) - before
    report(
        "forged-save-outcomes", forged=len(forged), dead_lettered=refused, believed=int(reply["saved"] == 9)
    )
    assert reply == {**genuine.model_dump(mode="json"), "status": 200}
    assert refused == len(forged)
