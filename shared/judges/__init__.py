"""Adapters of :class:`~shared.ports.SupersessionJudge` (docs/adr/0099-knowledge-updates.md)."""

from shared.judges.openai_compat import OpenAICompatJudge

__all__ = ["OpenAICompatJudge"]
