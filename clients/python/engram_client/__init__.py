"""engram-client: a thin client for Engram (long-term memory for AI agents), async and blocking,
over NATS or HTTP, with Engram's wire models and typed errors (SPEC section 9).

    from engram_client import EngramClient

    async with await EngramClient.from_connection(".engram/connection.json") as engram:
        await engram.recall(agent_config_id, cue="plan the trip")

The wire models are in ``engram_client.contracts`` (``events``, ``requests``, ``recall``,
``governance``, ``config``, ``ops``), the operation table in ``engram_client.contracts.operations``.
"""

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
