"""The gateway's routes, built from the operation table: one route per operation (``POST
/v1/sessions`` included: ``engram.session.submit``, which ingest checks before anything is stored),
and the probes. Each route only moves bytes between HTTP and NATS; every rule — authentication,
tenancy, validation — stays with the service that answers, so an HTTP caller gets exactly what a
NATS caller gets."""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Route

from contracts.errors import EngramError, InvalidRequest, NotFound, Unauthenticated
from contracts.operations import MEMORY_EXPORT, OPERATIONS, Operation
from services.gateway.bridge import Bridge
from services.gateway.console import console_mount
from services.gateway.console.web import PREFIX as CONSOLE_PREFIX
from services.gateway.docs import docs_routes
from services.gateway.events import EVENTS_PATH, events_endpoint
from services.gateway.payloads import Shape, decode_object, read_limited
from shared.messaging.wire import error_reply
from shared.observability.metrics import HTTP_REQUESTS, HTTP_SECONDS, exposition
from shared.security.auth import TokenVerifier

__all__ = ["JSONL", "build_app"]

log = logging.getLogger(__name__)

#: JSON Lines: one JSON value per line (``GET /v1/export``).
JSONL = "application/jsonl"
_JSON = "application/json"
#: A reply is an error envelope when its first key is "error" (no reply model starts so).
_ERROR_REPLY = re.compile(rb'\s*\{\s*"error"\s*:')

Endpoint = Callable[[Request], Awaitable[Response]]


def error_response(exc: BaseException) -> Response:
    """The SPEC 9 envelope with its status as the HTTP status; anything unexpected is
    ``INTERNAL`` without detail (``shared.messaging.wire.error_reply`` logs it)."""
    envelope = error_reply(exc)
    status = int(envelope["error"]["status"])
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse(envelope, status_code=status, headers=headers)


def _authorization(request: Request) -> str:
    """The caller's ``Authorization`` header, unchanged. A request without a bearer token is
    refused here: there is nothing to pass on, and a service would refuse it the same way."""
    value = request.headers.get("authorization", "")
    scheme, _, token = value.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthenticated("send Authorization: Bearer <token>")
    return value


def _reply_response(op: Operation[Any, Any], reply: bytes) -> Response:
    """A service's reply as it is, with its HTTP status, and ``Retry-After`` on a 429 (the
    envelope's ``retry_after_s``, whole seconds)."""
    status = _status(op, reply)
    headers = None
    if status == 429:
        retry = json.loads(reply)["error"].get("details", {}).get("retry_after_s")
        headers = {"Retry-After": str(int(retry))} if isinstance(retry, int | float) else None
    return Response(reply, status_code=status, media_type=_JSON, headers=headers)


def _status(op: Operation[Any, Any], reply: bytes) -> int:
    """The HTTP status of a service's reply: the envelope's for an error, the reply's own
    ``status`` where its model has one (``memory.save``: 202 or 200), else 200."""
    if _ERROR_REPLY.match(reply):
        return int(json.loads(reply)["error"]["status"])
    if any("status" in model.model_fields for model in op.replies):
        return int(json.loads(reply).get("status", 200))
    return 200


async def _payload(op: Operation[Any, Any], shape: Shape, request: Request) -> bytes:
    path = {k: str(v) for k, v in request.path_params.items()}
    if not shape.in_body:
        return json.dumps(shape.from_query(list(request.query_params.multi_items()), path)).encode()
    body = await read_limited(request.stream(), request.headers.get("content-length"), op.max_request_bytes)
    if not path:
        # As the caller sent it: the service parses and validates it, as it does on NATS.
        return body or b"{}"
    return json.dumps(shape.with_path(decode_object(body), path)).encode()


def _operation_endpoint(bridge: Bridge, op: Operation[Any, Any]) -> Endpoint:
    shape = Shape.of(op)

    async def endpoint(request: Request) -> Response:
        try:
            reply = await bridge.request(op, await _payload(op, shape, request), _authorization(request))
        except Exception as exc:
            return error_response(exc)
        return _reply_response(op, reply)

    return endpoint


def _export_endpoint(bridge: Bridge) -> Endpoint:
    """``GET /v1/export``: every page of ``memory.export``, one entry per line. The first page is
    fetched before answering, so its errors get their status; an error on a later page (a page
    token expiring mid-way) ends the stream with the error envelope as its last line."""
    op, shape = MEMORY_EXPORT, Shape.of(MEMORY_EXPORT)

    async def endpoint(request: Request) -> Response:
        try:
            authorization = _authorization(request)
            query = shape.from_query(list(request.query_params.multi_items()), {})
            first = await bridge.request(op, json.dumps(query).encode(), authorization)
        except Exception as exc:
            return error_response(exc)
        if _ERROR_REPLY.match(first):
            return _reply_response(op, first)

        async def lines() -> AsyncIterator[bytes]:
            page = json.loads(first)
            while True:
                for entry in page["entries"]:
                    yield json.dumps(entry, separators=(",", ":")).encode() + b"\n"
                if not page.get("next_page_token"):
                    return
                try:
                    reply = await bridge.request(
                        op,
                        json.dumps({**query, "page_token": page["next_page_token"]}).encode(),
                        authorization,
                    )
                except Exception as exc:
                    yield json.dumps(error_reply(exc)).encode() + b"\n"
                    return
                if _ERROR_REPLY.match(reply):
                    yield reply.strip() + b"\n"
                    return
                page = json.loads(reply)

        return StreamingResponse(lines(), media_type=JSONL)

    return endpoint


