"""Inside one organization (SPEC 3, 7.3): an end user never writes the shared pool or reads another
user; an actor without ``memory.admin`` never manages, deletes, purges or exports another actor's
memory; and an end-user token that carries ``memory.admin`` still acts only on its own memory.
Every case runs over every interface (``interface``: NATS, and the HTTP gateway)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from uuid import UUID, uuid4

import pytest
from nats.aio.client import Client
from sqlalchemy import select

from shared.security.auth import ALL_PERMISSIONS, TokenService
from shared.service.infra import Infra
from shared.storage.db.engine import Database
from shared.storage.db.models import ENTRIES
from tests.platform import eventually
from tests.security.support import Tally, count_rows, error_code, mint, report, save
from tests.security.transport import Interface

pytestmark = pytest.mark.integration

ALICE = {"kind": "end_user", "id": "alice"}
BOB = {"kind": "end_user", "id": "bob"}
CAROL = {"kind": "actor", "id": "carol"}
DAVE = {"kind": "actor", "id": "dave"}
OPS = ["pin", "unpin", "disable", "enable", "mark_incorrect", "edit", "merge", "rescope", "change_retention"]
STRATEGIES = ["last_k", "importance", "full", "pack", "semantic", "hybrid"]


@pytest.fixture
async def memory(
    engram: Infra, nc: Client, db: Database, org: UUID, agent: UUID, service_token: str
) -> dict[str, list[str]]:
    owned = {
        "alice": await save(nc, service_token, agent, ["Alice likes tea.", "Alice's dog is Rex."], ALICE),
        "bob": await save(nc, service_token, agent, ["Bob likes coffee.", "Bob's cat is Tom."], BOB),
        "carol": await save(nc, service_token, agent, ["Carol runs the on-call rota."], CAROL),
        "dave": await save(
            nc, service_token, agent, ["Dave owns the billing service.", "Dave's laptop"], DAVE
        ),
        "shared": await save(
            nc, service_token, agent, ["The VPN host is vpn.internal.", "Deploys freeze Fridays"]
        ),
    }

    async def indexed() -> bool:
        return await count_rows(db, ENTRIES.c.org_id == org, ENTRIES.c.embedding_status != "indexed") == 0

    await eventually(indexed, what="entries indexed")
    return owned


async def _rows_of(db: Database, org: UUID, keys: tuple[str, ...]) -> list[tuple[str, ...]]:
    cols = [c for c in ENTRIES.c if c.name not in ("search", "access_count", "last_accessed_at")]
    async with db.read() as s:
        rows = (
            await s.execute(
                select(*cols)
                .where(ENTRIES.c.org_id == org, ENTRIES.c.owner_key.in_(keys))
                .order_by(ENTRIES.c.id)
            )
        ).all()
    return [tuple(str(v) for v in r) for r in rows]


def _manage_body(agent: UUID, entry: str, op: str, own: str) -> dict[str, Any]:
    body: dict[str, Any] = {"agent_config_id": str(agent), "entry_id": entry, "op": op}
    if op == "edit":
        body["text"] = "rewritten by someone else"
    if op == "merge":
        body.update(text="merged by someone else", merge_with=[entry], entry_id=own)
    if op == "rescope":
        body["owner"] = "end_user:mallory"
    if op == "change_retention":
        body["ttl_seconds"] = 1
    return body


async def _probe_foreign(
    send: Interface,
    tally: Tally,
    token: str,
    agent: UUID,
    *,
    who: str,
    own: str,
    own_ref: str,
    foreign_ids: list[str],
    foreign_refs: list[str],
    principal: dict[str, Any] | None = None,
) -> None:
    """Every way to reach someone else's memory, each with the code it must get."""
    a = str(agent)
    p = {"principal": principal} if principal is not None else {}

    async def expect(subject: str, body: dict[str, Any], code: str) -> None:
        reply = await send(subject, {**body, **p}, token)
        got = tally.note(reply)
        if got != code:
            tally.problem(f"{who}: {subject} {body} -> {got or reply} (expected {code})")

    for entry in foreign_ids:
        await expect("engram.memory.get", {"agent_config_id": a, "entry_id": entry}, "NOT_FOUND")
        await expect(
            "engram.memory.get", {"agent_config_id": a, "entry_id": entry, "history": True}, "NOT_FOUND"
        )
        await expect("engram.memory.delete", {"agent_config_id": a, "entry_id": entry}, "NOT_FOUND")
        await expect(
            "engram.memory.feedback", {"agent_config_id": a, "entry_id": entry, "success": False}, "NOT_FOUND"
        )
        for op in OPS:
            await expect("engram.memory.manage", _manage_body(agent, entry, op, own), "NOT_FOUND")
        expanded = await send("engram.recall.expand", {"agent_config_id": a, "ids": [entry], **p}, token)
        tally.note(expanded)
        if expanded.get("results") != [] or expanded.get("not_found") != [entry]:
            tally.problem(f"{who}: expand disclosed {entry}: {expanded}")
    for ref in foreign_refs:
        await expect("engram.memory.list", {"agent_config_id": a, "actor_ref": ref}, "FORBIDDEN")
        await expect("engram.memory.export", {"agent_config_id": a, "actor_ref": ref}, "FORBIDDEN")
        await expect("engram.memory.export", {"actor_ref": ref}, "FORBIDDEN")
        await expect("engram.memory.purge", {"agent_config_id": a, "actor_ref": ref}, "FORBIDDEN")
        await expect("engram.memory.purge", {"actor_ref": ref, "session_id": "s"}, "FORBIDDEN")
    # Moving one's own entry to someone else is cross-owner: admin, and never an end user.
    for target in foreign_refs:
        body = {"agent_config_id": a, "entry_id": own, "op": "rescope", "owner": target}
        await expect("engram.memory.manage", body, "FORBIDDEN")
    # What the caller may see: only its own (and, for actors, the shared pool).
    for strategy in STRATEGIES:
        reply = await send(
            "engram.recall", {"agent_config_id": a, "strategy": strategy, "cue": "likes the", **p}, token
        )
        tally.note(reply)
        leaked = [r["id"] for r in reply.get("results", []) if r["id"] in foreign_ids]
        if error_code(reply) or leaked:
            tally.problem(f"{who}: recall {strategy} -> {error_code(reply)} leaked={leaked}")
    listed = await send("engram.memory.list", {"agent_config_id": a, **p}, token)
    tally.note(listed)
    if error_code(listed) or any(e["id"] in foreign_ids for e in listed["entries"]):
        tally.problem(f"{who}: list without actor_ref showed foreign entries: {listed}")
    own_list = await send("engram.memory.list", {"agent_config_id": a, "actor_ref": own_ref, **p}, token)
    tally.note(own_list)
    if error_code(own_list) or not own_list["entries"]:
        tally.problem(f"{who}: could not list its own memory: {own_list}")


