"""Record what the MCP SDK answers ``initialize`` with for Engram's server:
``services/mcp/initialize.json``, from which ``engram mcp`` answers before the SDK is loaded
(``services/mcp/early.py``).

    python -m services.mcp.initialize_export            # (re)write the file
    python -m services.mcp.initialize_export --check    # exit 1 if the file is missing or stale

The answer is taken from the SDK itself — the server ``engram mcp`` serves, over the SDK's stdio
transport, asked ``initialize`` as a client asks — for each protocol version it negotiates.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator, Sequence
from typing import Any, cast
from uuid import UUID

import anyio
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from nats.aio.client import Client

from contracts.schema_export import document_main
from services.mcp.caller import Caller, FixedCaller
from services.mcp.early import INITIALIZE_RECORD
from services.mcp.server import build_server

__all__ = ["build_record", "initialize_request", "main", "sdk_answer"]


class _Lines:
    def __init__(self, lines: Sequence[str]) -> None:
        self._lines = lines

    async def __aiter__(self) -> AsyncIterator[str]:
        for line in self._lines:
            yield line


class _Written:
    def __init__(self) -> None:
        self.lines: list[str] = []

    async def write(self, text: str) -> None:
        self.lines.append(text)

    async def flush(self) -> None:
        return None


def sdk_answer(request: dict[str, Any]) -> dict[str, Any]:
    """The SDK's reply to ``request`` (one JSON-RPC message), from the server ``engram mcp`` runs."""
    # The tools reach Engram only when called; initialize calls none, so no connection is needed.
    server = build_server(cast(Client, None), FixedCaller(Caller(token="", agent_config_id=UUID(int=0))))
    written = _Written()

    async def serve() -> None:
        await server.run_stdio_async(_Lines([json.dumps(request) + "\n"]), written)

    anyio.run(serve)
    replies = [json.loads(line) for line in written.lines]
    answer = [r for r in replies if isinstance(r, dict) and r.get("id") == request.get("id")]
    if len(answer) != 1:
        raise RuntimeError(f"the MCP SDK answered initialize with {replies!r}")
    reply: dict[str, Any] = answer[0]
    return reply


def initialize_request(version: str) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": version,
            "capabilities": {},
            "clientInfo": {"name": "engram-initialize-export", "version": "0"},
        },
    }


def build_record() -> dict[str, Any]:
    """The SDK's result for each protocol version its ``initialize`` negotiates (the result may
    be written differently for each)."""
    answers = {version: sdk_answer(initialize_request(version)) for version in HANDSHAKE_PROTOCOL_VERSIONS}
    return {"results": {version: answer["result"] for version, answer in answers.items()}}


def main(argv: Sequence[str] | None = None) -> int:
    return document_main(
        argv,
        path=INITIALIZE_RECORD,
        build=build_record,
        prog="services.mcp.initialize_export",
        description=__doc__,
    )


if __name__ == "__main__":
    sys.exit(main())
