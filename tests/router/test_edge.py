"""The request-reply edge (``shared/service/edge.py``) in memory (``Edge.request``: what it would answer a
NATS request): token, parse, authorize, error mapping, metrics and reply encoding, for operations
of the table. Its NATS side (queue subscriptions, drain, spans) is in
tests/integration/test_edge_nats.py. The handlers here only report what the edge handed them: the
edge is under test, not the operations."""

from __future__ import annotations

import json
from typing import Any
from uuid import uuid4

import pytest
from nats.errors import NoRespondersError
from prometheus_client import REGISTRY

from contracts.common import Principal
from contracts.config import MemoryConfig
from contracts.errors import NotFound
from contracts.governance import ListRequest, Page, PurgeReceipt, PurgeRequest
from contracts.operations import (
    AUDIT_QUERY,
    CONFIG_GET,
    CONFIG_PUT,
    MEMORY_LIST,
    MEMORY_PURGE,
    OPERATIONS,
    RECALL,
)
from contracts.recall import RecallReply, RecallRequest
from contracts.requests import AuditQuery, AuditQueryReply, ConfigGet, ConfigPut, ConfigReply
from shared.messaging.wire import MAX_REQUEST_BYTES
from shared.security.access import Caller
from shared.security.auth import ALL_PERMISSIONS, KNOWN_PERMISSIONS, TokenService
from shared.service.edge import Edge, route
from tests.factories import AgentConfigsOf

ORG = uuid4()
AGENT = uuid4()
ALICE = Principal(kind="end_user", id="alice")
RUNNER = Principal(kind="service", id="runner")
#: Agent configs for which the config.get handler fails in each way the edge maps.
NOT_FOUND_AGENT, BROKEN_AGENT, UNREACHABLE_AGENT = uuid4(), uuid4(), uuid4()
#: Another organization's agent config (the edge's ``agent_configs`` knows it as such).
FOREIGN_AGENT = uuid4()
#: What recall's observer saw: (strategy, seconds) per answered recall.
observed: list[tuple[str, float]] = []


