"""The two OpenAI-compatible adapters (the distiller and the embedder) as their tests build and call
them against :class:`~tests.support.FakeOpenAI`: fast backoff, closed after the test. What the
adapters share — retries, timeouts, the breaker, refused and unreadable answers — is tested once
for both (``test_model_endpoint.py``); each adapter's own file tests what is only its own."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import pytest

from services.distill.summary import summarize_trace
from shared.adapters.distillers.openai_compat import OpenAICompatDistiller
from shared.adapters.embedders import OpenAICompatEmbedder
from shared.runtime.resilience import CircuitBreaker
from tests.factories import make_session

__all__ = ["ADAPTERS", "DISTILLER", "EMBEDDER", "Adapter", "Closing", "closing"]

#: Quick retries, so a test of three attempts takes milliseconds.
FAST: dict[str, Any] = {"timeout_s": 5.0, "retries": 2, "backoff_base_s": 0.01, "backoff_max_s": 0.05}


class Built(Protocol):
    breaker: CircuitBreaker

    async def aclose(self) -> None: ...


Closing = Callable[[Any], Any]


@pytest.fixture
async def closing() -> AsyncIterator[Closing]:
    """``closing(adapter)`` returns the adapter and closes it after the test."""
    made: list[Built] = []

    def register(adapter: Any) -> Any:
        made.append(adapter)
        return adapter

    yield register
    for adapter in made:
        await adapter.aclose()


@dataclass(frozen=True)
class Adapter:
    """How to build one adapter (``FAST`` options, overridable) and make one call through it."""

    name: str
    build: Callable[..., Any]
    call: Callable[[Any], Awaitable[Any]]

    def __str__(self) -> str:
        return self.name


async def _distill(distiller: OpenAICompatDistiller) -> Any:
    session = make_session()
    return await distiller.distill(session, summarize_trace(session))


async def _embed(embedder: OpenAICompatEmbedder) -> Any:
    return await embedder.embed(["x"])


DISTILLER = Adapter(
    "distiller",
    lambda url, **kw: OpenAICompatDistiller(url, "fake-model", **(FAST | kw)),
    _distill,
)
EMBEDDER = Adapter(
    "embedder",
    lambda url, **kw: OpenAICompatEmbedder(url, "fake-embed", **(FAST | {"dimension": 8} | kw)),
    _embed,
)
ADAPTERS = [DISTILLER, EMBEDDER]
