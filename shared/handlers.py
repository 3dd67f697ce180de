"""Request-reply plumbing shared by every service: verify the token, parse the body, run the
handler, and turn any failure into the SPEC 9 envelope. A bad request never crashes a service.
Every answer is counted here, by operation and code (``engram_requests_total``), and timed."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from opentelemetry import trace
from pydantic import BaseModel

from shared.auth import Credential, TokenService, bearer_from_headers
from shared.metrics import REQUEST_SECONDS, REQUESTS
from shared.telemetry import annotate_consumer, annotate_memory_operation
from shared.wire import error_reply, parse_model

__all__ = ["answer"]

M = TypeVar("M", bound=BaseModel)


async def answer(
    tokens: TokenService,
    headers: Mapping[str, str] | None,
    body: bytes,
    model: type[M],
    handler: Callable[[Credential, M], Awaitable[BaseModel | dict[str, Any]]],
    *,
    operation: str,
    group: str,
    exclude_unset: bool = False,
) -> dict[str, Any]:
    """Authenticate before parsing: an anonymous caller learns nothing about the schema.
    ``operation`` (the subject) labels the request metrics and, with the queue ``group``, the
    current span (FastStream's consume span)."""
    started = time.perf_counter()
    span = trace.get_current_span()
    annotate_consumer(span, operation, group)
    try:
        credential = tokens.verify(bearer_from_headers(headers))
        request = parse_model(model, body)
        annotate_memory_operation(span, operation, request)
        result = await handler(credential, request)
    except Exception as exc:
        reply = error_reply(exc)
        _count(operation, started, str(reply.get("error", {}).get("code", "INTERNAL")))
        return reply
    _count(operation, started, "OK")
    if isinstance(result, BaseModel):
        # exclude_unset: fields a reply did not set (e.g. a format's absent fields) stay absent.
        return result.model_dump(mode="json", exclude_unset=exclude_unset)
    return result


def _count(operation: str, started: float, code: str) -> None:
    REQUESTS.labels(operation, code).inc()
    REQUEST_SECONDS.labels(operation).observe(time.perf_counter() - started)
