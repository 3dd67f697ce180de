"""The MCP tools, from the operation table: every operation with an ``mcp_tool`` is a tool of that
name, described by its ``mcp_description``, calling that operation (``server.py`` binds each name to
its implementation, and fails at build time if the table names a tool it lacks)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from contracts.operations import OPERATIONS, Operation

__all__ = ["TOOLS", "ToolDecl"]


@dataclass(frozen=True)
class ToolDecl:
    name: str
    operation: Operation[Any, Any]

    @property
    def description(self) -> str:
        assert self.operation.mcp_description is not None
        return self.operation.mcp_description

    @property
    def read_only(self) -> bool:
        return self.operation.permission == "memory.read"

    @property
    def destructive(self) -> bool:
        return self.operation.http_method == "DELETE"


TOOLS: tuple[ToolDecl, ...] = tuple(ToolDecl(op.mcp_tool, op) for op in OPERATIONS if op.mcp_tool)
