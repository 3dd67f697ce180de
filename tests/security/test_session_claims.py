"""Nobody can make another organization's session disappear (SPEC 3, 8; issue 21, item 7).

A session is deduplicated per organization and only after its token is verified (ingest's inbox,
``<org>/<event_id>``), never by an id a publisher chose. Each attack below publishes first —
another organization's valid token with the victim's ``event_id``, a garbage token, the victim's
own expired token, a ``Nats-Msg-Id`` equal to the key ingest hands a session to distill under —
and then the victim publishes as the README says; the victim's session must be distilled exactly
once, and sending it again must change nothing. The same holds for an elective save's key. Each
runs over every interface (``interface``: NATS and the HTTP gateway, where a token that does not
verify is refused before anything is stored)."""

from __future__ import annotations

from typing import Any
from uuid import UUID, uuid4

import pytest
from nats.aio.client import Client
from sqlalchemy import func, select

from shared.security.auth import ALL_PERMISSIONS, TokenService
from shared.storage.db.engine import Database
from shared.storage.db.models import AUDIT_LOG
from tests.platform import eventually, publish_session, session_payload
from tests.security.support import mint, report
from tests.security.transport import Interface

pytestmark = pytest.mark.integration

ATTACKS = ("other_org", "garbage", "expired_then_fresh", "internal_key")
#: The consumers a session passes through: settled means nothing of it is still on its way.
_DURABLES = (("ENGRAM_SESSIONS", "ingest"), ("ENGRAM_SESSIONS", "distill"))


def _session(org: UUID, agent: UUID, event_id: str) -> dict[str, Any]:
    return session_payload(
        org,
        agent,
        event_id=event_id,
        session_id=f"claim-{event_id[:8]}",
        tool_trace=[
            {"tool": "search", "input": {"q": "refund"}, "output": "2 hits"},
            {"tool": "refund_payment", "input": {"order": "A-1"}, "error": "card declined"},
        ],
    )


async def _distilled(db: Database, org: UUID, event_id: str) -> int:
    """How many times distill completed ``org``'s session ``event_id`` (its audit records)."""
    async with db.read() as s:
        query = (
            select(func.count())
            .select_from(AUDIT_LOG)
            .where(
                AUDIT_LOG.c.org_id == org,
                AUDIT_LOG.c.kind == "distill.completed",
                AUDIT_LOG.c.details["event_id"].astext == event_id,
            )
        )
        return int((await s.execute(query)).scalar_one())


async def _settled(observer_nc: Client) -> None:
    """Wait until ingest and distill hold nothing pending or unacknowledged."""
    seen: dict[str, tuple[int, int]] = {}

    async def quiet() -> bool:
        for stream, durable in _DURABLES:
            info = await observer_nc.jetstream().consumer_info(stream, durable)
            seen[durable] = (info.num_pending or 0, info.num_ack_pending or 0)
        return all(counts == (0, 0) for counts in seen.values())

    try:
        await eventually(quiet, timeout=60, what="ingest and distill settled")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; (pending, unacked) last seen: {seen}") from exc


async def _attacker_first(
    attack: str,
    interface: Interface,
    nc: Client,
    tokens: TokenService,
    victim: dict[str, Any],
) -> bool:
    """The attacker's publish; whether the way in took it (JetStream acked, or HTTP 202)."""
    org, event_id = UUID(victim["org_id"]), victim["event_id"]
    # The attacker's own organization and agent config (an agent config belongs to the first
    # organization that writes to it: that is another matter than event ids).
    other, agent = uuid4(), uuid4()
    if attack == "internal_key":
        # Only NATS lets a publisher choose headers: a session of the attacker's own, published
        # under the key ingest forwards the victim's session to distill with.
        token = mint(tokens, other, "service:attacker", ALL_PERMISSIONS)
        await publish_session(nc, _session(other, agent, str(uuid4())), token, msg_id=f"{org}/{event_id}")
        return True
    if attack == "other_org":
        # A valid session of another organization that reuses the victim's event_id.
        token = mint(tokens, other, "service:attacker", ALL_PERMISSIONS)
        payload = _session(other, agent, event_id)
    elif attack == "garbage":
        token, payload = "garbage", victim
    else:  # the victim's own token, expired: the README says to retry with a fresh one
        token, payload = mint(tokens, org, "service:runner", ALL_PERMISSIONS, ttl_seconds=-60), victim
    if interface.name == "nats":
        # A NATS publisher chooses its Nats-Msg-Id: the victim's event_id.
        await publish_session(nc, payload, token, msg_id=event_id)
        return True
    return await interface.publish_session(payload, token)


@pytest.mark.parametrize("attack", ATTACKS)
async def test_nobody_can_make_a_victims_session_disappear(
    attack: str,
    interface: Interface,
    nc: Client,
    observer_nc: Client,
    db: Database,
    tokens: TokenService,
    org: UUID,
    agent: UUID,
    service_token: str,
) -> None:
    """Whatever was published first with the victim's event_id, the victim's session is distilled
    exactly once, and publishing it again changes nothing."""
    event_id = str(uuid4())
    victim = _session(org, agent, event_id)
    taken = await _attacker_first(attack, interface, nc, tokens, victim)
    assert await interface.publish_session(victim, service_token), "the victim's session was refused"

    async def distilled() -> bool:
        return await _distilled(db, org, event_id) > 0

    await eventually(distilled, timeout=60, what=f"the victim's session distilled after {attack}")
    assert await interface.publish_session(victim, service_token), "the victim's retry was refused"
    await _settled(observer_nc)
    times = await _distilled(db, org, event_id)
    report(interface.label(f"session-claim-{attack}"), attacker_taken_in=taken, victim_distilled=times)
    assert times == 1
    if interface.name == "http" and attack in ("garbage", "expired_then_fresh"):
        assert not taken, "the gateway stored a session whose token did not verify"


async def test_nobody_can_make_a_victims_save_disappear(
    interface: Interface,
    nc: Client,
    db: Database,
    tokens: TokenService,
    org: UUID,
    agent: UUID,
    service_token: str,
) -> None:
    """A publish whose Nats-Msg-Id is the key ingest hands an elective save to distill under
    (``<org>/save/<request_id>``) does not stop the victim's save with that request id."""
    request_id = str(uuid4())
    other = uuid4()
    token = mint(tokens, other, "service:attacker", ALL_PERMISSIONS)
    await publish_session(
        nc, _session(other, uuid4(), str(uuid4())), token, msg_id=f"{org}/save/{request_id}"
    )
    body = {
        "agent_config_id": str(agent),
        "principal": {"kind": "end_user", "id": "alice"},
        "content": "Alice prefers store credit to card refunds.",
        "request_id": request_id,
        "wait": True,
    }
    outcome = await interface("engram.memory.save", body, service_token)
    report(interface.label("save-claim-internal_key"), outcome=outcome.get("saved", outcome.get("status")))
    assert outcome.get("saved") == 1, outcome