class Seen:
    """What the handlers were called with, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Caller, Any]] = []

    def last(self) -> tuple[str, Caller, Any]:
        return self.calls[-1]


@pytest.fixture
def seen() -> Seen:
    return Seen()


@pytest.fixture
def edge(tokens: TokenService, seen: Seen) -> Edge:
    served = Edge(tokens, agent_configs=AgentConfigsOf({AGENT: ORG, FOREIGN_AGENT: uuid4()}))

    async def config_get(caller: Caller, request: ConfigGet) -> ConfigReply:
        seen.calls.append(("config.get", caller, request))
        if request.agent_config_id == NOT_FOUND_AGENT:
            raise NotFound("no such agent config")
        if request.agent_config_id == BROKEN_AGENT:
            raise RuntimeError("the secret connection string is postgres://u:hunter2@db")
        if request.agent_config_id == UNREACHABLE_AGENT:
            raise ConnectionRefusedError("postgres is restarting")
        return ConfigReply(agent_config_id=request.agent_config_id, version=1, config=MemoryConfig())

    async def config_put(caller: Caller, request: ConfigPut) -> ConfigReply:
        seen.calls.append(("config.put", caller, request))
        return ConfigReply(agent_config_id=request.agent_config_id, version=2, config=MemoryConfig())

    async def audit_query(caller: Caller, request: AuditQuery) -> AuditQueryReply:
        seen.calls.append(("audit.query", caller, request))
        return AuditQueryReply(records=[], next_after_seq=None)

    async def purge(caller: Caller, request: PurgeRequest) -> PurgeReceipt:
        seen.calls.append(("memory.purge", caller, request))
        return PurgeReceipt(
            purge_id=uuid4(),
            actor_ref=request.actor_ref,
            session_id=request.session_id,
            agent_config_ids=[],
            entries=0,
            observations=0,
            derived=0,
            recall_records=0,
            vectors=0,
            vectors_deferred=False,
            cache_entries=0,
            entry_ids=[],
        )

    async def recall(caller: Caller, request: RecallRequest) -> RecallReply:
        seen.calls.append(("recall", caller, request))
        # Only what a format sets: the budget fields stay unset without a token budget.
        return RecallReply(
            results=[],
            context="",
            strategy="last_k",
            pack_id=None,
            count=0,
            matched_count=0,
            tokens_used=0,
            truncated=False,
            warnings=[],
        )

    observed.clear()
    served.serve(CONFIG_GET, config_get)
    served.serve(CONFIG_PUT, config_put)
    served.serve(AUDIT_QUERY, audit_query)
    served.serve(MEMORY_PURGE, purge)
    served.serve(RECALL, recall, observe=lambda reply, s: observed.append((reply.strategy, s)))
    return served


def mint(
    tokens: TokenService, principal: Principal = RUNNER, perms: set[str] | None = None, **kw: Any
) -> str:
    permissions = set(ALL_PERMISSIONS) if perms is None else perms
    return tokens.mint(org_id=ORG, principal=principal, permissions=permissions, **kw)


async def call(edge: Edge, subject: str, body: Any, token: str | None = None) -> dict[str, Any]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    data: dict[str, Any] = json.loads(await edge.request(subject, raw, headers))
    return data


def code(reply: dict[str, Any]) -> str:
    return str(reply.get("error", {}).get("code", "OK"))


def counted(subject: str, outcome: str) -> float:
    value = REGISTRY.get_sample_value("engram_requests_total", {"operation": subject, "code": outcome})
    return value or 0.0


# -- token before everything ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "token", [None, "", "not-a-jwt", "Bearer", "x" * 5000], ids=["none", "empty", "garbage", "word", "huge"]
)
async def test_without_a_valid_token_nothing_is_parsed_or_run(
    edge: Edge, seen: Seen, token: str | None
) -> None:
    """An anonymous caller learns nothing about the schema: a malformed body gets the same
    UNAUTHENTICATED as a good one, and no handler runs."""
    good = {"agent_config_id": str(AGENT)}
    for body in (good, b"{not json", {"unknown": 1}):
        reply = await call(edge, CONFIG_GET.subject, body, token)
        assert code(reply) == "UNAUTHENTICATED"
        assert reply["error"]["status"] == 401
    assert seen.calls == []


async def test_a_token_of_another_key_or_expired_is_refused(edge: Edge, seen: Seen) -> None:
    foreign = TokenService({"test-key": "y" * 48}).mint(
        org_id=ORG, principal=RUNNER, permissions=ALL_PERMISSIONS
    )
    expired = TokenService({"test-key": "y" * 48}).mint(
        org_id=ORG, principal=RUNNER, permissions=ALL_PERMISSIONS, ttl_seconds=-10
    )
    for token in (foreign, expired):
        assert code(await call(edge, CONFIG_GET.subject, {"agent_config_id": str(AGENT)}, token)) == (
            "UNAUTHENTICATED"
        )
    assert seen.calls == []


# -- parse ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b"{not json", "INVALID_REQUEST"),
        (b"[1, 2]", "INVALID_REQUEST"),
        (b'{"agent_config_id": "\\ud800"}', "INVALID_REQUEST"),
        ({"agent_config_id": "not-a-uuid"}, "INVALID_REQUEST"),
        ({"agent_config_id": str(AGENT), "extra": "field"}, "INVALID_REQUEST"),
        (b'{"agent_config_id": "' + b"a" * MAX_REQUEST_BYTES + b'"}', "PAYLOAD_TOO_LARGE"),
    ],
    ids=["not-json", "not-an-object", "lone-surrogate", "bad-uuid", "unknown-field", "too-large"],
)
async def test_bad_bodies_get_typed_errors_and_never_reach_the_handler(
    edge: Edge, seen: Seen, tokens: TokenService, body: Any, expected: str
) -> None:
    reply = await call(edge, CONFIG_GET.subject, body, mint(tokens))
    assert code(reply) == expected
    assert seen.calls == []


async def test_validation_details_name_the_field_never_the_value(edge: Edge, tokens: TokenService) -> None:
    secret = "sk-live-0123456789abcdef"
    reply = await call(edge, CONFIG_GET.subject, {"agent_config_id": secret}, mint(tokens))
    assert code(reply) == "INVALID_REQUEST"
    assert reply["error"]["details"]["errors"][0]["loc"] == "agent_config_id"
    assert secret not in json.dumps(reply)


# -- authorize -----------------------------------------------------------------------------------


async def test_the_operation_permission_comes_from_the_table(edge: Edge, tokens: TokenService) -> None:
    """config.get needs memory.read, config.put memory.admin (contracts/operations.py)."""
    reader = mint(tokens, perms={"memory.read"})
    assert code(await call(edge, CONFIG_GET.subject, {"agent_config_id": str(AGENT)}, reader)) == "OK"
    put = {"agent_config_id": str(AGENT), "config": {}}
    refused = await call(edge, CONFIG_PUT.subject, put, reader)
    assert code(refused) == "FORBIDDEN"
    assert refused["error"]["details"] == {"permission": "memory.admin"}
    writer = mint(tokens, perms={"memory.write"})
    assert code(await call(edge, CONFIG_GET.subject, {"agent_config_id": str(AGENT)}, writer)) == "FORBIDDEN"


async def test_admin_is_an_operator_permission(edge: Edge, tokens: TokenService, seen: Seen) -> None:
    """An end user's token with memory.admin is refused an admin operation, and so is a service
    token acting for an end user."""
    put = {"agent_config_id": str(AGENT), "config": {}}
    assert code(await call(edge, CONFIG_PUT.subject, put, mint(tokens, ALICE))) == "FORBIDDEN"
    assert code(await call(edge, CONFIG_PUT.subject, put, mint(tokens))) == "OK"
    assert [name for name, _, _ in seen.calls] == ["config.put"]


async def test_whom_a_request_acts_for(edge: Edge, tokens: TokenService, seen: Seen) -> None:
    """A service token names the principal (the shared pool when it names none); an end user acts
    only for itself."""
    body: dict[str, Any] = {"agent_config_id": str(AGENT), "strategy": "last_k"}
    await call(edge, RECALL.subject, {**body, "principal": {"kind": "end_user", "id": "bob"}}, mint(tokens))
    assert seen.last()[1].principal == Principal(kind="end_user", id="bob")
    assert seen.last()[1].credential.principal == RUNNER
    await call(edge, RECALL.subject, body, mint(tokens))
    assert seen.last()[1].principal == Principal(kind="none")
    alice = mint(tokens, ALICE, {"memory.read"})
    await call(edge, RECALL.subject, body, alice)
    assert seen.last()[1].principal == ALICE
    before = len(seen.calls)
    other = await call(edge, RECALL.subject, {**body, "principal": {"kind": "end_user", "id": "bob"}}, alice)
    assert code(other) == "FORBIDDEN"
    assert len(seen.calls) == before


async def test_a_restricted_token_names_only_its_own_agent_config_and_session(
    edge: Edge, tokens: TokenService, seen: Seen
) -> None:
    token = mint(tokens, ALICE, {"memory.read"}, agent_config_id=AGENT, session_id="s-1")
    body: dict[str, Any] = {"agent_config_id": str(AGENT), "strategy": "last_k"}
    assert code(await call(edge, RECALL.subject, {**body, "session_id": "s-1"}, token)) == "OK"
    assert code(await call(edge, RECALL.subject, {**body, "session_id": "s-2"}, token)) == "FORBIDDEN"
    other_agent = {**body, "agent_config_id": str(uuid4()), "session_id": "s-1"}
    assert code(await call(edge, RECALL.subject, other_agent, token)) == "FORBIDDEN"
    assert len(seen.calls) == 1


async def test_what_a_restricted_token_leaves_out_is_its_restriction(
    edge: Edge, tokens: TokenService, seen: Seen
) -> None:
    """Omitting the session or agent config never widens a restricted token's reach: the handler
    is given the token's (a recall in its session, a purge of its agent config and session)."""
    token = mint(tokens, agent_config_id=AGENT, session_id="s-1")
    assert code(await call(edge, RECALL.subject, {"agent_config_id": str(AGENT)}, token)) == "OK"
    assert seen.last()[2].session_id == "s-1"
    assert code(await call(edge, MEMORY_PURGE.subject, {"actor_ref": "end_user:alice"}, token)) == "OK"
    _, _, purge = seen.last()
    assert (purge.agent_config_id, purge.session_id) == (AGENT, "s-1")
    assert code(await call(edge, AUDIT_QUERY.subject, {}, token)) == "OK"
    assert seen.last()[2].agent_config_id == AGENT
    # An unrestricted token's omissions stay omissions.
    await call(edge, MEMORY_PURGE.subject, {"actor_ref": "end_user:alice"}, mint(tokens))
    assert (seen.last()[2].agent_config_id, seen.last()[2].session_id) == (None, None)


