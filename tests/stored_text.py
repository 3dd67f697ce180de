"""What text Engram stores from a trace must not look like, checked by unit and integration tests
alike: a literal ``null`` where a call had no input or output, and a redaction placeholder that
is not where a value stood (docs/adr/0078-distilled-text-artefacts.md)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from shared.text.policy import PII_KINDS

__all__ = ["artefacts", "readme_http_trace"]

README = Path(__file__).resolve().parents[1] / "README.md"
_PLACEHOLDER = "\\[(?:" + "|".join(PII_KINDS) + ")\\]"
#: The built-in lessons quote what a tool said ('…'); a value redacted inside a quote is in place.
_QUOTED = re.compile(r"'[^']*'")
_NULL = re.compile(r"\bnull\b")
_ENDS_ON_PLACEHOLDER = re.compile(_PLACEHOLDER + r"\W*$")


def readme_http_trace() -> list[dict[str, Any]]:
    """The ``tool_trace`` of the session the README's "HTTP API" section posts, as written there."""
    match = re.search(r'"tool_trace": (\[.*?\])\}\'\n', README.read_text())
    assert match is not None, "the README's HTTP example no longer posts a session with a tool_trace"
    trace: list[dict[str, Any]] = json.loads(match.group(1))
    return trace


def artefacts(text: str, *, sentence: bool = True) -> list[str]:
    """What is wrong with one stored text (empty when nothing is).

    ``sentence``: a lesson is a sentence and must not end on a placeholder outside a quoted
    value; an observation (``sentence=False``) is a record of a call, whose error or output
    ends where the tool's own text ended, redacted value or not. Meant for the demo's and the
    README's sessions, none of which holds the word ``null`` itself.
    """
    problems: list[str] = []
    if _NULL.search(text):
        problems.append("a literal null")
    if sentence and _ENDS_ON_PLACEHOLDER.search(_QUOTED.sub("'…'", text)):
        problems.append("ends on a placeholder outside a quoted value")
    words = text.split()
    placeholders = sum(bool(re.search(_PLACEHOLDER, word)) for word in words)
    if placeholders and placeholders * 2 >= len(words):
        problems.append("mostly placeholders")
    return problems
