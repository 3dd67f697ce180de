"""all-MiniLM-L6-v2 in-process with onnxruntime: the default embedder. No torch, no network.

The model's own files come from a pinned, checksummed package (:mod:`shared.adapters.embedders.model_files`);
``tokenizers`` splits texts into word pieces exactly as sentence-transformers does (the same
``tokenizer.json``, truncated at 256 pieces); :class:`~shared.adapters.embedders._bert.BertEncoder` runs the
6-layer encoder, mean pooling and L2 normalization in float32, as an ONNX graph it builds from the
weights, in onnxruntime. Vectors match sentence-transformers'
to a cosine of at least 0.9999 (``tests/unit/test_minilm_parity.py``).

Speed: texts are sorted by length and encoded in sub-batches of similar lengths (little padding),
spread over one worker thread per CPU. onnxruntime itself is held to one thread per run: the
products of one sub-batch are too small to split well, and a pool that spins while waiting for its
threads collapses when the machine is busy (measured: docs/benchmarks.md, "2026-12-01 — The
default embedder on numpy").
"""

from __future__ import annotations

import asyncio
import functools
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from safetensors.numpy import load as load_safetensors
from tokenizers import Encoding, Tokenizer

from shared.adapters.embedders._bert import BertEncoder, FloatArray
from shared.adapters.embedders.model_files import MODEL_NAME, model_dir, read_checked

__all__ = ["MODEL_NAME", "MiniLMEmbedder"]

_DIMENSION = 384
_HEADS = 12
#: sentence-transformers' ``max_seq_length`` for this model, special tokens included.
_MAX_TOKENS = 256
#: A sub-batch holds at most this many texts and this many tokens with padding (which bounds the
#: attention scores' memory: 8 texts of 256 tokens take 25 MB).
_SUB_BATCH_TEXTS = 32
_SUB_BATCH_TOKENS = 2_048


@dataclass(frozen=True)
class _Model:
    tokenizer: Tokenizer
    encoder: BertEncoder


class MiniLMEmbedder:
    """An :class:`~shared.ports.Embedder` computing all-MiniLM-L6-v2 (384 dimensions) in-process.

    The model loads on :meth:`load` or the first :meth:`embed` (about a second: reading and
    checking 90 MB), once per process however many embedders there are; so do its worker threads.
    """

    def __init__(self, *, threads: int | None = None, directory: Path | None = None) -> None:
        if threads is not None and threads < 1:
            raise ValueError(f"embedder threads must be at least 1, got {threads}")
        self.name = MODEL_NAME
        self.dimension = _DIMENSION
        self.threads = threads or _available_cpus()
        self._directory = directory

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One unit vector per text, in order, computed on worker threads."""
        if not texts:
            return []
        return await asyncio.to_thread(self.embed_sync, list(texts))

    def embed_sync(self, texts: Sequence[str]) -> list[list[float]]:
        """:meth:`embed` on the calling thread, for benchmarks and synchronous callers."""
        vectors: list[list[float]] = self.encode(texts).tolist()
        return vectors

    def encode(self, texts: Sequence[str]) -> FloatArray:
        """The vectors of ``texts`` as a ``(len(texts), 384)`` float32 array."""
        out = np.empty((len(texts), self.dimension), np.float32)
        if not texts:
            return out
        model = self._model()
        encodings = model.tokenizer.encode_batch(list(texts))
        batches = _sub_batches([len(encoding.ids) for encoding in encodings])

        def run(indexes: list[int]) -> None:
            ids, mask = _padded([encodings[i] for i in indexes])
            out[indexes] = model.encoder.encode(ids, mask)

        if len(batches) == 1 or self.threads == 1:
            for indexes in batches:
                run(indexes)
        else:
            # The calling thread takes the first share itself rather than waiting idle.
            pool = _pool(self.threads - 1)
            lanes = [batches[lane :: self.threads] for lane in range(self.threads)]
            futures = [pool.submit(_run_all, run, lane) for lane in lanes[1:] if lane]
            _run_all(run, lanes[0])
            for future in futures:
                future.result()
        return out

    def load(self) -> None:
        """Read and check the model's files now (the first :meth:`embed` would otherwise)."""
        self._model()

    async def aclose(self) -> None:
        """Nothing held beyond memory (the loaded model is shared by the process)."""

    def _model(self) -> _Model:
        return _load(self._directory or model_dir())


def _run_all(run: Callable[[list[int]], None], batches: list[list[int]]) -> None:
    for indexes in batches:
        run(indexes)


def _sub_batches(lengths: list[int]) -> list[list[int]]:
    """Indexes of the texts grouped longest first into sub-batches of similar length."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        # Sorted longest first: the first text of a sub-batch sets its padded length.
        width = lengths[current[0]] if current else lengths[i]
        if current and (len(current) >= _SUB_BATCH_TEXTS or (len(current) + 1) * width > _SUB_BATCH_TOKENS):
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


def _padded(encodings: list[Encoding]) -> tuple[np.ndarray, FloatArray]:
    """Token ids right-padded to the longest, and the mask of real tokens."""
    width = max(len(encoding.ids) for encoding in encodings)
    ids = np.zeros((len(encodings), width), np.int64)
    mask = np.zeros((len(encodings), width), np.float32)
    for row, encoding in enumerate(encodings):
        ids[row, : len(encoding.ids)] = encoding.ids
        mask[row, : len(encoding.ids)] = 1.0
    return ids, mask


_load_lock = threading.Lock()


@functools.cache
def _load_unlocked(directory: Path) -> _Model:
    tokenizer = Tokenizer.from_str(read_checked("tokenizer.json", directory).decode())
    # tokenizer.json was saved with padding to 128 and truncation at 128; sentence-transformers
    # pads per batch and truncates at its max_seq_length.
    tokenizer.no_padding()
    tokenizer.enable_truncation(_MAX_TOKENS)
    encoder = BertEncoder(load_safetensors(read_checked("model.safetensors", directory)), heads=_HEADS)
    return _Model(tokenizer, encoder)


def _load(directory: Path) -> _Model:
    with _load_lock:  # two first calls on two threads must not load it twice
        return _load_unlocked(directory)


@functools.cache
def _pool(workers: int) -> ThreadPoolExecutor:
    """One pool per process and size: embedders share the CPUs, so they share the threads."""
    return ThreadPoolExecutor(max_workers=workers, thread_name_prefix="minilm")


def _available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1
