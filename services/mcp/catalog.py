"""The MCP tools, from the operation table: every operation with an ``mcp_tool`` is a tool of that
name, described by its ``mcp_description``, calling that operation (``server.py`` binds each name to
its implementation, and fails at build time if the table names a tool it lacks).

What the table does not say is here, once per tool: which of the request's fields an agent may set
(and what each means to an agent) and what the structured result carries (``shapes.py`` derives
both from the operation's models). The agent config, session and principal are never arguments:
they come from the caller (``caller.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from contracts.governance import DeleteRequest, ListRequest
from contracts.operations import OPERATIONS, Operation
from contracts.recall import ExpandRequest, FeedbackReply, FeedbackRequest, RecallRequest
from contracts.requests import Accepted, SaveEntry, SaveOutcome
from services.mcp.shapes import (
    ExpandResult,
    ForgetResult,
    ListResult,
    RecallToolResult,
    ToolArguments,
    arguments,
)

__all__ = ["TOOLS", "ToolDecl"]


@dataclass(frozen=True)
class ToolDecl:
    name: str
    operation: Operation[Any, Any]
    #: What the agent may send; anything else is refused with the names allowed.
    arguments: type[ToolArguments]
    #: The structured result (the tool's output schema): a model, or a union of models.
    result: Any

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


# remember saves one entry: its arguments are an entry's, not the save request's.
_SHAPES: dict[str, tuple[type[ToolArguments], Any]] = {
    "remember": (
        arguments(
            "remember",
            SaveEntry,
            {
                "text": "The memory.",
                "importance": "0 (trivia) to 1 (critical).",
                "memory_type": "e.g. semantic, preference, procedural.",
            },
        ),
        # A waiting save answers its outcome, or 202 when distill took longer than the wait.
        Accepted | SaveOutcome,
    ),
    "recall": (
        arguments(
            "recall",
            RecallRequest,
            {
                "cue": "What you are about to do, in your words.",
                "strategy": "Default: hybrid with a cue, else the agent config's strategy.",
                "token_budget": "Most tokens the memories may take.",
                "format": "How each memory is rendered.",
                "top_k": "Most memories to return.",
            },
        ),
        RecallToolResult,
    ),
    "expand": (arguments("expand", ExpandRequest, {"ids": "Memory ids from recall."}), ExpandResult),
    "forget": (
        arguments("forget", DeleteRequest, {"entry_id": "The id of the memory to erase."}),
        ForgetResult,
    ),
    "list_memories": (
        arguments(
            "list_memories",
            ListRequest,
            {
                "page_size": "Memories per page.",
                "page_token": "next_page_token of the previous page.",
                "memory_types": "Only these memory types.",
                "lifecycle": "Only these lifecycles (default active; superseded: knowledge replaced since).",
            },
        ),
        ListResult,
    ),
    "memory_feedback": (
        arguments(
            "memory_feedback",
            FeedbackRequest,
            {
                "success": "True if the memory helped, false if it misled.",
                "entry_id": "The recalled memory; omit to rate the whole session.",
            },
        ),
        FeedbackReply,
    ),
}


def _tool(operation: Operation[Any, Any]) -> ToolDecl:
    assert operation.mcp_tool is not None
    if operation.mcp_tool not in _SHAPES:
        raise TypeError(
            f"the operation table declares MCP tool {operation.mcp_tool!r} without arguments here"
        )
    args, result = _SHAPES[operation.mcp_tool]
    return ToolDecl(operation.mcp_tool, operation, args, result)


TOOLS: tuple[ToolDecl, ...] = tuple(_tool(op) for op in OPERATIONS if op.mcp_tool)
