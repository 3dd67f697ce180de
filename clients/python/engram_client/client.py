"""``EngramClient`` (async) and ``SyncEngramClient`` (blocking): publish sessions, save and recall
memories, manage them, read and change memory config, query and verify the audit log — over NATS
or HTTP, one interface (docs/adr/0090-thin-python-client.md).

    async with await EngramClient.from_connection(".engram/connection.json") as engram:
        reply = await engram.recall(agent_config_id, cue="plan the trip")

Its operation methods are generated from the operation table (``engram_client/_methods.py``); this
module holds what they share: validating a request, the reply models, timeouts, the transports.
Everything is plain JSON with an ``Authorization`` header, so any language can do the same.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Awaitable, Iterator
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from nats.aio.client import Client
from pydantic import BaseModel

from engram_client._methods import OperationMethods, SyncOperationMethods
from engram_client.contracts.connection import ConnectionInfo
from engram_client.contracts.events import SessionEnded
from engram_client.contracts.nats_connect import Refusals
from engram_client.contracts.operations import Operation
from engram_client.transport import HttpTransport, NatsTransport, Transport

if TYPE_CHECKING:
    import httpx

__all__ = ["EngramClient", "SyncEngramClient"]

Rep = TypeVar("Rep", bound=BaseModel)
T = TypeVar("T")

#: How long a request waits when its operation names no timeout of its own.
DEFAULT_TIMEOUT_S = 5.0


class EngramClient(OperationMethods):
    """``async with await EngramClient.connect(url, token) as engram: await engram.recall(...)``

    Over NATS (``connect``), over HTTP (``connect_http``), or as a connection file says
    (``from_connection``); ``EngramClient(nc, token)`` uses a NATS connection the caller owns."""

    def __init__(
        self,
        nc: Client | Transport,
        token: str = "",
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        owns_connection: bool = False,
    ) -> None:
        self.transport: Transport = (
            NatsTransport(nc, token, owns_connection=owns_connection) if isinstance(nc, Client) else nc
        )
        self._timeout = timeout

    @classmethod
    # The timeout is the per-request default, not a deadline for this call.
    async def connect(
        cls,
        url: str,
        token: str,
        *,
        timeout: float = DEFAULT_TIMEOUT_S,  # noqa: ASYNC109
        inbox_prefix: str = "_INBOX",
        **nats_options: Any,
    ) -> EngramClient:
        """Over NATS. ``inbox_prefix``: where replies come back (a NATS identity may receive only
        under its own); ``nats_options`` go to ``nats.connect`` as they are, e.g. the NATS identity
        from :meth:`ConnectionInfo.nats_options`.

        An identity NATS refuses raises :class:`~engram_client.errors.Unauthenticated` at the first
        refusal (nats-py alone would retry for minutes); so does every request once the server
        has refused an open connection's identity (revoked or rotated away)."""
        refusals = Refusals(url, {"name": "engram-client", **nats_options})
        nc = await refusals.connect(inbox_prefix=inbox_prefix)
        return cls(NatsTransport(nc, token, refusals=refusals, owns_connection=True), timeout=timeout)

    @classmethod
    def connect_http(
        cls,
        url: str,
        token: str,
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        http: httpx.AsyncClient | None = None,
    ) -> EngramClient:
        """Over the HTTP API at ``url`` (e.g. ``http://127.0.0.1:8080``); ``http``: a client of
        the caller's (its own TLS, proxies), otherwise one of this client's own."""
        return cls(HttpTransport(url, token, http=http), timeout=timeout)

    @classmethod
    async def from_connection(
        cls,
        info: ConnectionInfo | str | Path,
        *,
        transport: Literal["nats", "http"] = "nats",
        token: str | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,  # noqa: ASYNC109
        **nats_options: Any,
    ) -> EngramClient:
        """As a connection file says (``engram up``'s ``connection.json``, or one from ``engram
        credentials mint``): its NATS identity and token, or its HTTP API; ``token`` overrides
        the file's (an agent's own token)."""
        if not isinstance(info, ConnectionInfo):
            info = ConnectionInfo.load(info)
        bearer = info.token if token is None else token
        if transport == "http":
            if not info.http_url:
                raise ValueError("this connection file names no HTTP API (http_url)")
            return cls.connect_http(info.http_url, bearer, timeout=timeout)
        return await cls.connect(
            info.nats_url, bearer, timeout=timeout, **{**info.nats_options(), **nats_options}
        )

    async def __aenter__(self) -> EngramClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await self.transport.close()

    def _timeout_of(self, op: Operation[Any, Any], payload: dict[str, Any]) -> float:
        # A waiting request (``save`` with ``wait``) answers after the work ran: allow it more.
        if op.wait_field and payload.get(op.wait_field):
            return self._timeout * 3
        return op.timeout_s or self._timeout

    @staticmethod
    def _payload(op: Operation[Any, Any], fields: dict[str, Any]) -> dict[str, Any]:
        """``fields`` validated as the operation's request model: a bad field is raised here
        (pydantic's ``ValidationError``), before anything is sent."""
        payload: dict[str, Any] = op.request.model_validate(fields).model_dump(mode="json", exclude_none=True)
        return payload

    async def _call(self, op: Operation[Any, Rep], fields: dict[str, Any]) -> Rep:
        """One operation of the table: its request validated, its reply model out (the table's
        types tie each generated method to its operation; mypy checks the replies)."""
        payload = self._payload(op, fields)
        data = await self.transport.call(op, payload, self._timeout_of(op, payload))
        return op.parse_reply(data)

    async def _pages(self, op: Operation[Any, Rep], fields: dict[str, Any]) -> AsyncIterator[Rep]:
        """Every page of a paged operation in order (each page re-authorized by Engram)."""
        payload = self._payload(op, fields)
        async for data in self.transport.pages(op, payload, self._timeout_of(op, payload)):
            yield op.parse_reply(data)

    async def publish_session(self, session: SessionEnded | dict[str, Any]) -> int:
        """Publish ``engram.session.ended`` (NATS only: JetStream acknowledges it once stored; it
        is checked after); returns the stream sequence. Publishing the same ``event_id`` again is
        a no-op in effect: ingest takes each organization's event once, after verifying the token.
        No Nats-Msg-Id is sent — JetStream would drop this session if anyone had published that id
        first. ``submit_session`` checks it before it is stored, over either transport."""
        model = session if isinstance(session, SessionEnded) else SessionEnded.model_validate(session)
        return await self.transport.publish_session(model.model_dump_json().encode())

    # nats-py takes a timeout per request; so does this thin wrapper.
    async def request(self, subject: str, payload: dict[str, Any], *, timeout: float | None = None) -> Any:  # noqa: ASYNC109
        """One raw request-reply on NATS; a wire error is raised as its typed ``EngramError``."""
        if not isinstance(self.transport, NatsTransport):
            raise TypeError("request(subject, ...) is NATS request-reply; this client speaks HTTP")
        return await self.transport.request(subject, payload, timeout or self._timeout)


