"""Wire error codes (SPEC section 9) and the one exception hierarchy that maps onto them.

Each subclass of :class:`EngramError` stands for exactly one wire code and also inherits the
builtin exception it resembles, so ``except ValueError`` still catches bad input.
"""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from pydantic import ValidationError

__all__ = [
    "ERROR_ENVELOPE_SCHEMA",
    "EmbeddingDimensionMismatch",
    "EngramError",
    "ErrorCode",
    "Forbidden",
    "Internal",
    "InvalidRequest",
    "NotFound",
    "PayloadTooLarge",
    "RateLimited",
    "SemanticDisabled",
    "SessionRequired",
    "Unauthenticated",
    "Unavailable",
    "UserOverrideNotPermitted",
    "VectorUnavailable",
    "WritePolicyDenied",
    "error_for_code",
    "validation_details",
]


class ErrorCode(StrEnum):
    INVALID_REQUEST = "INVALID_REQUEST"
    UNAUTHENTICATED = "UNAUTHENTICATED"
    FORBIDDEN = "FORBIDDEN"
    NOT_FOUND = "NOT_FOUND"
    SESSION_REQUIRED = "SESSION_REQUIRED"
    SEMANTIC_DISABLED = "SEMANTIC_DISABLED"
    USER_OVERRIDE_NOT_PERMITTED = "USER_OVERRIDE_NOT_PERMITTED"
    WRITE_POLICY_DENIED = "WRITE_POLICY_DENIED"
    PAYLOAD_TOO_LARGE = "PAYLOAD_TOO_LARGE"
    RATE_LIMITED = "RATE_LIMITED"
    EMBEDDING_DIMENSION_MISMATCH = "EMBEDDING_DIMENSION_MISMATCH"
    VECTOR_UNAVAILABLE = "VECTOR_UNAVAILABLE"
    UNAVAILABLE = "UNAVAILABLE"
    INTERNAL = "INTERNAL"


class EngramError(Exception):
    """The root of every error Engram reports on the wire."""

    code: ClassVar[ErrorCode] = ErrorCode.INTERNAL
    status: ClassVar[int] = 500
    #: Whether the same request may succeed if sent again later (a dependency was away or the
    #: caller went too fast); clients retry these with backoff and nothing else.
    retryable: ClassVar[bool] = False

    def __init__(self, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details: dict[str, Any] = details or {}

    def to_wire(self) -> dict[str, Any]:
        """The error envelope of SPEC section 9."""
        return {
            "error": {
                "code": self.code.value,
                "status": self.status,
                "message": self.message,
                "details": self.details,
            }
        }


class InvalidRequest(EngramError, ValueError):
    code = ErrorCode.INVALID_REQUEST
    status = 400


class Unauthenticated(EngramError, PermissionError):
    code = ErrorCode.UNAUTHENTICATED
    status = 401


class Forbidden(EngramError, PermissionError):
    code = ErrorCode.FORBIDDEN
    status = 403


class NotFound(EngramError, LookupError):
    code = ErrorCode.NOT_FOUND
    status = 404


class SessionRequired(EngramError, ValueError):
    code = ErrorCode.SESSION_REQUIRED
    status = 400


class SemanticDisabled(EngramError, ValueError):
    code = ErrorCode.SEMANTIC_DISABLED
    status = 400


class UserOverrideNotPermitted(EngramError, PermissionError):
    code = ErrorCode.USER_OVERRIDE_NOT_PERMITTED
    status = 403


class WritePolicyDenied(EngramError, ValueError):
    code = ErrorCode.WRITE_POLICY_DENIED
    status = 422


class PayloadTooLarge(EngramError, ValueError):
    code = ErrorCode.PAYLOAD_TOO_LARGE
    status = 413


class RateLimited(EngramError, RuntimeError):
    code = ErrorCode.RATE_LIMITED
    status = 429
    retryable = True


class EmbeddingDimensionMismatch(EngramError, ValueError):
    code = ErrorCode.EMBEDDING_DIMENSION_MISMATCH
    status = 502


class VectorUnavailable(EngramError, ConnectionError):
    code = ErrorCode.VECTOR_UNAVAILABLE
    status = 503
    retryable = True


class Unavailable(EngramError, ConnectionError):
    code = ErrorCode.UNAVAILABLE
    status = 503
    retryable = True


class Internal(EngramError, RuntimeError):
    code = ErrorCode.INTERNAL
    status = 500


#: The JSON Schema of the envelope (``EngramError.to_wire``), for the AsyncAPI and OpenAPI documents.
ERROR_ENVELOPE_SCHEMA: dict[str, Any] = {
    "title": "ErrorReply",
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["code", "status", "message", "details"],
            "properties": {
                "code": {"enum": [code.value for code in ErrorCode], "type": "string"},
                "status": {"type": "integer"},
                "message": {"type": "string"},
                "details": {"type": "object"},
            },
        }
    },
}

_BY_CODE: dict[ErrorCode, type[EngramError]] = {
    cls.code: cls
    for cls in (
        InvalidRequest,
        Unauthenticated,
        Forbidden,
        NotFound,
        SessionRequired,
        SemanticDisabled,
        UserOverrideNotPermitted,
        WritePolicyDenied,
        PayloadTooLarge,
        RateLimited,
        EmbeddingDimensionMismatch,
        VectorUnavailable,
        Unavailable,
        Internal,
    )
}


def error_for_code(code: str, message: str, details: dict[str, Any] | None = None) -> EngramError:
    """Rebuild the typed exception for a wire error (used by clients reading replies)."""
    try:
        cls = _BY_CODE[ErrorCode(code)]
    except ValueError:
        cls = Internal
    return cls(message, details)


def validation_details(exc: ValidationError) -> dict[str, Any]:
    """``INVALID_REQUEST``'s details for a model that refused a request: where and why validation
    failed. Never the input values: they could be secrets."""
    return {
        "errors": [
            {"loc": ".".join(str(p) for p in err["loc"]), "msg": err["msg"]} for err in exc.errors()[:20]
        ]
    }
