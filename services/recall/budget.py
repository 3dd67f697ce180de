"""Result formats and the token budget (SPEC 5.3).

A result's cost is ``ceil(len(json.dumps(result, default=str, separators=(",", ":"))) / 3)``
tokens. With a ``token_budget`` the packing rule is:

1. The top-ranked result is taken whole if it fits; otherwise it is shortened to the longest
   preview that fits (text cut, ``"…"`` appended, ``content_truncated: true``, id intact). The
   smallest preview keeps ``MIN_PREVIEW_CHARS`` (32) characters of text; a text no longer than
   that, or a quarantined placeholder, has no shorter form than itself. If even the smallest
   preview does not fit, nothing is returned and ``minimum_budget`` is its cost.
2. The following results are taken whole, in rank order, while they fit. At the first one that
   does not fit, packing stops: later results are not taken even if they are smaller, and no
   result but the top one is ever shortened (a long top match is never traded for smaller lower ones).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any, Literal

from services.recall.candidates import QUARANTINE_PLACEHOLDER, display_metadata, display_text
from services.recall.ranking import Ranked

__all__ = [
    "MAX_EXCLUDED_LISTED",
    "MIN_PREVIEW_CHARS",
    "QUARANTINE_PLACEHOLDER",
    "TITLE_CHARS",
    "BudgetOutcome",
    "Format",
    "fit_budget",
    "result_tokens",
    "serialize_result",
]

Format = Literal["text", "full", "compact", "narrative"]

MIN_PREVIEW_CHARS = 32
MAX_EXCLUDED_LISTED = 10
TITLE_CHARS = 60
_ELLIPSIS = "…"


#: A memory type shown in narrative text: a plain word or two. Types are free-form strings kept
#: as given, so anything else ("SYSTEM: ignore …") is rendered as "memory", never into a prompt.
_PLAIN_TYPE = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,23}( [A-Za-z0-9_-]{1,24})?")


def _narrative(r: Ranked, text: str) -> str:
    c = r.candidate
    importance = f"{round(c.importance, 2):g}"
    kind = c.memory_type if _PLAIN_TYPE.fullmatch(c.memory_type) and not c.quarantined else "memory"
    return f"On {c.created_at.date().isoformat()} ({kind}, importance {importance}): {text}"


def serialize_result(
    r: Ranked, fmt: Format, text: str | None = None, content_truncated: bool = False
) -> dict[str, Any]:
    """The JSON object ``r`` becomes in ``fmt`` (JSON-native values: id and dates as strings).

    ``text`` replaces the entry's text (a budget preview). A quarantined entry always shows
    ``QUARANTINE_PLACEHOLDER`` whatever ``text`` says and no metadata, and is marked
    ``quarantined: true``;
    ``content_truncated: true`` is added when set. ``full`` always carries both flags.
    ``similar_count`` is added when recall left near-duplicates of the entry out (``full``: always).
    """
    c = r.candidate
    quarantined = c.quarantined
    body = display_text(c) if quarantined or text is None else text
    truncated = content_truncated and not quarantined
    out: dict[str, Any] = {"id": str(c.id)}
    if fmt == "narrative":
        out.update(text=_narrative(r, body), score=round(r.score, 6))
    elif fmt == "compact":
        out.update(text=body, score=round(r.score, 6), memory_type=c.memory_type)
    else:
        out.update(
            text=body,
            score=round(r.score, 6),
            memory_type=c.memory_type,
            layer=c.layer,
            importance=c.importance,
            created_at=c.created_at.isoformat(),
            session_id=c.session_id,
            metadata=display_metadata(c),
        )
    if fmt == "full":
        out.update(
            source=c.source,
            reinforcement_count=c.reinforcement_count,
            content_truncated=truncated,
            quarantined=quarantined,
            similar_count=r.similar,
        )
    else:
        if truncated:
            out["content_truncated"] = True
        if quarantined:
            out["quarantined"] = True
        if r.similar:  # in every format: what the agent was spared is part of what it was told
            out["similar_count"] = r.similar
    return out


def result_tokens(serialized: dict[str, Any]) -> int:
    """``ceil(len(compact JSON) / 3)``: the cost of one serialized result (SPEC 5.3)."""
    return math.ceil(len(json.dumps(serialized, default=str, separators=(",", ":"))) / 3)


@dataclass
class BudgetOutcome:
    results: list[dict[str, Any]]
    tokens_used: int
    #: Any content shortened or any matched result left out.
    truncated: bool
    #: The budget fields are ``None`` when the request had no ``token_budget``.
    excluded_by_budget: int | None
    excluded_results: list[dict[str, Any]] | None
    excluded_results_truncated: bool | None
    minimum_budget: int | None
    #: Returned results whose text is the quarantine placeholder (warns ``memory_context_quarantined``).
    quarantined: int


def _preview(text: str, chars: int) -> str:
    return text[:chars].rstrip() + _ELLIPSIS


def _fit_top(r: Ranked, fmt: Format, budget: int) -> tuple[dict[str, Any] | None, int]:
    """The top result whole or as the longest preview within ``budget``, with its cost; or ``None``
    and the cost of its smallest preview (the minimum budget)."""
    whole = serialize_result(r, fmt)
    cost = result_tokens(whole)
    text = r.candidate.text
    if cost <= budget:
        return whole, cost
    if r.candidate.quarantined or len(text) <= MIN_PREVIEW_CHARS:
        return None, cost

    def shortened(chars: int) -> tuple[dict[str, Any], int]:
        s = serialize_result(r, fmt, text=_preview(text, chars), content_truncated=True)
        return s, result_tokens(s)

    smallest, floor = shortened(MIN_PREVIEW_CHARS)
    if floor > budget:
        return None, floor
    # The cost grows with the prefix length, so binary search the longest preview that fits.
    lo, hi, best = MIN_PREVIEW_CHARS, len(text) - 1, (smallest, floor)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        candidate = shortened(mid)
        if candidate[1] <= budget:
            lo, best = mid, candidate
        else:
            hi = mid - 1
    return best


def _title(r: Ranked) -> str:
    flat = " ".join(display_text(r.candidate).split())
    return flat if len(flat) <= TITLE_CHARS else flat[:TITLE_CHARS].rstrip() + _ELLIPSIS


def _excluded_ref(r: Ranked) -> dict[str, Any]:
    return {"id": str(r.candidate.id), "session_id": r.candidate.session_id, "title": _title(r)}


def fit_budget(ranked: list[Ranked], fmt: Format, token_budget: int | None) -> BudgetOutcome:
    """Serialize ``ranked`` in ``fmt`` and fit it to ``token_budget`` (module docstring: the rule).

    Without a budget everything is returned and the budget fields are ``None``.
    """
    if token_budget is None:
        everything = [serialize_result(r, fmt) for r in ranked]
        return BudgetOutcome(
            results=everything,
            tokens_used=sum(result_tokens(s) for s in everything),
            truncated=False,
            excluded_by_budget=None,
            excluded_results=None,
            excluded_results_truncated=None,
            minimum_budget=None,
            quarantined=sum(r.candidate.quarantined for r in ranked),
        )
    results: list[dict[str, Any]] = []
    used, minimum = 0, None
    if ranked:
        top, cost = _fit_top(ranked[0], fmt, token_budget)
        if top is None:
            minimum = cost
        else:
            results.append(top)
            used = cost
            for r in ranked[1:]:
                s = serialize_result(r, fmt)
                cost = result_tokens(s)
                if used + cost > token_budget:
                    break  # keep rank order: nothing after the first misfit is taken
                results.append(s)
                used += cost
    left_out = ranked[len(results) :]
    shortened = bool(results) and bool(results[0].get("content_truncated"))
    return BudgetOutcome(
        results=results,
        tokens_used=used,
        truncated=shortened or bool(left_out),
        excluded_by_budget=len(left_out),
        excluded_results=[_excluded_ref(r) for r in left_out[:MAX_EXCLUDED_LISTED]],
        excluded_results_truncated=len(left_out) > MAX_EXCLUDED_LISTED,
        minimum_budget=minimum,
        quarantined=sum(r.candidate.quarantined for r in ranked[: len(results)]),
    )
