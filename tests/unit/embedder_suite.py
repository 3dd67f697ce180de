"""The behaviour every Embedder adapter must show, written once and subclassed per adapter.

A subclass provides an ``embedder`` fixture; ``exact`` says whether batching may change the last
float bits (a neural model pads a batch to its longest text, a hashing embedder does not).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar

import pytest

from shared.ports import Embedder

DEPLOY_FAILURE = "The deploy failed because the quota was exceeded"
RELATED = "deployment quota error"
UNRELATED = "Alice likes hiking"
TEXTS = [
    DEPLOY_FAILURE,
    RELATED,
    UNRELATED,
    "",
    "!!! ???",
    "Ünïcödé wörds, 数字 and emoji 🚀 are text too",
    "word " * 400,
]


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    """The cosine of two vectors (their dot product, when both have unit length)."""
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / (math.hypot(*a) * math.hypot(*b))


class EmbedderSuite:
    """Subclass as ``Test<Adapter>Contract`` and provide an ``embedder`` fixture."""

    exact: ClassVar[bool] = True

    async def test_satisfies_the_port(self, embedder: Embedder) -> None:
        """The adapter is an Embedder with a name and a positive dimension."""
        assert isinstance(embedder, Embedder)
        assert embedder.name
        assert embedder.dimension > 0

    async def test_vectors_have_the_declared_dimension(self, embedder: Embedder) -> None:
        """Every vector has exactly ``dimension`` floats."""
        vectors = await embedder.embed(TEXTS)
        assert [len(vector) for vector in vectors] == [embedder.dimension] * len(TEXTS)
        assert all(isinstance(value, float) for vector in vectors for value in vector)

    async def test_vectors_have_unit_length(self, embedder: Embedder) -> None:
        """Every vector is L2-normalized, including those of empty and word-less texts."""
        for vector in await embedder.embed(TEXTS):
            assert math.hypot(*vector) == pytest.approx(1.0, abs=1e-5)

    async def test_no_texts_give_no_vectors(self, embedder: Embedder) -> None:
        """Embedding an empty list answers an empty list."""
        assert await embedder.embed([]) == []

    async def test_a_batch_keeps_input_order(self, embedder: Embedder) -> None:
        """The i-th vector of a batch is the vector of the i-th text alone."""
        batch = await embedder.embed(TEXTS)
        for text, vector in zip(TEXTS, batch, strict=True):
            [alone] = await embedder.embed([text])
            if self.exact:
                assert vector == alone
            else:
                assert cosine(vector, alone) == pytest.approx(1.0, abs=1e-4)

    async def test_the_same_text_gives_the_same_vector(self, embedder: Embedder) -> None:
        """Embedding is a function of the text: asking twice gives the same vector."""
        first = await embedder.embed([DEPLOY_FAILURE])
        second = await embedder.embed([DEPLOY_FAILURE])
        assert first == second

    async def test_related_texts_are_closer_than_unrelated_ones(self, embedder: Embedder) -> None:
        """A deploy-quota failure is closer to "deployment quota error" than to a hiking hobby."""
        failure, related, unrelated = await embedder.embed([DEPLOY_FAILURE, RELATED, UNRELATED])
        assert cosine(failure, related) > cosine(failure, unrelated) + 0.2
