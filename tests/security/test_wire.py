"""The wire, attacked: a real ``engram up`` subprocess (what ``make run`` starts, run as a new user
runs it, nothing configured), and NATS clients with and without credentials.

- No credentials, wrong credentials, revoked credentials: refused at the door.
- ``mallory``, a platform client minted for another organization, tries to read every reply and
  event (``_INBOX.>``, other clients' inboxes, ``engram.>``, ``$JS.>``, ``>``), to publish every
  internal subject and the JetStream API, and replays the issue's two attacks. Nothing is read,
  nothing published, 0 rows and 0 vectors change.
- With NATS permissions opened on purpose (a misconfigured server), the services themselves
  refuse every forged internal message: dead-lettered, audited, no effect.
- Credentials are issued, rotated and revoked on the running server.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import nats
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from sqlalchemy import func, select

from contracts.connection import ConnectionInfo
from contracts.operations import JETSTREAMS as STREAMS
from shared.embedded.nats_server import reload_nats_server
from shared.embedded.stack import load_dev_identity
from shared.security.nats_auth.keys import new_user_seed, public_key_of
from shared.security.nats_auth.permissions import PUBLIC_REQUESTS, Grant, Permissions
from shared.security.nats_auth.render import NatsUser
from shared.security.nats_auth.store import NatsIdentities
from shared.storage import audit
from shared.storage.db.engine import Database
from shared.storage.db.models import AUDIT_LOG, ENTRIES
from tests.engram_up import EngramUp, cli, stack_dir
from tests.nats_probe import Probe, cannot_connect, quiet
from tests.platform import eventually, publish_session, request, session_payload
from tests.security.forgery import MARKER, forged_session, forgeries
from tests.security.support import report

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="engram up checks read /proc"),
]

ALICE = {"kind": "end_user", "id": "alice"}
SECRET = "Alice's door code is 4711."
VICTIM_TEXTS = [SECRET, "Alice prefers store credit to refunds.", "Alice lives in Lisbon."]


@dataclass
class Stack:
    up: EngramUp
    data_dir: Path
    scratch: Path
    #: The development client (connection.json), its organization and agent config: the victim.
    victim: ConnectionInfo
    #: A platform client minted for another organization: the attacker.
    mallory: ConnectionInfo
    #: Another platform client (a third organization), whose replies mallory must not read either.
    bob: ConnectionInfo
    db: Database
    victim_ids: list[str]

    @property
    def url(self) -> str:
        return self.victim.nats_url

    @property
    def org(self) -> UUID:
        assert self.victim.org_id is not None
        return self.victim.org_id

    @property
    def agent(self) -> UUID:
        assert self.victim.agent_config_id is not None
        return self.victim.agent_config_id

    async def connect(self, who: ConnectionInfo, **extra: Any) -> Client:
        return await nats.connect(who.nats_url, error_cb=quiet, **who.nats_options(), **extra)


def _mint(data_dir: Path, scratch: Path, name: str, org: UUID, *perms: str) -> ConnectionInfo:
    """``engram credentials mint`` as an operator runs it; the client's file as it receives it."""
    out = scratch / f"{name}.json"
    args = ["credentials", "mint", "--org", str(org), "--name", name, "--out", str(out)]
    for perm in perms:
        args += ["--perm", perm]
    cli(*args, "--data-dir", str(data_dir))
    assert out.stat().st_mode & 0o077 == 0, "a client file readable by others"
    return ConnectionInfo.load(out)


async def _semantic_ids(nc: Client, stack: Stack) -> set[str]:
    """Which of the victim's entries semantic recall finds, i.e. which have vectors."""
    reply = await request(
        nc,
        "engram.recall",
        {
            "agent_config_id": str(stack.agent),
            "principal": ALICE,
            "strategy": "semantic",
            "cue": "Alice door code store credit Lisbon",
            "top_k": 20,
        },
        stack.victim.token,
    )
    assert "error" not in reply, reply
    return {r["id"] for r in reply["results"]}


async def _planted_rows(db: Database) -> int:
    """Rows anywhere holding the attacker's text."""
    async with db.read() as s:
        query = select(func.count()).select_from(ENTRIES).where(ENTRIES.c.text.contains(MARKER))
        return int((await s.execute(query)).scalar_one())


