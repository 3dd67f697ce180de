"""Cross-tenant fuzzing (SPEC 3, 8): two organizations hold the same texts for the same owner ids
(``end_user:alice`` in both, plus look-alike and wildcard-shaped ids); an attacker holding every
kind of token of organization A aims fuzzed agent configs, entry ids, principals and actor refs at
organization B over every memory subject. Nothing of B may come back, and B's rows, recall
records, tombstones, audit chain and vectors must be exactly as they were."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any
from uuid import UUID, uuid4

import pytest
from nats.aio.client import Client
from sqlalchemy import select

from shared.ports import Embedder, TenantFilter, VectorIndex
from shared.security.auth import ALL_PERMISSIONS, TokenService
from shared.storage.db.engine import Database
from shared.storage.db.models import AUDIT_LOG, ENTRIES, RECALLS
from tests.platform import eventually, request
from tests.security.support import Tally, count_rows, mint, org_snapshot, report, rng, save
from tests.security.transport import Interface

pytestmark = pytest.mark.integration

#: Owner ids both organizations use. Exact-match semantics must keep each one apart.
OWNER_IDS = ["alice", "ALICE", "аlice", "*", "%", "'", "bob"]  # "аlice" starts with a Cyrillic а
COMMON = [
    "Alice prefers window seats.",
    "The deploy key rotates on Mondays.",
    "Refunds need a ticket number.",
]
#: Principal ids an attacker tries: case, padding, wildcards, SQL and LIKE metacharacters,
#: look-alikes, invisible characters, separators, over-long, template syntax.
FUZZ_IDS = [
    "alice",
    "ALICE",
    "Alice",
    "alice ",
    " alice",
    "",
    "*",
    "%",
    "_",
    "'",
    '"',
    "' OR '1'='1",
    "alice%",
    "al_ce",
    "аlice",
    "ａｌｉｃｅ",
    "alice\u200b",
    "alice\x00",
    "end_user:alice",
    "bob",
    "carol",
    "null",
    "..",
    "\\",
    "a" * 201,
    "%00",
    "alice;--",
    "${org}",
    "{{alice}}",
]
STRATEGIES = ["last_k", "importance", "full", "pack", "semantic", "hybrid"]
OPS = ["pin", "unpin", "disable", "enable", "mark_incorrect", "edit", "merge", "rescope", "change_retention"]
SUBJECTS = [
    "engram.recall",
    "engram.recall.expand",
    "engram.memory.list",
    "engram.memory.get",
    "engram.memory.export",
    "engram.memory.purge",
    "engram.memory.prune",
    "engram.memory.manage",
    "engram.memory.delete",
    "engram.memory.feedback",
    "engram.audit.query",
    "engram.config.get",
    "engram.config.put",
]
#: Subjects whose requests take no ``principal`` (it would be an unknown field).
NO_PRINCIPAL = ("engram.audit.query", "engram.memory.prune", "engram.config.get", "engram.config.put")


def principals() -> list[Any]:
    out: list[Any] = [{"kind": k, "id": i} for k in ("end_user", "actor") for i in FUZZ_IDS]
    out += [
        {"kind": "none"},
        {"kind": "none", "id": "alice"},
        {"kind": "service", "id": "runner"},
        {"kind": "service", "id": "alice"},
        {"kind": "END_USER", "id": "alice"},
        {"kind": "end_user"},
        {"kind": "end_user", "id": None},
        "end_user:alice",
        None,
    ]
    return out


def actor_refs() -> list[str]:
    refs = [f"{k}:{i}" for k in ("end_user", "actor") for i in FUZZ_IDS]
    return [
        *refs,
        "none",
        "None",
        "NONE",
        "*",
        "",
        "end_user:",
        "end_user",
        "end_user:alice:x",
        "service:runner",
        "END_USER:alice",
        "end_user :alice",
        "end_user:alice\n",
    ]


async def _settled(db: Database, org: UUID) -> None:
    async def indexed() -> bool:
        return await count_rows(db, ENTRIES.c.org_id == org, ENTRIES.c.embedding_status != "indexed") == 0

    await eventually(indexed, what="every entry indexed")


async def _populate(nc: Client, db: Database, token: str, org: UUID, agent: UUID, marker: str) -> list[str]:
    """The same memory in each organization, plus texts only this one has (``marker``)."""
    ids: list[str] = []
    for owner_id in OWNER_IDS:
        owner = {"kind": "end_user", "id": owner_id}
        texts = [*COMMON, f"{marker} private note of {owner_id}"]
        ids += await save(nc, token, agent, texts, owner)
        ids += await save(
            nc, token, agent, [f"{marker} session note of {owner_id}"], owner, session_id="sess-1"
        )
    ids += await save(nc, token, agent, [*COMMON, f"{marker} carol's own"], {"kind": "actor", "id": "carol"})
    ids += await save(nc, token, agent, [*COMMON, f"{marker} shared pool"])
    await _settled(db, org)
    return ids


async def _vector_view(index: VectorIndex, embedder: Embedder, org: UUID, agent: UUID) -> list[str]:
    """Every vector id of ``org``'s agent config the index returns for its texts."""
    keys = ("", "actor:carol", *(f"end_user:{i}" for i in OWNER_IDS))
    tenant = TenantFilter(org_id=org, agent_config_id=agent, owner_keys=keys)
    seen: set[str] = set()
    for vector in await embedder.embed([*COMMON, "private note", "session note", "shared pool"]):
        seen |= {str(h.id) for h in await index.search(vector, tenant, 200)}
    return sorted(seen)


