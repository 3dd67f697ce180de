"""What LangGraph's vendored store tests get from Engram: its services on an event loop of their
own, and ``EngramStore``s for the store fixtures adapted in those tests.

The services run in a thread, as they would in another process: LangGraph's synchronous tests call
the store from the main thread with no event loop running, its asynchronous tests on pytest's loop,
and both reach the services over NATS. A synchronous test's store has its client on the services'
loop (``EngramStore.batch`` hands its work to the client's loop); an asynchronous test's store has
its client on the test's own loop, as an application's would."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Coroutine, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any, ClassVar, TypeVar
from uuid import UUID

from langgraph.store.base import TTLConfig

from contracts.client import EngramClient
from contracts.langgraph_store import EngramStore

__all__ = ["EngramStores", "LoopThread"]

T = TypeVar("T")

#: Per request: generous, as the machine running the suite may be busy.
REQUEST_TIMEOUT_S = 20.0


class LoopThread:
    """An event loop running in a daemon thread of its own."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], what: str, timeout: float = 120.0) -> T:
        """Wait, from another thread, for ``coro`` to finish on this loop."""
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()
            raise TimeoutError(f"{what} did not finish within {timeout:.0f} s on {self.name}") from None

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(30)
        if self._thread.is_alive():
            raise RuntimeError(f"the event loop of {self.name} did not stop within 30 s")
        self.loop.close()


class EngramStores:
    """Opens ``EngramStore``s on one organization's memory (one agent config, one end user)."""

    _active: ClassVar[EngramStores | None] = None

    def __init__(
        self, services: LoopThread, nats_url: str, nats_options: dict[str, Any], token: str, agent: UUID
    ) -> None:
        self._services = services
        self._url = nats_url
        self._options = nats_options
        self._token = token
        self._agent = agent

    @classmethod
    def current(cls) -> EngramStores:
        """The running test's, for store builders upstream calls without a fixture."""
        if cls._active is None:
            raise RuntimeError("no test holds the engram_stores fixture")
        return cls._active

    @contextmanager
    def active(self) -> Iterator[EngramStores]:
        EngramStores._active = self
        try:
            yield self
        finally:
            EngramStores._active = None

    async def _connect(self, ttl: TTLConfig | None) -> tuple[EngramClient, EngramStore]:
        """Built on the loop it is awaited on, as an application builds it (``async def main``)."""
        client = await EngramClient.connect(
            self._url, self._token, timeout=REQUEST_TIMEOUT_S, **self._options
        )
        return client, EngramStore(client, self._agent, ttl=ttl)

    @contextmanager
    def open_sync(self, *, ttl: TTLConfig | None = None) -> Iterator[EngramStore]:
        """A store for synchronous calls from this thread: its client lives on the services' loop."""
        client, store = self._services.run(self._connect(ttl), "connecting an EngramStore's client")
        try:
            yield store
        finally:
            self._services.run(client.close(), "closing an EngramStore's client")

    @asynccontextmanager
    async def open_async(self, *, ttl: TTLConfig | None = None) -> AsyncIterator[EngramStore]:
        """A store whose client lives on the running loop."""
        client, store = await self._connect(ttl)
        try:
            yield store
        finally:
            await client.close()
