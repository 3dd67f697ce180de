"""A slow, lossy link for the fault tests: a userspace TCP proxy between Engram's services and
Postgres or NATS (the kernel here has no ``netem``, so latency and connection loss are made in
the test's own process).

Every chunk read from either side is forwarded after ``latency_s`` (a delivery queue per
direction, so latency delays bytes without also capping throughput to one chunk per delay), and
after each chunk the connection is cut — both sockets aborted, as a dropped link or a reset by a
middlebox looks to its ends — with probability ``reset_rate``. ``cut_all()`` cuts every open
connection at once. Random choices come from a seeded generator; ``heal()`` turns all faults off."""

from __future__ import annotations

import asyncio
import contextlib
import random
from dataclasses import dataclass, field

__all__ = ["LinkStats", "SlowLink"]

#: Bytes read per chunk; the reset rate is per chunk forwarded.
CHUNK = 64 * 1024


@dataclass
class LinkStats:
    connections: int = 0
    chunks: int = 0
    bytes: int = 0
    #: Connections cut, by ``reset_rate`` or ``cut_all()``.
    resets: int = 0


@dataclass(eq=False)  # identity-hashed: held in a set while open
class _Pair:
    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    cut: bool = False


class SlowLink:
    """Listen on 127.0.0.1 (a free port) and forward to ``target_host:target_port``."""

    def __init__(
        self,
        target_host: str,
        target_port: int,
        *,
        latency_s: float = 0.0,
        reset_rate: float = 0.0,
        seed: int = 25,
    ) -> None:
        self.target = (target_host, target_port)
        self.latency_s = latency_s
        self.reset_rate = reset_rate
        self.stats = LinkStats()
        self._random = random.Random(seed)
        self._server: asyncio.Server | None = None
        self._pairs: set[_Pair] = set()
        self.port = 0

    async def start(self) -> SlowLink:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        self.cut_all(count=False)
        if self._server is not None:
            await self._server.wait_closed()

    async def __aenter__(self) -> SlowLink:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def heal(self) -> None:
        """No more latency or resets from now on (bytes already queued still arrive late)."""
        self.latency_s = 0.0
        self.reset_rate = 0.0

    def cut_all(self, *, count: bool = True) -> int:
        """Cut every open connection now; returns how many were cut."""
        pairs = list(self._pairs)
        for pair in pairs:
            self._cut(pair, count=count)
        return len(pairs)

    def _cut(self, pair: _Pair, *, count: bool = True) -> None:
        if pair.cut:
            return
        pair.cut = True
        if count:
            self.stats.resets += 1
        self._pairs.discard(pair)
        # abort(), not close(): no orderly FIN after the bytes in flight, the connection is gone.
        pair.client.transport.abort()
        pair.upstream.transport.abort()
        for task in pair.tasks:
            if task is not asyncio.current_task():
                task.cancel()

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            upstream_r, upstream_w = await asyncio.open_connection(*self.target)
        except OSError:
            client_w.transport.abort()
            return
        self.stats.connections += 1
        pair = _Pair(client_w, upstream_w)
        self._pairs.add(pair)
        pair.tasks = [
            asyncio.create_task(self._pump(pair, client_r, upstream_w)),
            asyncio.create_task(self._pump(pair, upstream_r, client_w)),
        ]
        await asyncio.gather(*pair.tasks, return_exceptions=True)

    async def _pump(self, pair: _Pair, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Read one direction into a queue of (due time, bytes); a second task writes each when due,
        in order. End of stream is passed on as a half-close."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, data = await queue.get()
                if (wait := due - loop.time()) > 0:
                    await asyncio.sleep(wait)
                if not data:
                    with contextlib.suppress(OSError, RuntimeError):
                        writer.write_eof()
                    return
                writer.write(data)
                await writer.drain()

        delivering = asyncio.create_task(deliver())
        try:
            while not pair.cut:
                data = await reader.read(CHUNK)
                queue.put_nowait((loop.time() + self.latency_s, data))
                if not data:
                    break
                self.stats.chunks += 1
                self.stats.bytes += len(data)
                if self.reset_rate and self._random.random() < self.reset_rate:
                    self._cut(pair)
                    return
            await delivering
        except (OSError, asyncio.IncompleteReadError):
            self._cut(pair, count=False)
        finally:
            delivering.cancel()
            # The other direction may still be open (a half-close); once both pumps end, the pair goes.
            if all(t.done() or t is asyncio.current_task() for t in pair.tasks):
                self._pairs.discard(pair)
                pair.client.transport.abort()
                pair.upstream.transport.abort()
