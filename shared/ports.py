"""Ports: what the domain needs from the outside world, as Protocols. Adapters live beside
them (``shared/distillers/…``) and are chosen at the composition root."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from contracts.events import SessionEnded

__all__ = ["Distiller", "Lesson", "TraceSummary"]


@dataclass(frozen=True)
class Lesson:
    """One lesson a distiller proposes; the save path decides whether it is kept."""

    text: str
    importance: float
    memory_type: str = "lesson"


@dataclass(frozen=True)
class TraceSummary:
    """The at most 25 most informative calls of a trace, rendered for a model, and which they are."""

    text: str
    #: indexes into ``session.tool_trace`` of the calls kept, in trace order.
    kept_indexes: tuple[int, ...]
    total_calls: int


@runtime_checkable
class Distiller(Protocol):
    """Turns one ended session into at most five lessons. An empty list is a normal answer.

    Raising means "try again later" (the event is redelivered with backoff, then dead-lettered);
    a distiller never fails the session itself.
    """

    name: str

    async def distill(self, session: SessionEnded, summary: TraceSummary) -> list[Lesson]: ...
