"""``/healthz``, ``/readyz`` and ``/metrics`` over plain HTTP for orchestrator probes (Kubernetes
``httpGet``, Compose ``healthcheck``) and Prometheus. Three routes do not need a web framework: the
standard library's asyncio streams serve them, so a service process carries no HTTP stack it does
not otherwise use.

- ``/healthz`` (liveness) answers 200 while the event loop turns. It checks no dependency on
  purpose: a Postgres restart must not make an orchestrator restart every service.
- ``/readyz`` (readiness) answers 200 only when every check passes (started, connected, not
  draining), else 503; the body names each check, so ``curl`` shows what is missing.
- ``/metrics`` answers the Prometheus text format (``shared.observability.metrics.exposition``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Mapping

from shared.observability.metrics import exposition

__all__ = ["HealthServer", "ReadinessCheck"]

log = logging.getLogger(__name__)

#: A named readiness check: true when that part is ready.
ReadinessCheck = Callable[[], Awaitable[bool]]
#: A probe that takes longer than this counts as failed (a wedged dependency is not ready).
_CHECK_TIMEOUT_S = 2.0
_REASONS = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable"}


class HealthServer:
    """Serves the probes on ``host:port`` from :meth:`start` until :meth:`stop`."""

    def __init__(self, host: str, port: int, checks: Mapping[str, ReadinessCheck] | None = None) -> None:
        self.host = host
        self.port = port
        self._checks: dict[str, ReadinessCheck] = dict(checks or {})
        self._server: asyncio.Server | None = None
        #: Set on SIGTERM: readiness fails from then on, so no new work is routed here.
        self.draining = False

    def add_check(self, name: str, check: ReadinessCheck) -> None:
        self._checks[name] = check

    async def start(self) -> None:
        try:
            self._server = await asyncio.start_server(self._serve, self.host, self.port)
        except OSError as exc:
            raise RuntimeError(
                f"cannot listen for health probes on {self.host}:{self.port} ({exc.strerror}); "
                "set ENGRAM_HEALTH_PORT to a free port (0 turns the probes off)"
            ) from exc
        if self.port == 0:  # an ephemeral port (tests): report the one the kernel chose
            self.port = int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None

    async def readiness(self) -> dict[str, bool]:
        """Each check's outcome (a check that raises or hangs counts as not ready)."""
        results = {"not_draining": not self.draining}
        for name, check in self._checks.items():
            try:
                results[name] = bool(await asyncio.wait_for(check(), _CHECK_TIMEOUT_S))
            except Exception:
                results[name] = False
        return results

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readline(), _CHECK_TIMEOUT_S)
            # Headers are read and ignored: probes carry nothing we need.
            while (line := await asyncio.wait_for(reader.readline(), _CHECK_TIMEOUT_S)) not in (
                b"\r\n",
                b"\n",
                b"",
            ):
                del line
            method, _, rest = request.decode("latin-1").partition(" ")
            path = rest.split(" ", 1)[0].split("?", 1)[0]
            if path == "/metrics" and method in ("GET", "HEAD"):
                status, (payload, content_type) = 200, await exposition()
            else:
                status, body = await self._answer(method, path)
                payload, content_type = json.dumps(body).encode(), "application/json"
            writer.write(
                f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Type: {content_type}\r\n"
                f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode()
                + (payload if method != "HEAD" else b"")
            )
            await writer.drain()
        except (TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _answer(self, method: str, path: str) -> tuple[int, dict[str, object]]:
        if method not in ("GET", "HEAD"):
            return 405, {"status": "method not allowed"}
        if path == "/healthz":
            return 200, {"status": "ok"}
        if path == "/readyz":
            checks = await self.readiness()
            ready = all(checks.values())
            return (200 if ready else 503), {"status": "ready" if ready else "not ready", "checks": checks}
        return 404, {"status": "not found"}