async def _org_entry_ids(db: Database, org: UUID) -> set[str]:
    async with db.read() as s:
        rows = await s.execute(select(ENTRIES.c.id).where(ENTRIES.c.org_id == org))
        return {str(r[0]) for r in rows}


async def _forged_dead_letters(db: Database) -> int:
    """``internal.rejected`` audit records: forged internal messages the services refused."""
    async with db.read() as s:
        query = (
            select(func.count())
            .select_from(AUDIT_LOG)
            .where(AUDIT_LOG.c.org_id == audit.SYSTEM_ORG, AUDIT_LOG.c.kind == "internal.rejected")
        )
        return int((await s.execute(query)).scalar_one())


async def _distilled(nc: Client, stack: Stack, session_id: str) -> None:
    """Wait until a genuine session of the victim is recallable: the pipeline behind every forged
    message has run past it (used as a sentinel after an attack)."""

    async def done() -> bool:
        reply = await request(
            nc, "engram.recall", {"agent_config_id": str(stack.agent), "principal": ALICE}, stack.victim.token
        )
        return session_id in {r["session_id"] for r in reply.get("results", [])}

    await eventually(done, timeout=60, what=f"the sentinel session {session_id} distilled")


async def _sentinel(nc: Client, stack: Stack) -> None:
    trace = [{"tool": "ping", "input": {}, "error": f"sentinel {uuid4().hex[:6]} timed out"}]
    payload = session_payload(stack.org, stack.agent, principal=ALICE, tool_trace=trace)
    await publish_session(nc, payload, stack.victim.token)
    await _distilled(nc, stack, payload["session_id"])


@pytest.fixture(scope="module")
async def stack() -> AsyncIterator[Stack]:
    """``engram up`` on a fresh data dir, the victim's memory in it (indexed), two minted clients."""
    with stack_dir() as scratch, EngramUp(scratch / "data", scratch / "up.log") as up:
        victim = ConnectionInfo.model_validate(await up.connection())
        mallory = _mint(up.data_dir, scratch, "mallory", uuid4(), "memory.read", "memory.write")
        bob = _mint(up.data_dir, scratch, "bob", uuid4())
        info = json.loads((up.data_dir / "connection.json").read_text())
        db = Database(info["database_url"], pool_size=2)
        nc = await nats.connect(victim.nats_url, **victim.nats_options())
        try:
            body = {
                "agent_config_id": str(victim.agent_config_id),
                "principal": ALICE,
                "wait": True,
                "entries": [{"text": t, "importance": 0.8, "memory_type": "fact"} for t in VICTIM_TEXTS],
            }
            saved = await request(nc, "engram.memory.save", body, victim.token, timeout=20)
            assert saved.get("status") == 200, saved
            stack = Stack(up, up.data_dir, scratch, victim, mallory, bob, db, [str(i) for i in saved["ids"]])

            async def indexed() -> bool:
                return await _semantic_ids(nc, stack) >= set(stack.victim_ids)

            await eventually(indexed, timeout=60, what="the victim's entries indexed")
        finally:
            await nc.drain()
        try:
            yield stack
        finally:
            await db.close()


async def test_connections_without_valid_credentials_are_refused(stack: Stack) -> None:
    """No credentials, a user and password, a token, an unknown nkey, and a revoked client's key
    are all refused at the door; the minted clients get in."""
    host = stack.url.split("//", 1)[1]
    ghost = _mint(stack.data_dir, stack.scratch, "ghost", uuid4())
    cli("credentials", "revoke", "--name", "ghost", "--data-dir", str(stack.data_dir))
    attempts: dict[str, tuple[str, dict[str, Any]]] = {
        "anonymous": (stack.url, {}),
        "user_password": (f"nats://engram:guess@{host}", {}),
        "token": (stack.url, {"token": stack.victim.token}),
        "unknown_nkey": (stack.url, {"nkeys_seed_str": new_user_seed()}),
        "revoked_client": (stack.url, ghost.nats_options()),
    }
    refused = {name: await cannot_connect(url, **options) for name, (url, options) in attempts.items()}
    admitted = []
    for who in (stack.victim, stack.mallory, stack.bob):
        nc = await stack.connect(who)
        admitted.append(nc.is_connected)
        await nc.close()
    report("wire-authentication", tried=len(refused), refused=sum(refused.values()), admitted=sum(admitted))
    assert refused == dict.fromkeys(attempts, True)
    assert admitted == [True, True, True]


