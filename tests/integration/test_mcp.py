"""The MCP server through the SDK's own client: in-process sessions against the real stack (NATS,
Postgres, every service), and ``engram mcp`` as a real stdio subprocess."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import pytest
from mcp import Client
from nats.aio.client import Client as Nats
from prometheus_client import REGISTRY

from contracts.operations import OPERATIONS, by_mcp_tool
from services.mcp import Caller
from services.mcp.catalog import TOOLS
from shared.embedded.nats_server import NatsServerProcess
from shared.security.auth import ALL_PERMISSIONS, TokenService
from shared.security.nats_auth.keys import new_user_seed
from shared.service.infra import Infra
from shared.text.memory_block import BLOCK_CLOSE, BLOCK_OPEN
from tests.mcp_clients import ENGRAM, code_of, connection_file, error_of, in_process, ok, over_stdio, text_of
from tests.platform import eventually
from tests.security.support import mint

pytestmark = pytest.mark.integration

RW = {"memory.read", "memory.write"}


@pytest.fixture
def alice(tokens: TokenService, org: UUID) -> str:
    return mint(tokens, org, "end_user:alice", RW)


@pytest.fixture
def session(engram: Infra, nc: Nats, alice: str, agent: UUID) -> Client:
    """Alice's agent."""
    return in_process(nc, Caller(token=alice, agent_config_id=agent))


async def test_the_tools_are_the_tables_and_never_ask_who_the_caller_is(session: Client) -> None:
    """The listed tools are exactly the operation table's ``mcp_tool`` entries, with its
    descriptions; no tool argument names an organization, principal or agent config (those come
    from the token and the server's configuration)."""
    table = {op.mcp_tool: op.mcp_description for op in OPERATIONS if op.mcp_tool}
    async with session:
        listed = (await session.list_tools()).tools
        assert [t.name for t in listed] == list(table)
        assert {t.name: t.description for t in listed} == table
        assert {t.name for t in listed} >= {
            "remember",
            "recall",
            "expand",
            "forget",
            "list_memories",
            "memory_feedback",
        }
        for tool in listed:
            props = set(tool.input_schema.get("properties", {}))
            assert not props & {"org_id", "org", "principal", "actor_ref", "agent_config_id", "token"}, (
                tool.name
            )


async def test_each_tool_calls_its_operation_and_nothing_else(session: Client) -> None:
    """Counting the requests Engram's edge answers, per operation, while each tool runs (the
    services run in this process): a tool sends exactly one request, of the operation the table
    names for it. The edge counts a request before it replies, so the count is final when the
    tool has answered. (Watching the request subjects from a second NATS connection instead
    missed a request the tool had been answered for in two loaded CI runs.)"""
    arguments = {
        "remember": {"text": "Backups run at 02:00 UTC."},
        "recall": {"cue": "backups"},
        "expand": {"ids": [str(uuid4())]},
        "forget": {"entry_id": str(uuid4())},
        "list_memories": {},
        "memory_feedback": {"entry_id": str(uuid4()), "success": True},
    }
    async with session:
        for decl in TOOLS:
            before = _answered()
            result = await session.call_tool(decl.name, arguments[decl.name])
            after = _answered()
            sent = {s: after[s] - before.get(s, 0.0) for s in after if after[s] != before.get(s, 0.0)}
            assert sent == {by_mcp_tool(decl.name).subject: 1.0}, (decl.name, text_of(result))


def _answered() -> dict[str, float]:
    """Requests the edge has answered so far, per operation's subject (any outcome)."""
    out: dict[str, float] = {}
    for metric in REGISTRY.collect():
        for sample in metric.samples:
            if sample.name == "engram_requests_total":
                subject = sample.labels["operation"]
                out[subject] = out.get(subject, 0.0) + sample.value
    return out