async def test_end_users_and_non_admin_actors_stay_in_their_own_memory(
    interface: Interface,
    db: Database,
    tokens: TokenService,
    org: UUID,
    agent: UUID,
    service_token: str,
    memory: dict[str, list[str]],
) -> None:
    tally = Tally(interface.label("authorization"))
    others = ("end_user:bob", "actor:dave", "")
    before = await _rows_of(db, org, others)
    alice_rw = mint(tokens, org, "end_user:alice", {"memory.read", "memory.write", "memory.purge"})
    alice_admin = mint(tokens, org, "end_user:alice", ALL_PERMISSIONS)
    carol = mint(tokens, org, "actor:carol", {"memory.read", "memory.write", "memory.purge"})
    not_alice = memory["bob"] + memory["carol"] + memory["dave"] + memory["shared"]
    user_refs = ["end_user:bob", "actor:carol", "none", "end_user:ALICE", "end_user:alice_"]
    for who, token, principal in (
        ("end_user", alice_rw, None),
        ("end_user_with_admin", alice_admin, None),
        ("service_for_alice", service_token, ALICE),
    ):
        await _probe_foreign(
            interface,
            tally,
            token,
            agent,
            who=who,
            own=memory["alice"][0],
            own_ref="end_user:alice",
            foreign_ids=not_alice,
            foreign_refs=user_refs,
            principal=principal,
        )
    await _probe_foreign(
        interface,
        tally,
        carol,
        agent,
        who="actor_without_admin",
        own=memory["carol"][0],
        own_ref="actor:carol",
        foreign_ids=memory["bob"] + memory["dave"] + memory["alice"],
        foreign_refs=["actor:dave", "end_user:bob", "end_user:alice"],
    )

    async def expect(token: str, subject: str, body: dict[str, Any], code: str, who: str) -> None:
        reply = await interface(subject, body, token)
        if (tally.note(reply) or "OK") != code:
            tally.problem(f"{who}: {subject} {body} -> {reply} (expected {code})")

    a = str(agent)
    # Saving for someone else or into the shared pool.
    for token, who in ((alice_rw, "end_user"), (alice_admin, "end_user_with_admin"), (carol, "actor")):
        for principal in (BOB, DAVE, {"kind": "none"}, {"kind": "end_user", "id": "ALICE"}, CAROL, ALICE):
            if (who == "actor" and principal == CAROL) or (who != "actor" and principal == ALICE):
                continue
            body = {"agent_config_id": a, "principal": principal, "content": "planted", "wait": True}
            await expect(token, "engram.memory.save", body, "FORBIDDEN", who)
    # The shared pool is readable by an actor, never writable without admin.
    for entry in memory["shared"]:
        await expect(carol, "engram.memory.get", {"agent_config_id": a, "entry_id": entry}, "OK", "actor")
        await expect(
            carol, "engram.memory.delete", {"agent_config_id": a, "entry_id": entry}, "FORBIDDEN", "actor"
        )
        for op in ("pin", "disable", "mark_incorrect", "edit", "change_retention"):
            body = _manage_body(agent, entry, op, memory["carol"][0])
            await expect(carol, "engram.memory.manage", body, "FORBIDDEN", "actor")
    await expect(
        carol, "engram.memory.purge", {"agent_config_id": a, "actor_ref": "none"}, "FORBIDDEN", "actor"
    )
    await expect(carol, "engram.memory.prune", {"agent_config_id": a, "max_entries": 0}, "FORBIDDEN", "actor")
    await expect(
        alice_rw, "engram.memory.prune", {"agent_config_id": a, "max_entries": 0}, "FORBIDDEN", "end_user"
    )

    tally.conclude(interface=interface, snapshots=(before, await _rows_of(db, org, others)))


