"""The ONNX graph ``shared/adapters/embedders/_bert.py`` writes from BERT weights, on a tiny random BERT of
another shape (2 layers, 2 heads, hidden 8), against the textbook forward pass written plainly in
numpy here: the graph is read from the weights' shapes, not from MiniLM's (which the parity tests
hold to sentence-transformers)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from shared.adapters.embedders._bert import BertEncoder

VOCAB, POSITIONS, HIDDEN, HEADS, INNER, LAYERS = 30, 12, 8, 2, 16, 2


def _weights(seed: int = 7) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)

    def r(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32) * 0.5

    w = {
        "embeddings.word_embeddings.weight": r(VOCAB, HIDDEN),
        "embeddings.position_embeddings.weight": r(POSITIONS, HIDDEN),
        "embeddings.token_type_embeddings.weight": r(2, HIDDEN),
        "embeddings.LayerNorm.weight": 1 + r(HIDDEN),
        "embeddings.LayerNorm.bias": r(HIDDEN),
    }
    for n in range(LAYERS):
        p = f"encoder.layer.{n}."
        for name, (out, inp) in {
            "attention.self.query": (HIDDEN, HIDDEN),
            "attention.self.key": (HIDDEN, HIDDEN),
            "attention.self.value": (HIDDEN, HIDDEN),
            "attention.output.dense": (HIDDEN, HIDDEN),
            "intermediate.dense": (INNER, HIDDEN),
            "output.dense": (HIDDEN, INNER),
        }.items():
            w[f"{p}{name}.weight"], w[f"{p}{name}.bias"] = r(out, inp), r(out)
        for norm in ("attention.output.LayerNorm", "output.LayerNorm"):
            w[f"{p}{norm}.weight"], w[f"{p}{norm}.bias"] = 1 + r(HIDDEN), r(HIDDEN)
    return w


def _reference(w: dict[str, np.ndarray], ids: list[int]) -> np.ndarray:
    """One unpadded sequence through BERT, mean-pooled and normalized, in float64, step by step."""
    f = {k: v.astype(np.float64) for k, v in w.items()}

    def norm(x: np.ndarray, prefix: str) -> np.ndarray:
        mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
        out: np.ndarray = (x - mean) / np.sqrt(var + 1e-12) * f[prefix + ".weight"] + f[prefix + ".bias"]
        return out

    def linear(x: np.ndarray, prefix: str) -> np.ndarray:
        return x @ f[prefix + ".weight"].T + f[prefix + ".bias"]

    gelu = np.vectorize(lambda v: 0.5 * v * (1 + math.erf(v / math.sqrt(2))))
    x = f["embeddings.word_embeddings.weight"][ids] + f["embeddings.position_embeddings.weight"][: len(ids)]
    x = norm(x + f["embeddings.token_type_embeddings.weight"][0], "embeddings.LayerNorm")
    size = HIDDEN // HEADS
    for n in range(LAYERS):
        p = f"encoder.layer.{n}."
        heads = []
        for h in range(HEADS):
            cut = slice(h * size, (h + 1) * size)
            q, k, v = (linear(x, p + f"attention.self.{m}")[:, cut] for m in ("query", "key", "value"))
            scores = q @ k.T / math.sqrt(size)
            weights = np.exp(scores - scores.max(-1, keepdims=True))
            heads.append(weights / weights.sum(-1, keepdims=True) @ v)
        x = norm(
            x + linear(np.concatenate(heads, -1), p + "attention.output.dense"),
            p + "attention.output.LayerNorm",
        )
        x = norm(
            x + linear(gelu(linear(x, p + "intermediate.dense")), p + "output.dense"), p + "output.LayerNorm"
        )
    pooled: np.ndarray = x.mean(0)
    return pooled / float(np.linalg.norm(pooled))


def test_matches_the_textbook_forward_pass_padded_or_not() -> None:
    """Three sequences of different lengths in one right-padded batch each give the plain forward
    pass's vector: padding changes no real token's output."""
    w = _weights()
    encoder = BertEncoder(w, heads=HEADS)
    sequences = [[1, 5, 9, 2], [1, 17, 2], [1, 3, 4, 8, 12, 29, 6, 2]]
    width = max(map(len, sequences))
    ids = np.zeros((len(sequences), width), np.int64)
    mask = np.zeros((len(sequences), width), np.float32)
    for row, seq in enumerate(sequences):
        ids[row, : len(seq)], mask[row, : len(seq)] = seq, 1.0
    vectors = encoder.encode(ids, mask)
    assert np.array_equal(encoder.encode(ids.astype(np.int32), mask.astype(np.float64)), vectors)
    for vector, seq in zip(vectors, sequences, strict=True):
        assert np.allclose(vector, _reference(w, seq), atol=2e-5)
        assert abs(float(np.linalg.norm(vector)) - 1.0) < 1e-5


def test_more_tokens_than_positions_are_refused() -> None:
    encoder = BertEncoder(_weights(), heads=HEADS)
    ids = np.ones((1, POSITIONS + 1), np.int64)
    with pytest.raises(ValueError, match=f"{POSITIONS + 1} tokens exceed the model's {POSITIONS} positions"):
        encoder.encode(ids, np.ones(ids.shape, np.float32))


def test_weights_it_cannot_use_are_refused_by_name() -> None:
    """A missing tensor is named; a hidden size that the heads do not divide is said."""
    w = _weights()
    del w["encoder.layer.1.output.dense.bias"]
    with pytest.raises(ValueError, match=r"encoder\.layer\.1\.output\.dense\.bias"):
        BertEncoder(w, heads=HEADS)
    with pytest.raises(ValueError, match="not a multiple of 3 heads"):
        BertEncoder(_weights(), heads=3)