async def test_remember_recall_expand_list_feedback_forget(session: Client) -> None:
    """Each tool round-trips through Engram: a remembered lesson is recalled inside the data block,
    expanded and listed by id, rated, and forgotten for good."""
    async with session:
        lesson = "Refunds over 500 EUR need a second approver in the billing tool."
        saved = ok(await session.call_tool("remember", {"text": lesson, "importance": 0.8}))
        assert saved["saved"] == 1
        memory_id = saved["ids"][0]

        # hybrid finds an entry once it is embedded (both legs are in the vector store).
        async def recalled_it() -> bool:
            found = ok(await session.call_tool("recall", {"cue": "refund approval", "strategy": "hybrid"}))
            return bool(found["results"])

        await eventually(recalled_it, what="the lesson embedded")
        recalled = await session.call_tool("recall", {"cue": "refund approval", "strategy": "hybrid"})
        data = ok(recalled)
        assert [r["id"] for r in data["results"]] == [memory_id]
        # The result's text is its JSON; the lesson is inside the context's data block.
        assert json.loads(text_of(recalled)) == data
        assert lesson in _inside_block(data["context"])

        expanded = ok(await session.call_tool("expand", {"ids": [memory_id, str(uuid4())]}))
        assert expanded["ids"] == [memory_id]
        assert len(expanded["not_found"]) == 1
        assert lesson in _inside_block(expanded["context"])

        listed = ok(await session.call_tool("list_memories", {"page_size": 10}))
        assert [e["id"] for e in listed["entries"]] == [memory_id]
        assert lesson in _inside_block(listed["context"])

        helped = ok(await session.call_tool("memory_feedback", {"entry_id": memory_id, "success": True}))
        assert helped == {"updated": 0, "deleted": 0, "labelled": 0}  # recorded; nothing to decay
        misled = ok(await session.call_tool("memory_feedback", {"entry_id": memory_id, "success": False}))
        assert misled["updated"] == 1  # its reliability decayed

        forgotten = ok(await session.call_tool("forget", {"entry_id": memory_id}))
        assert forgotten["entries"] == 1
        assert ok(await session.call_tool("recall", {"strategy": "last_k"}))["results"] == []
        assert ok(await session.call_tool("expand", {"ids": [memory_id]}))["not_found"] == [memory_id]


def _inside_block(context: str) -> str:
    return context.split(BLOCK_OPEN, 1)[1].split(BLOCK_CLOSE, 1)[0]


async def test_remembering_twice_reinforces(session: Client) -> None:
    """The second identical remember is reported as reinforcement, not a second memory."""
    async with session:
        first = ok(await session.call_tool("remember", {"text": "Alice prefers store credit."}))
        second = await session.call_tool("remember", {"text": "Alice prefers store credit."})
        assert first["saved"] == 1
        assert ok(second)["reinforced"] == 1
        assert ok(second)["ids"] == first["ids"]


async def test_wire_errors_are_tool_errors(
    engram: Infra, nc: Nats, session: Client, tokens: TokenService, org: UUID, agent: UUID
) -> None:
    """SPEC 9 errors reach the agent as tool errors with their code and message; the session goes on."""
    async with session:
        missing = error_of(await session.call_tool("forget", {"entry_id": str(uuid4())}))
        assert missing["code"] == "NOT_FOUND"
        for args in ({"top_k": 5000}, {"strategy": "everything"}, {"format": 3}):
            invalid = error_of(await session.call_tool("recall", args))
            assert invalid["code"] == "INVALID_REQUEST", invalid
            assert invalid["details"]["fields"] == list(args), invalid
        bad_id = error_of(await session.call_tool("forget", {"entry_id": "not-a-uuid"}))
        assert bad_id["code"] == "INVALID_REQUEST"
        # A session rating needs a session, which this agent was not started with.
        unrated = error_of(await session.call_tool("memory_feedback", {"success": True}))
        assert unrated["code"] == "INVALID_REQUEST"
        assert ok(await session.call_tool("recall", {"strategy": "last_k"}))["results"] == []

        reader = mint(tokens, org, "end_user:alice", {"memory.read"})
        forged = "not-a-token"
        for token, tool, args, code in (
            (reader, "remember", {"text": "Deploys happen on Tuesdays."}, "FORBIDDEN"),
            (forged, "recall", {"strategy": "last_k"}, "UNAUTHENTICATED"),
            (forged, "list_memories", {}, "UNAUTHENTICATED"),
        ):
            async with in_process(nc, Caller(token=token, agent_config_id=agent)) as other:
                error = error_of(await other.call_tool(tool, args))
                assert error["code"] == code, (tool, error)
                assert error["message"]