#: Everything mallory would subscribe to, to read other tenants' replies and events.
SPY_SUBSCRIPTIONS = [
    "_INBOX.>",
    "_INBOX_dev.>",
    "_INBOX_bob.>",
    "_INBOX_engram.>",
    "_INBOX_engram-recall.>",
    "engram.>",
    "engram.memory.written",
    "engram.memory.purged",
    "engram.audit.>",
    "engram.dlq.>",
    "engram.session.ended",
    "engram.session.validated",
    "engram.save.result.*",
    "$JS.>",
    "$JS.API.>",
    "$JS.ACK.>",
    ">",
]
#: Posing as a service: answering other tenants' requests (with their tokens in them).
SPY_RESPONDERS = [("engram.recall", "recall"), ("engram.recall", ""), ("engram.memory.save", "ingest")]


async def test_a_platform_client_reads_no_other_clients_replies(stack: Stack) -> None:
    """The issue's attack 2, replayed: mallory subscribes to ``_INBOX.>``, the other clients'
    inboxes, ``engram.>``, ``$JS.>`` and ``>`` (every one refused) and listens on its own inbox
    while the victim recalls a door code, exports and queries the audit log, and bob recalls: not
    one reply or event reaches mallory."""
    probe = await Probe.connect(stack.url, "mallory", **stack.mallory.nats_options())
    seen: list[Msg] = []

    async def spy(msg: Msg) -> None:
        seen.append(msg)

    refused = 0
    subs = []
    for subject in SPY_SUBSCRIPTIONS:

        async def subscribe(subject: str = subject) -> None:
            subs.append(await probe.nc.subscribe(subject, cb=spy))

        refused += await probe.refused("subscription", subject, subscribe)
    for subject, queue in SPY_RESPONDERS:

        async def respond(subject: str = subject, queue: str = queue) -> None:
            subs.append(await probe.nc.subscribe(subject, queue=queue, cb=spy))

        refused += await probe.refused("subscription", subject, respond)
    # Its own inbox is allowed: whatever arrives there without mallory asking was someone else's.
    own = await probe.nc.subscribe(f"{stack.mallory.nats_inbox_prefix}.>", cb=spy)
    await probe.nc.flush()

    victim = await stack.connect(stack.victim)
    bob = await stack.connect(stack.bob)
    try:
        recalled = await request(
            victim,
            "engram.recall",
            {"agent_config_id": str(stack.agent), "principal": ALICE, "strategy": "full"},
            stack.victim.token,
        )
        assert SECRET in recalled["context"], recalled  # the reply mallory is after exists
        exported = await request(
            victim, "engram.memory.export", {"actor_ref": "end_user:alice"}, stack.victim.token
        )
        assert "error" not in exported, exported
        audited = await request(victim, "engram.audit.query", {"limit": 50}, stack.victim.token)
        assert audited.get("records"), audited
        await request(bob, "engram.recall", {"agent_config_id": str(uuid4())}, stack.bob.token)
        await victim.flush()
        await bob.flush()
        # A round trip of mallory's own after all of that: anything in flight to it has arrived.
        await probe.nc.flush()
    finally:
        await victim.close()
        await bob.close()
        await own.unsubscribe()
        await probe.nc.close()
    leaked = [m for m in seen if b"4711" in m.data or b"Alice" in m.data]
    tried = len(SPY_SUBSCRIPTIONS) + len(SPY_RESPONDERS)
    report(
        "wire-replies", subscriptions_tried=tried, refused=refused, replies_read=len(seen), leaked=len(leaked)
    )
    assert refused == tried
    assert seen == []


