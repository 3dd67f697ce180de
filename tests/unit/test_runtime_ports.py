"""The runtime closes the ports it opened (a model endpoint's HTTP client included) and leaves
the ones a caller brought to the caller."""

from __future__ import annotations

from contextlib import AsyncExitStack

from services.runtime import _open_ports
from shared.adapters.embedders.openai_compat import OpenAICompatEmbedder
from shared.runtime.settings import EngramSettings


def _settings(**values: object) -> EngramSettings:
    return EngramSettings(_env_file=None, vector_store="none", **values)  # type: ignore[call-arg]


async def test_an_embedder_the_runtime_built_is_closed_with_it() -> None:
    settings = _settings(embedder="text-embedding-3-small", embedder_url="http://127.0.0.1:9/v1")
    async with AsyncExitStack() as stack:
        ports = await _open_ports(settings, ["embed", "recall"], stack, None, None, None)
        embedder = ports.embedder
        assert isinstance(embedder, OpenAICompatEmbedder)
        assert not embedder.endpoint._client.is_closed
    assert embedder.endpoint._client.is_closed


async def test_an_embedder_the_caller_brought_stays_open() -> None:
    brought = OpenAICompatEmbedder(base_url="http://127.0.0.1:9/v1", model="m", dimension=8)
    async with AsyncExitStack() as stack:
        ports = await _open_ports(_settings(), ["embed"], stack, None, brought, None)
        assert ports.embedder is brought
    assert not brought.endpoint._client.is_closed
    await brought.aclose()
    assert brought.endpoint._client.is_closed


async def test_a_process_without_vectors_opens_no_embedder() -> None:
    settings = _settings(embedder="text-embedding-3-small", embedder_url="http://127.0.0.1:9/v1")
    async with AsyncExitStack() as stack:
        ports = await _open_ports(settings, ["ingest", "distill"], stack, None, None, None)
        assert ports.embedder is None
        assert ports.vector_index is None
        assert ports.results is None
