"""A feed per tenant end to end (SPEC 11, docs/adr/0102-tenant-feeds.md), on the real stack: NATS
with the generated users, the services, Postgres, the HTTP gateway, and a webhook receiver that
verifies every request with the ``standardwebhooks`` library.

Two organizations write; organization A's SSE client, its webhook receiver and its NATS platform
client see exactly A's events — ids and metadata, never the text — and B's see only B's. A client
that reconnects with ``Last-Event-ID`` loses nothing. A receiver that fails a few times gets the
event after the retries; one that fails every time has it dead-lettered, and a replay delivers it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any
from uuid import UUID, uuid4

import httpx
import nats
import pytest
from nats.js.api import ConsumerConfig, DeliverPolicy
from sqlalchemy import insert, select

from contracts import subjects as s
from contracts.common import Principal
from services.governance_audit.webhooks.api import new_secret
from services.governance_audit.webhooks.delivery import FEED_RETENTION_S, WebhookDelivery
from shared.runtime.settings import EngramSettings
from shared.runtime.time import utcnow
from shared.security.auth import ALL_PERMISSIONS, TokenService
from shared.storage.db.engine import Database
from shared.storage.db.models import WEBHOOK_DELIVERIES, WEBHOOKS
from tests.conftest import nats_options
from tests.platform import eventually
from tests.support.servers import SecuredNatsServer
from tests.support.webhook_receiver import Receiver, webhook_receiver

pytestmark = pytest.mark.integration

#: Memory text that must never leave in an event.
MARKER = "zebra-violet-quartz"


@pytest.fixture(scope="module")
def settings(settings: EngramSettings) -> EngramSettings:
    """Receivers on 127.0.0.1 (allowed here on purpose), three attempts with short backoff."""
    return settings.model_copy(
        update={
            "webhook_allow_private_networks": True,
            "webhook_attempts": 3,
            "webhook_backoff_s": (0.2, 0.3),
        }
    )


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    async with webhook_receiver() as r:
        yield r


def admin(tokens: TokenService, org: UUID) -> dict[str, str]:
    token = tokens.mint(
        org_id=org, principal=Principal(kind="service", id="ops"), permissions=ALL_PERMISSIONS
    )
    return {"Authorization": f"Bearer {token}"}


async def register(http: httpx.AsyncClient, headers: dict[str, str], receiver: Receiver, path: str) -> str:
    reply = await http.post("/v1/webhooks", json={"url": receiver.url(path)}, headers=headers)
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["secret"].startswith("whsec_")
    receiver.endpoints[path].secret = body["secret"]
    return str(body["webhook_id"])


async def save(http: httpx.AsyncClient, headers: dict[str, str], agent: UUID, n: int) -> list[str]:
    reply = await http.post(
        "/v1/memories",
        json={
            "agent_config_id": str(agent),
            "principal": {"kind": "end_user", "id": "alice"},
            "entries": [{"text": f"lesson {i} {uuid4().hex} {MARKER}", "importance": 0.8} for i in range(n)],
            "wait": True,
        },
        headers=headers,
    )
    assert reply.status_code == 200, reply.text
    ids: list[str] = reply.json()["ids"]
    return ids


class SseClient:
    """Reads ``GET /v1/events`` in the background: each event's id, type and parsed data."""

    def __init__(self, http: httpx.AsyncClient, headers: dict[str, str]) -> None:
        self.events: list[tuple[int, str, dict[str, Any]]] = []
        self.raw: list[str] = []
        self.opened = asyncio.Event()
        self._http, self._headers = http, headers
        self._task: asyncio.Task[None] | None = None

    def start(self, last_event_id: int | None = None) -> None:
        headers = dict(self._headers)
        if last_event_id is not None:
            headers["Last-Event-ID"] = str(last_event_id)
        self._task = asyncio.create_task(self._read(headers))

    async def _read(self, headers: dict[str, str]) -> None:
        async with self._http.stream("GET", "/v1/events", headers=headers, timeout=None) as reply:
            assert reply.status_code == 200, await reply.aread()
            assert reply.headers["content-type"].startswith("text/event-stream")
            frame: dict[str, str] = {}
            async for line in reply.aiter_lines():
                self.raw.append(line)
                if line.startswith(":"):
                    self.opened.set()
                elif not line:
                    if "id" in frame:
                        self.events.append((int(frame["id"]), frame["event"], json.loads(frame["data"])))
                    frame = {}
                else:
                    name, _, value = line.partition(": ")
                    frame[name] = value

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def written(self) -> set[str]:
        return {str(d["entry_id"]) for _, kind, d in self.events if kind == "memory.written"}