async def test_an_agent_config_of_another_organization_is_refused_before_the_handler(
    edge: Edge, tokens: TokenService, seen: Seen
) -> None:
    """An operation flagged ``owned`` (purge) refuses another organization's agent config as
    FORBIDDEN and never reaches its handler; one nobody configured yet may be named."""
    foreign = {"actor_ref": "end_user:alice", "agent_config_id": str(FOREIGN_AGENT)}
    refused = await call(edge, MEMORY_PURGE.subject, foreign, mint(tokens))
    assert refused["error"]["code"] == "FORBIDDEN"
    assert seen.calls == []
    fresh = {"actor_ref": "end_user:alice", "agent_config_id": str(uuid4())}
    assert code(await call(edge, MEMORY_PURGE.subject, fresh, mint(tokens))) == "OK"
    assert (
        code(await call(edge, MEMORY_PURGE.subject, {**fresh, "agent_config_id": str(AGENT)}, mint(tokens)))
        == "OK"
    )
    assert [name for name, _, _ in seen.calls] == ["memory.purge", "memory.purge"]


async def test_a_known_agent_config_is_one_the_organization_used(tokens: TokenService, seen: Seen) -> None:
    """``known`` (list): an agent config the organization never used is NOT_FOUND, another's
    FORBIDDEN — both before the handler."""
    edge = Edge(tokens, agent_configs=AgentConfigsOf({AGENT: ORG, FOREIGN_AGENT: uuid4()}))

    async def listed(caller: Caller, request: ListRequest) -> Page:
        seen.calls.append(("memory.list", caller, request))
        return Page(entries=[], next_page_token=None)

    edge.serve(MEMORY_LIST, listed)
    answers = [
        code(await call(edge, MEMORY_LIST.subject, {"agent_config_id": str(agent)}, mint(tokens)))
        for agent in (uuid4(), FOREIGN_AGENT, AGENT)
    ]
    assert answers == ["NOT_FOUND", "FORBIDDEN", "OK"]
    assert len(seen.calls) == 1
    # A later page is the page token's to refuse (bound to its filters); another's stays FORBIDDEN.
    later = {"agent_config_id": str(uuid4()), "page_token": "body.mac"}
    assert code(await call(edge, MEMORY_LIST.subject, later, mint(tokens))) == "OK"
    foreign = {**later, "agent_config_id": str(FOREIGN_AGENT)}
    assert code(await call(edge, MEMORY_LIST.subject, foreign, mint(tokens))) == "FORBIDDEN"
    assert len(seen.calls) == 2


