"""Fixtures for LangGraph's own store tests (vendored beside this file) run against ``EngramStore``:
Engram's services on real NATS and Postgres (``tests/conftest.py``), and a fresh organization per
test, whose end user's token the store holds."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from services.runtime import running_services
from shared.embedded.nats_server import NatsServerProcess
from shared.runtime.settings import EngramSettings
from shared.security.auth import TokenService
from tests.conformance.langgraph.stores import EngramStores, LoopThread
from tests.security.support import mint

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="module")
def engram_services(settings: EngramSettings) -> Iterator[LoopThread]:
    """Engram's services, running on an event loop in a thread of their own."""
    thread = LoopThread("engram-services")
    stack = AsyncExitStack()
    try:
        thread.run(stack.enter_async_context(running_services(settings)), "starting Engram's services")
        yield thread
    finally:
        thread.run(stack.aclose(), "stopping Engram's services")
        thread.close()


# Autouse: upstream's store builders that are plain functions (``create_vector_store``) reach the
# test's stores through ``EngramStores.current()``.
@pytest.fixture(autouse=True)
def engram_stores(
    engram_services: LoopThread,
    nats_proc: NatsServerProcess,
    platform_options: dict[str, Any],
    tokens: TokenService,
    org: UUID,
    agent: UUID,
) -> Iterator[EngramStores]:
    """Stores on the memory of end user Alice of a fresh organization."""
    token = mint(tokens, org, "end_user:alice", {"memory.read", "memory.write"})
    with EngramStores(engram_services, nats_proc.url, platform_options, token, agent).active() as stores:
        yield stores
