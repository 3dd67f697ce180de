"""The two ways to reach Engram behind one interface: NATS request-reply (what the services
answer) and the HTTP gateway (the same operations as routes; docs/adr/0090-thin-python-client.md).
A transport moves one operation's JSON request and its JSON reply; an error reply is raised as its typed
:class:`~engram_client.contracts.errors.EngramError` here, whichever way it came."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

from nats.aio.client import Client

from engram_client.contracts.errors import EngramError, Internal, Unavailable, error_for_code
from engram_client.contracts.nats_connect import Refusals, refusal_raised
from engram_client.contracts.operations import Operation
from engram_client.http_shape import HttpShape

if TYPE_CHECKING:
    # httpx is imported when an HTTP transport is made: a NATS client never pays for it.
    import httpx

__all__ = ["HttpTransport", "NatsTransport", "Transport", "raise_for_error"]

#: JSON Lines: how the gateway streams every page of a paged operation (``GET /v1/export``).
JSONL = "application/jsonl"


def raise_for_error(data: Any) -> Any:
    """``data`` unchanged, unless it is the SPEC 9 error envelope: then its typed exception."""
    if isinstance(data, dict) and isinstance(data.get("error"), dict):
        err = data["error"]
        details = err.get("details")
        raise error_for_code(
            str(err.get("code")), str(err.get("message")), details if isinstance(details, dict) else None
        )
    return data


async def _followed_pages(
    payload: dict[str, Any], fetch: Callable[[dict[str, Any]], Awaitable[Any]]
) -> AsyncIterator[Any]:
    """Each page ``fetch`` returns for ``payload``, then for ``payload`` with the last page's
    ``next_page_token`` as its ``page_token``, until a page has none."""
    token: str | None = None
    while True:
        page = await fetch({**payload, "page_token": token} if token else payload)
        yield page
        token = page.get("next_page_token")
        if not token:
            return


class Transport(Protocol):
    """What :class:`~engram_client.EngramClient` needs of a way to reach Engram."""

    async def call(self, op: Operation[Any, Any], payload: dict[str, Any], timeout: float) -> Any:  # noqa: ASYNC109
        """One operation: ``payload`` (the request model, dumped) out, the decoded reply back."""
        ...

    def pages(self, op: Operation[Any, Any], payload: dict[str, Any], timeout: float) -> AsyncIterator[Any]:
        """A paged operation's replies in order (``next_page_token`` followed to the end)."""
        ...

    async def publish_session(self, body: bytes) -> int:
        """``engram.session.ended``, stored by JetStream: its stream sequence."""
        ...

    async def close(self) -> None: ...


class NatsTransport:
    """Request-reply on NATS with an ``Authorization`` header, as every service expects it."""

    def __init__(
        self, nc: Client, token: str, *, refusals: Refusals | None = None, owns_connection: bool = False
    ) -> None:
        self.nc = nc
        self._js = nc.jetstream()
        self._token = token
        #: How this transport's own connection learns that NATS refused its identity.
        self._refusals = refusals
        self._owns = owns_connection

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._token}"}

    async def request(self, subject: str, payload: dict[str, Any], timeout: float) -> Any:  # noqa: ASYNC109
        with refusal_raised(self._refusals):
            reply = await self.nc.request(
                subject, json.dumps(payload, default=str).encode(), timeout=timeout, headers=self._headers()
            )
        return raise_for_error(json.loads(reply.data))

    async def call(self, op: Operation[Any, Any], payload: dict[str, Any], timeout: float) -> Any:  # noqa: ASYNC109
        return await self.request(op.subject, payload, timeout)

    def pages(self, op: Operation[Any, Any], payload: dict[str, Any], timeout: float) -> AsyncIterator[Any]:
        return _followed_pages(payload, lambda page_payload: self.call(op, page_payload, timeout))

    async def publish_session(self, body: bytes) -> int:
        # Imported here: the subject is a fact of the table, the JetStream API of nats-py.
        from engram_client.contracts.operations import SESSION_ENDED

        with refusal_raised(self._refusals):
            ack = await self._js.publish(SESSION_ENDED.subject, body, headers=self._headers())
        return int(ack.seq)

    async def close(self) -> None:
        if self._owns and not self.nc.is_closed:
            await self.nc.drain()


class HttpTransport:
    """The HTTP gateway (``engram up``'s, or ``engram serve gateway``): each operation at its route,
    its request in the query (``GET``, ``DELETE``) or the JSON body, path fields in the path."""

    def __init__(self, base_url: str, token: str, *, http: httpx.AsyncClient | None = None) -> None:
        import httpx

        self.base_url = base_url.rstrip("/")
        self._owns = http is None
        self._http = http or httpx.AsyncClient()
        self._headers = {"Authorization": f"Bearer {token}"}

    async def call(self, op: Operation[Any, Any], payload: dict[str, Any], timeout: float) -> Any:  # noqa: ASYNC109
        return _decoded(await self._send(op, payload, timeout))

    async def _send(self, op: Operation[Any, Any], payload: dict[str, Any], timeout: float) -> httpx.Response:  # noqa: ASYNC109
        import httpx

        shape = HttpShape.of(op)
        path, rest = shape.path(payload)
        try:
            response = await self._http.request(
                op.http_method,
                self.base_url + path,
                params=tuple(shape.to_query(rest)) if not shape.in_body else None,
                json=rest if shape.in_body else None,
                headers=self._headers,
                timeout=timeout,
            )
        except httpx.TransportError as exc:
            raise Unavailable(f"the HTTP API at {self.base_url} does not answer: {exc!r}") from exc
        return response

    def pages(self, op: Operation[Any, Any], payload: dict[str, Any], timeout: float) -> AsyncIterator[Any]:
        return _followed_pages(payload, lambda page_payload: self._page(op, page_payload, timeout))

    async def _page(self, op: Operation[Any, Any], payload: dict[str, Any], timeout: float) -> Any:  # noqa: ASYNC109
        response = await self._send(op, payload, timeout)
        if response.headers.get("content-type", "").startswith(JSONL):
            # The gateway followed the pages itself (GET /v1/export): every entry, one a line, as
            # one last page.
            return _jsonl_page(response)
        return _decoded(response)

    async def publish_session(self, body: bytes) -> int:
        raise Unavailable(
            "publishing to the session stream takes NATS; over HTTP, submit_session "
            "(POST /v1/sessions) checks and stores the session"
        )

    async def close(self) -> None:
        if self._owns:
            await self._http.aclose()


def _jsonl_page(response: httpx.Response) -> dict[str, Any]:
    """The entries of a JSON Lines answer as one last page; an error on a later page ends the
    stream with its envelope as the last line, raised here."""
    entries = [json.loads(line) for line in response.text.splitlines() if line.strip()]
    if entries:
        raise_for_error(entries[-1])
    return {"entries": entries, "next_page_token": None}


def _decoded(response: httpx.Response) -> Any:
    try:
        data = response.json()
    except ValueError:
        data = None
    if response.is_success and data is not None:
        return raise_for_error(data)
    raise_for_error(data)  # the gateway's SPEC 9 envelope, with its code
    error: EngramError = Internal(
        f"HTTP {response.status_code} without an error envelope", {"status": response.status_code}
    )
    raise error
