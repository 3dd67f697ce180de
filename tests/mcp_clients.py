"""How tests reach the MCP server as an agent would, with the SDK's own client: in-process (the
stdio shape: one caller fixed per server), ``engram mcp`` as a real stdio subprocess, or over
streamable HTTP under uvicorn on a real port (the caller in each request's headers); and how they
read tool results."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import uvicorn
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult, TextContent
from nats.aio.client import Client as Nats
from starlette.applications import Starlette

from services.mcp import Caller, FixedCaller, build_server
from services.mcp.caller import AGENT_CONFIG_HEADER, SESSION_HEADER
from shared.embedded.nats_server import NatsServerProcess
from tests.platform import eventually

__all__ = [
    "ENGRAM",
    "code_of",
    "connection_file",
    "error_of",
    "in_process",
    "ok",
    "over_http",
    "over_stdio",
    "serving",
    "text_of",
]

ENGRAM = Path(sys.executable).with_name("engram")


def in_process(nc: Nats, caller: Caller) -> Client:
    """An agent on an in-process server. Enter it in the test itself: anyio's task groups must
    close in the task that opened them (a yielding async fixture would not)."""
    return Client(build_server(nc, FixedCaller(caller)))


def connection_file(nats_proc: NatsServerProcess, path: Path) -> Path:
    """A client file (as ``engram credentials mint`` writes one) for ``nats_proc``'s platform
    client identity, at ``path``; it holds no token."""
    identity = getattr(nats_proc, "client", None)
    info: dict[str, Any] = {"nats_url": nats_proc.url}
    if identity is not None:
        info |= {"nats_nkey_seed": identity.seed, "nats_inbox_prefix": identity.inbox_prefix}
    path.write_text(json.dumps(info))
    return path


def over_stdio(connection: Path, caller: Caller | None) -> Client:
    """An agent launching ``engram mcp --connection <connection>`` as a desktop agent does, with
    ``caller``'s token and agent config in its environment (none of it without a caller)."""
    env = {"PATH": os.environ.get("PATH", ""), "ENGRAM_CONNECTION_FILE": str(connection)}
    if caller is not None:
        env |= {"ENGRAM_TOKEN": caller.token, "ENGRAM_AGENT_CONFIG_ID": str(caller.agent_config_id)}
        if caller.session_id is not None:
            env["ENGRAM_SESSION_ID"] = caller.session_id
    params = StdioServerParameters(command=str(ENGRAM), args=["mcp"], env=env)
    return Client(params, read_timeout_seconds=60)


def over_http(url: str, caller: Caller | None = None, **headers: str) -> Client:
    """An agent reaching ``url`` with ``caller`` in its headers (and any ``headers`` besides)."""
    sent = dict(headers)
    if caller is not None:
        sent["Authorization"] = f"Bearer {caller.token}"
        sent[AGENT_CONFIG_HEADER] = str(caller.agent_config_id)
        if caller.session_id is not None:
            sent[SESSION_HEADER] = caller.session_id
    return Client(streamable_http_client(url, http_client=httpx2.AsyncClient(headers=sent, timeout=30)))


@asynccontextmanager
async def serving(app: Starlette, *, lifespan: str = "on") -> AsyncIterator[str]:
    """``app`` under uvicorn on a free local port; yields the MCP endpoint's URL."""
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan=lifespan)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())

    async def started() -> bool:
        return server.started

    try:
        await eventually(started, what="uvicorn listening")
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        server.should_exit = True
        await task


def text_of(result: CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, TextContent))


def code_of(result: CallToolResult) -> str:
    """``OK``, the SPEC 9 code of a tool error, or ``UNTYPED`` for an error without the envelope
    (a crash the agent cannot act on)."""
    if not result.is_error:
        return "OK"
    error = (result.structured_content or {}).get("error")
    return str(error["code"]) if isinstance(error, dict) else "UNTYPED"


def error_of(result: CallToolResult) -> dict[str, Any]:
    assert result.is_error, text_of(result)
    assert result.structured_content is not None
    error: dict[str, Any] = result.structured_content["error"]
    return error


def ok(result: CallToolResult) -> dict[str, Any]:
    assert not result.is_error, text_of(result)
    assert result.structured_content is not None
    return result.structured_content
