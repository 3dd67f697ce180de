"""Observations (SPEC 4.1): a session's raw tool activity kept as ``layer="observation"`` entries,
so recall can target what happened, not only what was learned. They go through the same save
path as lessons (so PII redaction and quarantine apply) and expire after a short retention."""

from __future__ import annotations

from contracts.events import SessionEnded, ToolCall
from services.distill.save_path import Draft
from shared.text.trace_text import call_head, clip, one_line, output_text

__all__ = ["OBSERVATION_IMPORTANCE", "observation_drafts"]

#: Observations are raw activity: cheap to keep, short-lived, and ranked below lessons.
OBSERVATION_IMPORTANCE = 0.3
_FIELD_CHARS = 300


def observation_drafts(session: SessionEnded) -> list[Draft]:
    """One observation per tool call of the trace."""
    return [_observation(i, call, session) for i, call in enumerate(session.tool_trace)]


def _text(call: ToolCall) -> str:
    """``tool(input) error: …``, ``tool(input) -> output``, or ``tool(input)`` when it worked and
    returned nothing."""
    head = call_head(call, _FIELD_CHARS)
    if call.error:
        return f"{head} error: {clip(one_line(call.error), _FIELD_CHARS)}"
    output = output_text(call.output, _FIELD_CHARS)
    return f"{head} -> {output}" if output else head


def _observation(index: int, call: ToolCall, session: SessionEnded) -> Draft:
    return Draft(
        text=_text(call),
        importance=OBSERVATION_IMPORTANCE,
        memory_type="episodic",
        layer="observation",
        metadata={"call_index": index, "tool": call.tool, "failed": call.error is not None},
        occurred_at=session.occurred_at,
    )