async def test_unknown_arguments_are_refused_naming_the_allowed_ones(session: Client) -> None:
    """An argument a tool does not take (recall's ``query`` for ``cue``, as an agent guesses) is an
    ``INVALID_REQUEST`` tool error naming it and every argument the tool takes, for every tool, and
    nothing reaches Engram; the same call without it is answered."""
    valid: dict[str, dict[str, Any]] = {
        "remember": {"text": "Backups run at 02:00 UTC."},
        "recall": {"strategy": "last_k"},
        "expand": {"ids": [str(uuid4())]},
        "forget": {"entry_id": str(uuid4())},
        "list_memories": {},
        "memory_feedback": {"entry_id": str(uuid4()), "success": True},
    }
    async with session:
        listed = {t.name: list(t.input_schema["properties"]) for t in (await session.list_tools()).tools}
        for decl in TOOLS:
            before = _answered()
            refused = await session.call_tool(decl.name, {**valid[decl.name], "query": "backups"})
            assert _answered() == before, decl.name
            error = error_of(refused)
            assert error["code"] == "INVALID_REQUEST", (decl.name, error)
            assert error["details"] == {"fields": ["query"], "allowed": listed[decl.name]}, decl.name
            assert "query" in error["message"]
            assert all(name in error["message"] for name in listed[decl.name]), error["message"]
            assert "query" in text_of(refused)
            assert code_of(await session.call_tool(decl.name, valid[decl.name])) in {"OK", "NOT_FOUND"}


async def test_engram_mcp_over_stdio(
    engram: Infra, nats_proc: NatsServerProcess, alice: str, agent: UUID, tmp_path: Path
) -> None:
    """``engram mcp`` as a desktop agent runs it: a subprocess speaking MCP on stdin/stdout, the token
    from ``ENGRAM_TOKEN``, NATS and its identity from a connection file."""
    connection = connection_file(nats_proc, tmp_path / "client.json")
    async with over_stdio(connection, Caller(token=alice, agent_config_id=agent)) as client:
        names = [t.name for t in (await client.list_tools()).tools]
        assert names == [d.name for d in TOOLS]
        saved = ok(
            await client.call_tool("remember", {"text": "The staging database is read-only on Fridays."})
        )
        recalled = ok(await client.call_tool("recall", {"strategy": "last_k"}))
    assert [r["id"] for r in recalled["results"]] == saved["ids"]
    assert "read-only on Fridays" in recalled["context"]


def test_engram_mcp_with_a_refused_nats_identity_exits_naming_authorization(
    nats_proc: NatsServerProcess, tokens: TokenService, org: UUID, agent: UUID, tmp_path: Path
) -> None:
    """``engram mcp`` whose connection file holds an nkey the server does not know (revoked, or
    never minted) exits with UNAUTHENTICATED naming NATS authorization, after one refused login —
    not after nats-py's reconnect loop gives up minutes later."""
    if getattr(nats_proc, "client", None) is None:
        pytest.skip("this module's NATS server runs without authentication")
    connection = connection_file(nats_proc, tmp_path / "connection.json")
    info = json.loads(connection.read_text()) | {"nats_nkey_seed": new_user_seed()}
    connection.write_text(json.dumps(info))
    env = {
        "PATH": os.environ.get("PATH", ""),
        "ENGRAM_CONNECTION_FILE": str(connection),
        "ENGRAM_TOKEN": mint(tokens, org, "end_user:alice", {"memory.read"}),
        "ENGRAM_AGENT_CONFIG_ID": str(agent),
        "COLUMNS": "200",
    }
    started = subprocess.run(
        [str(ENGRAM), "mcp"], env=env, input="", capture_output=True, text=True, timeout=60, check=False
    )
    assert started.returncode != 0, started.stderr
    assert "UNAUTHENTICATED" in started.stderr, started.stderr[-2000:]
    assert "authorization" in started.stderr.lower(), started.stderr[-2000:]
    assert "Traceback" not in started.stderr
    assert started.stdout == ""


def test_engram_mcp_refuses_to_start_without_a_token(
    nats_proc: NatsServerProcess, tokens: TokenService, org: UUID, agent: UUID, tmp_path: Path
) -> None:
    """Without ``ENGRAM_TOKEN``, ``engram mcp`` exits at once saying to set it, although its
    connection file holds a token with every permission (``engram up``'s, for the operator): an
    agent never acts with that one by default."""
    connection = connection_file(nats_proc, tmp_path / "connection.json")
    operator = mint(tokens, org, "service:engram-dev", ALL_PERMISSIONS)
    info = json.loads(connection.read_text()) | {"token": operator, "agent_config_id": str(agent)}
    connection.write_text(json.dumps(info))
    # Wide, so the error box does not wrap the command it names.
    env = {"PATH": os.environ.get("PATH", ""), "ENGRAM_CONNECTION_FILE": str(connection), "COLUMNS": "200"}
    started = subprocess.run(
        [str(ENGRAM), "mcp"],
        env=env,
        input="",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert started.returncode != 0, started.stderr
    assert "ENGRAM_TOKEN" in started.stderr
    assert "engram token mint" in started.stderr
    assert started.stdout == ""  # nothing spoken on the MCP channel
