"""engram-client: a thin client for Engram (long-term memory for AI agents), async and blocking,
over NATS or HTTP, with Engram's wire models and typed errors (SPEC section 9).

    from engram_client import EngramClient

    async with await EngramClient.from_connection(".engram/connection.json") as engram:
        await engram.recall(agent_config_id, cue="plan the trip")

The wire models are in ``engram_client.contracts`` (``events``, ``requests``, ``recall``,
``governance``, ``config``, ``ops``), the operation table in ``engram_client.contracts.operations``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engram_client.client import EngramClient, SyncEngramClient
    from engram_client.contracts.connection import ConnectionInfo
    from engram_client.contracts.errors import (
        EmbeddingDimensionMismatch,
        EngramError,
        ErrorCode,
        Forbidden,
        Internal,
        InvalidRequest,
        NotFound,
        PayloadTooLarge,
        RateLimited,
        SemanticDisabled,
        SessionRequired,
        Unauthenticated,
        Unavailable,
        UserOverrideNotPermitted,
        VectorUnavailable,
        WritePolicyDenied,
    )
    from engram_client.transport import HttpTransport, NatsTransport, Transport

__all__ = [
    "ConnectionInfo",
    "EmbeddingDimensionMismatch",
    "EngramClient",
    "EngramError",
    "ErrorCode",
    "Forbidden",
    "HttpTransport",
    "Internal",
    "InvalidRequest",
    "NatsTransport",
    "NotFound",
    "PayloadTooLarge",
    "RateLimited",
    "SemanticDisabled",
    "SessionRequired",
    "SyncEngramClient",
    "Transport",
    "Unauthenticated",
    "Unavailable",
    "UserOverrideNotPermitted",
    "VectorUnavailable",
    "WritePolicyDenied",
]

#: Where each name above lives: it is imported on first use, so that importing a part of the package
#: (``engram_client.contracts.connection``) does not load the client, nats-py and every wire model
#: (``engram --help`` and ``engram console`` start fast: docs/adr/0092-commands-that-start-fast.md).
_HOME = {
    "ConnectionInfo": "engram_client.contracts.connection",
    "EngramClient": "engram_client.client",
    "SyncEngramClient": "engram_client.client",
    "HttpTransport": "engram_client.transport",
    "NatsTransport": "engram_client.transport",
    "Transport": "engram_client.transport",
}


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    # ``__import__``, not ``importlib.import_module``: ``python -X importtime`` lists only the former
    # (tests/unit/test_startup_imports.py reads it).
    value = getattr(__import__(_HOME.get(name, "engram_client.contracts.errors"), fromlist=[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
