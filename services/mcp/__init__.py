"""The MCP server (``engram mcp``): Engram's memory operations as tools for an agent, over stdio
and streamable HTTP. It holds no business logic: each tool is one NATS request-reply with the
caller's token, exactly what a NATS client would send.

The names below are imported on first use: ``engram mcp`` imports ``services.mcp.early`` (the
standard library only) before the MCP SDK (docs/adr/0092-commands-that-start-fast.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from services.mcp.caller import Caller, CallerSource, FixedCaller, HeaderCaller
    from services.mcp.server import build_server, streamable_http_app

__all__ = ["Caller", "CallerSource", "FixedCaller", "HeaderCaller", "build_server", "streamable_http_app"]

_HOME = {"build_server": "services.mcp.server", "streamable_http_app": "services.mcp.server"}


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    # ``__import__``, not ``importlib.import_module``: ``python -X importtime`` lists only the former
    # (tests/unit/test_startup_imports.py reads it).
    value = getattr(__import__(_HOME.get(name, "services.mcp.caller"), fromlist=[name]), name)
    globals()[name] = value
    return value
