"""Trace summary (SPEC 4.1): the at most 25 most informative calls of a session, rendered compactly.

A trace can hold 2,000 calls; a model gets the ones that teach something. Each call is scored
and the best ``limit`` are kept, then rendered in trace order so cause and effect stay readable.
"""

from __future__ import annotations

import re

from contracts.events import SessionEnded, ToolCall
from shared.ports import TraceSummary
from shared.text.trace_text import as_json, call_head, clip, one_line, output_text

__all__ = ["DEFAULT_LIMIT", "score_calls", "summarize_trace"]

DEFAULT_LIMIT = 25

# Scores, chosen so that the categories rank in this order and never tie across categories:
# an error outranks everything else together, a recovery outranks an edge call, and so on.
_ERROR = 1000.0
_RECOVERY = 400.0
_REMEMBER = 200.0
_EDGE = 100.0
_NEW_TOOL = 20.0
_OUTPUT_LENGTH_MAX = 5.0
_OUTPUT_LENGTH_FULL_AT = 2000

_INPUT_CHARS = 200
_OUTPUT_CHARS = 300
_ERROR_CHARS = 300
_TASK_CHARS = 500

_REMEMBER_RE = re.compile(r"\bremember\b|\bnote to self\b", re.IGNORECASE)


def summarize_trace(session: SessionEnded, limit: int = DEFAULT_LIMIT) -> TraceSummary:
    """Keep the ``limit`` most informative calls of ``session.tool_trace`` and render them.

    Informative means, in this order: calls that failed, a success of a tool right after it
    failed (a recovery), calls mentioning "remember", the first and the last call, the first
    call of each distinct tool, and slightly, longer outputs. Ties go to the earlier call, so
    the same session always gives the same summary.
    """
    if limit < 0:
        raise ValueError("limit must not be negative")
    trace = session.tool_trace
    scores = score_calls(trace)
    best = sorted(range(len(trace)), key=lambda i: (-scores[i], i))[:limit]
    kept = tuple(sorted(best))

    def render() -> str:
        lines = [
            f"Task: {clip(one_line(session.task), _TASK_CHARS) or '(none given)'} "
            f"| status: {session.status} | steps: {session.steps}",
            f"kept {len(kept)} of {len(trace)} calls (errors, recoveries, first/last, distinct tools)",
            *(_render_call(i, trace[i]) for i in kept),
        ]
        return "\n".join(lines)

    return TraceSummary(kept_indexes=kept, total_calls=len(trace), render=render)


def score_calls(trace: list[ToolCall]) -> list[float]:
    """How informative each call is (higher is more); see :func:`summarize_trace`."""
    scores: list[float] = []
    seen_tools: set[str] = set()
    last_failed: dict[str, bool] = {}
    for index, call in enumerate(trace):
        input_text, output_text = _json_text(call.input), _json_text(call.output)
        score = 0.0
        if call.error is not None:
            score += _ERROR
        elif last_failed.get(call.tool, False):
            score += _RECOVERY
        if _REMEMBER_RE.search(input_text) or _REMEMBER_RE.search(output_text):
            score += _REMEMBER
        if index in (0, len(trace) - 1):
            score += _EDGE
        if call.tool not in seen_tools:
            score += _NEW_TOOL
        score += _OUTPUT_LENGTH_MAX * min(len(output_text), _OUTPUT_LENGTH_FULL_AT) / _OUTPUT_LENGTH_FULL_AT
        scores.append(score)
        seen_tools.add(call.tool)
        last_failed[call.tool] = call.error is not None
    return scores


def _render_call(index: int, call: ToolCall) -> str:
    line = f"#{index} {call_head(call, _INPUT_CHARS)}"
    output = output_text(call.output, _OUTPUT_CHARS)
    if output:
        line += f" -> {output}"
    if call.error is not None:
        line += f" [ERROR: {clip(one_line(call.error), _ERROR_CHARS)}]"
    return line


def _json_text(value: object) -> str:
    """Strings as they are; anything else as JSON (see :func:`~shared.text.trace_text.as_json`)."""
    return value if isinstance(value, str) else as_json(value)