async def test_end_user_token_with_admin_cannot_prune_other_owners(
    interface: Interface,
    db: Database,
    tokens: TokenService,
    org: UUID,
    agent: UUID,
    memory: dict[str, list[str]],
) -> None:
    alice_admin = mint(tokens, org, "end_user:alice", ALL_PERMISSIONS)
    others = ("end_user:bob", "actor:dave", "actor:carol", "")
    before = await _rows_of(db, org, others)
    reply = await interface(
        "engram.memory.prune", {"agent_config_id": str(agent), "max_entries": 0}, alice_admin
    )
    after = await _rows_of(db, org, others)
    report(
        interface.label("end-user-admin-prune"),
        requests=1,
        reply=reply,
        foreign_rows_deleted=len(before) - len(after),
        **interface.counts(),
    )
    assert error_code(reply) == "FORBIDDEN"
    assert before == after


async def test_end_user_token_with_admin_cannot_read_others_audit_or_change_config(
    interface: Interface,
    tokens: TokenService,
    org: UUID,
    agent: UUID,
    memory: dict[str, list[str]],
) -> None:
    """``memory.admin`` is an operator's permission; access.py refuses it on end-user tokens for
    other owners' memory. The audit trail (who recalled which ids) and the shared config are other
    owners' business too."""
    alice_admin = mint(tokens, org, "end_user:alice", ALL_PERMISSIONS)
    audit = await interface("engram.audit.query", {"limit": 1000}, alice_admin)
    others = set(memory["bob"] + memory["dave"] + memory["carol"] + memory["shared"])
    foreign = [r for r in audit.get("records", []) if others & set(r["entry_ids"])]
    config = await interface(
        "engram.config.put", {"agent_config_id": str(agent), "config": {"top_k": 1}}, alice_admin
    )
    report(
        interface.label("end-user-admin-audit-config"),
        requests=2,
        audit_code=error_code(audit) or "OK",
        audit_records_about_other_owners=len(foreign),
        config_put_code=error_code(config) or "OK",
        **interface.counts(),
    )
    assert foreign == []
    assert error_code(config) == "FORBIDDEN"


