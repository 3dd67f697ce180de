"""A client's NATS connection that takes "no" for an answer.

nats-py retries a refused login as it retries a lost connection: every ``reconnect_time_wait``,
``max_reconnect_attempts`` times (two minutes by default), logging a traceback each time, and then
raises ``NoServersError``, which names no reason. But nats-server refusing an identity (an unknown
nkey, one revoked or rotated away by ``engram credentials``) is permanent: the same identity is
refused again on every attempt. So here the first refusal ends it — out of :meth:`Refusals.connect`
as :class:`~engram_client.contracts.errors.Unauthenticated` naming the identity, or, for an open connection
whose identity the server stops admitting (it closes the connection and refuses the reconnect),
by closing the connection and failing its requests, those waiting included, with that error.

    nc = await connect_nats(info.nats_url, **info.nats_options())
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import nkeys
from nats.aio.client import Client
from nats.errors import ConnectionClosedError
from nats.errors import TimeoutError as NatsTimeout

from engram_client.contracts.errors import Unauthenticated

__all__ = ["Refusals", "connect_nats", "refusal_raised"]

log = logging.getLogger("engram.client")

#: What nats-server answers a login it does not (or no longer) admit.
_REFUSED = re.compile(r"authorization violation|authentication (?:expired|revoked)", re.IGNORECASE)


def _refused(exc: BaseException) -> bool:
    return bool(_REFUSED.search(str(exc)))


def _identity(options: dict[str, Any]) -> str:
    """The NATS identity a connection logs in with, as a message may name it (never the seed)."""
    seed = options.get("nkeys_seed_str")
    if not seed:
        return "this connection's credentials"
    try:
        return f"nkey {nkeys.from_seed(bytearray(str(seed).encode())).public_key.decode()}"
    except Exception:  # not a seed at all: nats-py refuses it on its own
        return "this connection's nkey"


class Refusals:
    """One connection (``nats.connect``'s options, ``error_cb`` and ``closed_cb`` included) and
    whether NATS refused its identity. Errors other than a refusal (a lost connection nats-py will
    retry) are logged in one line, or passed to the caller's own ``error_cb``."""

    def __init__(self, url: str, options: dict[str, Any]) -> None:
        self._url = url
        self._options = dict(options)
        self._identity = _identity(self._options)
        #: The caller's own callbacks, still called for what is not a refusal.
        self._error_cb: Callable[[Exception], Awaitable[None]] | None = self._options.pop("error_cb", None)
        self._closed_cb: Callable[[], Awaitable[None]] | None = self._options.pop("closed_cb", None)
        self.nc = Client()
        self._connected = False
        #: Why the connection ended for good, once NATS refused its identity.
        self.refusal: Unauthenticated | None = None
        self._closing: asyncio.Task[None] | None = None

    async def connect(self, **more: Any) -> Client:
        """Connect (``more`` adds to the options); a refused identity raises ``Unauthenticated``
        after one attempt."""
        try:
            await self.nc.connect(
                self._url,
                error_cb=self._on_error,
                closed_cb=self._on_closed,
                **{**self._options, **more},
            )
        except Unauthenticated:
            await _close_quietly(self.nc)
            raise
        self._connected = True
        return self.nc

    def _refuse(self, why: BaseException) -> Unauthenticated:
        if self.refusal is None:
            self.refusal = Unauthenticated(
                f"NATS authorization refused {self._identity} at {self._url} ({why}): it is unknown "
                "to the server, or was revoked or rotated away; use current credentials "
                "(`engram credentials mint` or `rotate`)",
                {"nats_url": self._url, "identity": self._identity},
            )
        return self.refusal

    async def _on_error(self, exc: Exception) -> None:
        if not _refused(exc):
            if self.refusal is not None:  # the refused connection's socket going away: no news
                return
            if self._error_cb is not None:
                await self._error_cb(exc)
            else:
                log.warning("NATS connection to %s: %s", self._url, exc or type(exc).__name__)
            return
        refusal = self._refuse(exc)
        if not self._connected:
            raise refusal  # out of nats-py's connect loop: no second attempt
        self._abandon()
        # Called from nats-py's reconnect task, which closing the connection cancels: close it
        # from a task of its own (the reconnect loop waits reconnect_time_wait before retrying).
        if self._closing is None:
            self._closing = asyncio.get_running_loop().create_task(_close_quietly(self.nc))

    async def _on_closed(self) -> None:
        error = self.nc.last_error
        if self.refusal is None and error is not None and _refused(error):
            self._refuse(error)  # the server's -ERR on an open connection, which nats-py closed
            self._abandon()
        if self._closed_cb is not None:
            await self._closed_cb()

    def _abandon(self) -> None:
        """Drop what nats-py keeps for a connection it would resume: a refused one never does.
        nats-py (2.16) leaves a request in flight to its timeout when a connection ends, and its
        close() writes what was buffered while reconnecting to the dead socket, failing half-way
        (subscriptions and socket left open). Its private state, read defensively."""
        for waiting in list(getattr(self.nc, "_resp_map", {}).values()):
            if not waiting.done():
                waiting.set_exception(ConnectionClosedError())
                waiting.exception()  # a request awaiting it raises it; one nats-py dropped is not logged
        buffered = getattr(self.nc, "_pending", None)
        if isinstance(buffered, list) and buffered:
            buffered.clear()
            self.nc._pending_data_size = 0


async def connect_nats(url: str, **nats_options: Any) -> Client:
    """``nats.connect(url, **nats_options)``, but a refused identity fails at once (module doc)."""
    return await Refusals(url, nats_options).connect()


@contextlib.contextmanager
def refusal_raised(refusals: Refusals | None) -> Iterator[None]:
    """A request that failed because NATS refused the connection's identity raises that refusal
    (``Unauthenticated``) instead of a timeout or a closed connection."""
    try:
        yield
    except (NatsTimeout, ConnectionClosedError) as exc:
        if refusals is not None and refusals.refusal is not None:
            raise refusals.refusal from exc
        raise


async def _close_quietly(nc: Client) -> None:
    """Close a connection that may be half open (refused at login, or reconnecting)."""
    with contextlib.suppress(Exception):
        await nc.close()
