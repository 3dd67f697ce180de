"""Adapters of :class:`~shared.ports.SupersessionJudge` (docs/adr/0102-knowledge-updates.md)."""

from shared.judges.openai_compat import OpenAICompatJudge

__all__ = ["OpenAICompatJudge"]