@dataclass(frozen=True)
class Restricted:
    """A service token of ``org`` restricted to ``agent``, and another agent config of the same
    organization with memory of its own."""

    token: str
    other: UUID
    other_ids: list[str]


@pytest.fixture
async def restricted(
    nc: Client, tokens: TokenService, org: UUID, agent: UUID, service_token: str, memory: dict[str, list[str]]
) -> Restricted:
    other = uuid4()
    other_ids = await save(nc, service_token, other, ["Other workload's secret."], ALICE)
    return Restricted(
        mint(tokens, org, "service:runner", ALL_PERMISSIONS, agent_config_id=agent), other, other_ids
    )


async def test_agent_config_restricted_token_stays_in_its_agent_config(
    interface: Interface, restricted: Restricted
) -> None:
    """A token restricted to one agent config (SPEC 8) reaches no other agent config of its own
    organization: refused when it names one, its own only when it names none."""
    tally = Tally(interface.label("agent-config-restriction"))
    o, other_ids = str(restricted.other), restricted.other_ids
    refused: list[tuple[str, dict[str, Any]]] = [
        ("engram.recall", {"agent_config_id": o, "principal": ALICE}),
        ("engram.recall.expand", {"agent_config_id": o, "principal": ALICE, "ids": other_ids}),
        ("engram.memory.feedback", {"agent_config_id": o, "entry_id": other_ids[0], "success": False}),
        ("engram.memory.list", {"agent_config_id": o, "actor_ref": "end_user:alice"}),
        ("engram.memory.get", {"agent_config_id": o, "entry_id": other_ids[0]}),
        ("engram.memory.delete", {"agent_config_id": o, "entry_id": other_ids[0]}),
        ("engram.memory.manage", {"agent_config_id": o, "entry_id": other_ids[0], "op": "disable"}),
        ("engram.memory.export", {"agent_config_id": o, "actor_ref": "end_user:alice"}),
        ("engram.memory.purge", {"agent_config_id": o, "actor_ref": "end_user:alice"}),
        ("engram.memory.prune", {"agent_config_id": o, "max_entries": 0}),
        ("engram.memory.save", {"agent_config_id": o, "content": "planted", "wait": True}),
        ("engram.config.get", {"agent_config_id": o}),
        ("engram.config.put", {"agent_config_id": o, "config": {"top_k": 1}}),
    ]
    for subject, body in refused:
        reply = await interface(subject, body, restricted.token)
        if tally.note(reply) != "FORBIDDEN":
            tally.problem(f"{subject} on another agent config -> {reply}")
    # Naming no agent config means the token's own: nothing of the other one comes back.
    for subject, body in (
        ("engram.memory.export", {"actor_ref": "end_user:alice"}),
        ("engram.memory.purge", {"actor_ref": "end_user:bob"}),
    ):
        reply = await interface(subject, body, restricted.token)
        tally.note(reply)
        if any(i in str(reply) for i in other_ids):
            tally.problem(f"{subject} without agent config disclosed the other agent config's ids")
    tally.conclude(interface=interface)


async def test_agent_config_restricted_token_reads_only_its_agent_configs_audit(
    interface: Interface, restricted: Restricted
) -> None:
    named = await interface(
        "engram.audit.query", {"agent_config_id": str(restricted.other)}, restricted.token
    )
    unnamed = await interface("engram.audit.query", {"limit": 1000}, restricted.token)
    other_ids = set(restricted.other_ids)
    leaked = [r for r in unnamed.get("records", []) if other_ids & set(r["entry_ids"])]
    report(
        interface.label("agent-config-restriction-audit"),
        requests=2,
        named_code=error_code(named) or "OK",
        named_records=len(named.get("records", [])),
        unnamed_records_of_other_agent_config=len(leaked),
        **interface.counts(),
    )
    assert error_code(named) == "FORBIDDEN"
    assert leaked == []
