"""EngramClient, the convenience client for Python platforms, against the real services."""

from __future__ import annotations

import logging
from typing import Any
from uuid import UUID, uuid4

import pytest
from nats.errors import ConnectionClosedError

from contracts.client import EngramClient
from contracts.common import Principal
from contracts.errors import Forbidden, InvalidRequest, Unauthenticated
from contracts.requests import SaveEntry, SaveOutcome
from shared.embedded.nats_server import NatsServerProcess
from shared.runtime.settings import EngramSettings
from shared.security.auth import ALL_PERMISSIONS, TokenService
from shared.security.nats_auth.store import Identity
from shared.service.infra import Infra
from tests.platform import eventually, session_payload
from tests.support.servers import SecuredNatsServer

pytestmark = pytest.mark.integration


async def test_client_round_trip(
    engram: Infra,
    settings: EngramSettings,
    org: UUID,
    agent: UUID,
    service_token: str,
    platform_options: dict[str, Any],
) -> None:
    """publish_session, submit_session (the same event_id again: duplicate), save (wait), config
    and audit calls work and return typed models."""
    async with await EngramClient.connect(settings.nats_url, service_token, **platform_options) as client:
        seq = await client.publish_session(
            session_payload(org, agent, tool_trace=[{"tool": "t", "input": {}, "error": "e"}])
        )
        assert seq > 0
        session = session_payload(org, agent, tool_trace=[{"tool": "t", "input": {}, "error": "e"}])
        taken = await client.submit_session(session)
        assert (taken.duplicate, taken.stream_seq is not None) == (False, True)
        again = await client.submit_session(session)
        assert (again.duplicate, again.stream_seq) == (True, None)
        outcome = await client.save(
            agent,
            [SaveEntry(text="Prefers dark mode.", importance=0.6)],
            wait=True,
            principal={"kind": "end_user", "id": "alice"},
        )
        assert isinstance(outcome, SaveOutcome)
        assert outcome.saved == 1
        accepted = await client.save(agent, [{"text": "Second fact."}])
        assert accepted.status == 202
        config = await client.put_config(agent, {"top_k": 7})
        assert (config.version, config.config.top_k) == (2, 7)  # v1: defaults, made by the first write
        assert (await client.get_config(agent)).config.top_k == 7

        async def distilled() -> bool:
            return bool((await client.audit_query(kind="distill.completed")).records)

        await eventually(distilled, what="the published session distilled")
        assert (await client.audit_verify()).ok


async def test_client_raises_typed_errors(
    engram: Infra,
    settings: EngramSettings,
    tokens: TokenService,
    agent: UUID,
    service_token: str,
    platform_options: dict[str, Any],
) -> None:
    """Wire errors come back as the matching EngramError subclass."""
    async with await EngramClient.connect(settings.nats_url, "forged", **platform_options) as anonymous:
        with pytest.raises(Unauthenticated):
            await anonymous.get_config(agent)
    async with await EngramClient.connect(settings.nats_url, service_token, **platform_options) as client:
        with pytest.raises(InvalidRequest):
            await client.put_config(agent, {"top_k": 0})
        await client.put_config(agent, {"top_k": 3})
    foreign = tokens.mint(
        org_id=uuid4(), principal=Principal(kind="service", id="x"), permissions=ALL_PERMISSIONS
    )
    async with await EngramClient.connect(settings.nats_url, foreign, **platform_options) as intruder:
        with pytest.raises(Forbidden):
            await intruder.get_config(agent)


