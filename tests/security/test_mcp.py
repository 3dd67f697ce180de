"""The attacker's view through MCP: tools take no organization or principal, so all an agent of
organization A can aim at organization B is B's agent config (the server's setting) and B's entry
ids (tool arguments) — with every kind of token A holds. Nothing of B may come back and B's rows
must be exactly as they were. And memory text, injected or not, reaches the agent only inside
the one ``<engram-memory>`` data block, with quarantined text withheld."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any
from uuid import UUID, uuid4

import pytest
from mcp import Client
from mcp.types import CallToolResult
from nats.aio.client import Client as Nats

from contracts.common import Principal
from services.mcp import Caller, streamable_http_app
from shared.embedded.nats_server import NatsServerProcess
from shared.security.auth import ALL_PERMISSIONS, TokenService
from shared.service.infra import Infra
from shared.storage.db.engine import Database
from shared.storage.db.models import ENTRIES
from shared.text.memory_block import BLOCK_CLOSE, BLOCK_OPEN
from tests.conftest import TEST_KID, TEST_SECRET, connect_as
from tests.mcp_clients import code_of, in_process, over_http, serving, text_of
from tests.platform import eventually
from tests.security.support import Tally, count_rows, mint, org_snapshot, report, rng, save
from tests.security.test_injection import CUES, FORMATS, STRATEGIES, scaffolding_removed
from tests.unit.injection_corpus import ATTACKS

pytestmark = pytest.mark.integration

ALICE = {"kind": "end_user", "id": "alice"}
ALICE_PRINCIPAL = Principal(kind="end_user", id="alice")


async def _indexed(db: Database, org: UUID) -> None:
    async def done() -> bool:
        return await count_rows(db, ENTRIES.c.org_id == org, ENTRIES.c.embedding_status != "indexed") == 0

    await eventually(done, what="every entry indexed")


def _calls(r: Any, victim_ids: list[str], own_ids: list[str]) -> list[tuple[str, dict[str, Any]]]:
    """Every tool, aimed at the victim's ids (and, as a control, the attacker's own)."""
    calls: list[tuple[str, dict[str, Any]]] = []
    for strategy in STRATEGIES:
        for fmt in FORMATS:
            calls.append(
                ("recall", {"strategy": strategy, "format": fmt, "cue": r.choice([*CUES, "kestrel"])})
            )
    for _ in range(4):
        calls.append(("expand", {"ids": r.sample(victim_ids, min(20, len(victim_ids))) + own_ids[:1]}))
    calls.append(("list_memories", {"page_size": 100}))
    calls.append(("list_memories", {"memory_types": ["semantic"], "page_size": 5}))
    for victim in r.sample(victim_ids, 6):
        calls.append(("memory_feedback", {"entry_id": victim, "success": False}))
        calls.append(("forget", {"entry_id": victim}))
    calls.append(("remember", {"text": f"kestrel attacker note {r.random()}"}))
    return calls


TRANSPORTS = ["in-process", "http"]


@pytest.fixture(scope="module")
async def mcp_url(engram: Infra, nats_proc: NatsServerProcess) -> AsyncIterator[str]:
    """The streamable-HTTP app on a real port, on a NATS connection of its own (as a gateway's)."""
    nc = await connect_as(nats_proc, getattr(nats_proc, "client", None))
    async with serving(streamable_http_app(nc, TokenService({TEST_KID: TEST_SECRET}))) as url:
        yield url
    await nc.drain()


def _agent(transport: str, nc: Nats, url: str, caller: Caller) -> Client:
    return in_process(nc, caller) if transport == "in-process" else over_http(url, caller)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_no_tool_reaches_another_organization(
    engram: Infra, nc: Nats, db: Database, tokens: TokenService, mcp_url: str, transport: str
) -> None:
    """Every token kind of organization A, aimed at B's agent config and entry ids through every
    tool, sees nothing of B and changes nothing of B; the same calls do find A's own memory."""
    victim_org, attacker_org, agent, own_agent = uuid4(), uuid4(), uuid4(), uuid4()
    victim_service = mint(tokens, victim_org, "service:runner", ALL_PERMISSIONS)
    marker = f"kestrel-{uuid4().hex[:10]}"
    victim_texts = [f"{marker} note {i}: invoices route through the north team" for i in range(8)]
    victim_ids = await save(nc, victim_service, agent, victim_texts[:4], ALICE)
    victim_ids += await save(nc, victim_service, agent, victim_texts[4:])  # the shared pool
    # The attacker's organization has the same owner ids (and an agent config of its own: B's is
    # B's, which is the first thing the attacker tries).
    attacker_service = mint(tokens, attacker_org, "service:runner", ALL_PERMISSIONS)
    own_ids = await save(nc, attacker_service, own_agent, ["Invoices route through the south team."], ALICE)
    await _indexed(db, victim_org)
    await _indexed(db, attacker_org)
    before = await org_snapshot(db, victim_org)

    attackers = {
        "end_user:alice rw": mint(tokens, attacker_org, "end_user:alice", {"memory.read", "memory.write"}),
        "end_user:alice all": mint(tokens, attacker_org, "end_user:alice", ALL_PERMISSIONS),
        "service all": attacker_service,
        "actor:carol all": mint(tokens, attacker_org, "actor:carol", ALL_PERMISSIONS),
        "restricted to the agent": tokens.mint(
            org_id=attacker_org,
            principal=ALICE_PRINCIPAL,
            permissions=ALL_PERMISSIONS,
            agent_config_id=own_agent,
            session_id="sess-1",
        ),
    }
    name = "mcp-cross-tenant" if transport == "in-process" else "mcp-http-cross-tenant"
    tally = Tally(name)
    per_tool: dict[str, Counter[str]] = {}
    leaks: list[str] = []
    own_seen = 0
    r = rng("mcp-cross-tenant")
    for label, token in attackers.items():
        for target_agent in (agent, own_agent, uuid4()):
            for session in (None, "sess-1"):
                caller = Caller(token=token, agent_config_id=target_agent, session_id=session)
                async with _agent(transport, nc, mcp_url, caller) as client:
                    for tool, args in _calls(r, victim_ids, own_ids):
                        result = await client.call_tool(tool, args)
                        code = code_of(result)
                        tally.requests += 1
                        tally.codes[code] += 1
                        per_tool.setdefault(tool, Counter())[code] += 1
                        structured = dict(result.structured_content or {})
                        # A result's text is its structured JSON (an error's: its message), so
                        # the structured result is all it shows.
                        if code == "OK":
                            assert json.loads(text_of(result)) == structured, (tool, text_of(result))
                        # expand names the requested ids it did not find: an echo, not a leak.
                        structured.pop("not_found", None)
                        shown = (text_of(result) if code != "OK" else "") + json.dumps(structured)
                        if marker in shown or any(v in shown for v in victim_ids):
                            leaks.append(f"{label}/{session}/{tool}: {shown[:160]!r}")
                        own_seen += sum(i in shown for i in own_ids) if code == "OK" else 0
    after = await org_snapshot(db, victim_org)
    foreign_writes = int(before != after)
    report(
        name,
        requests=tally.requests,
        leaks=len(leaks),
        foreign_writes=foreign_writes,
        internal_errors=tally.codes.get("INTERNAL", 0),
        untyped_errors=tally.codes.get("UNTYPED", 0),
        victim_entries=len(victim_ids),
        attacker_saw_its_own=own_seen,
        codes=dict(tally.codes),
        by_tool={k: dict(v) for k, v in per_tool.items()},
        leak_samples=leaks[:20],
    )
    assert leaks == []
    assert foreign_writes == 0
    assert tally.codes.get("INTERNAL", 0) == 0
    assert tally.codes.get("UNTYPED", 0) == 0
    # Every call was well-formed, so each reached Engram (a renamed argument would stop it here).
    assert tally.codes.get("INVALID_REQUEST", 0) == 0
    # The control: the same calls do reach the attacker's own memory, so silence is not the pass.
    assert own_seen > 0


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_injected_memory_stays_inside_the_data_block(
    engram: Infra,
    nc: Nats,
    db: Database,
    tokens: TokenService,
    org: UUID,
    agent: UUID,
    service_token: str,
    mcp_url: str,
    transport: str,
) -> None:
    """Every attack of the shared corpus, recalled, expanded and listed through MCP: the agent sees
    the placeholder inside the one data block, never the attack text, anywhere in a tool result."""
    ids = await save(nc, service_token, agent, list(ATTACKS), ALICE)
    await _indexed(db, org)
    alice = mint(tokens, org, "end_user:alice", {"memory.read", "memory.write"})
    name = "mcp-injection" if transport == "in-process" else "mcp-http-injection"
    tally = Tally(name)
    results_checked = 0

    def check(label: str, result: CallToolResult) -> None:
        nonlocal results_checked
        tally.requests += 1
        code = code_of(result)
        tally.codes[code] += 1
        if code != "OK":
            tally.problem(f"{label}: {text_of(result)[:120]}")
            return
        structured = result.structured_content or {}
        if json.loads(text_of(result)) != structured:
            tally.problem(f"{label}: the text is not the structured result")
        # Memory text is only ever inside the context (decoded here: in the JSON text it is escaped).
        text = str(structured.get("context", ""))
        everything = text + json.dumps(structured) + text_of(result)
        if any(a in everything for a in ATTACKS):
            tally.problem(f"{label}: attack text in the tool result")
        if BLOCK_OPEN not in text:
            return
        if text.count(BLOCK_OPEN) != 1 or text.count(BLOCK_CLOSE) != 1:
            tally.problem(f"{label}: {text.count(BLOCK_OPEN)} openers, {text.count(BLOCK_CLOSE)} closers")
        _, _, rest = text.partition(BLOCK_OPEN)
        inside, _, after = rest.partition(BLOCK_CLOSE)
        results_checked += inside.count("[memory withheld") + inside.count("[quarantined memory withheld")
        # Outside the block: the header before it, nothing after it — no memory text.
        if any(word in after.lower() for word in ("ignore", "instruction", "system")):
            tally.problem(f"{label}: text after the block: {after[:120]!r}")

    async with _agent(transport, nc, mcp_url, Caller(token=alice, agent_config_id=agent)) as client:
        for strategy in STRATEGIES:
            for fmt in FORMATS:
                for cue in CUES if strategy in ("pack", "semantic", "hybrid") else CUES[:1]:
                    for budget in (None, 40, 400):
                        args: dict[str, Any] = {"strategy": strategy, "format": fmt, "cue": cue}
                        if budget is not None:
                            args["token_budget"] = budget
                        result = await client.call_tool("recall", args)
                        check(f"recall {strategy}/{fmt}/{budget}/{cue!r}", result)
                        structured = result.structured_content or {}
                        # The text is the structured result, the context in it as Engram sent it.
                        if code_of(result) == "OK" and json.loads(text_of(result)) != structured:
                            tally.problem(f"recall {strategy}/{fmt}: the text is not the result")
                        if structured.get("context") and scaffolding_removed(structured["context"]):
                            tally.problem(f"recall {strategy}/{fmt}: memory text in the context")
        for chunk in range(0, len(ids), 20):
            check("expand", await client.call_tool("expand", {"ids": ids[chunk : chunk + 20]}))
        check("list", await client.call_tool("list_memories", {"page_size": 100}))
    report(
        name,
        requests=tally.requests,
        attacks=len(ATTACKS),
        placeholders_checked=results_checked,
        problems=len(tally.problems),
        codes=dict(tally.codes),
        problem_samples=tally.problems[:10],
    )
    assert tally.problems == []
    assert results_checked >= len(ATTACKS)
