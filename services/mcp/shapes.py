"""What the MCP tools take and give, derived from the operation table's request and reply models.

A tool's arguments are the fields of its operation's request that an agent may set, copied with
their types and bounds (so a bound is written once, in ``contracts``) and with a sentence for the
agent; any other argument is refused, never ignored. A tool's structured result is a projection
of the operation's reply: the ids and metadata it carries, and memory text only inside the
``context`` data block (``services/mcp/server.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import GenericAlias
from typing import Any, get_args
from uuid import UUID

from mcp.server.mcpserver.utilities.func_metadata import ArgModelBase, FuncMetadata
from pydantic import BaseModel, ConfigDict, Field, create_model
from pydantic.fields import FieldInfo

from contracts.governance import EntryView, Page, PurgeReceipt
from contracts.recall import ExpandReply, RecallReply, RecallResult

__all__ = [
    "ExpandResult",
    "ForgetResult",
    "ListResult",
    "RecallToolResult",
    "ToolArguments",
    "ToolMetadata",
    "ToolResult",
    "arguments",
    "projection",
]


class ToolArguments(ArgModelBase):
    """A tool's arguments (the SDK's base for them, which validates and hands them over one level
    deep): an argument outside the schema is an error, as a field outside a request is."""

    model_config = ConfigDict(extra="forbid")


class ToolMetadata(FuncMetadata):
    """The SDK's per-tool metadata (argument model, output model and schema), given our models."""

    @classmethod
    def of(cls, arguments: type[ToolArguments], result: Any) -> ToolMetadata:
        """``result`` is a model or a union of models (remember: accepted, or its outcome)."""
        metadata = cls(arg_model=arguments, output_model=result)
        assert metadata.output_schema is not None
        if "type" not in metadata.output_schema:
            # MCP wants an object at the root; a union's alternatives all are, so this holds.
            metadata.output_schema = {"type": "object", **metadata.output_schema}
        return metadata

    def pre_parse_json(self, data: dict[str, Any]) -> dict[str, Any]:
        """The SDK reads JSON out of a string given for any argument not typed plain ``str`` (some
        clients send lists as JSON text); a string for an argument that takes strings stays the
        string it is — a cue of ``'["a", "b"]'`` is text, not a list to refuse."""
        parsed = super().pre_parse_json(data)
        fields = self.arg_model.model_fields
        return {
            key: data[key]
            if isinstance(data[key], str) and key in fields and _takes_text(fields[key])
            else value
            for key, value in parsed.items()
        }


def _takes_text(field: FieldInfo) -> bool:
    return field.annotation is str or str in get_args(field.annotation)


class ToolResult(BaseModel):
    """A tool's structured result; read from the reply's attributes."""

    model_config = ConfigDict(frozen=True, from_attributes=True)


def _fields(source: type[BaseModel], names: Iterable[str]) -> dict[str, tuple[Any, FieldInfo]]:
    # A name the source lacks fails here, when the module is imported, not at the first call.
    return {name: (source.model_fields[name].annotation, source.model_fields[name]) for name in names}


def arguments(tool: str, source: type[BaseModel], described: Mapping[str, str]) -> type[ToolArguments]:
    """The arguments of ``tool``: the fields of ``source`` (a request model) that ``described``
    names, each with its type, default and bounds from ``source`` and its description for the agent."""
    fields = {
        name: (annotation, FieldInfo.merge_field_infos(info, description=described[name]))
        for name, (annotation, info) in _fields(source, described).items()
    }
    return create_model(f"{tool}_arguments", __base__=ToolArguments, **fields)  # type: ignore[call-overload,no-any-return]


def projection(name: str, source: type[BaseModel], keep: Iterable[str], **added: Any) -> type[ToolResult]:
    """A result model with the fields ``keep`` of ``source`` (a reply model) as they are, and the
    ``added`` fields (``name=(type, default or ...)``)."""
    return create_model(name, __base__=ToolResult, **_fields(source, keep), **added)  # type: ignore[call-overload,no-any-return]


def _list_of(item: type[BaseModel]) -> Any:
    """``list[item]`` of a model made at run time (which a type checker cannot name)."""
    return GenericAlias(list, (item,))


_CONTEXT = (str, Field(description="The memories' text inside the <engram-memory> data block ('' for none)."))
_RECALLED = ("id", "score", "memory_type", "content_truncated", "quarantined")
_LISTED = (
    "id",
    "memory_type",
    "importance",
    "lifecycle",
    "pinned",
    "created_at",
    "quarantined",
    # knowledge updates: what this memory replaced, and what replaced it
    "supersedes",
    "superseded_by",
)

RecallToolResult = projection(
    "recall_result",
    RecallReply,
    ("context", "strategy", "count", "matched_count", "tokens_used", "truncated", "warnings"),
    results=(_list_of(projection("recalled", RecallResult, _RECALLED)), ...),
)
ExpandResult = projection(
    "expand_result", ExpandReply, ("truncated", "not_found"), ids=(list[UUID], ...), context=_CONTEXT
)
ListResult = projection(
    "list_memories_result",
    Page,
    ("next_page_token",),
    entries=(_list_of(projection("listed", EntryView, _LISTED)), ...),
    context=_CONTEXT,
)
#: The receipt without whose memory it was (the token says who; no tool names a principal).
ForgetResult = projection(
    "forget_result", PurgeReceipt, (name for name in PurgeReceipt.model_fields if name != "actor_ref")
)