class Attack:
    """Builds fuzzed requests from organization A aimed at organization B."""

    def __init__(self, a_agent: UUID, b_agent: UUID, a_ids: list[str], b_ids: list[str], seed: str) -> None:
        self.r = rng(seed)
        self.a_agent, self.b_agent = str(a_agent), str(b_agent)
        self.a_ids, self.b_ids = a_ids, b_ids
        self.principals = principals()
        self.refs = actor_refs()
        #: Whether requests may erase A's own memory (prune to zero, purge on A's agent config).
        self.destructive = False

    def agent(self) -> str:
        x = self.r.random()
        return self.b_agent if x < 0.5 else self.a_agent if x < 0.85 else str(uuid4())

    def entry(self) -> str:
        x = self.r.random()
        return (
            self.r.choice(self.b_ids) if x < 0.65 else self.r.choice(self.a_ids) if x < 0.8 else str(uuid4())
        )

    def principal(self, body: dict[str, Any]) -> None:
        p = self.r.choice(self.principals)
        if p is not None:
            body["principal"] = p

    def body(self, subject: str, agent: str | None = None) -> dict[str, Any]:
        r = self.r
        a = agent or self.agent()
        b: dict[str, Any] = {"agent_config_id": a}
        if subject == "engram.recall":
            b.update(strategy=r.choice(STRATEGIES), cue=r.choice([*COMMON, "private note", "alice"]))
            if r.random() < 0.3:
                b["session_id"] = "sess-1"
            if r.random() < 0.2:
                b["top_k"] = 20
            if r.random() < 0.2:
                b["filters"] = {"session_id": "sess-1"}
            if r.random() < 0.2:
                b["diagnostics"] = "candidates"
        elif subject == "engram.recall.expand":
            b["ids"] = [self.entry() for _ in range(r.randint(1, 30))]
        elif subject == "engram.memory.list":
            if r.random() < 0.7:
                b["actor_ref"] = r.choice(self.refs)
            if r.random() < 0.3:
                b["lifecycle"] = ["active", "stale", "superseded", "suppressed", "disabled"]
            if r.random() < 0.2:
                b["session_id"] = "sess-1"
        elif subject in ("engram.memory.get", "engram.memory.delete"):
            b["entry_id"] = self.entry()
        elif subject in ("engram.memory.export", "engram.memory.purge"):
            if r.random() < 0.35:
                del b["agent_config_id"]
            b["actor_ref"] = r.choice(self.refs)
            if subject == "engram.memory.purge" and r.random() < 0.3:
                b["session_id"] = "sess-1"
            if (
                subject == "engram.memory.purge"
                and not self.destructive
                and b.get("agent_config_id") != self.b_agent
            ):
                b["agent_config_id"] = self.b_agent
        elif subject == "engram.memory.prune":
            # Erasing all of A's own memory would leave the later requests nothing to mix with.
            b["max_entries"] = 0 if a != self.a_agent or self.destructive else 1000
        elif subject == "engram.memory.manage":
            op = r.choice(OPS)
            b.update(op=op, entry_id=self.entry())
            if op in ("edit", "merge"):
                b["text"] = "overwritten by org A"
            if op == "merge":
                b["entry_id"] = r.choice(self.a_ids + self.b_ids)
                b["merge_with"] = [self.entry() for _ in range(r.randint(1, 3))]
            if op == "rescope":
                b["owner"] = r.choice(["none", "end_user:alice", "actor:carol", "end_user:mallory"])
            if op == "change_retention":
                b["ttl_seconds"] = 1
        elif subject == "engram.memory.feedback":
            if r.random() < 0.7:
                b.update(entry_id=self.entry(), success=False)
            else:
                b.update(session_id="sess-1", success=r.random() < 0.5)
        elif subject == "engram.audit.query":
            b = {"limit": 1000}
            if r.random() < 0.5:
                b["agent_config_id"] = a
        elif subject == "engram.config.put":
            b["config"] = {"memory_enabled": False, "scope": "workload", "top_k": 1}
        if subject not in NO_PRINCIPAL and r.random() < 0.85:
            self.principal(b)
        return b