def test_an_edge_without_agent_configs_does_not_serve_an_operation_that_checks_them(
    tokens: TokenService,
) -> None:
    async def purge(caller: Caller, request: PurgeRequest) -> PurgeReceipt:
        raise AssertionError("never served")

    with pytest.raises(RuntimeError, match="agent_configs"):
        Edge(tokens).serve(MEMORY_PURGE, purge)


# -- errors, metrics, replies --------------------------------------------------------------------


async def test_handler_failures_map_to_the_spec_9_envelope(edge: Edge, tokens: TokenService) -> None:
    """A typed error keeps its code; an outage of a store is UNAVAILABLE; anything else is
    INTERNAL without a word of what went wrong."""
    token = mint(tokens)
    not_found = await call(edge, CONFIG_GET.subject, {"agent_config_id": str(NOT_FOUND_AGENT)}, token)
    assert not_found["error"] == {
        "code": "NOT_FOUND",
        "status": 404,
        "message": "no such agent config",
        "details": {},
    }
    down = await call(edge, CONFIG_GET.subject, {"agent_config_id": str(UNREACHABLE_AGENT)}, token)
    assert (code(down), down["error"]["status"]) == ("UNAVAILABLE", 503)
    broken = await call(edge, CONFIG_GET.subject, {"agent_config_id": str(BROKEN_AGENT)}, token)
    assert (code(broken), broken["error"]["status"]) == ("INTERNAL", 500)
    assert "hunter2" not in json.dumps(broken)