async def test_each_organization_sees_exactly_its_own_feed(
    http: httpx.AsyncClient, tokens: TokenService, receiver: Receiver, nats_proc: SecuredNatsServer
) -> None:
    """A's SSE client, webhook receiver and NATS platform client see all of A's events and none of
    B's (ids, no text); B's receiver sees only B's; resuming with Last-Event-ID loses nothing."""
    org_a, org_b, agent_a, agent_b = uuid4(), uuid4(), uuid4(), uuid4()
    head_a, head_b = admin(tokens, org_a), admin(tokens, org_b)
    await register(http, head_a, receiver, "/a")
    await register(http, head_b, receiver, "/b")
    client_a = await nats_proc.mint(f"feed-{org_a.hex[:8]}", org_a)
    nc = await nats.connect(nats_proc.url, **nats_options(client_a))
    sse = SseClient(http, head_a)
    sse.start()
    try:
        await asyncio.wait_for(sse.opened.wait(), 30)
        ids_a = await save(http, head_a, agent_a, 3)
        ids_b = await save(http, head_b, agent_b, 3)

        await eventually(lambda: set(ids_a) <= sse.written(), what=lambda: f"SSE saw {sse.written()}")
        # Resume: stop, write more, reconnect after the last event seen.
        await sse.stop()
        last = sse.events[-1][0]
        more_a = await save(http, head_a, agent_a, 2)
        await save(http, head_b, agent_b, 2)
        resumed = SseClient(http, head_a)
        resumed.start(last_event_id=last)
        await eventually(lambda: set(more_a) <= resumed.written(), what=lambda: f"saw {resumed.written()}")
        await resumed.stop()
        assert resumed.events[0][0] > last
        # Nothing lost: from the first event the first connection saw to the last the second saw,
        # the two hold every event of the feed, as a reader from the start sees it.
        first, end = sse.events[0][0], resumed.events[-1][0]
        full = await _read_all(http, head_a, end)
        seen = [seq for seq, _, _ in sse.events + resumed.events]
        assert seen == [seq for seq, _, _ in full if seq >= first]

        all_events = sse.events + resumed.events
        assert {d["org_id"] for _, _, d in all_events} == {str(org_a)}
        assert not set(ids_b) & (sse.written() | resumed.written())
        assert {"memory.written"} <= {kind for _, kind, _ in all_events}
        assert any(kind.startswith("audit.") for _, kind, _ in all_events)
        assert not any(MARKER in line for line in sse.raw + resumed.raw)

        # The webhooks: A's receiver gets A's written entries, B's gets B's, signed and verified.
        a, b = receiver.endpoints["/a"], receiver.endpoints["/b"]

        def hooked(endpoint_events: list[dict[str, Any]]) -> set[str]:
            return {str(e["data"]["entry_id"]) for e in endpoint_events}

        await eventually(
            lambda: set(ids_a + more_a) <= hooked(a.events("memory.written")),
            what=lambda: f"A's receiver got {hooked(a.events('memory.written'))}",
        )
        await eventually(lambda: set(ids_b) <= hooked(b.events("memory.written")), what="B's receiver")
        assert {e["data"]["org_id"] for e in a.received} == {str(org_a)}
        assert {e["data"]["org_id"] for e in b.received} == {str(org_b)}
        assert a.forged == b.forged == 0
        assert not any(MARKER.encode() in e["_body"] for e in a.received + b.received)
        assert all(e["_headers"]["webhook-id"] == e["data"]["event_id"] for e in a.received)

        # A's NATS platform client, through its own durable on A's feed.
        js = nc.jetstream()
        sub = await js.pull_subscribe(
            s.feed_subject(org_a),
            durable=client_a.name,
            stream="ENGRAM_FEED",
            config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL),
        )
        pulled = await sub.fetch(len(full), timeout=10)
        assert {json.loads(m.data)["org_id"] for m in pulled} == {str(org_a)}
        assert {m.metadata.sequence.stream for m in pulled} <= {seq for seq, _, _ in full}
    finally:
        await sse.stop()
        await nc.close()


async def _read_all(
    http: httpx.AsyncClient, headers: dict[str, str], end: int
) -> list[tuple[int, str, dict[str, Any]]]:
    reader = SseClient(http, headers)
    reader.start(last_event_id=0)
    await eventually(
        lambda: bool(reader.events) and reader.events[-1][0] >= end,
        what="reading the feed from the start",
    )
    await reader.stop()
    return [e for e in reader.events if e[0] <= end]


