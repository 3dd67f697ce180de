"""The OpenAI-compatible embedder against a real HTTP server speaking the protocol (FakeOpenAI).

Decision: a vector of the wrong length raises EmbeddingDimensionMismatch at once, never retried.
Retries, timeouts, the breaker and refused or unreadable answers are tested for both adapters in
``test_model_endpoint.py``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from contracts.errors import EmbeddingDimensionMismatch, ErrorCode
from shared.adapters.embedders import HashingEmbedder, OpenAICompatEmbedder
from shared.runtime.resilience import CircuitBreaker
from tests.integration.openai_adapters import EMBEDDER, Closing, closing
from tests.support import FakeOpenAI
from tests.unit.embedder_suite import EmbedderSuite

MakeEmbedder = Callable[..., OpenAICompatEmbedder]
__all__ = ["closing"]  # the fixture
TEXTS = [f"memory number {n}: the {word} job failed" for n, word in enumerate("abcdefghij")]


@pytest.fixture
def make_embedder(closing: Closing) -> MakeEmbedder:
    """Embedders with fast backoff and 8 dimensions, closed after the test."""
    return lambda base_url, **overrides: closing(EMBEDDER.build(base_url, **overrides))


class TestOpenAICompatEmbedderContract(EmbedderSuite):
    @pytest.fixture
    async def embedder(self, make_embedder: MakeEmbedder) -> AsyncIterator[OpenAICompatEmbedder]:
        async with FakeOpenAI(embedding_dimension=384, shuffle_embeddings=True) as server:
            yield make_embedder(server.base_url, dimension=384, batch_size=3)


def _expected(texts: list[str], dimension: int = 8) -> list[list[float]]:
    """What the fake's vectors are once normalized: the hashing embedder's."""
    return HashingEmbedder(dimension).embed_sync(texts)


def _assert_vectors(actual: list[list[float]], expected: list[list[float]]) -> None:
    assert len(actual) == len(expected)
    for got, want in zip(actual, expected, strict=True):
        assert got == pytest.approx(want, abs=1e-9)


async def test_answers_normalized_vectors(make_embedder: MakeEmbedder) -> None:
    """The endpoint's vectors (length 3 here) come back with unit length, in input order."""
    async with FakeOpenAI() as server:
        vectors = await make_embedder(server.base_url).embed(TEXTS[:3])
    _assert_vectors(vectors, _expected(TEXTS[:3]))


async def test_sends_model_and_inputs_with_the_api_key(make_embedder: MakeEmbedder) -> None:
    """One POST to /v1/embeddings names the model, lists the inputs and carries the bearer key."""
    async with FakeOpenAI() as server:
        await make_embedder(server.base_url, api_key="sk-test").embed(["a", "b"])
        [request] = server.requests
    assert (request.method, request.path) == ("POST", "/v1/embeddings")
    assert request.json() == {"model": "fake-embed", "input": ["a", "b"]}
    assert request.headers["authorization"] == "Bearer sk-test"


async def test_order_survives_a_shuffled_answer(make_embedder: MakeEmbedder) -> None:
    """When the server lists embeddings out of order, the index field puts them back."""
    async with FakeOpenAI(shuffle_embeddings=True) as server:
        vectors = await make_embedder(server.base_url).embed(TEXTS)
    _assert_vectors(vectors, _expected(TEXTS))


async def test_splits_large_inputs_into_batches(make_embedder: MakeEmbedder) -> None:
    """Ten texts at batch size 4 are three requests (4, 4, 2), answered in input order."""
    async with FakeOpenAI(shuffle_embeddings=True) as server:
        vectors = await make_embedder(server.base_url, batch_size=4).embed(TEXTS)
        sizes = [len(request.json()["input"]) for request in server.requests]
    assert sizes == [4, 4, 2]
    _assert_vectors(vectors, _expected(TEXTS))


async def test_no_texts_make_no_request(make_embedder: MakeEmbedder) -> None:
    """Embedding nothing answers [] without calling the endpoint."""
    async with FakeOpenAI() as server:
        assert await make_embedder(server.base_url).embed([]) == []
        assert server.request_count == 0


async def test_a_wrong_dimension_is_a_mismatch_and_not_retried(make_embedder: MakeEmbedder) -> None:
    """A 16-float answer to a 384-dimension embedder raises EmbeddingDimensionMismatch after one request."""
    async with FakeOpenAI(embedding_dimension=16) as server:
        embedder = make_embedder(server.base_url, dimension=384, breaker=CircuitBreaker(failure_threshold=1))
        with pytest.raises(EmbeddingDimensionMismatch) as caught:
            await embedder.embed(["x"])
        assert server.request_count == 1
    assert caught.value.code is ErrorCode.EMBEDDING_DIMENSION_MISMATCH
    assert caught.value.status == 502
    assert caught.value.details | {"expected": 384, "actual": 16} == caught.value.details
    assert embedder.breaker.state == "closed"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"dimension": 0}, "ENGRAM_EMBEDDER_DIMENSION"),
        ({"timeout_s": 0}, "timeout"),
        ({"retries": -1}, "retries"),
        ({"batch_size": 0}, "batch size"),
    ],
)
def test_bad_settings_fail_when_built(
    make_embedder: MakeEmbedder, overrides: dict[str, Any], message: str
) -> None:
    """Nonsense settings are refused when the embedder is built, naming what is wrong."""
    with pytest.raises(ValueError, match=message):
        make_embedder("http://127.0.0.1:9/v1", **overrides)