def _internal_publishes() -> list[str]:
    """Every subject only a service may publish, and the JetStream API beyond a session publish."""
    streams = [d.name for d in STREAMS]
    return [
        "engram.session.validated",
        "engram.save.accepted",
        f"engram.save.result.{uuid4()}",
        "engram.memory.written",
        "engram.memory.purged",
        "engram.audit.memory.saved",
        "engram.audit.memory.purged",
        "engram.audit.config.changed",
        "engram.audit.internal.rejected",
        "engram.dlq.session",
        "engram.dlq.distill",
        "engram.dlq.internal",
        # other identities' inboxes (forging a reply or a pulled message)
        "_INBOX.x.y",
        "_INBOX_dev.x.y",
        "_INBOX_engram.x.y",
        "$JS.API.INFO",
        "$JS.API.STREAM.NAMES",
        "$JS.API.STREAM.LIST",
        "$JS.API.CONSUMER.CREATE.ENGRAM_SESSIONS",
        *(f"$JS.API.STREAM.{op}.{s}" for s in streams for op in ("INFO", "UPDATE", "DELETE", "PURGE")),
        *(f"$JS.API.STREAM.MSG.GET.{s}" for s in streams),
        *(f"$JS.API.DIRECT.GET.{s}" for s in streams),
        *(f"$JS.API.CONSUMER.CREATE.{s}.spy" for s in streams),
        "$JS.API.CONSUMER.CREATE.ENGRAM_SESSIONS.distill.engram.session.validated",
        "$JS.API.CONSUMER.MSG.NEXT.ENGRAM_SESSIONS.distill",
        "$JS.API.CONSUMER.DELETE.ENGRAM_MEMORY.embed",
        "$JS.ACK.ENGRAM_SESSIONS.distill.1.1.1.1700000000000000000.0",
    ]


async def test_a_platform_client_publishes_no_internal_subject(stack: Stack) -> None:
    """Every internal subject and the JetStream API (beyond publishing a session) are refused to
    mallory, while its own session and requests go through."""
    probe = await Probe.connect(stack.url, "mallory", **stack.mallory.nats_options())
    subjects = _internal_publishes()
    try:
        refused = [s for s in subjects if await probe.publish_refused(s, b"{}")]
        # What a platform client is for still works (its own organization, its own token).
        ack = await probe.nc.jetstream().publish(
            "engram.session.ended",
            json.dumps(session_payload(stack.mallory.org_id or uuid4(), uuid4())).encode(),
            headers={"Authorization": f"Bearer {stack.mallory.token}"},
        )
        replies = [
            await request(probe.nc, subject, {"agent_config_id": str(uuid4())}, stack.mallory.token)
            for subject in ("engram.config.get", "engram.recall")
        ]
        allowed_public = [not await probe.publish_refused(s) for s in PUBLIC_REQUESTS]
    finally:
        await probe.nc.close()
    report("wire-internal-publish", tried=len(subjects), refused=len(refused))
    assert sorted(refused) == sorted(subjects)
    assert ack.stream == "ENGRAM_SESSIONS"
    assert all("error" not in r for r in replies), replies
    assert all(allowed_public)


async def test_the_cross_tenant_write_and_vector_delete_attacks_have_no_effect(stack: Stack) -> None:
    """The issue's attack 1, replayed by mallory: a session for the victim's organization on
    engram.session.validated, an accepted save for it, and memory.purged for the victim's ids,
    each refused by the server; after a genuine session went through the pipeline behind them,
    0 rows were planted and every vector is still there."""
    probe = await Probe.connect(stack.url, "mallory", **stack.mallory.nats_options())
    victim = await stack.connect(stack.victim)
    try:
        before_rows = await _org_entry_ids(stack.db, stack.org)
        kid = load_dev_identity(stack.data_dir).kid
        attacks = forgeries(stack.org, stack.agent, stack.victim_ids, kid)
        # The literal attack of the issue, too: a session.ended-shaped JSON, no header at all.
        literal = json.dumps(forged_session(stack.org, stack.agent)).encode()
        refused = [await probe.publish_refused("engram.session.validated", literal)]
        refused += [await probe.publish_refused(f.subject, f.data, f.headers) for f in attacks]
        await _sentinel(victim, stack)
        planted = await _planted_rows(stack.db)
        after_rows = await _org_entry_ids(stack.db, stack.org)
        vectors = await _semantic_ids(victim, stack)
    finally:
        await victim.close()
        await probe.nc.close()
    deleted = set(stack.victim_ids) - vectors
    report(
        "wire-attacks",
        forged_messages=len(refused),
        refused_by_nats=sum(refused),
        rows_planted=planted,
        victim_rows_lost=len(before_rows - after_rows),
        vectors_deleted=len(deleted),
    )
    assert all(refused)
    assert planted == 0
    assert before_rows <= after_rows
    assert deleted == set()


