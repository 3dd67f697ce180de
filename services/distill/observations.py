"""Observations (SPEC 4.1): a session's raw tool activity kept as ``layer="observation"`` entries,
so recall can target what happened, not only what was learned. They go through the same save
path as lessons (so PII redaction and quarantine apply) and expire after a short retention."""

from __future__ import annotations

import json

from contracts.events import SessionEnded, ToolCall
from services.distill.save_path import Draft
from shared.policy import clip_outside_pii

__all__ = ["OBSERVATION_IMPORTANCE", "observation_drafts"]

#: Observations are raw activity: cheap to keep, short-lived, and ranked below lessons.
OBSERVATION_IMPORTANCE = 0.3
_FIELD_CHARS = 300


def observation_drafts(session: SessionEnded) -> list[Draft]:
    """One observation per tool call of the trace."""
    return [_observation(i, call, session) for i, call in enumerate(session.tool_trace)]


def _short(value: object) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    # Never through a PII value: half a card number would no longer be redacted downstream.
    return clip_outside_pii(text, _FIELD_CHARS + 1)


def _observation(index: int, call: ToolCall, session: SessionEnded) -> Draft:
    outcome = f"error: {_short(call.error)}" if call.error else f"-> {_short(call.output)}"
    return Draft(
        text=f"{call.tool}({_short(call.input)}) {outcome}",
        importance=OBSERVATION_IMPORTANCE,
        memory_type="episodic",
        layer="observation",
        metadata={"call_index": index, "tool": call.tool, "failed": call.error is not None},
        occurred_at=session.occurred_at,
    )