async def test_client_calls_every_memory_operation(
    engram: Infra,
    settings: EngramSettings,
    agent: UUID,
    service_token: str,
    platform_options: dict[str, Any],
) -> None:
    """Each operation method of the table answers its typed reply against the real services."""
    alice = {"kind": "end_user", "id": "alice"}
    async with await EngramClient.connect(settings.nats_url, service_token, **platform_options) as client:
        saved = await client.save(
            agent,
            [{"text": "Deploys go out on Tuesdays."}, {"text": "The staging cluster is eu-west."}],
            wait=True,
            principal=alice,
        )
        assert isinstance(saved, SaveOutcome)
        first, second = saved.ids
        recalled = await client.recall(agent, principal=alice, strategy="importance")
        assert {r.id for r in recalled.results} == {first, second}
        assert [r.id for r in (await client.expand(agent, [first], principal=alice)).results] == [first]
        assert (await client.feedback(agent, entry_id=second, success=False, principal=alice)).updated == 1
        page = await client.list_entries(agent, principal=alice)
        assert {e.id for e in page.entries} == {first, second}
        assert (await client.get_entry(agent, first, principal=alice)).entry.text.startswith("Deploys")
        assert (await client.manage(agent, first, "pin", principal=alice)).entry.pinned  # type: ignore[union-attr]
        exported = [
            e.id async for p in client.export("end_user:alice", agent_config_id=agent) for e in p.entries
        ]
        assert set(exported) == {first, second}
        assert (await client.delete(agent, second, principal=alice)).entry_ids == [second]
        assert (await client.prune(agent, 10)).remaining == 1
        assert (await client.purge("end_user:alice", agent_config_id=agent)).entry_ids == [first]


def _secured(server: NatsServerProcess) -> SecuredNatsServer:
    assert isinstance(server, SecuredNatsServer), "these tests revoke identities on a secured server"
    return server


def _login(identity: Identity) -> dict[str, Any]:
    return {"nkeys_seed_str": identity.seed, "inbox_prefix": identity.inbox_prefix}


async def _refused_logins(server: SecuredNatsServer, identity: Identity) -> int:
    """How many times the server refused ``identity``'s login, once it has logged the first."""

    def count() -> int:
        return len(server.log_lines(f'authentication error - Nkey "{identity.public_key}"'))

    async def logged() -> bool:
        return count() > 0

    await eventually(logged, what=f"the server's log of a refused login of {identity.public_key}")
    return count()


async def test_connect_with_a_revoked_identity_fails_at_the_first_refusal(
    nats_proc: NatsServerProcess, service_token: str, caplog: pytest.LogCaptureFixture
) -> None:
    """EngramClient.connect with a revoked NATS identity raises UNAUTHENTICATED naming NATS
    authorization and the identity after one refused login, and logs no traceback (nats-py alone
    retries for two minutes, a traceback each time, then raises NoServersError)."""
    server = _secured(nats_proc)
    name = f"gone-{uuid4().hex[:8]}"
    gone = await server.mint(name, uuid4())
    await server.revoke(name)
    with pytest.raises(Unauthenticated) as refused:
        await EngramClient.connect(server.url, service_token, **_login(gone))
    assert "NATS authorization refused" in refused.value.message
    assert gone.public_key in refused.value.message
    assert gone.seed not in refused.value.message
    assert await _refused_logins(server, gone) == 1
    assert [r.getMessage() for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR] == []


async def test_requests_of_a_connection_whose_identity_is_revoked_fail_once_refused(
    engram: Infra,
    nats_proc: NatsServerProcess,
    agent: UUID,
    service_token: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """When a connected client's NATS identity is revoked, the next request and every later one
    raise UNAUTHENTICATED once the server refuses the reconnect (one refused login), not at their
    timeout, and nothing logs a traceback (nats-py retries without end, each request timing out)."""
    server = _secured(nats_proc)
    name = f"carol-{uuid4().hex[:8]}"
    carol = await server.mint(name, uuid4())
    # A timeout far longer than the test: a request must end because it was refused.
    client = await EngramClient.connect(server.url, service_token, timeout=60, **_login(carol))
    try:
        assert (await client.get_config(agent)).agent_config_id == agent  # serving
        await server.revoke(name)  # the server has closed the connection when this returns
        with pytest.raises(Unauthenticated) as next_request:
            await client.get_config(agent)
        with pytest.raises(Unauthenticated) as later:
            await client.publish_session(session_payload(uuid4(), agent))
    finally:
        await client.close()
    for refused in (next_request.value, later.value):
        assert "NATS authorization refused" in refused.message
        assert carol.public_key in refused.message
        # The connection was closed on the refusal; neither request waited out its timeout.
        assert isinstance(refused.__cause__, ConnectionClosedError), repr(refused.__cause__)
    assert await _refused_logins(server, carol) == 1
    assert [r.getMessage() for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR] == []
