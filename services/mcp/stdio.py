"""``engram mcp``: the MCP server over stdio for one desktop agent, whose token is given when the
process starts (``ENGRAM_TOKEN``). Logs go to stderr; stdout carries only JSON-RPC."""

from __future__ import annotations

from contracts.connection import ConnectionInfo
from contracts.nats_connect import connect_nats
from services.mcp.caller import Caller, FixedCaller
from services.mcp.server import build_server

__all__ = ["serve_stdio"]


async def serve_stdio(info: ConnectionInfo, caller: Caller) -> None:
    """Serve MCP on stdin/stdout until the client closes them, reaching Engram at ``info``."""
    # A refused NATS identity fails at once, naming authorization, rather than retrying.
    nc = await connect_nats(info.nats_url, name="engram-mcp", **info.nats_options())
    try:
        await build_server(nc, FixedCaller(caller)).run_stdio_async()
    finally:
        await nc.drain()