async def test_a_failing_receiver_gets_the_event_after_retries_then_dead_letter_and_replay(
    http: httpx.AsyncClient, tokens: TokenService, receiver: Receiver
) -> None:
    """A receiver failing twice gets each event on the third attempt (same webhook-id each time);
    one failing every time has it dead-lettered after three attempts (visible among the
    organization's dead letters), and a replay delivers it once the receiver is back."""
    org, agent = uuid4(), uuid4()
    head = admin(tokens, org)
    await register(http, head, receiver, "/flaky")
    receiver.endpoints["/flaky"].fail_first = 2
    down = await register(http, head, receiver, "/down")
    receiver.endpoints["/down"].fail_all = True
    ids = await save(http, head, agent, 1)
    flaky, dead = receiver.endpoints["/flaky"], receiver.endpoints["/down"]

    await eventually(
        lambda: any(e["data"].get("entry_id") == ids[0] for e in flaky.received),
        what="retried delivery",
    )
    event_id = next(e["data"]["event_id"] for e in flaky.received if e["data"].get("entry_id") == ids[0])
    assert flaky.attempts[event_id] == 3

    async def dead_lettered() -> bool:
        page = (await http.get("/v1/webhooks", headers=head)).json()["webhooks"]
        return any(w["webhook_id"] == down and w["dead"] >= 1 for w in page)

    await eventually(dead_lettered, what="a dead-lettered delivery")
    assert dead.attempts[event_id] == 3
    assert not dead.received

    async def letter_listed() -> bool:
        reply = await http.get("/v1/dead-letters", params={"source": "webhook"}, headers=head)
        return any(letter["original_event_id"] == event_id for letter in reply.json()["letters"])

    await eventually(letter_listed, what="the webhook dead letter among the organization's")

    dead.fail_all = False
    reply = await http.post(f"/v1/webhooks/{down}/replay", json={}, headers=head)
    assert reply.status_code == 200, reply.text
    assert reply.json()["replayed"] >= 1
    await eventually(
        lambda: any(e["data"]["event_id"] == event_id for e in dead.received), what="replayed delivery"
    )
    assert dead.forged == 0


async def test_webhooks_and_the_feed_belong_to_their_organization(
    http: httpx.AsyncClient, tokens: TokenService, receiver: Receiver
) -> None:
    """Another organization cannot list, replay or delete a webhook (NOT_FOUND); no token, an
    end user's token and one without memory.admin cannot open the feed; secrets are never listed."""
    org_a, org_b = uuid4(), uuid4()
    webhook = await register(http, admin(tokens, org_a), receiver, "/owned")
    head_b = admin(tokens, org_b)
    assert (await http.get("/v1/webhooks", headers=head_b)).json()["webhooks"] == []
    for reply in (
        await http.post(f"/v1/webhooks/{webhook}/replay", json={}, headers=head_b),
        await http.delete(f"/v1/webhooks/{webhook}", headers=head_b),
    ):
        assert reply.status_code == 404, reply.text
    listed = (await http.get("/v1/webhooks", headers=admin(tokens, org_a))).json()["webhooks"]
    assert [w["webhook_id"] for w in listed] == [webhook]
    assert "secret" not in listed[0]

    assert (await http.get("/v1/events")).status_code == 401
    end_user = tokens.mint(
        org_id=org_a, principal=Principal(kind="end_user", id="alice"), permissions=ALL_PERMISSIONS
    )
    reader = tokens.mint(
        org_id=org_a, principal=Principal(kind="service", id="r"), permissions=frozenset({"memory.read"})
    )
    for token in (end_user, reader):
        reply = await http.get("/v1/events", headers={"Authorization": f"Bearer {token}"})
        assert reply.status_code == 403, reply.text
    bad = await http.get("/v1/events", headers={**admin(tokens, org_a), "Last-Event-ID": "x"})
    assert bad.status_code == 400

    deleted = await http.delete(f"/v1/webhooks/{webhook}", headers=admin(tokens, org_a))
    assert deleted.status_code == 200, deleted.text


async def test_delivered_rows_older_than_the_feed_are_pruned_and_others_kept(db: Database) -> None:
    """The worker drops delivered rows past the feed's retention; newer delivered, pending and dead
    rows stay."""
    webhook, now = uuid4(), utcnow()
    async with db.transaction() as session:
        await session.execute(
            insert(WEBHOOKS).values(
                id=webhook, org_id=uuid4(), url="http://x", secret=new_secret(), created_at=now
            )
        )
        old = now - timedelta(seconds=FEED_RETENTION_S + 60)
        for state, delivered_at in (
            ("delivered", old),
            ("delivered", now),
            ("dead", None),
            ("pending", None),
        ):
            await session.execute(
                insert(WEBHOOK_DELIVERIES).values(
                    webhook_id=webhook,
                    org_id=uuid4(),
                    event_id=uuid4(),
                    event="memory.written",
                    subject="s",
                    payload=b"{}",
                    state=state,
                    next_attempt_at=now + timedelta(days=1),
                    created_at=old,
                    delivered_at=delivered_at,
                )
            )
    worker = WebhookDelivery(db, attempts=1, backoff_s=(1.0,), timeout_s=1.0, allow_private=True)
    try:
        await worker._prune_delivered()
    finally:
        await worker.finished()
    async with db.read() as session:
        left = (
            await session.execute(
                select(WEBHOOK_DELIVERIES.c.state, WEBHOOK_DELIVERIES.c.delivered_at).where(
                    WEBHOOK_DELIVERIES.c.webhook_id == webhook
                )
            )
        ).all()
    assert sorted(state for state, _ in left) == ["dead", "delivered", "pending"]
    assert all(at is None or at > now - timedelta(days=1) for _, at in left)
