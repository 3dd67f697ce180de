"""Who calls a tool: the bearer token and the agent config (and session) the tools act in.

The organization and principal are inside the token and nowhere else — no tool argument names
them. Over stdio the caller is fixed when the process starts (``ENGRAM_TOKEN``); over streamable
HTTP it is read from each request's headers (``Authorization: Bearer …``). The agent config and
session are where an agent works, not who it is: they come from the same place (environment or
``X-Engram-Agent-Config`` / ``X-Engram-Session`` headers), so an agent never picks them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol
from uuid import UUID

from contracts.errors import InvalidRequest, Unauthenticated
from shared.security.auth import bearer_from_headers

__all__ = ["AGENT_CONFIG_HEADER", "SESSION_HEADER", "Caller", "CallerSource", "FixedCaller", "HeaderCaller"]

AGENT_CONFIG_HEADER = "x-engram-agent-config"
SESSION_HEADER = "x-engram-session"


@dataclass(frozen=True)
class Caller:
    token: str
    agent_config_id: UUID
    session_id: str | None = None


class CallerSource(Protocol):
    """The caller of one tool call, from the transport's request headers (None over stdio)."""

    def __call__(self, headers: Mapping[str, str] | None) -> Caller: ...


@dataclass(frozen=True)
class FixedCaller:
    """stdio: one agent per process, its token given when the process starts."""

    caller: Caller

    def __call__(self, headers: Mapping[str, str] | None) -> Caller:
        return self.caller


@dataclass(frozen=True)
class HeaderCaller:
    """Streamable HTTP: the ``Authorization`` header is the caller; the agent config comes from
    ``X-Engram-Agent-Config`` or, without it, ``default_agent_config_id``."""

    default_agent_config_id: UUID | None = None

    def __call__(self, headers: Mapping[str, str] | None) -> Caller:
        lowered = {k.lower(): v for k, v in (headers or {}).items()}
        token = bearer_from_headers(lowered)
        if token is None:
            raise Unauthenticated("missing bearer token (send Authorization: Bearer <token>)")
        raw = lowered.get(AGENT_CONFIG_HEADER)
        if raw:
            try:
                agent = UUID(raw)
            except ValueError as exc:
                raise InvalidRequest(f"{AGENT_CONFIG_HEADER} is not a UUID") from exc
        elif self.default_agent_config_id is not None:
            agent = self.default_agent_config_id
        else:
            raise InvalidRequest(f"name the agent config in the {AGENT_CONFIG_HEADER} header")
        return Caller(token=token, agent_config_id=agent, session_id=lowered.get(SESSION_HEADER) or None)