async def test_with_nats_permissions_opened_the_services_refuse_forged_messages(stack: Stack) -> None:
    """A misconfigured server (a user allowed everything, applied with a reload): forged messages
    on every internal hand-off now reach the services, which dead-letter each one with an
    ``internal.rejected`` audit record; 0 rows planted, 0 vectors deleted, and the pipeline still
    serves the victim's genuine sessions."""
    identities = NatsIdentities(stack.data_dir)
    seed = new_user_seed()
    wide_open = (Grant("misconfigured", (">",)),)
    everything = Permissions(publish=wide_open, subscribe=wide_open)
    identities.write_auth(extra=[NatsUser(public_key_of(seed), everything, "a misconfiguration")])
    assert await reload_nats_server(stack.data_dir / "nats")
    attacker = await nats.connect(stack.url, nkeys_seed_str=seed, error_cb=quiet)
    victim = await stack.connect(stack.victim)
    try:
        before_rows = await _org_entry_ids(stack.db, stack.org)
        before_letters = await _forged_dead_letters(stack.db)
        kid = load_dev_identity(stack.data_dir).kid
        attacks = forgeries(stack.org, stack.agent, stack.victim_ids, kid)
        js = attacker.jetstream()
        for forged in attacks:  # stored by JetStream now: the server no longer stands in the way
            ack = await js.publish(forged.subject, forged.data, headers=forged.headers)
            assert ack.seq > 0

        async def all_refused() -> bool:
            return await _forged_dead_letters(stack.db) - before_letters >= len(attacks)

        await eventually(all_refused, timeout=60, what=f"{len(attacks)} forged messages dead-lettered")
        await _sentinel(victim, stack)
        letters = await _forged_dead_letters(stack.db) - before_letters
        planted = await _planted_rows(stack.db)
        after_rows = await _org_entry_ids(stack.db, stack.org)
        vectors = await _semantic_ids(victim, stack)
    finally:
        await victim.close()
        await attacker.close()
        identities.write_auth()  # back to the least-privilege users
        await reload_nats_server(stack.data_dir / "nats")
    deleted = set(stack.victim_ids) - vectors
    report(
        "wire-forged-internal",
        forged_sent=len(attacks),
        dead_lettered=letters,
        accepted=len(attacks) - letters,
        rows_planted=planted,
        victim_rows_lost=len(before_rows - after_rows),
        vectors_deleted=len(deleted),
    )
    assert letters == len(attacks)
    assert planted == 0
    assert before_rows <= after_rows
    assert deleted == set()


async def test_credentials_are_issued_rotated_and_revoked_on_the_running_server(stack: Stack) -> None:
    """mint gives a working identity; rotate closes the old key's connection and refuses it while
    the new one works; revoke closes the client's connection and refuses it from then on."""
    carol = _mint(stack.data_dir, stack.scratch, "carol", uuid4())
    first = await stack.connect(carol, allow_reconnect=False)
    reply = await request(first, "engram.config.get", {"agent_config_id": str(uuid4())}, carol.token)
    assert "error" not in reply, reply

    second_file = stack.scratch / "carol-2.json"
    cli(
        "credentials",
        "rotate",
        "--name",
        "carol",
        "--out",
        str(second_file),
        "--data-dir",
        str(stack.data_dir),
    )
    rotated = ConnectionInfo.load(second_file)
    assert rotated.nats_inbox_prefix == carol.nats_inbox_prefix
    assert rotated.org_id == carol.org_id

    async def closed(nc: Client) -> bool:
        return nc.is_closed

    await eventually(lambda: closed(first), timeout=15, what="the rotated-away key's connection closed")
    old_refused = await cannot_connect(stack.url, **carol.nats_options())
    second = await stack.connect(rotated, allow_reconnect=False)
    reply = await request(second, "engram.config.get", {"agent_config_id": str(uuid4())}, rotated.token)
    assert "error" not in reply, reply

    cli("credentials", "revoke", "--name", "carol", "--data-dir", str(stack.data_dir))
    await eventually(lambda: closed(second), timeout=15, what="the revoked client's connection closed")
    revoked_refused = await cannot_connect(stack.url, **rotated.nats_options())
    listed = cli("credentials", "list", "--all", "--data-dir", str(stack.data_dir)).stdout
    record = next(json.loads(line) for line in listed.splitlines() if json.loads(line)["name"] == "carol")
    report("wire-credentials", rotated_key_refused=old_refused, revoked_refused=revoked_refused)
    assert old_refused
    assert revoked_refused
    assert record["revoked_at"]
    assert record["rotated_at"]
    assert record["public_key"] == public_key_of(rotated.nats_nkey_seed or "")
