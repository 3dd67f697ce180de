"""Security fixtures: the same in-process Engram as ``tests/conftest.py``, but with the embedder and
the Qdrant Edge index built here and handed to ``running_services``, so a test can look into the
very vector store recall searches (Edge is single-writer, in-process: there must be one instance);
and ``interface``, which runs an attack once over NATS and once through the HTTP gateway."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from nats.aio.client import Client

from services.runtime import build_embedder, build_vector_index, running_services
from shared.ports import Embedder, VectorIndex
from shared.runtime.settings import EngramSettings
from shared.service.infra import Infra
from tests.security import support
from tests.security.transport import INTERFACES, Interface, OverHttp, OverNats


@pytest.fixture(scope="module")
def embedder(settings: EngramSettings) -> Embedder:
    return build_embedder(settings)


@pytest.fixture(scope="module")
async def vector_index(settings: EngramSettings, embedder: Embedder) -> AsyncIterator[VectorIndex]:
    index = build_vector_index(settings, embedder)
    assert index is not None
    yield index
    await index.close()


@pytest.fixture(scope="module")
async def engram(
    settings: EngramSettings, embedder: Embedder, vector_index: VectorIndex
) -> AsyncIterator[Infra]:
    """Every service in-process on this module's NATS, sharing ``vector_index``."""
    async with running_services(settings, embedder=embedder, vector_index=vector_index) as infra:
        yield infra


@pytest.fixture(params=INTERFACES)
def interface(request: pytest.FixtureRequest, engram: Infra, nc: Client) -> Iterator[Interface]:
    """The way into the running Engram of an attack, once per interface (the gateway is started
    only for ``http``).
    Afterwards, what the interface itself found wrong (over HTTP: a status that is not the
    envelope's, a bare 5xx) must be nothing."""
    way: Interface = OverHttp(request.getfixturevalue("http")) if request.param == "http" else OverNats(nc)
    yield way
    assert way.problems() == []


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if support.LINES:
        terminalreporter.section("security summary")
        for line in support.LINES:
            terminalreporter.write_line(line)
        terminalreporter.write_line(f"(counts kept in {support.RESULTS_FILE})")
