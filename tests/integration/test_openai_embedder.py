"""The OpenAI-compatible embedder against a real HTTP server speaking the protocol (FakeOpenAI).

Decision: a 2xx answer that is not one embedding per input, and a 4xx, raise Unavailable without
counting against the breaker (the endpoint is up; our configuration or the server is wrong); a
vector of the wrong length raises EmbeddingDimensionMismatch at once, never retried.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

from contracts.errors import EmbeddingDimensionMismatch, ErrorCode, Unavailable
from shared.embedders import HashingEmbedder, OpenAICompatEmbedder
from shared.resilience import CircuitBreaker
from shared.testing import FakeOpenAI
from tests.unit.embedder_suite import EmbedderSuite

MakeEmbedder = Callable[..., OpenAICompatEmbedder]
TEXTS = [f"memory number {n}: the {word} job failed" for n, word in enumerate("abcdefghij")]


@pytest.fixture
async def make_embedder() -> AsyncIterator[MakeEmbedder]:
    """Embedders with fast backoff and 8 dimensions, closed after the test."""
    made: list[OpenAICompatEmbedder] = []

    def make(base_url: str, **overrides: Any) -> OpenAICompatEmbedder:
        options: dict[str, Any] = {
            "dimension": 8,
            "timeout_s": 5.0,
            "retries": 2,
            "backoff_base_s": 0.01,
            "backoff_max_s": 0.05,
        }
        embedder = OpenAICompatEmbedder(base_url, "fake-embed", **(options | overrides))
        made.append(embedder)
        return embedder

    yield make
    for embedder in made:
        await embedder.aclose()


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


async def test_a_failing_endpoint_is_unavailable_after_retries(make_embedder: MakeEmbedder) -> None:
    """HTTP 500 on every attempt: retries+1 requests, then Unavailable with the reason."""
    async with FakeOpenAI(mode="fail") as server:
        embedder = make_embedder(server.base_url, retries=2)
        with pytest.raises(Unavailable) as caught:
            await embedder.embed(["x"])
        assert server.request_count == 3
    assert caught.value.details["reason"] == "HTTP 500"
    assert embedder.breaker.consecutive_failures == 1


@pytest.mark.parametrize("status", [429, 503])
async def test_a_flaky_endpoint_recovers_through_retries(make_embedder: MakeEmbedder, status: int) -> None:
    """Two failures (429 or 5xx) then success: the vectors arrive and the breaker stays clean."""
    async with FakeOpenAI(mode="flaky", fail_first=2, fail_status=status) as server:
        embedder = make_embedder(server.base_url, retries=2)
        vectors = await embedder.embed(["x"])
        assert server.request_count == 3
    _assert_vectors(vectors, _expected(["x"]))
    assert embedder.breaker.consecutive_failures == 0


@pytest.mark.parametrize("status", [400, 401, 404])
async def test_a_refused_request_is_not_retried(make_embedder: MakeEmbedder, status: int) -> None:
    """A 4xx other than 429 is one request, Unavailable (reason rejected), breaker still closed."""
    async with FakeOpenAI(mode="fail", fail_status=status) as server:
        embedder = make_embedder(server.base_url, breaker=CircuitBreaker(failure_threshold=1))
        with pytest.raises(Unavailable) as caught:
            await embedder.embed(["x"])
        assert server.request_count == 1
    assert (caught.value.details["reason"], caught.value.details["status"]) == ("rejected", status)
    assert embedder.breaker.state == "closed"


async def test_an_answer_without_embeddings_is_unavailable(make_embedder: MakeEmbedder) -> None:
    """A 2xx body without ``data`` is Unavailable (unparseable_answer), not retried, breaker closed."""
    async with FakeOpenAI(mode="garbage") as server:
        embedder = make_embedder(server.base_url, breaker=CircuitBreaker(failure_threshold=1))
        with pytest.raises(Unavailable) as caught:
            await embedder.embed(["x"])
        assert server.request_count == 1
    assert caught.value.details["reason"] == "unparseable_answer"
    assert embedder.breaker.state == "closed"


async def test_a_slow_endpoint_times_out_after_retries(make_embedder: MakeEmbedder) -> None:
    """An endpoint slower than the 0.2 s timeout is tried retries+1 times, then Unavailable."""
    async with FakeOpenAI(mode="slow", delay_s=5.0) as server:
        embedder = make_embedder(server.base_url, timeout_s=0.2, retries=1)
        with pytest.raises(Unavailable) as caught:
            await embedder.embed(["x"])
        assert server.request_count == 2
    assert caught.value.details["reason"] == "timeout"


async def test_nobody_listening_is_unavailable(make_embedder: MakeEmbedder) -> None:
    """A closed port is a connection error: Unavailable after the retries."""
    async with FakeOpenAI() as server:
        base_url = server.base_url
    embedder = make_embedder(base_url, retries=1)
    with pytest.raises(Unavailable, match="connection error"):
        await embedder.embed(["x"])


async def test_the_breaker_opens_and_then_short_circuits(make_embedder: MakeEmbedder) -> None:
    """After two failed calls the breaker is open: no request until it half-opens and recovers."""
    now = [0.0]
    breaker = CircuitBreaker(failure_threshold=2, reset_after_s=30, clock=lambda: now[0])
    async with FakeOpenAI(mode="fail") as server:
        embedder = make_embedder(server.base_url, retries=0, breaker=breaker)
        for _ in range(2):
            with pytest.raises(Unavailable):
                await embedder.embed(["x"])
        assert breaker.state == "open"
        with pytest.raises(Unavailable) as caught:
            await embedder.embed(["x"])
        assert caught.value.details["reason"] == "circuit_open"
        assert server.request_count == 2
        now[0] += 30
        server.mode = "ok"
        _assert_vectors(await embedder.embed(["x"]), _expected(["x"]))
        assert server.request_count == 3
    assert embedder.breaker.state == "closed"


async def test_a_shared_client_is_left_open(make_embedder: MakeEmbedder) -> None:
    """An embedder given a client does not close it."""
    async with httpx.AsyncClient() as client, FakeOpenAI() as server:
        embedder = make_embedder(server.base_url, client=client)
        await embedder.embed(["x"])
        await embedder.aclose()
        assert not client.is_closed


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