def _probes(bridge: Bridge) -> list[Route]:
    async def healthz(request: Request) -> Response:
        """Liveness: the process answers (no dependency checked: a NATS blip must not restart it)."""
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> Response:
        """Readiness: NATS is reachable and every service runs somewhere
        (shared/observability/liveness.py)."""
        checks = {"nats": bridge.connected}
        if checks["nats"]:
            checks |= await bridge.services_running()
        ready = all(checks.values())
        body = {"status": "ready" if ready else "not ready", "checks": checks}
        return JSONResponse(body, status_code=200 if ready else 503)

    async def metrics(request: Request) -> Response:
        body, content_type = await exposition()
        return Response(body, media_type=content_type)

    return [
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]


def _counted(route: str, endpoint: Endpoint) -> Endpoint:
    """The endpoint, with its answers counted and timed per route (bounded labels: a route name,
    a status code — never a path with ids in it)."""

    async def counted(request: Request) -> Response:
        started = time.perf_counter()
        status = 500
        try:
            response = await endpoint(request)
            status = response.status_code
            return response
        finally:
            HTTP_SECONDS.labels(route).observe(time.perf_counter() - started)
            HTTP_REQUESTS.labels(route, str(status)).inc()

    return counted


def _by_method(endpoints: dict[str, Endpoint]) -> Endpoint:
    """One path's operations behind one route: Starlette answers a method no operation has with
    405 and an ``Allow`` naming every method of the path (one route per operation would name only
    its own)."""

    async def endpoint(request: Request) -> Response:
        method = "GET" if request.method == "HEAD" else request.method
        return await endpoints[method](request)

    return endpoint


def routes(bridge: Bridge, tokens: TokenVerifier) -> list[Route]:
    """Every route of the table (one per path), the event feed, and the probes."""
    by_path: dict[str, dict[str, Endpoint]] = {}
    for op in OPERATIONS:
        endpoint = _export_endpoint(bridge) if op is MEMORY_EXPORT else _operation_endpoint(bridge, op)
        by_path.setdefault(op.http_path, {})[op.http_method] = _counted(op.name, endpoint)
    table = [
        Route(path, _by_method(endpoints), methods=list(endpoints)) for path, endpoints in by_path.items()
    ]
    events = Route(
        EVENTS_PATH, _counted("events", events_endpoint(bridge, tokens, error_response)), methods=["GET"]
    )
    return [*table, events, *_probes(bridge)]


async def _http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own refusals (no such route, method not allowed) in the SPEC 9 envelope."""
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        return error_response(NotFound(f"no route {request.url.path}"))
    error: EngramError = InvalidRequest(str(exc.detail))
    envelope = error.to_wire()
    envelope["error"]["status"] = exc.status_code  # 405: the method is wrong, not the body
    return JSONResponse(envelope, status_code=exc.status_code, headers=exc.headers)


def build_app(
    bridge: Bridge, mcp_app: Starlette, tokens: TokenVerifier, *, cors_origins: list[str] | None = None
) -> Starlette:
    """The ASGI application, with ``mcp_app`` (the MCP server's streamable HTTP transport, built
    by the gateway process on ``bridge``'s connection) at ``/mcp``. CORS is off unless origins are
    given (``ENGRAM_HTTP_CORS_ORIGINS``)."""
    middleware = []
    if cors_origins:
        middleware.append(
            Middleware(
                CORSMiddleware,
                allow_origins=cors_origins,
                allow_methods=["GET", "POST", "PUT", "PATCH", "DELETE"],
                allow_headers=["Authorization", "Content-Type"],
            )
        )

    # MCP over streamable HTTP: the caller is each request's Authorization header, as on every
    # other route. Its session manager runs in this app's lifespan.
    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with mcp_app.router.lifespan_context(mcp_app):
            yield

    async def console_root(request: Request) -> Response:
        return RedirectResponse(f"{CONSOLE_PREFIX}/", status_code=303)

    app = Starlette(
        routes=[
            *routes(bridge, tokens),
            Route("/mcp", endpoint=mcp_app),
            Route(CONSOLE_PREFIX, console_root, methods=["GET"]),
            console_mount(bridge, tokens),
            *docs_routes(),
        ],
        middleware=middleware,
        exception_handlers={HTTPException: _http_error},
        lifespan=lifespan,
    )
    # No silent 307 from ``/v1/memories/`` (an empty entry id) to another operation's route: a
    # path no route has is a NOT_FOUND envelope. Only the console's bare prefix redirects, above.
    app.router.redirect_slashes = False
    return app
