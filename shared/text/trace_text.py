"""How a tool call reads as text, wherever Engram writes one down: an observation, a line of the
trace summary a model reads, a built-in lesson.

One place, so that a call without input reads ``refund_payment()`` everywhere (never
``refund_payment(null)``), a call that returned nothing shows no ``-> null``, and every cut
keeps clear of PII values (docs/adr/0078-distilled-text-artefacts.md).
"""

from __future__ import annotations

import json
import re

from contracts.events import ToolCall
from shared.text.policy import clip_outside_pii

__all__ = ["as_json", "call_head", "clip", "is_nothing", "one_line", "output_text"]

_SPACE_RE = re.compile(r"\s+")


def is_nothing(value: object) -> bool:
    """Whether a call's input or output says nothing: absent, ``null``, or an empty string,
    object or list."""
    return value is None or (isinstance(value, str | dict | list) and not value)


def call_head(call: ToolCall, limit: int) -> str:
    """``tool(<input as compact JSON>)``, the input cut to ``limit`` characters; ``tool()``
    when it had none."""
    shown = "" if is_nothing(call.input) else clip(one_line(as_json(call.input)), limit)
    return f"{call.tool}({shown})"


def output_text(value: object, limit: int) -> str:
    """A call's output on one line, cut to ``limit``: strings as they are, anything else as JSON;
    empty when it had none."""
    if is_nothing(value):
        return ""
    return clip(one_line(value if isinstance(value, str) else as_json(value)), limit)


def as_json(value: object) -> str:
    """Compact, key-sorted JSON, so the same call always renders the same."""
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"), default=str)


def one_line(text: str) -> str:
    return _SPACE_RE.sub(" ", text).strip()


def clip(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, never through a PII value: half a card number would
    no longer be recognised, and so no longer redacted, downstream."""
    return clip_outside_pii(text, limit)
