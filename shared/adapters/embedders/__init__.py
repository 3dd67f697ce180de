"""Adapters of the :class:`~shared.ports.Embedder` port, and the choice between them.

- ``minilm.py``: all-MiniLM-L6-v2 in-process with onnxruntime, from a pinned packaged copy: the default.
- ``hashing.py``: deterministic feature hashing; zero dependencies; for tests that need speed.
- ``openai_compat.py``: any OpenAI-compatible ``/v1/embeddings`` endpoint.
- ``minilm_torch.py``: the same model through sentence-transformers and torch (the ``local-model``
  extra), the reference that the default is checked and benchmarked against; not selectable.
"""

from __future__ import annotations

import re

from shared.adapters.embedders.hashing import HashingEmbedder
from shared.adapters.embedders.minilm import MiniLMEmbedder
from shared.adapters.embedders.model_files import MODEL_NAME, ModelFilesError, install_hint, model_dir
from shared.adapters.embedders.openai_compat import OpenAICompatEmbedder
from shared.ports import Embedder

__all__ = ["HashingEmbedder", "MiniLMEmbedder", "OpenAICompatEmbedder", "build_embedder"]

_HASHING_RE = re.compile(r"hashing(?:-(?P<dimension>\d+))?")
_LOCAL_MODEL_NAMES = (MODEL_NAME, f"sentence-transformers/{MODEL_NAME}")


def build_embedder(name: str, *, url: str = "", api_key: str = "", dimension: int = 384) -> Embedder:
    """The embedder that ``ENGRAM_EMBEDDER`` (``name``) and ``ENGRAM_EMBEDDER_URL`` (``url``) select.

    - ``hashing-<dimension>`` (or ``hashing``, taking ``dimension``): :class:`HashingEmbedder`.
    - any model name with a ``url``: :class:`OpenAICompatEmbedder` on that endpoint, expecting
      vectors of ``dimension`` (``ENGRAM_EMBEDDER_DIMENSION``). This includes all-MiniLM-L6-v2
      served by an endpoint: a URL says where the model runs.
    - ``all-MiniLM-L6-v2`` without a URL (the default): :class:`MiniLMEmbedder`, in-process.

    Raises :class:`ValueError` with what to set or install when the choice cannot work here, so a
    misconfigured service fails at start rather than at its first write.
    """
    name = name.strip()
    hashing = _HASHING_RE.fullmatch(name)
    if hashing:
        if url:
            raise ValueError(
                f"ENGRAM_EMBEDDER={name} is computed in-process, but ENGRAM_EMBEDDER_URL is set too; "
                "unset ENGRAM_EMBEDDER_URL or name the endpoint's model in ENGRAM_EMBEDDER"
            )
        return HashingEmbedder(int(hashing["dimension"] or dimension))
    if url:
        return OpenAICompatEmbedder(url, name, dimension, api_key=api_key or None)
    if name in _LOCAL_MODEL_NAMES:
        try:
            model_dir()
        except ModelFilesError:
            raise ValueError(
                f"ENGRAM_EMBEDDER={name} runs the model in-process and needs its files: {install_hint()}"
            ) from None
        return MiniLMEmbedder()
    raise ValueError(
        f"unknown embedder {name!r}: set ENGRAM_EMBEDDER to hashing-384 or {MODEL_NAME}, or set "
        "ENGRAM_EMBEDDER_URL to an OpenAI-compatible /v1 endpoint serving that model"
    )
