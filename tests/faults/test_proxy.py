"""The slow link itself: bytes arrive whole and in order through it however it delays them, and a
cut ends the connection for both ends (the fault tests' counts rely on both)."""

from __future__ import annotations

import asyncio
import os

import pytest

from tests.faults.proxy import SlowLink


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()
    writer.close()


async def test_bytes_arrive_whole_and_in_order_through_a_slow_link() -> None:
    server = await asyncio.start_server(_echo, "127.0.0.1", 0)
    payload = os.urandom(1 << 20)
    try:
        async with SlowLink("127.0.0.1", server.sockets[0].getsockname()[1], latency_s=0.002) as link:
            reader, writer = await asyncio.open_connection("127.0.0.1", link.port)
            for i in range(0, len(payload), 10_000):
                writer.write(payload[i : i + 10_000])
            await writer.drain()
            writer.write_eof()
            echoed = await asyncio.wait_for(reader.read(-1), timeout=60)
            writer.close()
        assert echoed == payload
        assert link.stats.resets == 0
        assert link.stats.bytes == 2 * len(payload)
    finally:
        server.close()


async def test_a_cut_ends_the_connection() -> None:
    server = await asyncio.start_server(_echo, "127.0.0.1", 0)
    try:
        async with SlowLink("127.0.0.1", server.sockets[0].getsockname()[1]) as link:
            reader, writer = await asyncio.open_connection("127.0.0.1", link.port)
            writer.write(b"ping")
            assert await asyncio.wait_for(reader.readexactly(4), timeout=30) == b"ping"
            assert link.cut_all() == 1
            with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
                await asyncio.wait_for(reader.readexactly(1), timeout=30)
            writer.close()
        assert link.stats.resets == 1
    finally:
        server.close()
