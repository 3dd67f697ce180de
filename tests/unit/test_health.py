"""The health endpoint: liveness always, readiness only when every check passes and not draining."""

from __future__ import annotations

import asyncio
import json

import pytest

from shared.observability.health import HealthServer


async def _get(port: int, path: str, method: str = "GET") -> tuple[int, dict[str, object]]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"{method} {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    await writer.drain()
    raw = await reader.read()
    writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body) if body else {}


async def test_readiness_follows_the_checks_and_draining() -> None:
    """/readyz is 200 only while every check passes and the process is not draining; /healthz stays 200."""
    state = {"nats": True}

    async def nats() -> bool:
        return state["nats"]

    async def broken() -> bool:
        raise ConnectionError("postgres away")

    server = HealthServer("127.0.0.1", 0, {"nats": nats})
    await server.start()
    try:
        assert await _get(server.port, "/healthz") == (200, {"status": "ok"})
        status, body = await _get(server.port, "/readyz")
        assert status == 200
        assert body["checks"] == {"not_draining": True, "nats": True}
        state["nats"] = False
        status, body = await _get(server.port, "/readyz")
        assert (status, body["status"]) == (503, "not ready")
        state["nats"] = True
        server.add_check("postgres", broken)
        status, body = await _get(server.port, "/readyz")
        assert status == 503
        assert body["checks"]["postgres"] is False  # type: ignore[index]
        state["nats"] = True
        await server.stop()
        server = HealthServer("127.0.0.1", 0, {"nats": nats})
        await server.start()
        server.draining = True
        status, body = await _get(server.port, "/readyz")
        assert status == 503
        assert body["checks"]["not_draining"] is False  # type: ignore[index]
        assert (await _get(server.port, "/healthz"))[0] == 200
    finally:
        await server.stop()


async def test_unknown_paths_and_methods_are_refused() -> None:
    """Anything but GET/HEAD of the probes and /metrics answers 404 or 405, never a crash."""
    server = HealthServer("127.0.0.1", 0)
    await server.start()
    try:
        assert (await _get(server.port, "/nowhere"))[0] == 404
        assert (await _get(server.port, "/healthz", "POST"))[0] == 405
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"\xff\xfe garbage\r\n\r\n")
        await writer.drain()
        assert (await reader.read()).startswith(b"HTTP/1.1 405")
        writer.close()
    finally:
        await server.stop()


async def test_a_taken_port_is_reported_with_what_to_set() -> None:
    """Two processes on one health port: the second says which variable to change."""
    first = HealthServer("127.0.0.1", 0)
    await first.start()
    try:
        second = HealthServer("127.0.0.1", first.port)
        with pytest.raises(RuntimeError, match="ENGRAM_HEALTH_PORT"):
            await second.start()
    finally:
        await first.stop()


async def test_metrics_answer_the_prometheus_text_format() -> None:
    """/metrics answers 200 in the Prometheus text format with Engram's metrics, refreshed first."""
    from prometheus_client.parser import text_string_to_metric_families

    from shared.observability.metrics import OUTBOX_BACKLOG, refreshing

    async def refresh() -> None:
        OUTBOX_BACKLOG.set(42)

    server = HealthServer("127.0.0.1", 0)
    await server.start()
    try:
        with refreshing(refresh):
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            await writer.drain()
            raw = await reader.read()
            writer.close()
    finally:
        await server.stop()
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    assert b"Content-Type: text/plain; version=" in head
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    assert families["engram_outbox_backlog_messages"].samples[0].value == 42
    assert "engram_requests" in families
