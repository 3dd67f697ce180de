"""The MCP server (``engram mcp``): Engram's memory operations as tools for an agent, over stdio
and streamable HTTP. It holds no business logic: each tool is one NATS request-reply with the
caller's token, exactly what a NATS client would send."""

from services.mcp.caller import Caller, CallerSource, FixedCaller, HeaderCaller
from services.mcp.server import build_server, streamable_http_app

__all__ = ["Caller", "CallerSource", "FixedCaller", "HeaderCaller", "build_server", "streamable_http_app"]
