"""The distill gate (SPEC 4.1): which ended sessions are worth distilling at all."""

from __future__ import annotations

from contracts.config import MemoryConfig
from contracts.events import SessionEnded

__all__ = ["DISTILLED_STATUSES", "MIN_STEPS", "distill_gate"]

#: Failures are distilled on purpose; cancelled and timed-out sessions teach nothing reliable.
DISTILLED_STATUSES = frozenset({"success", "failed"})
MIN_STEPS = 2


def distill_gate(session: SessionEnded, config: MemoryConfig, org_memory_enabled: bool) -> str | None:
    """The reason to skip distilling ``session``, or ``None`` when it should be distilled.

    Reasons: ``memory_disabled``, ``org_memory_disabled``, ``write_disabled``,
    ``status_<status>`` (``cancelled`` / ``timeout``) and ``too_few_steps``; the first that
    applies wins, in that order.
    """
    if not config.memory_enabled:
        return "memory_disabled"
    if not org_memory_enabled:
        return "org_memory_disabled"
    if not config.memory_write_enabled:
        return "write_disabled"
    if session.status not in DISTILLED_STATUSES:
        return f"status_{session.status}"
    if session.steps < MIN_STEPS:
        return "too_few_steps"
    return None
