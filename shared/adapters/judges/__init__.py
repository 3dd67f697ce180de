"""Adapters of :class:`~shared.ports.SupersessionJudge` (docs/adr/0103-knowledge-updates.md)."""

from shared.adapters.judges.openai_compat import OpenAICompatJudge

__all__ = ["OpenAICompatJudge"]
