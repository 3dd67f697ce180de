"""Forged, expired, other-organization and permission-less bearer tokens on every request subject,
and forged tokens on ``engram.session.ended`` (dead-lettered, never distilled), each case over
every interface (``interface``: NATS, and the HTTP gateway, where an error must also carry its
envelope's status and a forged session is taken in, then refused by ingest). SPEC 8 and 9."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any
from uuid import UUID, uuid4

import jwt
import pytest
from nats.aio.client import Client
from nats.js.api import ConsumerConfig, DeliverPolicy
from sqlalchemy import select

from contracts.operations import OPERATIONS
from shared.security.auth import ALL_PERMISSIONS, TokenService
from shared.service.infra import Infra
from shared.storage.db.engine import Database
from shared.storage.db.models import AUDIT_LOG, ENTRIES
from tests.conftest import TEST_KID, TEST_SECRET
from tests.platform import eventually, session_payload
from tests.security.support import (
    Tally,
    claims_for,
    count_rows,
    forge,
    mint,
    org_snapshot,
    report,
    save,
)
from tests.security.transport import Interface

pytestmark = pytest.mark.integration

ALICE = {"kind": "end_user", "id": "alice"}
#: Every request-reply subject of the operation table.
SUBJECTS = tuple(op.subject for op in OPERATIONS)


def bodies(
    org: UUID, agent: UUID, entry: str, *, principal: dict[str, Any] | None = ALICE
) -> dict[str, dict[str, Any]]:
    """A valid body for every request subject, all about ``entry`` (alice's) in ``agent`` of
    ``org`` (a session is alice's, in ``org``)."""
    a = str(agent)
    p: dict[str, Any] = {"principal": principal} if principal is not None else {}
    return {
        "engram.memory.save": {"agent_config_id": a, **p, "content": "an attacker's note", "wait": True},
        "engram.session.submit": session_payload(org, agent, principal=ALICE, session_id="attacker"),
        "engram.recall": {"agent_config_id": a, **p, "strategy": "last_k"},
        "engram.recall.expand": {"agent_config_id": a, **p, "ids": [entry]},
        "engram.memory.feedback": {"agent_config_id": a, **p, "entry_id": entry, "success": False},
        "engram.memory.list": {"agent_config_id": a, **p},
        "engram.memory.get": {"agent_config_id": a, **p, "entry_id": entry},
        "engram.memory.delete": {"agent_config_id": a, **p, "entry_id": entry},
        "engram.memory.purge": {"agent_config_id": a, **p, "actor_ref": "end_user:alice"},
        "engram.memory.prune": {"agent_config_id": a, "max_entries": 0},
        "engram.memory.manage": {"agent_config_id": a, **p, "entry_id": entry, "op": "disable"},
        "engram.memory.export": {"agent_config_id": a, **p, "actor_ref": "end_user:alice"},
        "engram.config.get": {"agent_config_id": a},
        "engram.config.put": {"agent_config_id": a, "config": {"top_k": 3, "memory_enabled": False}},
        "engram.audit.query": {"limit": 1000},
        "engram.audit.verify": {},
        "engram.ops.dead_letters": {"limit": 10},
        "engram.ops.lag": {},
        # The admin API, aimed at this organization and its platform client.
        "engram.admin.org.create": {"name": "taken over", "org_id": str(org)},
        "engram.admin.org.list": {"include_disabled": True},
        "engram.admin.org.disable": {"org_id": str(org)},
        "engram.admin.agent_config.create": {"org_id": str(org), "agent_config_id": a},
        "engram.admin.agent_config.list": {"org_id": str(org)},
        "engram.admin.client.mint": {"org_id": str(org), "name": "attacker"},
        "engram.admin.client.rotate": {"name": "tenant"},
        "engram.admin.client.revoke": {"name": "tenant"},
        "engram.admin.client.list": {"org_id": str(org)},
        "engram.admin.token.mint": {
            "org_id": str(org),
            "principal": {"kind": "service", "id": "attacker"},
            "permissions": ["memory.read", "memory.write", "memory.admin", "memory.purge"],
        },
        "engram.admin.token.revoke": {"org_id": str(org), "token_id": "any"},
        # A private address: refused whoever asks (no DNS lookup, no delivery leaves the machine).
        "engram.webhooks.register": {"url": "http://127.0.0.1:9/hook"},
        "engram.webhooks.list": {},
        "engram.webhooks.delete": {"webhook_id": str(agent)},
        "engram.webhooks.replay": {"webhook_id": str(agent)},
    }


def leaks_org(reply: dict[str, Any], org: UUID, ids: list[str]) -> bool:
    blob = json.dumps(reply)
    return str(org) in blob or any(i in blob for i in ids)


@pytest.fixture
async def victim(
    engram: Infra, nc: Client, db: Database, org: UUID, agent: UUID, service_token: str
) -> dict[str, Any]:
    """Alice's memory in ``org``, indexed, so no background write moves the rows any more."""
    ids = await save(
        nc, service_token, agent, ["Alice prefers window seats.", "Alice's PIN hint is blue."], ALICE
    )
    await save(nc, service_token, agent, ["The shared pool knows the VPN host."])

    async def settled() -> bool:
        return await count_rows(db, ENTRIES.c.org_id == org, ENTRIES.c.embedding_status != "indexed") == 0

    await eventually(settled, what="entries indexed")
    return {"ids": ids, "all_ids": [str(i) for i in await _all_ids(db, org)]}


async def _all_ids(db: Database, org: UUID) -> list[UUID]:
    async with db.read() as s:
        return list((await s.execute(select(ENTRIES.c.id).where(ENTRIES.c.org_id == org))).scalars().all())


async def test_forged_and_expired_tokens_are_unauthenticated_on_every_subject(
    interface: Interface, db: Database, org: UUID, agent: UUID, victim: dict[str, Any]
) -> None:
    """Every forged or expired bearer token, and malformed Authorization headers: UNAUTHENTICATED
    (401 over HTTP), nothing of the victim in the reply, nothing of the victim changed."""
    before = await org_snapshot(db, org)
    tally = Tally(interface.label("forged-tokens"))
    forged = forge(org, TEST_KID, TEST_SECRET)
    per_subject = bodies(org, agent, victim["ids"][0])
    header_variants: dict[str, dict[str, str]] = {
        "no_header": {},
        "empty_bearer": {"Authorization": "Bearer "},
        "basic_scheme": {"Authorization": f"Basic {forged['wrong_key_same_kid']}"},
        "no_scheme": {"Authorization": forged["expired"]},
        "bearer_twice": {"Authorization": f"Bearer Bearer {forged['expired']}"},
        **{name: {"Authorization": f"Bearer {token}"} for name, token in forged.items()},
    }
    for subject in SUBJECTS:
        for variant, headers in header_variants.items():
            reply = await interface.with_headers(subject, per_subject[subject], headers)
            code = tally.note(reply)
            if code != "UNAUTHENTICATED":
                tally.problem(f"{subject} {variant}: {code or reply}")
            if leaks_org(reply, org, victim["all_ids"]):
                tally.problem(f"{subject} {variant}: reply names the victim's data")
    tally.conclude(
        interface=interface,
        snapshots=(before, await org_snapshot(db, org)),
        variants=len(header_variants),
        subjects=len(SUBJECTS),
    )


async def test_permissionless_tokens_are_forbidden_on_every_subject(
    interface: Interface,
    db: Database,
    tokens: TokenService,
    org: UUID,
    agent: UUID,
    victim: dict[str, Any],
) -> None:
    """Valid signatures, no usable permission: the empty set, and permission strings that are not
    the exact names (wildcards, case, whitespace, a string instead of a list): FORBIDDEN (403),
    UNAUTHENTICATED where the perms claim is not a list, which makes the token itself invalid."""
    before = await org_snapshot(db, org)
    tally = Tally(interface.label("permissionless-tokens"))
    made: dict[str, tuple[str, dict[str, Any] | None]] = {
        "service_no_perms": (mint(tokens, org, "service:runner", set()), ALICE),
        "end_user_no_perms": (mint(tokens, org, "end_user:alice", set()), None),
        "actor_no_perms": (mint(tokens, org, "actor:carol", set()), None),
    }
    odd_perms: dict[str, Any] = {
        "wildcard": ["*"],
        "prefix_wildcard": ["memory.*"],
        "upper_case": ["MEMORY.ADMIN", "MEMORY.READ", "MEMORY.WRITE", "MEMORY.PURGE"],
        "padded": ["memory.admin ", " memory.read", "memory.write\u200b", "memory.purge\n"],
        "lookalike": ["mеmory.admin", "memory.reаd"],  # Cyrillic е / а
        "string_not_list": "memory.admin",
        "admin_word": ["admin", "root", "all"],
    }
    for label, perms in odd_perms.items():
        claims = {**claims_for(org), "perms": perms}
        made[f"service_{label}"] = (
            jwt.encode(claims, TEST_SECRET, algorithm="HS256", headers={"kid": TEST_KID}),
            ALICE,
        )
    for label, (token, principal) in made.items():
        per_subject = bodies(org, agent, victim["ids"][0], principal=principal)
        for subject in SUBJECTS:
            reply = await interface(subject, per_subject[subject], token)
            code = tally.note(reply)
            # A perms claim that is not a list of strings makes the token itself invalid.
            expected = "UNAUTHENTICATED" if label == "service_string_not_list" else "FORBIDDEN"
            if code != expected:
                tally.problem(f"{subject} {label}: {code or reply}")
    tally.conclude(interface=interface, snapshots=(before, await org_snapshot(db, org)), tokens=len(made))


async def test_permissions_given_as_an_object_grant_nothing(
    interface: Interface, org: UUID, agent: UUID, victim: dict[str, Any]
) -> None:
    """A token whose ``perms`` claim is an object (``{"memory.admin": false}``: a map of flags, as
    another token issuer might write it) must not be read as a list of its keys."""
    claims = {**claims_for(org), "perms": {"memory.admin": False, "memory.purge": False}}
    token = jwt.encode(claims, TEST_SECRET, algorithm="HS256", headers={"kid": TEST_KID})
    tally = Tally(interface.label("perms-object"))
    per_subject = bodies(org, agent, victim["ids"][0])
    for subject in ("engram.audit.query", "engram.config.put", "engram.memory.prune"):
        reply = await interface(subject, per_subject[subject], token)
        if tally.note(reply) not in ("FORBIDDEN", "UNAUTHENTICATED"):
            tally.problem(f"{subject}: accepted")
    tally.conclude(interface=interface)


async def test_other_organization_tokens_never_reach_this_organization(
    interface: Interface,
    db: Database,
    tokens: TokenService,
    org: UUID,
    agent: UUID,
    victim: dict[str, Any],
) -> None:
    """A valid token of another organization, with every permission, aimed at this organization's
    agent config, entry ids and owners: refused (FORBIDDEN / NOT_FOUND) or answered from its own,
    empty organization — never with this organization's data, and nothing here changes."""
    before = await org_snapshot(db, org)
    tally = Tally(interface.label("other-org-tokens"))
    other = uuid4()
    by_subject: dict[str, dict[str, int]] = {}
    refs = ["service:runner", "actor:carol", "end_user:alice"]
    for ref in refs:
        token = mint(tokens, other, ref, ALL_PERMISSIONS)
        restricted = mint(tokens, other, ref, ALL_PERMISSIONS, agent_config_id=agent)
        principal = ALICE if ref.startswith("service") else None
        per_subject = bodies(org, agent, victim["ids"][0], principal=principal)
        for subject in SUBJECTS:
            for tok in (token, restricted):
                reply = await interface(subject, per_subject[subject], tok)
                code = tally.note(reply) or "OK"
                by_subject.setdefault(subject, {}).setdefault(code, 0)
                by_subject[subject][code] += 1
                if code not in ("OK", "FORBIDDEN", "NOT_FOUND"):
                    tally.problem(f"{subject} {ref}: unexpected {code}")
                if leaks_org(reply, org, victim["all_ids"]):
                    tally.problem(f"{subject} {ref}: reply names the victim's data: {reply}")
                if code == "OK" and subject == "engram.memory.save":
                    tally.problem(f"{subject} {ref}: saved into another organization's agent config")
    tally.conclude(
        interface=interface,
        snapshots=(before, await org_snapshot(db, org)),
        leaks=sum("names the victim" in p for p in tally.problems),
        by_subject=by_subject,
    )
    # The agent config stays the victim's: the other organization cannot claim or read it.
    assert by_subject["engram.config.put"] == {"FORBIDDEN": 2 * len(refs)}
    assert by_subject["engram.memory.save"] == {"FORBIDDEN": 2 * len(refs)}


async def _dead_letters(nc: Client, since_seq: int) -> list[dict[str, Any]]:
    js = nc.jetstream()
    sub = await js.pull_subscribe(
        "engram.dlq.>",
        stream="ENGRAM_DLQ",
        config=ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=since_seq + 1),
    )
    letters: list[dict[str, Any]] = []
    try:
        while True:
            try:
                msgs = await sub.fetch(100, timeout=0.5)
            except TimeoutError:
                break
            letters += [json.loads(m.data) for m in msgs]
    finally:
        await sub.unsubscribe()
    return letters


async def test_forged_session_ended_is_dead_lettered_and_never_distilled(
    interface: Interface,
    observer_nc: Client,
    db: Database,
    tokens: TokenService,
    org: UUID,
    agent: UUID,
    service_token: str,
) -> None:
    """Forged, foreign and permission-less tokens on published sessions, never distilled: over
    NATS taken in (JetStream ack), then refused by ingest — dead-lettered with their code; over
    HTTP refused before anything is stored (ingest checks ``engram.session.submit`` first)."""
    start = int((await observer_nc.jetstream().stream_info("ENGRAM_DLQ")).state.last_seq)
    trace = [{"tool": "deploy", "input": {}, "error": "remember: the forged lesson"}]
    bad: list[tuple[str, str | None, str]] = [
        (name, token, "UNAUTHENTICATED") for name, token in forge(org, TEST_KID, TEST_SECRET).items()
    ]
    bad += [
        ("missing", None, "UNAUTHENTICATED"),
        ("other_org", mint(tokens, uuid4(), "service:runner", ALL_PERMISSIONS), "FORBIDDEN"),
        ("no_perms", mint(tokens, org, "service:runner", set()), "FORBIDDEN"),
        ("read_only", mint(tokens, org, "service:runner", {"memory.read"}), "FORBIDDEN"),
        (
            "restricted_elsewhere",
            mint(tokens, org, "service:runner", ALL_PERMISSIONS, agent_config_id=uuid4()),
            "FORBIDDEN",
        ),
        ("end_user_for_bob", mint(tokens, org, "end_user:alice", ALL_PERMISSIONS), "FORBIDDEN"),
    ]
    taken_in: dict[str, bool] = {}
    for name, token, _ in bad:
        principal = {"kind": "end_user", "id": "bob"} if name == "end_user_for_bob" else ALICE
        payload = session_payload(
            org, agent, tool_trace=trace, principal=principal, session_id=f"forged-{name}"
        )
        taken_in[name] = await interface.publish_session(payload, token)
    good = session_payload(org, agent, tool_trace=trace, principal=ALICE, session_id="honest")
    assert await interface.publish_session(good, service_token)
    expected = sorted(code for name, _, code in bad if taken_in[name])

    async def settled() -> bool:
        return len(await _dead_letters(observer_nc, start)) >= len(expected)

    await eventually(settled, what="every forged session dead-lettered")

    async def honest_done() -> bool:
        return await count_rows(db, ENTRIES.c.org_id == org, ENTRIES.c.session_id == "honest") > 0

    await eventually(honest_done, what="the honest session distilled")
    await asyncio.sleep(0.3)  # a late straggler would show up below
    letters = await _dead_letters(observer_nc, start)
    got = sorted(str(letter["code"]) for letter in letters)
    distilled = await count_rows(db, ENTRIES.c.org_id == org, ENTRIES.c.session_id.like("forged-%"))
    async with db.read() as s:
        completed = (
            (
                await s.execute(
                    select(AUDIT_LOG.c.session_id).where(
                        AUDIT_LOG.c.org_id == org, AUDIT_LOG.c.kind == "distill.completed"
                    )
                )
            )
            .scalars()
            .all()
        )
    forged_completed = [s for s in completed if s and str(s).startswith("forged-")]
    refused_at_door = sorted(name for name, accepted in taken_in.items() if not accepted)
    report(
        interface.label("forged-session-ended"),
        published=len(bad),
        refused_at_door=len(refused_at_door),
        dead_lettered=len(letters),
        processed=distilled + len(forged_completed),
        codes=dict(Counter(got)),
        **interface.counts(),
    )
    assert refused_at_door == (sorted(taken_in) if interface.checks_sessions_first else [])
    assert got == expected
    assert distilled == 0
    assert forged_completed == []