async def test_every_answer_is_counted_by_operation_and_code(edge: Edge, tokens: TokenService) -> None:
    subject = CONFIG_GET.subject
    before = {c: counted(subject, c) for c in ("OK", "UNAUTHENTICATED", "INVALID_REQUEST", "NOT_FOUND")}
    await call(edge, subject, {"agent_config_id": str(AGENT)}, mint(tokens))
    await call(edge, subject, {"agent_config_id": str(AGENT)})
    await call(edge, subject, b"[]", mint(tokens))
    await call(edge, subject, {"agent_config_id": str(NOT_FOUND_AGENT)}, mint(tokens))
    after = {c: counted(subject, c) for c in before}
    assert {c: after[c] - before[c] for c in before} == dict.fromkeys(before, 1.0)


async def test_recall_replies_leave_out_what_they_did_not_set_and_are_timed_by_strategy(
    edge: Edge, tokens: TokenService
) -> None:
    """recall's reply is sparse (the table's ``sparse_reply``): no budget fields without a budget;
    its observer sees each answered recall's strategy. A refused recall is not timed there."""
    reply = await call(edge, RECALL.subject, {"agent_config_id": str(AGENT)}, mint(tokens))
    assert "excluded_by_budget" not in reply
    assert "diagnostics" not in reply
    assert [strategy for strategy, _ in observed] == ["last_k"]
    assert observed[0][1] > 0
    await call(edge, RECALL.subject, {"agent_config_id": str(AGENT)})
    assert len(observed) == 1


async def test_other_replies_carry_every_field(edge: Edge, tokens: TokenService) -> None:
    reply = await call(edge, AUDIT_QUERY.subject, {}, mint(tokens))
    assert reply == {"records": [], "next_after_seq": None}


def test_a_service_serves_exactly_its_operations_of_the_table(tokens: TokenService) -> None:
    """serve_group refuses to start with an operation of the group missing, or one of another's."""

    async def handler(caller: Caller, request: Any) -> Any:
        raise AssertionError("never called")

    recall_ops = [op for op in OPERATIONS if op.queue_group == "recall"]
    Edge(tokens).serve_group("recall", [route(op, handler) for op in recall_ops])
    with pytest.raises(RuntimeError, match="operation table"):
        Edge(tokens).serve_group("recall", [route(op, handler) for op in recall_ops[1:]])
    with pytest.raises(RuntimeError, match="operation table"):
        Edge(tokens).serve_group("recall", [route(op, handler) for op in [*recall_ops, CONFIG_GET]])
    # Nor is an operation served twice in one process (two services registering it).
    edge = Edge(tokens)
    edge.serve_group("recall", [route(op, handler) for op in recall_ops])
    with pytest.raises(RuntimeError, match="served twice"):
        edge.serve(recall_ops[0], handler)


async def test_a_subject_the_edge_does_not_serve_has_no_responders(edge: Edge) -> None:
    with pytest.raises(NoRespondersError):
        await edge.request("engram.nothing", b"{}")


def test_every_operation_names_a_real_permission() -> None:
    assert {op.permission for op in OPERATIONS} <= KNOWN_PERMISSIONS
