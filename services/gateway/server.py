"""Running the gateway: uvicorn on a socket of our own, inside a process that owns its signals —
``engram up`` (beside the services) and ``engram serve gateway`` (alone, as in production).
This is the gateway process's composition root: it also hosts the MCP server's streamable HTTP
transport (``services.mcp``), the one place the gateway reaches into another service."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import uvicorn

from services.gateway.app import build_app
from services.gateway.bridge import Bridge
from services.gateway.http_protocol import EnvelopeHttpToolsProtocol
from services.mcp import streamable_http_app
from shared.runtime.process_memory import settle_heap
from shared.runtime.settings import EngramSettings
from shared.security.oidc import build_verifier

__all__ = ["RunningGateway", "running_gateway", "serve_gateway"]

log = logging.getLogger("engram.gateway")

#: In-flight HTTP requests get this long to finish at shutdown.
_GRACE_S = 5.0
_STARTUP_S = 10.0


class _Server(uvicorn.Server):
    """uvicorn without its own signal handlers (the process running it owns SIGINT/SIGTERM) and
    without its 100 ms tick."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self._exiting = asyncio.Event()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    def exit(self) -> None:
        self.should_exit = True
        self._exiting.set()

    async def main_loop(self) -> None:
        # uvicorn's loop wakes every 100 ms to look at should_exit and, every tenth time, refresh
        # the Date header: ten wake-ups a second in an idle gateway (record 0089). Once a second
        # does the refresh (ticks counted in tenths, as uvicorn does); exit() wakes it at once.
        counter = 0
        while not await self.on_tick(counter):
            counter += 10
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._exiting.wait(), 1.0)


@dataclass(frozen=True)
class RunningGateway:
    host: str
    port: int

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"


def bind(host: str, port: int, *, fall_back: bool = False) -> socket.socket:
    """A listening socket on ``host:port``; with ``fall_back``, on a free port when that one is
    taken (``engram up``: a second stack on one machine still starts)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named explicitly: asyncio sets TCP_NODELAY only on accepted sockets whose
    # protocol says TCP, and without it every reply written in two parts (uvicorn writes headers,
    # then body) waits ~40 ms for the client's delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        if not fall_back or port == 0:
            sock.close()
            raise RuntimeError(f"cannot listen for HTTP on {host}:{port} ({exc.strerror})") from exc
        log.warning("port %d is taken; the HTTP gateway takes a free port instead", port)
        sock.bind((host, 0))
    sock.listen(2048)
    sock.setblocking(False)
    return sock


@asynccontextmanager
async def running_gateway(
    settings: EngramSettings, nkey_seed: str, *, fall_back: bool = False
) -> AsyncIterator[RunningGateway]:
    """Serve the gateway on ``settings.http_host:http_port`` until the block ends: connected to
    NATS as ``nkey_seed`` (the gateway's identity) first, listening after. Its token keys
    (``ENGRAM_TOKEN_KEYS``, as the services') verify MCP clients' bearer tokens at the door."""
    tokens = build_verifier(settings)  # no keys, or a bad issuer list: fails here
    bridge = await Bridge.connect(settings, nkey_seed)
    origins = [o.strip() for o in settings.http_cors_origins.split(",") if o.strip()]
    config = uvicorn.Config(
        build_app(bridge, streamable_http_app(bridge.nats, tokens), tokens, cors_origins=origins),
        lifespan="on",  # the MCP session manager at /mcp (services/mcp) runs in it
        http=EnvelopeHttpToolsProtocol,  # what its parser refuses, in the SPEC 9 envelope too
        access_log=False,
        server_header=False,
        log_config=None,  # our logging (shared.observability.logging) stays as it is
        timeout_graceful_shutdown=int(_GRACE_S),
    )
    server = _Server(config)
    sock = bind(settings.http_host, settings.http_port, fall_back=fall_back)
    task = asyncio.create_task(server.serve(sockets=[sock]), name="engram-gateway")
    try:
        async with asyncio.timeout(_STARTUP_S):
            while not server.started:
                if task.done():
                    await task  # raises what stopped it
                    raise RuntimeError("the HTTP gateway stopped while starting")
                await asyncio.sleep(0.01)
        host, port = sock.getsockname()[:2]
        running = RunningGateway(str(host), int(port))
        log.info("HTTP gateway on %s", running.url)
        yield running
    finally:
        server.exit()
        with contextlib.suppress(Exception):
            await task
        sock.close()
        await bridge.close()
        await tokens.aclose()


async def serve_gateway(settings: EngramSettings) -> int:
    """``engram serve gateway``: the gateway alone until SIGTERM/SIGINT (its NATS identity is
    ``ENGRAM_NATS_NKEY_SEED``, like any ``engram serve`` process); ``/readyz`` on its own port."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        async with running_gateway(settings, settings.nats_nkey_seed.get_secret_value()):
            settle_heap()  # start-up is done: what it made lives as long as the process
            await stop.wait()
            log.info("stopping: finishing in-flight requests")
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    return 0
