"""Console sign-in state, in the gateway process's memory: sessions (a random id in a cookie → the
bearer token it stands for) and one-time sign-in codes (``engram console``'s link).

The token stays here, server-side: the browser only ever holds the session id, so the token is never
in a URL, a page or a log. One process only — a second gateway replica does not know these sessions
(docs/adr/0071-web-console.md)."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from cachetools import TLRUCache, TTLCache

from shared.security.auth import Credential

__all__ = ["ConsoleSession", "SessionStore", "TokenClaims"]

#: A session ends after this long without a request ...
IDLE_S = 30 * 60
#: ... and after this long at all (or when its token expires, if sooner).
ABSOLUTE_S = 8 * 3600
#: A one-time sign-in code is good for this long, once.
CODE_S = 120
#: Bound on live sessions and codes: an unauthenticated flood of sign-in attempts cannot grow
#: memory without limit (the least recently used go first).
MAX_ENTRIES = 10_000


@dataclass(frozen=True)
class TokenClaims:
    """What the console shows about a verified token (its credential, whoever issued it): the
    services still verify every request; these label the page and bound the session's lifetime."""

    org_id: str
    principal: str
    permissions: tuple[str, ...]
    expires_at: float
    agent_config_id: str | None

    @classmethod
    def of(cls, credential: Credential, expires_at: float) -> TokenClaims:
        """What a verified token proves, as the console shows it."""
        return cls(
            org_id=str(credential.org_id),
            principal=credential.principal.ref,
            permissions=tuple(sorted(credential.permissions)),
            expires_at=expires_at,
            agent_config_id=str(credential.agent_config_id) if credential.agent_config_id else None,
        )


@dataclass
class ConsoleSession:
    id: str
    token: str
    claims: TokenClaims
    agent_config_id: str
    #: The synchronizer token every mutating form carries (CSRF).
    csrf: str
    expires_at: float
    idle_until: float = field(default=0.0)

    @property
    def authorization(self) -> str:
        return f"Bearer {self.token}"

    def can(self, permission: str) -> bool:
        return permission in self.claims.permissions


class SessionStore:
    def __init__(
        self, *, clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time
    ) -> None:
        # A session lives until its absolute deadline (ABSOLUTE_S, or its token's expiry if sooner);
        # past MAX_ENTRIES the least recently used goes first. Its idle deadline moves on every
        # request, which cachetools cannot say (an entry's expiry is fixed when it is stored), so
        # get() checks that one itself.
        self._sessions: TLRUCache[str, ConsoleSession, float] = TLRUCache(
            maxsize=MAX_ENTRIES, ttu=lambda _id, session, _now: session.expires_at, timer=clock
        )
        # code → (token, agent config), good for CODE_S.
        self._codes: TTLCache[str, tuple[str, str | None], float] = TTLCache(
            maxsize=MAX_ENTRIES, ttl=CODE_S, timer=clock
        )
        self._clock = clock
        self._wall = wall

    def open(self, token: str, claims: TokenClaims, agent_config_id: str) -> ConsoleSession:
        now = self._clock()
        # The token's own expiry (wall clock) as a monotonic deadline.
        token_left = claims.expires_at - self._wall()
        session = ConsoleSession(
            id=secrets.token_urlsafe(32),
            token=token,
            claims=claims,
            agent_config_id=agent_config_id,
            csrf=secrets.token_urlsafe(32),
            expires_at=now + min(ABSOLUTE_S, token_left),
            idle_until=now + IDLE_S,
        )
        self._sessions[session.id] = session
        return session

    def get(self, session_id: str | None) -> ConsoleSession | None:
        """The live session, its idle deadline pushed on; None (and forgotten) once expired."""
        session = self._sessions.get(session_id) if session_id else None
        if session is None:
            return None
        now = self._clock()
        if now >= session.idle_until:
            del self._sessions[session.id]
            return None
        session.idle_until = now + IDLE_S
        return session

    def close(self, session_id: str | None) -> None:
        if session_id:
            self._sessions.pop(session_id, None)

    def issue_code(self, token: str, agent_config_id: str | None) -> str:
        """A one-time code standing for ``token`` for ``CODE_S`` seconds."""
        code = secrets.token_urlsafe(32)
        self._codes[code] = (token, agent_config_id)
        return code

    def redeem_code(self, code: str) -> tuple[str, str | None] | None:
        """The token and agent config a code stands for, once; None when unknown, used or expired."""
        return self._codes.pop(code, None)
