"""Distiller adapters (the :class:`~shared.ports.Distiller` port): pick one at the composition root.

- :class:`BuiltinDistiller`: deterministic rules over the trace, no model needed.
- :class:`OpenAICompatDistiller`: any OpenAI-compatible chat endpoint.
"""

from shared.adapters.distillers.builtin import BuiltinDistiller
from shared.adapters.distillers.openai_compat import OpenAICompatDistiller

__all__ = ["BuiltinDistiller", "OpenAICompatDistiller"]