class SyncEngramClient(SyncOperationMethods):
    """The same client, blocking, for code without an event loop (scripts, notebooks, WSGI):

        with SyncEngramClient.from_connection(".engram/connection.json") as engram:
            engram.recall(agent_config_id, cue="plan the trip")

    It runs an :class:`EngramClient` on an event loop of its own, in a thread of its own."""

    def __init__(self, connect: Awaitable[EngramClient] | EngramClient) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="engram-client", daemon=True)
        self._thread.start()
        try:
            self._client: EngramClient = (
                connect if isinstance(connect, EngramClient) else self._run(_awaited(connect))
            )
        except BaseException:
            self._stop()
            raise

    @classmethod
    def connect(cls, url: str, token: str, **options: Any) -> SyncEngramClient:
        """Over NATS; the options are :meth:`EngramClient.connect`'s."""
        return cls(EngramClient.connect(url, token, **options))

    @classmethod
    def connect_http(cls, url: str, token: str, **options: Any) -> SyncEngramClient:
        """Over HTTP; the options are :meth:`EngramClient.connect_http`'s."""
        return cls(_made(lambda: EngramClient.connect_http(url, token, **options)))

    @classmethod
    def from_connection(cls, info: ConnectionInfo | str | Path, **options: Any) -> SyncEngramClient:
        """As a connection file says; the options are :meth:`EngramClient.from_connection`'s."""
        return cls(EngramClient.from_connection(info, **options))

    def __enter__(self) -> SyncEngramClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        if self._loop.is_closed():
            return
        try:
            self._run(self._client.close())
        finally:
            self._stop()

    def publish_session(self, session: SessionEnded | dict[str, Any]) -> int:
        return self._run(self._client.publish_session(session))

    def _run(self, call: Awaitable[T]) -> T:
        return asyncio.run_coroutine_threadsafe(_awaited(call), self._loop).result()

    def _iterate(self, pages: AsyncIterator[T]) -> Iterator[T]:
        while True:
            try:
                yield self._run(pages.__anext__())
            except StopAsyncIteration:
                return

    def _stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()


async def _awaited(call: Awaitable[T]) -> T:
    return await call


async def _made(make: Any) -> EngramClient:
    """An HTTP client is made on the loop that will use it (httpx binds its pool to that loop)."""
    client: EngramClient = make()
    return client
