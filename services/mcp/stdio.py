"""``engram mcp``: the MCP server over stdio for one desktop agent, whose token is given when the
process starts (``ENGRAM_TOKEN``). Logs go to stderr; stdout carries only JSON-RPC."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import anyio

from contracts.connection import ConnectionInfo
from contracts.nats_connect import connect_nats
from services.mcp.caller import Caller, FixedCaller
from services.mcp.early import EarlyStdio
from services.mcp.server import build_server

__all__ = ["serve_stdio"]

log = logging.getLogger("engram.mcp")


async def serve_stdio(info: ConnectionInfo, caller: Caller, early: EarlyStdio | None = None) -> None:
    """Serve MCP on stdin/stdout until the client closes them, reaching Engram at ``info``; with
    ``early``, on the wire it holds, after the ``initialize`` it may have answered
    (``services/mcp/early.py``)."""
    # A refused NATS identity fails at once, naming authorization, rather than retrying.
    nc = await connect_nats(info.nats_url, name="engram-mcp", **info.nats_options())
    try:
        server = build_server(nc, FixedCaller(caller))
        if early is None:
            await server.run_stdio_async()
        else:
            await server.run_stdio_async(_Replayed(early), _Answered(early))
    finally:
        await nc.drain()


class _Replayed:
    """The wire's lines for the SDK, the one ``EarlyStdio`` read first included."""

    def __init__(self, early: EarlyStdio) -> None:
        self._early = early

    async def __aiter__(self) -> AsyncIterator[str]:
        if not self._early.first_line:
            return
        yield self._early.first_line.decode("utf-8", "replace")
        rest = anyio.wrap_file(io.TextIOWrapper(self._early.stdin, encoding="utf-8", errors="replace"))
        async for line in rest:
            yield line


class _Answered:
    """The wire for the SDK's messages, without its reply to the ``initialize`` already answered."""

    def __init__(self, early: EarlyStdio) -> None:
        self._early = early
        self._pending = early.answered
        self._out = anyio.wrap_file(io.TextIOWrapper(early.stdout, encoding="utf-8"))

    async def write(self, text: str) -> None:
        if self._pending is not None and self._drops(text, self._pending):
            self._pending = None
            return
        await self._out.write(text)

    async def flush(self) -> None:
        await self._out.flush()

    @staticmethod
    def _drops(text: str, sent: dict[str, Any]) -> bool:
        try:
            reply = json.loads(text)
        except ValueError:
            return False
        if not isinstance(reply, dict) or reply.get("id") != sent["id"] or "method" in reply:
            return False
        if reply != sent:
            log.warning(
                "engram mcp answered initialize with %s, the MCP SDK with %s: services/mcp/initialize.json "
                "is stale (make schema)",
                json.dumps(sent),
                text.strip(),
            )
        return True
