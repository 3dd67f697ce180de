"""The default all-MiniLM-L6-v2 (onnxruntime) computes what sentence-transformers computes: cosine ≥ 0.9999 on
every one of 200+ varied texts, against the checked-in reference (no torch needed) and, where the
``local-model`` extra is installed, against sentence-transformers live."""

from __future__ import annotations

import numpy as np
import pytest

from shared.adapters.embedders.minilm import MiniLMEmbedder
from shared.adapters.embedders.minilm_torch import SentenceTransformerEmbedder, missing_dependencies
from tests.unit.minilm_parity import load_reference, parity_texts

MIN_COSINE = 0.9999


@pytest.fixture(scope="module")
def minilm() -> MiniLMEmbedder:
    embedder = MiniLMEmbedder()
    embedder.load()
    return embedder


def test_the_reference_covers_what_the_issue_names(minilm: MiniLMEmbedder) -> None:
    """The reference has at least 200 texts, among them empty ones, emoji, non-Latin scripts and
    texts past the model's 256 word pieces; and it was made from today's text list."""
    texts, vectors = load_reference()
    assert texts == parity_texts()
    assert len(texts) >= 200
    assert vectors.shape == (len(texts), 384)
    assert vectors.dtype == np.float32
    assert "" in texts
    assert any("🚀" in text for text in texts)
    assert any("部署" in text for text in texts)
    tokenizer = minilm._model().tokenizer
    truncated = [e for e in tokenizer.encode_batch(texts) if len(e.ids) == 256]
    assert len(truncated) >= 20


def test_vectors_match_the_checked_in_reference(minilm: MiniLMEmbedder) -> None:
    """Every text's vector has cosine ≥ 0.9999 with sentence-transformers' (in one batch)."""
    texts, reference = load_reference()
    cosines = np.einsum("ij,ij->i", minilm.encode(texts), reference)
    worst = int(np.argmin(cosines))
    assert cosines.min() >= MIN_COSINE, (cosines.min(), texts[worst][:80])


def test_vectors_match_the_reference_one_text_at_a_time(minilm: MiniLMEmbedder) -> None:
    """Alone (no padding at all), each text still matches the reference."""
    texts, reference = load_reference()
    for text, expected in zip(texts[::7], reference[::7], strict=True):
        [vector] = minilm.encode([text])
        assert float(vector @ expected) >= MIN_COSINE, text[:80]


@pytest.mark.skipif(bool(missing_dependencies()), reason="the local-model extra (torch) is not installed")
def test_vectors_match_sentence_transformers_live(minilm: MiniLMEmbedder) -> None:
    """Against sentence-transformers running here and now, on the same texts."""
    texts = parity_texts()
    live = np.asarray(SentenceTransformerEmbedder().embed_sync(texts), dtype=np.float32)
    cosines = np.einsum("ij,ij->i", minilm.encode(texts), live)
    assert cosines.min() >= MIN_COSINE
