"""all-MiniLM-L6-v2 through sentence-transformers and torch: the reference the default embedder
(:mod:`shared.adapters.embedders.minilm`, onnxruntime) is checked and measured against, not a deployment
choice.

Reads the same packaged files as the default, offline. Needs the optional extra
(``pip install -e '.[local-model]'``: torch, sentence-transformers); nothing heavy is imported until
the model loads, so the core install runs without torch. The parity test and ``make bench`` use it.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.util
import os
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from shared.adapters.embedders.model_files import MODEL_NAME, model_dir

__all__ = ["SentenceTransformerEmbedder", "missing_dependencies"]

_DIMENSION = 384
_REQUIRED_MODULES = ("torch", "sentence_transformers")
# While loading: no network, and no "Loading weights" progress bar on stderr.
_LOAD_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}


def missing_dependencies() -> list[str]:
    """The modules of the ``local-model`` extra that cannot be imported here (empty when all can)."""
    missing = []
    for module in _REQUIRED_MODULES:
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            spec = None
        if spec is None:
            missing.append(module)
    return missing


class SentenceTransformerEmbedder:
    """An :class:`~shared.ports.Embedder` running all-MiniLM-L6-v2 on ``device`` (384 dimensions).

    Vectors are what sentence-transformers produces for this model: mean pooling over the tokens
    (texts are truncated at 256 word pieces), then L2 normalization.
    """

    def __init__(self, model: str = MODEL_NAME, batch_size: int = 64, device: str = "cpu") -> None:
        if model != MODEL_NAME:
            raise ValueError(
                f"the local model embedder ships only {MODEL_NAME!r}, not {model!r} (ENGRAM_EMBEDDER)"
            )
        if batch_size < 1:
            raise ValueError("local model batch size must be at least 1")
        self.name = MODEL_NAME
        self.dimension = _DIMENSION
        self.batch_size = batch_size
        self.device = device
        self._model: Any = None
        self._load_lock = threading.Lock()
        self._infer_lock = threading.Lock()

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One unit vector per text, in order; the first call also loads the model (a few seconds)."""
        if not texts:
            return []
        return await asyncio.to_thread(self.embed_sync, list(texts))

    def embed_sync(self, texts: Sequence[str]) -> list[list[float]]:
        """:meth:`embed` on the calling thread, for benchmarks and synchronous callers."""
        if not texts:
            return []
        model = self.model()
        # One batch at a time: torch already spreads one over every core, so concurrent batches
        # would only fight over them (and grow memory) without finishing any sooner.
        with self._infer_lock:
            matrix = model.encode(
                list(texts),
                batch_size=self.batch_size,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
        vectors: list[list[float]] = matrix.tolist()
        return vectors

    def load(self) -> None:
        """Load the model now (the first :meth:`embed` would otherwise)."""
        self.model()

    async def aclose(self) -> None:
        """Nothing held beyond memory."""

    def model(self) -> Any:
        """The loaded ``SentenceTransformer`` (loaded on first use, once, from the packaged files)."""
        with self._load_lock:  # two first calls in two worker threads must not load it twice
            if self._model is None:
                self._model = _load(self.device)
            return self._model


def _load(device: str) -> Any:
    missing = missing_dependencies()
    if missing:
        raise RuntimeError(
            f"the {MODEL_NAME} embedder needs {', '.join(missing)}: pip install -e '.[local-model]'"
        )
    path = model_dir()
    with _offline():
        # Imported here, not at the top: torch takes seconds and hundreds of MB to import.
        sentence_transformers = importlib.import_module("sentence_transformers")
        return sentence_transformers.SentenceTransformer(str(path), device=device, local_files_only=True)


@contextlib.contextmanager
def _offline() -> Iterator[None]:
    """Forbid the Hugging Face libraries any network access while the model loads.

    ``local_files_only`` already keeps the loader on disk; these variables also stop the hub
    client's own lookups (telemetry, "is there a newer revision") that some versions still try.
    The libraries read them when first imported, which is why the import happens inside.
    """
    saved = {name: os.environ.get(name) for name in _LOAD_ENV}
    os.environ.update(_LOAD_ENV)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