async def test_organization_a_never_sees_or_touches_organization_b(
    interface: Interface,
    nc: Client,
    db: Database,
    tokens: TokenService,
    embedder: Embedder,
    vector_index: VectorIndex,
) -> None:
    """The attack, through ``interface`` (NATS, the HTTP gateway); the victim's memory is written
    over NATS either way."""
    name = interface.label("cross-tenant")
    org_a, org_b, agent_a, agent_b = uuid4(), uuid4(), uuid4(), uuid4()
    svc_b = mint(tokens, org_b, "service:runner", ALL_PERMISSIONS)
    svc_a = mint(tokens, org_a, "service:runner", ALL_PERMISSIONS)
    marker = f"orgB-{uuid4().hex[:10]}"
    b_ids = await _populate(nc, db, svc_b, org_b, agent_b, marker)
    a_ids = await _populate(nc, db, svc_a, org_a, agent_a, "orgA")
    # B's own recalls leave recall records (rated below by the attacker's session feedback).
    for strategy in STRATEGIES:
        await request(
            nc,
            "engram.recall",
            {
                "agent_config_id": str(agent_b),
                "principal": {"kind": "end_user", "id": "alice"},
                "strategy": strategy,
                "cue": "window seats",
                "session_id": "sess-1",
            },
            svc_b,
        )

    async def recorded() -> bool:
        async with db.read() as s:
            rows = (await s.execute(select(RECALLS.c.pack_id).where(RECALLS.c.org_id == org_b))).all()
        return len(rows) == len(STRATEGIES)

    await eventually(recorded, what="B's recall records flushed")
    before = await org_snapshot(db, org_b)
    vectors_before = await _vector_view(vector_index, embedder, org_b, agent_b)
    assert len(vectors_before) == len(b_ids)

    attackers = {
        "service": mint(tokens, org_a, "service:runner", ALL_PERMISSIONS),
        "service_restricted_to_b_agent": mint(
            tokens, org_a, "service:runner", ALL_PERMISSIONS, agent_config_id=agent_b
        ),
        "admin_actor": mint(tokens, org_a, "actor:carol", ALL_PERMISSIONS),
        "end_user_with_admin": mint(tokens, org_a, "end_user:alice", ALL_PERMISSIONS),
        "end_user": mint(tokens, org_a, "end_user:alice", {"memory.read", "memory.write", "memory.purge"}),
        "actor": mint(tokens, org_a, "actor:carol", {"memory.read", "memory.write"}),
    }
    attack = Attack(agent_a, agent_b, a_ids, b_ids, "cross-tenant")
    tally = Tally(name)
    b_org, b_set = str(org_b), set(b_ids)
    leaks: list[str] = []
    per_subject: dict[str, Counter[str]] = {s: Counter() for s in SUBJECTS}

    async def attempt(subject: str, token_name: str, body: dict[str, Any]) -> None:
        reply = await interface(subject, body, attackers[token_name])
        code = tally.note(reply)
        per_subject[subject][code or "OK"] += 1
        if code == "INTERNAL":
            tally.problem(f"INTERNAL on {subject} {body!r}")
        visible = {k: v for k, v in reply.items() if k != "not_found"}  # expand echoes what was asked
        blob = json.dumps(visible, ensure_ascii=False)
        found = [m for m in (b_org, marker) if m in blob]
        if code is None:
            found += [i for i in b_set if i in blob]
        if found:
            leaks.append(f"{subject} as {token_name} {body!r} -> {found[:3]}")

    # Non-destructive for A first, so A's own memory is there to be mixed with B's ids;
    # the phases that may erase A's memory (purge/prune acting for fuzzed principals) come last.
    # 1. Every one of B's entry ids, by id, on both agent configs.
    for entry in b_ids:
        for agent in (str(agent_b), str(agent_a)):
            await attempt("engram.memory.get", "admin_actor", {"agent_config_id": agent, "entry_id": entry})
            await attempt("engram.recall.expand", "service", {"agent_config_id": agent, "ids": [entry]})
            await attempt(
                "engram.memory.feedback",
                "service",
                {"agent_config_id": agent, "entry_id": entry, "success": False},
            )
    # 1b. Every manage op on B's ids, from A's admin, on both agent configs; merging A's own
    # entry with B's ids (the sources are loaded one by one: each must be A's).
    for op in OPS:
        for entry in b_ids[::9]:
            for agent in (str(agent_b), str(agent_a)):
                body: dict[str, Any] = {"agent_config_id": agent, "entry_id": entry, "op": op}
                if op in ("edit", "merge"):
                    body["text"] = f"org A rewrote this {uuid4().hex[:6]}"
                if op == "merge":
                    body.update(entry_id=a_ids[0], merge_with=[entry])
                if op == "rescope":
                    body["owner"] = "end_user:mallory"
                if op == "change_retention":
                    body["ttl_seconds"] = 1
                await attempt("engram.memory.manage", "admin_actor", body)
    # 2. Random mixes of all of it.
    r = rng("cross-tenant-mix")
    for _ in range(500):
        subject = r.choice(SUBJECTS)
        await attempt(subject, r.choice(list(attackers)), attack.body(subject))

    attack.destructive = True
    # 3. Every principal variant, acted for by a service token, on B's agent config and on A's.
    for subject in SUBJECTS:
        for principal in principals():
            for agent in (str(agent_b), str(agent_a)):
                body = attack.body(subject, agent)
                body.pop("principal", None)
                if principal is not None and subject not in NO_PRINCIPAL:
                    body["principal"] = principal
                await attempt(subject, "service", body)
    # 4. Every actor ref against B's agent config, from every token.
    for token_name in attackers:
        for ref in actor_refs():
            for subject in ("engram.memory.list", "engram.memory.export", "engram.memory.purge"):
                await attempt(subject, token_name, {"agent_config_id": str(agent_b), "actor_ref": ref})
    after = await org_snapshot(db, org_b)
    vectors_after = await _vector_view(vector_index, embedder, org_b, agent_b)
    async with db.read() as s:
        a_audit_ids = {
            i
            for row in (
                await s.execute(select(AUDIT_LOG.c.entry_ids).where(AUDIT_LOG.c.org_id == org_a))
            ).all()
            for i in row[0]
        }
    foreign_in_a_audit = sorted(a_audit_ids & b_set)
    changed_rows = sorted(set(before["entries"]) ^ set(after["entries"]))
    foreign_writes = len(changed_rows) + int(before["recalls"] != after["recalls"])
    foreign_writes += abs(after["erasures"] - before["erasures"]) + abs(after["audit"] - before["audit"])
    foreign_writes += int(vectors_before != vectors_after)
    report(
        name,
        **interface.counts(),
        requests=tally.requests,
        leaks=len(leaks),
        foreign_writes=foreign_writes,
        internal_errors=tally.codes.get("INTERNAL", 0),
        foreign_ids_in_attacker_audit=len(foreign_in_a_audit),
        victim_entries=len(b_ids),
        victim_vectors=len(vectors_before),
        codes=dict(tally.codes),
        by_subject={k: dict(v) for k, v in per_subject.items()},
        leak_samples=leaks[:20],
        problems=tally.problems[:20],
        changed_rows=changed_rows[:10],
    )
    assert leaks == []
    assert tally.problems == []
    assert before == after
    assert vectors_before == vectors_after
    assert foreign_in_a_audit == []
    # The fuzzer did reach A's own memory (so "nothing of B" is not "nothing at all").
    assert per_subject["engram.memory.list"]["OK"] > 0
    assert per_subject["engram.recall"]["OK"] > 0
